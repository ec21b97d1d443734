// A weight matrix [n_rows, n_cols] read as the GGUF stores it, in binding 0 (block Wt).
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
#if defined(WEIGHT_F32)
layout(set = 0, binding = 0) readonly buffer Wt { vec4 w4[]; };
layout(set = 0, binding = 0) readonly buffer Wt1 { float w1[]; };  // the same bytes
vec4 weight4(uint row, uint q, uint n_cols) { return w4[row * (n_cols / 4) + q]; }
float weight1(uint row, uint k, uint n_cols) { return w1[row * n_cols + k]; }
#elif defined(WEIGHT_F16) || defined(WEIGHT_BF16)
layout(set = 0, binding = 0) readonly buffer Wt { uint w[]; };  // two elements per word
#if defined(WEIGHT_F16)
vec2 pair(uint v) { return unpackHalf2x16(v); }
#else
vec2 pair(uint v) { return uintBitsToFloat(uvec2(v << 16, v & 0xFFFF0000u)); }
#endif
vec4 weight4(uint row, uint q, uint n_cols) {
    uint i = (row * n_cols + 4 * q) / 2;
    return vec4(pair(w[i]), pair(w[i + 1]));
}
float weight1(uint row, uint k, uint n_cols) {
    uint i = row * n_cols + k;
    return pair(w[i / 2])[i % 2];
}
#elif defined(WEIGHT_Q8_0) || defined(WEIGHT_Q4_1)
layout(set = 0, binding = 0) readonly buffer Wt { uint w[]; };
// The 16 bits at an even byte offset, and the 32 bits at an even byte offset (straddling two
// words when the offset is 2 mod 4).
uint half_at(uint byte) { return (w[byte / 4] >> (8 * (byte % 4))) & 0xFFFFu; }
uint word_at(uint byte) {
    uint i = byte / 4;
    return byte % 4 == 0 ? w[i] : (w[i] >> 16) | (w[i + 1] << 16);
}
#if defined(WEIGHT_Q8_0)
const uint BLOCK_BYTES = 34;
vec4 weight4(uint row, uint q, uint n_cols) {
    uint block = (row * (n_cols / 32) + q / 8) * BLOCK_BYTES;
    float d = unpackHalf2x16(half_at(block)).x;
    int v = int(word_at(block + 2 + 4 * (q % 8)));
    return d * vec4(bitfieldExtract(v, 0, 8), bitfieldExtract(v, 8, 8),
                    bitfieldExtract(v, 16, 8), bitfieldExtract(v, 24, 8));
}
float weight1(uint row, uint k, uint n_cols) {
    uint block = (row * (n_cols / 32) + k / 32) * BLOCK_BYTES, i = 2 + k % 32;
    float d = unpackHalf2x16(half_at(block)).x;
    int v = int(word_at(block + (i & ~1u)));
    return d * float(bitfieldExtract(v, 8 * int(i & 1u), 8));
}
#else
const uint BLOCK_WORDS = 5;  // 20 bytes: blocks stay word-aligned
vec4 weight4(uint row, uint q, uint n_cols) {
    uint block = (row * (n_cols / 32) + q / 8) * BLOCK_WORDS, j = q % 8;
    vec2 dm = unpackHalf2x16(w[block]);                 // (d, m)
    uint v = w[block + 1 + j % 4] >> (j / 4 * 4);       // high nibbles for elements 16..31
    uvec4 n = uvec4(v, v >> 8, v >> 16, v >> 24) & 15u;
    return dm.x * vec4(n) + dm.y;
}
float weight1(uint row, uint k, uint n_cols) {
    uint block = (row * (n_cols / 32) + k / 32) * BLOCK_WORDS, i = k % 32;
    vec2 dm = unpackHalf2x16(w[block]);
    uint byte = i % 16;
    uint n = (w[block + 1 + byte / 4] >> (8 * (byte % 4) + i / 16 * 4)) & 15u;
    return dm.x * float(n) + dm.y;
}
#endif
#else
#error "define one WEIGHT_* type"
#endif
