// A weight matrix [n_rows, n_cols] read as the GGUF stores it, in binding WEIGHT_BINDING
// (default 0). A kernel that reads several matrices includes this file once per matrix,
// defining before each include WEIGHT_BINDING and W_(name), the spelling of every name
// declared here (e.g. `#define W_(name) name##_up` declares weight4_up reading binding
// WEIGHT_BINDING), then #undef-ing both; with neither defined the names are as written.
// One of these defines picks the type (vkrt/glsl/variants.json builds each):
//   WEIGHT_F32   f32, row-major
//   WEIGHT_F16   IEEE half, row-major
//   WEIGHT_BF16  bfloat16 (the upper 16 bits of an f32), row-major
//   WEIGHT_Q8_0  ggml block_q8_0: 34 bytes per 32 elements = f16 d, then 32 int8 q;
//                element i = d * q[i]
//   WEIGHT_Q4_1  ggml block_q4_1: 20 bytes per 32 elements = f16 d, f16 m, then 16 bytes qs;
//                element i < 16 = d * (qs[i] & 15) + m, element i + 16 = d * (qs[i] >> 4) + m
// (block layouts: ggml-common.h, as gguf-py's quants.py dequantizes them). Rows of a block
// type hold n_cols / 32 blocks back to back (n_cols % 32 == 0); rows follow each other.
// Blocks are bound as uint32 words (little-endian) and fields extracted by byte offset: a
// Q8_0 block is 2-byte aligned only, so no wider load fits it; this needs no 8- or 16-bit
// storage feature.
// weight4(row, q, n_cols): elements 4q .. 4q + 3 of `row` (n_cols % 4 == 0).
// weight1(row, k, n_cols): element k of `row`.
#ifndef WEIGHT_BINDING
#define WEIGHT_BINDING 0
#define W_(name) name
#define WEIGHT_DEFAULT_NAMES
#endif
#if defined(WEIGHT_F32)
layout(set = 0, binding = WEIGHT_BINDING) readonly buffer W_(Wt) { vec4 W_(w4)[]; };
layout(set = 0, binding = WEIGHT_BINDING) readonly buffer W_(Wt1) { float W_(w1)[]; };  // the same bytes
vec4 W_(weight4)(uint row, uint q, uint n_cols) { return W_(w4)[row * (n_cols / 4) + q]; }
float W_(weight1)(uint row, uint k, uint n_cols) { return W_(w1)[row * n_cols + k]; }
#elif defined(WEIGHT_F16) || defined(WEIGHT_BF16)
layout(set = 0, binding = WEIGHT_BINDING) readonly buffer W_(Wt) { uint W_(w)[]; };  // two elements per word
#if defined(WEIGHT_F16)
vec2 W_(pair)(uint v) { return unpackHalf2x16(v); }
#else
vec2 W_(pair)(uint v) { return uintBitsToFloat(uvec2(v << 16, v & 0xFFFF0000u)); }
#endif
vec4 W_(weight4)(uint row, uint q, uint n_cols) {
    uint i = (row * n_cols + 4 * q) / 2;
    return vec4(W_(pair)(W_(w)[i]), W_(pair)(W_(w)[i + 1]));
}
float W_(weight1)(uint row, uint k, uint n_cols) {
    uint i = row * n_cols + k;
    return W_(pair)(W_(w)[i / 2])[i % 2];
}
#elif defined(WEIGHT_Q8_0) || defined(WEIGHT_Q4_1)
layout(set = 0, binding = WEIGHT_BINDING) readonly buffer W_(Wt) { uint W_(w)[]; };
// The 16 bits at an even byte offset, and the 32 bits at an even byte offset (straddling two
// words when the offset is 2 mod 4).
uint W_(half_at)(uint byte) { return (W_(w)[byte / 4] >> (8 * (byte % 4))) & 0xFFFFu; }
uint W_(word_at)(uint byte) {
    uint i = byte / 4;
    return byte % 4 == 0 ? W_(w)[i] : (W_(w)[i] >> 16) | (W_(w)[i + 1] << 16);
}
#if defined(WEIGHT_Q8_0)
const uint W_(BLOCK_BYTES) = 34;
vec4 W_(weight4)(uint row, uint q, uint n_cols) {
    uint block = (row * (n_cols / 32) + q / 8) * W_(BLOCK_BYTES);
    float d = unpackHalf2x16(W_(half_at)(block)).x;
    int v = int(W_(word_at)(block + 2 + 4 * (q % 8)));
    return d * vec4(bitfieldExtract(v, 0, 8), bitfieldExtract(v, 8, 8),
                    bitfieldExtract(v, 16, 8), bitfieldExtract(v, 24, 8));
}
float W_(weight1)(uint row, uint k, uint n_cols) {
    uint block = (row * (n_cols / 32) + k / 32) * W_(BLOCK_BYTES), i = 2 + k % 32;
    float d = unpackHalf2x16(W_(half_at)(block)).x;
    int v = int(W_(word_at)(block + (i & ~1u)));
    return d * float(bitfieldExtract(v, 8 * int(i & 1u), 8));
}
#else
const uint W_(BLOCK_WORDS) = 5;  // 20 bytes: blocks stay word-aligned
vec4 W_(weight4)(uint row, uint q, uint n_cols) {
    uint block = (row * (n_cols / 32) + q / 8) * W_(BLOCK_WORDS), j = q % 8;
    vec2 dm = unpackHalf2x16(W_(w)[block]);                 // (d, m)
    uint v = W_(w)[block + 1 + j % 4] >> (j / 4 * 4);       // high nibbles for elements 16..31
    uvec4 n = uvec4(v, v >> 8, v >> 16, v >> 24) & 15u;
    return dm.x * vec4(n) + dm.y;
}
float W_(weight1)(uint row, uint k, uint n_cols) {
    uint block = (row * (n_cols / 32) + k / 32) * W_(BLOCK_WORDS), i = k % 32;
    vec2 dm = unpackHalf2x16(W_(w)[block]);
    uint byte = i % 16;
    uint n = (W_(w)[block + 1 + byte / 4] >> (8 * (byte % 4) + i / 16 * 4)) & 15u;
    return dm.x * float(n) + dm.y;
}
#endif
#else
#error "define one WEIGHT_* type"
#endif
#ifdef WEIGHT_DEFAULT_NAMES
#undef WEIGHT_BINDING
#undef W_
#undef WEIGHT_DEFAULT_NAMES
#endif
