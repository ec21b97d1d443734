// A weight matrix [n_rows, n_cols] read as the GGUF stores it, in binding WEIGHT_BINDING
// (default 0). A kernel that reads several matrices includes this file once per matrix,
// defining before each include WEIGHT_BINDING and W_(name), the spelling of every name
// declared here (e.g. `#define W_(name) name##_up` declares weight4_up reading binding
// WEIGHT_BINDING), then #undef-ing both; with neither defined the names are as written.
// One define picks the type (vkrt/glsl/variants.json builds each, generated from the table
// in vkrt/weight_types.py, which also passes a block type's WEIGHT_BLOCK and
// WEIGHT_BLOCK_BYTES):
//   WEIGHT_F32   f32, row-major
//   WEIGHT_F16   IEEE half, row-major
//   WEIGHT_BF16  bfloat16 (the upper 16 bits of an f32), row-major
//   WEIGHT_Q8_0, WEIGHT_Q4_0, WEIGHT_Q4_1, WEIGHT_Q5_0, WEIGHT_Q5_1, WEIGHT_IQ4_NL (blocks of
//   32), WEIGHT_Q2_K, WEIGHT_Q3_K, WEIGHT_Q4_K, WEIGHT_Q5_K, WEIGHT_Q6_K, WEIGHT_IQ4_XS
//   (blocks of 256): ggml's block_* structs, each described at its block4 below
// (block layouts: ggml-common.h, as gguf-py's quants.py dequantizes them). Rows of a block
// type hold n_cols / WEIGHT_BLOCK blocks back to back (n_cols % WEIGHT_BLOCK == 0); rows
// follow each other. Blocks are bound as uint32 words (little-endian) and fields extracted by
// byte offset: most blocks are 2-byte aligned only, so no wider load fits them (Q4_K's and
// Q5_K's are whole 16-byte units and also read 16 bytes at a time); this needs no 8- or
// 16-bit storage feature. Values are dequantized as gguf-py does, in f32.
// weight4(row, q, n_cols): elements 4q .. 4q + 3 of `row` (n_cols % 4 == 0).
// weight1(row, k, n_cols): element k of `row`.
// Where the type defines WEIGHT_RAW4 (Q4_1, Q4_K): raw4(row, q, n_cols), the words weight4
// reads (a WEIGHT_RAW_T; WEIGHT_RAW_ZERO decodes to 0), and decode4(words, 4q %
// WEIGHT_BLOCK), their value (weight4 in two phases).
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
#elif defined(WEIGHT_BLOCK)
// Block types: WEIGHT_BLOCK elements in WEIGHT_BLOCK_BYTES bytes per block (the variant's
// defines, from vkrt/weight_types.py). Each type defines block4(o, e): elements e .. e + 3
// (e % 4 == 0) of the block at byte o. Four consecutive elements always share one scale
// and sit in four consecutive bytes (the same nibble or bit field of each), so block4 reads
// a handful of words.
layout(set = 0, binding = WEIGHT_BINDING) readonly buffer W_(Wt) { uint W_(w)[]; };
// The byte at any offset; the 16 bits at an even byte offset; the 32 bits at any byte offset
// (straddling two words when it is not a multiple of 4: blocks of 18, 22, 34, 110 and 210
// bytes are only 2-byte aligned, and no wider or unaligned load is assumed).
uint W_(byte_at)(uint byte) { return (W_(w)[byte / 4] >> (8 * (byte % 4))) & 0xFFu; }
uint W_(half_at)(uint byte) { return (W_(w)[byte / 4] >> (8 * (byte % 4))) & 0xFFFFu; }
uint W_(word_at)(uint byte) {
    uint i = byte / 4, s = 8 * (byte % 4);
    return s == 0 ? W_(w)[i] : (W_(w)[i] >> s) | (W_(w)[i + 1] << (32 - s));
}
float W_(f16_at)(uint byte) { return unpackHalf2x16(W_(half_at)(byte)).x; }
// The four bytes of v shifted right by `shift`, each masked to `mask`.
uvec4 W_(fields)(uint v, uint shift, uint mask) {
    v >>= shift;
    return uvec4(v, v >> 8, v >> 16, v >> 24) & mask;
}
// kvalues_iq4nl (ggml-common.h): IQ4_NL's and IQ4_XS's non-linear 4-bit levels -127, -104,
// -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113, as int8 bytes of four words
// (selects and shifts: a const array, indexed at run time, took lavapipe 3x longer to build
// and run: test_kernels -k iq4 cold, 17 s against 6 s).
#if defined(WEIGHT_IQ4_NL) || defined(WEIGHT_IQ4_XS)
vec4 W_(levels)(uvec4 n) {
    uvec4 v = mix(mix(uvec4(0xBFAD9881u), uvec4(0xF6EADDCFu), greaterThan(n, uvec4(3u))),
                  mix(uvec4(0x26190D01u), uvec4(0x71594535u), greaterThan(n, uvec4(11u))),
                  greaterThan(n, uvec4(7u)));
    return vec4(ivec4(v << (24u - 8u * (n & 3u))) >> 24);   // byte n % 4, sign-extended
}
#endif
// The block-level reader (unit_dot) looks the 16 levels up in shared memory instead: one
// load per weight, and 16 floats in 16 distinct banks never conflict. A kernel calling
// unit_dot calls weights_unit_init() first, in uniform control flow (it fills the table and
// waits on a barrier); declared once however often this file is included.
#if (defined(WEIGHT_IQ4_NL) || defined(WEIGHT_IQ4_XS)) && !defined(WEIGHT_IQ4_LUT)
#define WEIGHT_IQ4_LUT
shared float iq4_levels[16];
#endif
#ifndef WEIGHT_UNIT_INIT
#define WEIGHT_UNIT_INIT
void weights_unit_init() {
#ifdef WEIGHT_IQ4_LUT
    for (uint i = gl_LocalInvocationID.x; i < 16; i += gl_WorkGroupSize.x)
        iq4_levels[i] = W_(levels)(uvec4(i)).x;
    barrier();
#endif
}
#endif
#if defined(WEIGHT_Q8_0)
// block_q8_0 (34 bytes): f16 d, int8 qs[32]; x = d * qs[e].
vec4 W_(block4)(uint o, uint e) {
    float d = W_(f16_at)(o);
    int v = int(W_(word_at)(o + 2 + e));
    return d * vec4(bitfieldExtract(v, 0, 8), bitfieldExtract(v, 8, 8),
                    bitfieldExtract(v, 16, 8), bitfieldExtract(v, 24, 8));
}
#elif defined(WEIGHT_Q4_1)
// block_q4_1 (20 bytes): f16 d, f16 m, qs[16]; element e < 16 = d * (qs[e] & 15) + m,
// element e + 16 = d * (qs[e] >> 4) + m.
// In two phases (WEIGHT_RAW4: matmul_coop.comp fetches the words steps ahead and decodes
// them as it stores its tile, so that no use of a load waits on it early): raw_at(o, e),
// the block's words block4 reads (4-byte aligned: blocks of 20 bytes), and decode4(v, e).
#ifndef WEIGHT_RAW4
#define WEIGHT_RAW4
#endif
#define WEIGHT_RAW_T uvec2
#define WEIGHT_RAW_ZERO uvec2(0u)
uvec2 W_(raw_at)(uint o, uint e) { return uvec2(W_(w)[o / 4], W_(w)[o / 4 + 1 + e % 16 / 4]); }
vec4 W_(decode4)(uvec2 v, uint e) {
    vec2 dm = unpackHalf2x16(v.x);                            // (d, m)
    uvec4 n = W_(fields)(v.y, e / 16 * 4, 15u);
    return dm.x * vec4(n) + dm.y;
}
vec4 W_(block4)(uint o, uint e) { return W_(decode4)(W_(raw_at)(o, e), e); }
#elif defined(WEIGHT_Q4_0)
// block_q4_0 (18 bytes): f16 d, qs[16]; x = d * (nibble - 8), nibbles as Q4_1's.
vec4 W_(block4)(uint o, uint e) {
    uvec4 n = W_(fields)(W_(word_at)(o + 2 + e % 16), e / 16 * 4, 15u);
    return W_(f16_at)(o) * (vec4(n) - 8.0);
}
#elif defined(WEIGHT_Q5_0) || defined(WEIGHT_Q5_1)
// block_q5_0 (22 bytes): f16 d, u32 qh, qs[16]; block_q5_1 (24 bytes): f16 d, f16 m, u32 qh,
// qs[16]. q = nibble (as Q4_1's) | bit e of qh << 4; Q5_0: x = d * (q - 16), Q5_1: d * q + m.
#if defined(WEIGHT_Q5_0)
const uint W_(QH) = 2;
#else
const uint W_(QH) = 4;
#endif
vec4 W_(block4)(uint o, uint e) {
    uvec4 h = (uvec4(W_(word_at)(o + W_(QH))) >> (e + uvec4(0, 1, 2, 3))) & 1u;
    vec4 q = vec4(W_(fields)(W_(word_at)(o + W_(QH) + 4 + e % 16), e / 16 * 4, 15u) | h << 4);
#if defined(WEIGHT_Q5_0)
    return W_(f16_at)(o) * (q - 16.0);
#else
    return W_(f16_at)(o) * q + W_(f16_at)(o + 2);
#endif
}
#elif defined(WEIGHT_IQ4_NL)
// block_iq4_nl (18 bytes): f16 d, qs[16]; x = d * kvalues[nibble], nibbles as Q4_1's.
vec4 W_(block4)(uint o, uint e) {
    return W_(f16_at)(o) * W_(levels)(W_(fields)(W_(word_at)(o + 2 + e % 16), e / 16 * 4, 15u));
}
#elif defined(WEIGHT_Q2_K)
// block_q2_K (84 bytes): scales[16] (4-bit scale | 4-bit min << 4, one per 16 elements),
// qs[64], f16 d, f16 dmin. Element e = 128 h + 32 j + l: 2 bits at shift 2 j of qs[32 h + l];
// x = d * (sc & 15) * q - dmin * (sc >> 4), sc = scales[e / 16].
vec4 W_(block4)(uint o, uint e) {
    uint sc = W_(byte_at)(o + e / 16);
    uvec4 q = W_(fields)(W_(word_at)(o + 16 + e / 128 * 32 + e % 32), e / 32 % 4 * 2, 3u);
    return W_(f16_at)(o + 80) * float(sc & 15u) * vec4(q) - W_(f16_at)(o + 82) * float(sc >> 4);
}
#elif defined(WEIGHT_Q3_K)
// block_q3_K (110 bytes): hmask[32], qs[64], scales[12] (16 6-bit scales), f16 d. Element
// e = 128 h + 32 j + l: 2 low bits at shift 2 j of qs[32 h + l], minus 4 unless bit e / 32 of
// hmask[l] is set; scale s = e / 16: low 4 bits in scales[s % 8] >> 4 (s / 8), high 2 bits
// in scales[8 + s % 4] >> 2 (s / 4), minus 32; x = d * scale * q.
vec4 W_(block4)(uint o, uint e) {
    uint s = e / 16;
    uint sc = (W_(byte_at)(o + 96 + s % 8) >> (s / 8 * 4)) & 15u
              | ((W_(byte_at)(o + 104 + s % 4) >> (s / 4 * 2)) & 3u) << 4;
    uvec4 q = W_(fields)(W_(word_at)(o + 32 + e / 128 * 32 + e % 32), e / 32 % 4 * 2, 3u);
    uvec4 h = W_(fields)(W_(word_at)(o + e % 32), e / 32, 1u);
    return W_(f16_at)(o + 108) * float(int(sc) - 32) * (vec4(q) - 4.0 * vec4(1u - h));
}
#elif defined(WEIGHT_Q4_K) || defined(WEIGHT_Q5_K)
// block_q4_K (144 bytes): f16 d, f16 dmin, scales[12] (8 6-bit scales and mins), qs[128];
// block_q5_K (176 bytes): the same with qh[32] before qs. Element e = 64 c + 32 i + l of
// sub-block b = e / 32: nibble i of qs[32 c + l], Q5_K's bit b of qh[l] << 4;
// x = d * sc[b] * q - dmin * m[b] (get_scale_min_k4).
#if defined(WEIGHT_Q4_K)
const uint W_(QS) = 16;
#else
const uint W_(QS) = 48;
#endif
// Both blocks are whole 16-byte units (144 and 176 bytes) and every field the readers
// take 16 bytes of (the header: d, dmin, scales; a unit's 16 qs and qh bytes) starts at a
// multiple of 16 of the block, so they read them as one uvec4 of the same binding (one
// 16-byte load in place of four word loads; bench/README.md, twenty-fourth session).
layout(set = 0, binding = WEIGHT_BINDING) readonly buffer W_(Wt16) { uvec4 W_(w16)[]; };
// (scale, min) of sub-block b from the three scale words s (the block's words 1-3), ggml's
// get_scale_min_k4: bytes 0-3 scales 0-3 (and the top 2 bits of scales 4-7), 4-7 mins 0-3
// (and the top 2 bits of mins 4-7), 8-11 the low nibbles of scales and mins 4-7.
uvec2 W_(scale_min)(uvec3 s, uint b) {
    uint j = 8 * (b % 4);
    uvec2 v = uvec2(s.x >> j, s.y >> j);
    if (b < 4) return v & 63u;
    uint lo = s.z >> j;
    return uvec2(lo & 15u, (lo >> 4) & 15u) | (v >> 6 & 3u) << 4;
}
#if defined(WEIGHT_Q4_K)
// In two phases (WEIGHT_RAW4, as Q4_1's): raw_at(o, e), the block's 16-byte header (d, dmin,
// the 12 scale bytes: words 0-3) and the quant word, and decode4(v, e), scale_min on the
// header's words.
#ifndef WEIGHT_RAW4
#define WEIGHT_RAW4
#endif
#ifndef WEIGHT_RAW_Q4_K
#define WEIGHT_RAW_Q4_K
struct RawQ4K { uvec4 h; uint q; };
#endif
#define WEIGHT_RAW_T RawQ4K
#define WEIGHT_RAW_ZERO RawQ4K(uvec4(0u), 0u)
RawQ4K W_(raw_at)(uint o, uint e) {
    return RawQ4K(W_(w16)[o / 16], W_(w)[o / 4 + 4 + e / 64 * 8 + e % 32 / 4]);
}
vec4 W_(decode4)(RawQ4K v, uint e) {
    uint b = e / 32;
    uvec2 sm = W_(scale_min)(v.h.yzw, b);
    uvec4 q = W_(fields)(v.q, b % 2 * 4, 15u);
    vec2 dm = unpackHalf2x16(v.h.x);                          // (d, dmin)
    return dm.x * float(sm.x) * vec4(q) - dm.y * float(sm.y);
}
vec4 W_(block4)(uint o, uint e) { return W_(decode4)(W_(raw_at)(o, e), e); }
#else
vec4 W_(block4)(uint o, uint e) {
    uint i = o / 4;
    uvec2 sm = W_(scale_min)(uvec3(W_(w)[i + 1], W_(w)[i + 2], W_(w)[i + 3]), e / 32);
    uvec4 q = W_(fields)(W_(word_at)(o + W_(QS) + e / 64 * 32 + e % 32), e / 32 % 2 * 4, 15u);
    q |= W_(fields)(W_(word_at)(o + 16 + e % 32), e / 32, 1u) << 4;
    return W_(f16_at)(o) * float(sm.x) * vec4(q) - W_(f16_at)(o + 2) * float(sm.y);
}
#endif
#elif defined(WEIGHT_Q6_K)
// block_q6_K (210 bytes): ql[128], qh[64], int8 scales[16], f16 d (last). Element
// e = 128 h + 32 j + l: nibble j / 2 of ql[64 h + 32 (j % 2) + l] | 2 bits at shift 2 j of
// qh[32 h + l] << 4, minus 32; x = d * scales[e / 16] * q.
vec4 W_(block4)(uint o, uint e) {
    uint h = e / 128, j = e / 32 % 4, l = e % 32;
    float sc = float(bitfieldExtract(int(W_(byte_at)(o + 192 + e / 16)), 0, 8));
    uvec4 q = W_(fields)(W_(word_at)(o + 64 * h + 32 * (j % 2) + l), j / 2 * 4, 15u)
              | W_(fields)(W_(word_at)(o + 128 + 32 * h + l), 2 * j, 3u) << 4;
    return W_(f16_at)(o + 208) * sc * (vec4(q) - 32.0);
}
#elif defined(WEIGHT_IQ4_XS)
// block_iq4_xs (136 bytes): f16 d, u16 scales_h, scales_l[4], qs[128]. Sub-block b = e / 32:
// scale = (scales_l[b / 2] >> 4 (b % 2) & 15 | (scales_h >> 2 b & 3) << 4) - 32; element
// 32 b + 16 i + l = d * scale * kvalues[nibble i of qs[16 b + l]].
vec4 W_(block4)(uint o, uint e) {
    uint b = e / 32;
    uint sc = (W_(byte_at)(o + 4 + b / 2) >> (b % 2 * 4)) & 15u
              | ((W_(half_at)(o + 2) >> (2 * b)) & 3u) << 4;
    uvec4 n = W_(fields)(W_(word_at)(o + 8 + 16 * b + e % 16), e % 32 / 16 * 4, 15u);
    return W_(f16_at)(o) * float(int(sc) - 32) * W_(levels)(n);
}
#else
#error "WEIGHT_BLOCK without a block type"
#endif
// The block-level reader (decode products: matvec.comp, matvec_glu.comp, qkv_rope.comp).
// A block is UNITS units of 32 weights; unit u's weights are two runs of 16 consecutive
// elements of the block, starting at unit_runs(u).x and unit_runs(u).y, chosen per type so
// that a unit's low bits are 16 consecutive bytes of the block, four words, that no other
// unit shares. unit_hdr(o, u) decodes unit u's scales, mins and d (a vec4 per type, read
// once per unit); unit_part(o, u, q, hdr, xa, xb) is the dot product of word q's weights
// (run x's elements 4q .. 4q + 3 with xa, run y's with xb), reading each word with one plain
// uint load when the type is 4-byte aligned (every field it reads sits at a multiple of 4),
// or the two covering words shifted when it is only 2-byte aligned (no unaligned access
// assumed). unit_dot(o, u, q0, step, xv) sums the parts q0, q0 + step, ... < 4 with
// xv[q], xv[4 + q]: step 1 is the whole unit in one invocation (its header decoded once
// for 32 weights), step 4 a quarter per invocation (4 invocations per unit: consecutive
// invocations read consecutive words and x; vkrt/tuning.py picks).
// Integers become floats as halves: 0x6400 | q is the f16 1024 + q, exact for q < 1024, and
// unpackHalf2x16 turns two of them into f32 with no int-to-float conversion. Each weight is
// dequantized to f32 as block4 (and gguf-py) computes it, or, where a run has one scale and
// no min, the scale multiplies the run's dot product of integers.
// The four bytes of v, each masked to m (a byte mask), as floats minus `bias`.
vec4 W_(bytes_f)(uint v, uint m, float bias) {
    uint mm = m | (m << 16);
    vec2 a = unpackHalf2x16((v & mm) | 0x64006400u);          // bytes 0, 2
    vec2 b = unpackHalf2x16(((v >> 8) & mm) | 0x64006400u);   // bytes 1, 3
    return vec4(a.x, b.x, a.y, b.y) - (1024.0 + bias);
}
// Word q of the 16 bytes at an even byte offset.
uint W_(word_q)(uint byte, uint q) {
    uint i = byte / 4 + q;
#if WEIGHT_BLOCK_BYTES % 4 != 0
    if (byte % 4 != 0) return (W_(w)[i] >> 16) | (W_(w)[i + 1] << 16);
#endif
    return W_(w)[i];
}
// Bit `bit` of the four bytes of v moved to bit `to` of each byte.
uint W_(bits_at)(uint v, uint bit, uint to) { return ((v >> bit) & 0x01010101u) << to; }
// Four 1-bit values h (bits 0..3) spread to bit 4 of bytes 0..3 (Q5_0/Q5_1's qh).
uint W_(spread4)(uint h) { return ((h * 0x00204081u) & 0x01010101u) << 4; }
#if defined(WEIGHT_IQ4_NL) || defined(WEIGHT_IQ4_XS)
// The levels of the low nibbles of v's four bytes (weights_unit_init's table).
vec4 W_(lut4)(uint v) {
    return vec4(iq4_levels[v & 15u], iq4_levels[(v >> 8) & 15u], iq4_levels[(v >> 16) & 15u],
                iq4_levels[(v >> 24) & 15u]);
}
#endif
#if defined(WEIGHT_Q8_0) || defined(WEIGHT_Q4_0) || defined(WEIGHT_IQ4_NL) || defined(WEIGHT_Q4_1) \
    || defined(WEIGHT_Q5_0) || defined(WEIGHT_Q5_1)
// The 32-weight types: one unit, the block; runs 0..15 and 16..31. Their scales are plain
// loads (read once per unit by the compiler's load elimination): no header to decode.
const uint W_(UNITS) = 1;
uvec2 W_(unit_runs)(uint u) { return uvec2(0, 16); }
vec4 W_(unit_hdr)(uint o, uint u) { return vec4(0.0); }
#endif
#if defined(WEIGHT_Q8_0)
// Q8_0: qs at 2, elements 0..15 then 16..31, int8: (q ^ 0x80) - 128.
#define WEIGHT_SIGNED_INTS 1
uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    return uvec2(W_(word_q)(o + 2, q), W_(word_q)(o + 18, q));
}
vec4 W_(unit_scales)(uint o, uint u) { return vec4(vec2(W_(f16_at)(o)), 0.0, 0.0); }
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    uint a = W_(word_q)(o + 2, q), b = W_(word_q)(o + 18, q);
    return W_(f16_at)(o) * (dot(W_(bytes_f)(a ^ 0x80808080u, 0xFFu, 128.0), xa)
                            + dot(W_(bytes_f)(b ^ 0x80808080u, 0xFFu, 128.0), xb));
}
#elif defined(WEIGHT_Q4_0) || defined(WEIGHT_IQ4_NL)
// Q4_0, IQ4_NL: qs at 2: byte l holds element l (low nibble) and l + 16.
#if defined(WEIGHT_Q4_0)
#define WEIGHT_QOFF 8
#endif
uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    uint v = W_(word_q)(o + 2, q);
    return uvec2(v & 0x0F0F0F0Fu, (v >> 4) & 0x0F0F0F0Fu);
}
vec4 W_(unit_scales)(uint o, uint u) { return vec4(vec2(W_(f16_at)(o)), 0.0, 0.0); }
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    uint v = W_(word_q)(o + 2, q);
#if defined(WEIGHT_Q4_0)
    return W_(f16_at)(o) * (dot(W_(bytes_f)(v, 15u, 8.0), xa) + dot(W_(bytes_f)(v >> 4, 15u, 8.0), xb));
#else
    return W_(f16_at)(o) * (dot(W_(lut4)(v), xa) + dot(W_(lut4)(v >> 4), xb));
#endif
}
#elif defined(WEIGHT_Q4_1)
// Q4_1: (d, m) the first word, qs words 1..4 (4-byte aligned).
uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    uint v = W_(w)[o / 4 + 1 + q];
    return uvec2(v & 0x0F0F0F0Fu, (v >> 4) & 0x0F0F0F0Fu);
}
vec4 W_(unit_scales)(uint o, uint u) {
    vec2 dm = unpackHalf2x16(W_(w)[o / 4]);
    return vec4(dm.xx, -dm.yy);
}
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    vec2 dm = unpackHalf2x16(W_(w)[o / 4]);
    uint v = W_(w)[o / 4 + 1 + q];
    return dot(dm.x * W_(bytes_f)(v, 15u, 0.0) + dm.y, xa)
           + dot(dm.x * W_(bytes_f)(v >> 4, 15u, 0.0) + dm.y, xb);
}
#elif defined(WEIGHT_Q5_0) || defined(WEIGHT_Q5_1)
// Q5_0 / Q5_1: element l's fifth bit is bit l of qh (at QH), element l + 16's bit l + 16;
// qs at QH + 4.
uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    uint qh = W_(word_at)(o + W_(QH)), v = W_(word_q)(o + W_(QH) + 4, q);
    return uvec2((v & 0x0F0F0F0Fu) | W_(spread4)((qh >> (4 * q)) & 15u),
                 ((v >> 4) & 0x0F0F0F0Fu) | W_(spread4)((qh >> (16 + 4 * q)) & 15u));
}
#if defined(WEIGHT_Q5_1)
vec4 W_(unit_scales)(uint o, uint u) {
    vec2 dm = unpackHalf2x16(W_(w)[o / 4]);
    return vec4(dm.xx, -dm.yy);
}
#else
#define WEIGHT_QOFF 16
vec4 W_(unit_scales)(uint o, uint u) { return vec4(vec2(W_(f16_at)(o)), 0.0, 0.0); }
#endif
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    uint qh = W_(word_at)(o + W_(QH)), v = W_(word_q)(o + W_(QH) + 4, q);
    uint lo = (v & 0x0F0F0F0Fu) | W_(spread4)((qh >> (4 * q)) & 15u);
    uint hi = ((v >> 4) & 0x0F0F0F0Fu) | W_(spread4)((qh >> (16 + 4 * q)) & 15u);
#if defined(WEIGHT_Q5_1)
    vec2 dm = unpackHalf2x16(W_(w)[o / 4]);
    return dot(dm.x * W_(bytes_f)(lo, 31u, 0.0) + dm.y, xa)
           + dot(dm.x * W_(bytes_f)(hi, 31u, 0.0) + dm.y, xb);
#else
    return W_(f16_at)(o) * (dot(W_(bytes_f)(lo, 31u, 16.0), xa) + dot(W_(bytes_f)(hi, 31u, 16.0), xb));
#endif
}
#elif defined(WEIGHT_Q2_K) || defined(WEIGHT_Q3_K)
// Q2_K / Q3_K: 8 units; unit u = 4 h + 2 p + i covers qs[32 h + 16 i .. + 16] at shifts 4 p
// (run x: elements 128 h + 64 p + 16 i + l, j = 2 p) and 4 p + 2 (run y: + 32, j = 2 p + 1);
// the runs' scales are s = 8 h + 4 p + i and s + 2 (one per 16 elements).
const uint W_(UNITS) = 8;
uvec2 W_(unit_runs)(uint u) {
    uint a = 128 * (u / 4) + 64 * (u / 2 % 2) + 16 * (u % 2);
    return uvec2(a, a + 32);
}
// Header: (scale x, scale y, min x, min y) of the two runs (Q3_K: d * its 6-bit scales).
vec4 W_(unit_hdr)(uint o, uint u) {
    uint h = u / 4, p = u / 2 % 2, i = u % 2, s = 8 * h + 4 * p + i;
#if defined(WEIGHT_Q2_K)
    uint sw = W_(w)[o / 4 + s / 4] >> (8 * i);       // scales s (byte 0) and s + 2 (byte 2)
    vec2 dd = unpackHalf2x16(W_(w)[o / 4 + 20]);    // (d, dmin) at byte 80
    vec2 a = dd.x * vec2(sw & 15u, (sw >> 16) & 15u);
    vec2 m = dd.y * vec2((sw >> 4) & 15u, (sw >> 20) & 15u);
    return vec4(a, m);
#else
    // 6-bit scales: low 4 bits in scales[s % 8] >> 4 (s / 8), high 2 in scales[8 + s % 4]
    // >> 2 (s / 4), minus 32.
    uint t = s + 2;
    int sa = int((W_(byte_at)(o + 96 + s % 8) >> (s / 8 * 4)) & 15u
                 | ((W_(byte_at)(o + 104 + s % 4) >> (s / 4 * 2)) & 3u) << 4) - 32;
    int sb = int((W_(byte_at)(o + 96 + t % 8) >> (t / 8 * 4)) & 15u
                 | ((W_(byte_at)(o + 104 + t % 4) >> (t / 4 * 2)) & 3u) << 4) - 32;
    return vec4(W_(f16_at)(o + 108) * vec2(sa, sb), 0.0, 0.0);
#endif
}
uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    uint h = u / 4, p = u / 2 % 2, i = u % 2;
#if defined(WEIGHT_Q2_K)
    uint v = W_(w)[(o + 16 + 32 * h + 16 * i) / 4 + q];
    return uvec2((v >> (4 * p)) & 0x03030303u, (v >> (4 * p + 2)) & 0x03030303u);
#else
    uint v = W_(word_q)(o + 32 + 32 * h + 16 * i, q), hm = W_(word_q)(o + 16 * i, q);
    uint b = 4 * h + 2 * p;                          // hmask bits of the two runs: b, b + 1
    return uvec2(((v >> (4 * p)) & 0x03030303u) | W_(bits_at)(hm, b, 2),
                 ((v >> (4 * p + 2)) & 0x03030303u) | W_(bits_at)(hm, b + 1, 2));
#endif
}
#if defined(WEIGHT_Q3_K)
#define WEIGHT_QOFF 4
#endif
vec4 W_(unit_scales)(uint o, uint u) { return W_(unit_hdr)(o, u); }
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    uint h = u / 4, p = u / 2 % 2, i = u % 2;
#if defined(WEIGHT_Q2_K)
    uint v = W_(w)[(o + 16 + 32 * h + 16 * i) / 4 + q];
    return dot(hd.x * W_(bytes_f)(v >> (4 * p), 3u, 0.0) - hd.z, xa)
           + dot(hd.y * W_(bytes_f)(v >> (4 * p + 2), 3u, 0.0) - hd.w, xb);
#else
    uint v = W_(word_q)(o + 32 + 32 * h + 16 * i, q), hm = W_(word_q)(o + 16 * i, q);
    uint b = 4 * h + 2 * p;                          // hmask bits of the two runs: b, b + 1
    vec4 qa = W_(bytes_f)(((v >> (4 * p)) & 0x03030303u) | W_(bits_at)(hm, b, 2), 7u, 4.0);
    vec4 qb = W_(bytes_f)(((v >> (4 * p + 2)) & 0x03030303u) | W_(bits_at)(hm, b + 1, 2), 7u, 4.0);
    return hd.x * dot(qa, xa) + hd.y * dot(qb, xb);
#endif
}
#elif defined(WEIGHT_Q4_K) || defined(WEIGHT_Q5_K)
// Q4_K / Q5_K: 8 units; unit u = 2 c + i covers qs[32 c + 16 i .. + 16]: run x its low
// nibbles (sub-block 2 c, elements 64 c + 16 i + l), run y its high nibbles (sub-block
// 2 c + 1, + 32); Q5_K's fifth bits are bits 2 c and 2 c + 1 of qh[16 i + l].
const uint W_(UNITS) = 8;
uvec2 W_(unit_runs)(uint u) {
    uint a = 64 * (u / 2) + 16 * (u % 2);
    return uvec2(a, a + 32);
}
// Header: (d sc, d sc', dmin m, dmin m') of sub-blocks 2 c and 2 c + 1.
vec4 W_(unit_hdr)(uint o, uint u) {
    uint c = u / 2;
    uvec4 h = W_(w16)[o / 16];                      // (d, dmin) and the scale words
    vec2 dd = unpackHalf2x16(h.x);
    uvec2 s0 = W_(scale_min)(h.yzw, 2 * c), s1 = W_(scale_min)(h.yzw, 2 * c + 1);
    vec2 a = dd.x * vec2(s0.x, s1.x), m = dd.y * vec2(s0.y, s1.y);
    return vec4(a, m);
}
uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    uint c = u / 2, i = u % 2;
    uint v = W_(w16)[(o + W_(QS) + 32 * c + 16 * i) / 16][q];
    uvec2 n = uvec2(v, v >> 4) & 0x0F0F0F0Fu;
#if defined(WEIGHT_Q5_K)
    uint qh = W_(w16)[(o + 16 + 16 * i) / 16][q];
    n |= uvec2(W_(bits_at)(qh, 2 * c, 4), W_(bits_at)(qh, 2 * c + 1, 4));
#endif
    return n;
}
vec4 W_(unit_scales)(uint o, uint u) { return W_(unit_hdr)(o, u); }
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    uint c = u / 2, i = u % 2;
    uint v = W_(w16)[(o + W_(QS) + 32 * c + 16 * i) / 16][q];
    uint lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
#if defined(WEIGHT_Q5_K)
    uint qh = W_(w16)[(o + 16 + 16 * i) / 16][q];
    lo |= W_(bits_at)(qh, 2 * c, 4);
    hi |= W_(bits_at)(qh, 2 * c + 1, 4);
#endif
    return dot(hd.x * W_(bytes_f)(lo, 31u, 0.0) - hd.z, xa) + dot(hd.y * W_(bytes_f)(hi, 31u, 0.0) - hd.w, xb);
}
#elif defined(WEIGHT_Q6_K)
// Q6_K: 8 units; unit u = 4 h + 2 p + i covers ql[64 h + 32 p + 16 i .. + 16]: run x its
// low nibbles (j = p: elements 128 h + 32 p + 16 i + l), run y its high nibbles (j = p + 2:
// + 64); the 2 high bits at shift 2 j of qh[32 h + 16 i + l]; scales (int8) s = 8 h + 2 p
// + i and s + 4.
const uint W_(UNITS) = 8;
uvec2 W_(unit_runs)(uint u) {
    uint a = 128 * (u / 4) + 32 * (u / 2 % 2) + 16 * (u % 2);
    return uvec2(a, a + 64);
}
// Header: d times the runs' int8 scales.
vec4 W_(unit_hdr)(uint o, uint u) {
    uint s = 8 * (u / 4) + 2 * (u / 2 % 2) + u % 2;
    float sa = float(bitfieldExtract(int(W_(byte_at)(o + 192 + s)), 0, 8));
    float sb = float(bitfieldExtract(int(W_(byte_at)(o + 196 + s)), 0, 8));
    return vec4(W_(f16_at)(o + 208) * vec2(sa, sb), 0.0, 0.0);
}
#define WEIGHT_QOFF 32
uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    uint h = u / 4, p = u / 2 % 2, i = u % 2;
    uint v = W_(word_q)(o + 64 * h + 32 * p + 16 * i, q), qh = W_(word_q)(o + 128 + 32 * h + 16 * i, q);
    return uvec2((v & 0x0F0F0F0Fu) | ((qh >> (2 * p)) & 0x03030303u) << 4,
                 ((v >> 4) & 0x0F0F0F0Fu) | ((qh >> (2 * p + 4)) & 0x03030303u) << 4);
}
vec4 W_(unit_scales)(uint o, uint u) { return W_(unit_hdr)(o, u); }
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    uint h = u / 4, p = u / 2 % 2, i = u % 2;
    uint v = W_(word_q)(o + 64 * h + 32 * p + 16 * i, q), qh = W_(word_q)(o + 128 + 32 * h + 16 * i, q);
    vec4 qa = W_(bytes_f)((v & 0x0F0F0F0Fu) | ((qh >> (2 * p)) & 0x03030303u) << 4, 63u, 32.0);
    vec4 qb = W_(bytes_f)(((v >> 4) & 0x0F0F0F0Fu) | ((qh >> (2 * p + 4)) & 0x03030303u) << 4, 63u, 32.0);
    return hd.x * dot(qa, xa) + hd.y * dot(qb, xb);
}
#elif defined(WEIGHT_IQ4_XS)
// IQ4_XS: 8 units, the sub-blocks; unit b covers qs[16 b .. + 16]: run x its low nibbles
// (elements 32 b + l), run y its high nibbles (32 b + 16 + l); one scale.
const uint W_(UNITS) = 8;
uvec2 W_(unit_runs)(uint u) { return uvec2(32 * u, 32 * u + 16); }
// Header: d times the sub-block's scale.
vec4 W_(unit_hdr)(uint o, uint u) {
    uint w0 = W_(w)[o / 4], w1 = W_(w)[o / 4 + 1];   // d, scales_h; scales_l
    int sc = int((w1 >> (4 * u)) & 15u | ((w0 >> (16 + 2 * u)) & 3u) << 4) - 32;
    return vec4(unpackHalf2x16(w0).x * float(sc), 0.0, 0.0, 0.0);
}
uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    uint v = W_(w)[(o + 8 + 16 * u) / 4 + q];
    return uvec2(v & 0x0F0F0F0Fu, (v >> 4) & 0x0F0F0F0Fu);
}
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    uint v = W_(w)[(o + 8 + 16 * u) / 4 + q];
    return hd.x * (dot(W_(lut4)(v), xa) + dot(W_(lut4)(v >> 4), xb));
}
#endif
#ifdef XQ
// unit_dot_q(o, u): unit u's product with x^ (unit_xq.glsl, this invocation's quantized
// unit) for the types with an integer form (vkrt/weight_types.py `integer_x`): with
// unit_ints (word q's integers of run x and run y, as unit_part reads them), unit_scales
// ((s_x, s_y, mn_x, mn_y): a weight is s (q - QOFF) - mn) and QOFF (Q4_0 8, Q5_0 16, Q3_K 4,
// Q6_K 32, else 0; Q8_0's integers are signed), sum_run s (sum q_w q_x - QOFF sum q_x) -
// mn sum q_x, times dx: the integer sums are exact, the scales' products rounded once each.
// unit_ints repeats unit_part's field extraction on purpose: unit_part written over
// unit_ints compiled to a float path 8% slower at 7B on the H200 (bench/README.md,
// 2026-12-03), so unit_part keeps its measured text.
#include "unit_xq.glsl"
#if defined(WEIGHT_IQ4_NL) || defined(WEIGHT_IQ4_XS)
#error "XQ: the IQ4 levels are a table, not integers times a scale"
#endif
#ifndef WEIGHT_QOFF
#define WEIGHT_QOFF 0
#endif
#ifndef WEIGHT_SIGNED_INTS
#define WEIGHT_SIGNED_INTS 0
#endif
float W_(unit_dot_q)(uint o, uint u) {
    vec4 sm = W_(unit_scales)(o, u);
    int sa = 0, sb = 0;
    for (uint q = 0; q < 4; ++q) {
        uvec2 ab = W_(unit_ints)(o, u, q);
        if (WEIGHT_SIGNED_INTS != 0) {
            sa += xq_dot_s(ab.x, q);
            sb += xq_dot_s(ab.y, 4 + q);
        } else {
            sa += xq_dot_u(ab.x, q);
            sb += xq_dot_u(ab.y, 4 + q);
        }
    }
    sa -= WEIGHT_QOFF * xq_s[0];
    sb -= WEIGHT_QOFF * xq_s[1];
    return xq_dx * (sm.x * float(sa) + sm.y * float(sb) - sm.z * float(xq_s[0]) - sm.w * float(xq_s[1]));
}
#endif
// Parts q0, q0 + step, ... < 4 of unit u (step 1: the whole unit), its header decoded once.
float W_(unit_dot)(uint o, uint u, uint q0, uint step, vec4 xv[8]) {
#ifdef XQ
    if (xq_ok) return W_(unit_dot_q)(o, u);
#endif
    vec4 hd = W_(unit_hdr)(o, u);
    float s = 0.0;
    for (uint q = q0; q < 4; q += step) s += W_(unit_part)(o, u, q, hd, xv[q], xv[4 + q]);
    return s;
}
// A row holds n_cols / WEIGHT_BLOCK blocks back to back; rows follow each other.
vec4 W_(weight4)(uint row, uint q, uint n_cols) {
    uint k = 4 * q;
    return W_(block4)((row * (n_cols / WEIGHT_BLOCK) + k / WEIGHT_BLOCK) * WEIGHT_BLOCK_BYTES,
                      k % WEIGHT_BLOCK);
}
float W_(weight1)(uint row, uint k, uint n_cols) { return W_(weight4)(row, k / 4, n_cols)[k % 4]; }
#ifdef WEIGHT_RAW4
// weight4's words (decode4(raw4(row, q, n_cols), 4 * q % WEIGHT_BLOCK) is weight4).
WEIGHT_RAW_T W_(raw4)(uint row, uint q, uint n_cols) {
    uint k = 4 * q;
    return W_(raw_at)((row * (n_cols / WEIGHT_BLOCK) + k / WEIGHT_BLOCK) * WEIGHT_BLOCK_BYTES,
                      k % WEIGHT_BLOCK);
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
