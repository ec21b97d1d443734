#version 450
// The attention block's input half for one decode token at position p, in one dispatch:
// RMSNorm of x (rms_in.glsl), the Q, K and V products (plus their biases when BIAS), RoPE
// on Q and K (adjacent pairs, or halves when NEOX, as rope.comp), Q into q_out and K, V into
// row p of the KV cache. It replaces rmsnorm, three products, three bias_add, two rope
// dispatches and copy_rows (three or four dependent stages).
// Specialization constants: 1 NEOX (0: pairs (2i, 2i+1) of a head, the `llama` files' order;
// 1: pairs (i, i + head_dim / 2), `qwen2`/`qwen3` files, rope.comp), 2 BIAS (1: add bq, bk, bv
// (bindings 10, 11, 12: [n_heads * head_dim], [n_kv_heads * head_dim] f32) to the products
// before RoPE, as qwen2's q/k/v_proj biases; 0: those bindings are not read), 3 QK_NORM
// (0: none; 1: Q and K are written before RoPE, biases added, for head_norm_rope.comp to
// RMS-norm each head and rotate it, as qwen3's and gemma3's q_norm, k_norm), 4 PAIRS (pairs of
// rows per workgroup, default 1; it divides head_dim / 2).
// Wq (binding 0): [n_heads * head_dim, n_cols], Wk (binding 3), Wv (binding 4):
// [n_kv_heads * head_dim, n_cols], as the GGUF stores them, one type for all three
// (weights.glsl), or in the mixed variants (qkv_rope_<type>_v_<type>: WEIGHT_V_<TYPE> and
// WEIGHT_V_BLOCK_BYTES defined, vkrt/weight_types.py MIXED_QKV) Wv of a K-quant of its own,
// as llama.cpp's Q4_K_M and Q5_K_M files store attn_v in Q6_K in some layers (its quantizer,
// src/llama-quant.cpp `use_more_bits`); x: [n_cols] f32; norm_w: [n_cols] f32; cos_sin:
// [positions, head_dim / 2] vec2 f32 (rope.comp); q_out: [n_heads * head_dim] f32; k_cache, v_cache: [rows,
// n_kv_heads * head_dim] f32; pos: [1] u32.
// p = pos0 + pos[0] when use_pos is 1 (a replayed step, which advances pos on the GPU), else
// pos0.
// Dispatch: spread((n_heads + 2 n_kv_heads) * head_dim / 2 / PAIRS) workgroups (grid.glsl),
// each owning PAIRS consecutive pairs of output rows of the stacked [Q; K; V] rows that RoPE
// rotates together ((2i, 2i + 1), or with NEOX (h D + j, h D + j + D / 2) for pair
// i = h D / 2 + j), so a workgroup owns whole rotations; V's pairs are adjacent rows. Which
// matrix a workgroup's pairs fall in is uniform per workgroup (PAIRS divides D / 2).
// Each row is summed over the workgroup (all 2 PAIRS rows together, reduce_rows.glsl; pair j
// finished by invocation j), every x load serving all of them; block types
// are walked a unit of 32 weights at a time (weights.glsl unit_dot, x through unit_x.glsl:
// STAGE_X, specialization constant 7), as matvec.comp.
// n_cols % 4 == 0 (% 32 for block types).
#extension GL_GOOGLE_include_directive : require
#ifdef XQ
#extension GL_EXT_spirv_intrinsics : require   // unit_xq.glsl
#endif
#include "grid.glsl"
#include "reduce.glsl"
#include "kv.glsl"
#include "weights.glsl"
#define WEIGHT_BINDING 3
#define W_(name) name##_k
#include "weights.glsl"
#undef WEIGHT_BINDING
#undef W_
#ifdef WEIGHT_BLOCK
const uint BLOCK_BYTES_QK = WEIGHT_BLOCK_BYTES;
#endif
#ifdef WEIGHT_V_BLOCK_BYTES
// V's type replaces Q's and K's for its include (blocks of 256: the same WEIGHT_BLOCK and
// UNITS, so a unit index means the same columns in all three).
#undef WEIGHT_Q2_K
#undef WEIGHT_Q3_K
#undef WEIGHT_Q4_K
#undef WEIGHT_Q5_K
#undef WEIGHT_Q6_K
#undef WEIGHT_RAW4
#undef WEIGHT_RAW_T
#undef WEIGHT_RAW_ZERO
#undef WEIGHT_QOFF
#undef WEIGHT_BLOCK_BYTES
#define WEIGHT_BLOCK_BYTES WEIGHT_V_BLOCK_BYTES
#if defined(WEIGHT_V_Q3_K)
#define WEIGHT_Q3_K 1
#elif defined(WEIGHT_V_Q4_K)
#define WEIGHT_Q4_K 1
#elif defined(WEIGHT_V_Q5_K)
#define WEIGHT_Q5_K 1
#elif defined(WEIGHT_V_Q6_K)
#define WEIGHT_Q6_K 1
#else
#error "WEIGHT_V_BLOCK_BYTES without a V type"
#endif
#define UNIT_X_V
#endif
#define WEIGHT_BINDING 4
#define W_(name) name##_v
#include "weights.glsl"
#undef WEIGHT_BINDING
#undef W_
#ifdef WEIGHT_BLOCK
const uint BLOCK_BYTES_V = WEIGHT_BLOCK_BYTES;
#endif
layout(set = 0, binding = 1) readonly buffer X { vec4 x[]; };
layout(set = 0, binding = 5) readonly buffer NormW { vec4 norm_w[]; };
layout(set = 0, binding = 6) readonly buffer CosSin { vec2 cos_sin[]; };
layout(set = 0, binding = 8) writeonly buffer VCache { KV_T2 v_cache[]; };
layout(set = 0, binding = 9) readonly buffer Pos { uint pos_buf[]; };
layout(set = 0, binding = 10) readonly buffer BiasQ { float bias_q[]; };
layout(set = 0, binding = 11) readonly buffer BiasK { float bias_k[]; };
layout(set = 0, binding = 12) readonly buffer BiasV { float bias_v[]; };
layout(set = 0, binding = 2) writeonly buffer QOut { float q_out_f[]; };
layout(set = 0, binding = 7) writeonly buffer KCache { KV_T k_cache_f[]; };
layout(constant_id = 1) const uint NEOX = 0;
layout(constant_id = 2) const uint BIAS = 0;
layout(constant_id = 3) const uint QK_NORM = 0;
layout(constant_id = 4) const uint PAIRS = 1;
const uint REDUCE_ROWS = 2 * PAIRS;
#include "reduce_rows.glsl"
layout(push_constant) uniform Push {
    uint n_cols; uint n_heads; uint n_kv_heads; uint head_dim; uint pos0; uint use_pos;
    float eps;
} pc;
#include "rms_in.glsl"

// PAIRS pairs of rows of one matrix (pairs i0 .. i0 + PAIRS - 1: rows first_row(i) and
// first_row(i) + d; V: rows 2i, 2i + 1) times n(x), this invocation's share of the columns,
// into pair_acc: every x load serves 2 PAIRS rows.
vec2 pair_acc[PAIRS];
#ifdef WEIGHT_BLOCK
vec4 x_at(uint i) { return x_weighted(i); }
#include "unit_x.glsl"
#define PAIRS_FN(NAME, DOT, W4, BYTES, V) \
void NAME(uint i0, uint d, bool adjacent) { \
    uint blocks = pc.n_cols / WEIGHT_BLOCK, units = row_units(pc.n_cols); \
    for (uint j = 0; j < PAIRS; ++j) pair_acc[j] = vec2(0.0); \
    for (uint k0 = 0; k0 < units; k0 += unit_chunk()) { \
        vec4 xv[8]; \
        load_unit_x_runs(k0, units, xv, V); \
        uint k = k0 + unit_lane(); \
        if (k >= units) continue; \
        uint b = k / UNITS, un = k % UNITS; \
        for (uint j = 0; j < PAIRS; ++j) { \
            uint r = adjacent ? 2 * (i0 + j) : first_row(i0 + j); \
            pair_acc[j] += vec2(DOT((r * blocks + b) * BYTES, un, unit_q0(), SPLIT, xv), \
                                DOT(((r + d) * blocks + b) * BYTES, un, unit_q0(), SPLIT, xv)); \
        } \
    } \
}
#else
#define PAIRS_FN(NAME, DOT, W4, BYTES, V) \
void NAME(uint i0, uint d, bool adjacent) { \
    for (uint j = 0; j < PAIRS; ++j) pair_acc[j] = vec2(0.0); \
    for (uint k = gl_LocalInvocationID.x; k < pc.n_cols / 4; k += gl_WorkGroupSize.x) { \
        vec4 xv = x_weighted(k); \
        for (uint j = 0; j < PAIRS; ++j) { \
            uint r = adjacent ? 2 * (i0 + j) : first_row(i0 + j); \
            pair_acc[j] += vec2(dot(W4(r, k, pc.n_cols), xv), dot(W4(r + d, k, pc.n_cols), xv)); \
        } \
    } \
}
#endif

// The first of the two rows pair i of a rotated matrix (Q or K) rotates; the second is
// first_row + pair_stride().
uint first_row(uint i) {
    uint half_dim = pc.head_dim / 2;
    return NEOX != 0 ? (i / half_dim) * pc.head_dim + i % half_dim : 2 * i;
}
uint pair_stride() { return NEOX != 0 ? pc.head_dim / 2 : 1; }

PAIRS_FN(pairs_q, unit_dot, weight4, BLOCK_BYTES_QK, false)
PAIRS_FN(pairs_k, unit_dot_k, weight4_k, BLOCK_BYTES_QK, false)
PAIRS_FN(pairs_v, unit_dot_v, weight4_v, BLOCK_BYTES_V, true)

vec2 rotate(vec2 v, uint p, uint pair) {
    vec2 r = cos_sin[p * (pc.head_dim / 2) + pair % (pc.head_dim / 2)];
    return vec2(v.x * r.x - v.y * r.y, v.x * r.y + v.y * r.x);
}

void main() {
    uint half_dim = pc.head_dim / 2, i0 = linear_workgroup() * PAIRS;
    uint q_pairs = pc.n_heads * half_dim, kv_pairs = pc.n_kv_heads * half_dim;
    if (i0 >= q_pairs + 2 * kv_pairs) return;    // uniform per workgroup
#ifdef WEIGHT_BLOCK
    weights_unit_init();
#endif
    float s = rms_scale(pc.n_cols, pc.eps);
    uint p = pc.pos0 + (pc.use_pos != 0 ? pos_buf[0] : 0);
    // Which matrix the pairs fall in is uniform per workgroup: PAIRS divides half_dim.
    uint m = i0 < q_pairs ? 0 : (i0 < q_pairs + kv_pairs ? 1 : 2);
    uint base = m == 0 ? 0 : (m == 1 ? q_pairs : q_pairs + kv_pairs);
    uint d = m == 2 ? 1 : pair_stride();
    if (m == 0) pairs_q(i0, d, false);
    else if (m == 1) pairs_k(i0 - base, d, false);
    else pairs_v(i0 - base, 1, true);
    uint kv_width = 2 * kv_pairs;
    for (uint j = 0; j < PAIRS; ++j) {           // uniform control flow
        reduce_rows_put(2 * j, pair_acc[j].x);
        reduce_rows_put(2 * j + 1, pair_acc[j].y);
    }
    barrier();
    for (uint j = gl_LocalInvocationID.x; j < PAIRS; j += gl_WorkGroupSize.x) {   // pair j by lane j
        vec2 acc = vec2(reduce_rows_get(2 * j), reduce_rows_get(2 * j + 1)) * s;
        uint i = i0 - base + j;                  // the pair within its matrix
        uint r = m == 2 ? 2 * i : first_row(i);
        if (BIAS != 0) {
            if (m == 0) acc += vec2(bias_q[r], bias_q[r + d]);
            else if (m == 1) acc += vec2(bias_k[r], bias_k[r + d]);
            else acc += vec2(bias_v[r], bias_v[r + 1]);
        }
        // With QK_NORM, Q and K are written as they are: head_norm_rope.comp norms and
        // rotates them.
        if (m != 2 && QK_NORM == 0) acc = rotate(acc, p, i);
        if (m == 0) {
            q_out_f[r] = acc.x;
            q_out_f[r + d] = acc.y;
        } else if (m == 1) {
            k_cache_f[p * kv_width + r] = KV_T(acc.x);
            k_cache_f[p * kv_width + r + d] = KV_T(acc.y);
        } else {
            v_cache[p * kv_pairs + i] = KV_T2(acc);
        }
    }
}
