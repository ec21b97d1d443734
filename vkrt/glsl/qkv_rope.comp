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
// (0: none; head_dim: RMSNorm each head of Q and K before RoPE with weights qn, kn (bindings
// 13, 14: [head_dim] f32) and the push constant eps, as qwen3's and gemma3's q_norm, k_norm;
// then a workgroup owns a whole Q or K head, see below).
// Wq (binding 0): [n_heads * head_dim, n_cols], Wk (binding 3), Wv (binding 4):
// [n_kv_heads * head_dim, n_cols], as the GGUF stores them, one type for all three
// (weights.glsl); x: [n_cols] f32; norm_w: [n_cols] f32; cos_sin: [positions, head_dim / 2]
// vec2 f32 (rope.comp); q_out: [n_heads * head_dim] f32; k_cache, v_cache: [rows,
// n_kv_heads * head_dim] f32; pos: [1] u32.
// p = pos0 + pos[0] when use_pos is 1 (a replayed step, which advances pos on the GPU), else
// pos0.
// Dispatch: spread((n_heads + 2 n_kv_heads) * head_dim / 2) workgroups (grid.glsl), one per
// pair of output rows of the stacked [Q; K; V] rows that RoPE rotates together ((2i, 2i + 1),
// or with NEOX (h D + j, h D + j + D / 2) for pair i = h D / 2 + j), so a workgroup owns
// whole rotations. Which matrix a pair falls in is uniform per workgroup. With QK_NORM:
// n_heads + n_kv_heads + n_kv_heads * head_dim / 2 workgroups, one per Q head, one per K
// head (it computes the head's pairs one after another, each row summed over the
// workgroup, so every invocation holds every value and the head's sum of squares; the
// first invocation then norms, rotates and writes them), one per pair of V rows.
// Each pair of rows is summed over the workgroup, every x load serving both rows; block types
// are walked a unit of 32 weights at a time (weights.glsl unit_dot, x through unit_x.glsl:
// STAGE_X, specialization constant 7), as matvec.comp.
// n_cols % 4 == 0 (% 32 for block types).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
#include "weights.glsl"
#define WEIGHT_BINDING 3
#define W_(name) name##_k
#include "weights.glsl"
#undef WEIGHT_BINDING
#undef W_
#define WEIGHT_BINDING 4
#define W_(name) name##_v
#include "weights.glsl"
#undef WEIGHT_BINDING
#undef W_
layout(set = 0, binding = 1) readonly buffer X { vec4 x[]; };
layout(set = 0, binding = 2) writeonly buffer QOut { vec2 q_out[]; };
layout(set = 0, binding = 5) readonly buffer NormW { vec4 norm_w[]; };
layout(set = 0, binding = 6) readonly buffer CosSin { vec2 cos_sin[]; };
layout(set = 0, binding = 7) writeonly buffer KCache { vec2 k_cache[]; };
layout(set = 0, binding = 8) writeonly buffer VCache { vec2 v_cache[]; };
layout(set = 0, binding = 9) readonly buffer Pos { uint pos_buf[]; };
layout(set = 0, binding = 10) readonly buffer BiasQ { float bias_q[]; };
layout(set = 0, binding = 11) readonly buffer BiasK { float bias_k[]; };
layout(set = 0, binding = 12) readonly buffer BiasV { float bias_v[]; };
// Scalar views of q_out and k_cache for the halves (NEOX) layout.
layout(set = 0, binding = 2) writeonly buffer QOutF { float q_out_f[]; };
layout(set = 0, binding = 7) writeonly buffer KCacheF { float k_cache_f[]; };
layout(constant_id = 1) const uint NEOX = 0;
layout(constant_id = 2) const uint BIAS = 0;
layout(constant_id = 3) const uint QK_NORM = 0;
layout(set = 0, binding = 13) readonly buffer QNorm { float q_norm_w[]; };
layout(set = 0, binding = 14) readonly buffer KNorm { float k_norm_w[]; };
shared vec2 head_s[QK_NORM / 2 + 1];   // a Q or K head's pairs before the norm (QK_NORM)
layout(push_constant) uniform Push {
    uint n_cols; uint n_heads; uint n_kv_heads; uint head_dim; uint pos0; uint use_pos;
    float eps;
} pc;
#include "rms_in.glsl"

// Rows r and r + d of one matrix (its unit_dot / weight4) times n(x), this invocation's
// share of the columns.
#ifdef WEIGHT_BLOCK
vec4 x_at(uint i) { return x_weighted(i); }
#include "unit_x.glsl"
#define PAIR_FN(NAME, DOT, W4) \
vec2 NAME(uint r, uint d) { \
    uint blocks = pc.n_cols / WEIGHT_BLOCK, units = row_units(pc.n_cols); \
    vec2 acc = vec2(0.0); \
    for (uint k0 = 0; k0 < units; k0 += unit_chunk()) { \
        vec4 xv[8]; \
        load_unit_x(k0, units, xv); \
        uint k = k0 + unit_lane(); \
        if (k >= units) continue; \
        uint b = k / UNITS, un = k % UNITS; \
        acc += vec2(DOT((r * blocks + b) * WEIGHT_BLOCK_BYTES, un, unit_q0(), SPLIT, xv), \
                    DOT(((r + d) * blocks + b) * WEIGHT_BLOCK_BYTES, un, unit_q0(), SPLIT, xv)); \
    } \
    return acc; \
}
#else
#define PAIR_FN(NAME, DOT, W4) \
vec2 NAME(uint r, uint d) { \
    vec2 acc = vec2(0.0); \
    for (uint k = gl_LocalInvocationID.x; k < pc.n_cols / 4; k += gl_WorkGroupSize.x) { \
        vec4 xv = x_weighted(k); \
        acc += vec2(dot(W4(r, k, pc.n_cols), xv), dot(W4(r + d, k, pc.n_cols), xv)); \
    } \
    return acc; \
}
#endif
PAIR_FN(pair_q, unit_dot, weight4)
PAIR_FN(pair_k, unit_dot_k, weight4_k)
PAIR_FN(pair_v, unit_dot_v, weight4_v)

// The first of the two rows pair i of a rotated matrix (Q or K) rotates; the second is
// first_row + pair_stride().
uint first_row(uint i) {
    uint half_dim = pc.head_dim / 2;
    return NEOX != 0 ? (i / half_dim) * pc.head_dim + i % half_dim : 2 * i;
}
uint pair_stride() { return NEOX != 0 ? pc.head_dim / 2 : 1; }

vec2 rotate(vec2 v, uint p, uint pair) {
    vec2 r = cos_sin[p * (pc.head_dim / 2) + pair % (pc.head_dim / 2)];
    return vec2(v.x * r.x - v.y * r.y, v.x * r.y + v.y * r.x);
}

// Q head h (is_q) or K head h for one token at position p with QK_NORM: its pairs
// (first_row(j) - h D, + pair_stride()) j < D / 2 over the workgroup, plus biases, then
// RMSNorm over the head (scale from the sum of squares every invocation has), the norm
// weights, RoPE, and the writes (invocation 0).
void normed_head(bool is_q, uint h, float s, uint p) {
    uint half_dim = pc.head_dim / 2, d = pair_stride();
    float ss = 0.0;
    for (uint j = 0; j < half_dim; ++j) {
        uint r = h * pc.head_dim + first_row(j);  // first_row(j) < head_dim for j < D / 2
        vec2 acc = is_q ? pair_q(r, d) : pair_k(r, d);
        acc = vec2(workgroup_sum(acc.x), workgroup_sum(acc.y)) * s;
        if (BIAS != 0) acc += is_q ? vec2(bias_q[r], bias_q[r + d]) : vec2(bias_k[r], bias_k[r + d]);
        ss += dot(acc, acc);
        if (gl_LocalInvocationID.x == 0) head_s[j] = acc;  // read back by this invocation only
    }
    if (gl_LocalInvocationID.x != 0) return;
    float scale = 1.0 / sqrt(ss / float(pc.head_dim) + pc.eps);
    uint kv_width = pc.n_kv_heads * pc.head_dim;
    for (uint j = 0; j < half_dim; ++j) {
        uint e = first_row(j), r = h * pc.head_dim + e;
        vec2 w = is_q ? vec2(q_norm_w[e], q_norm_w[e + d]) : vec2(k_norm_w[e], k_norm_w[e + d]);
        vec2 o = rotate(head_s[j] * scale * w, p, j);
        if (is_q) {
            q_out_f[r] = o.x;
            q_out_f[r + d] = o.y;
        } else {
            k_cache_f[p * kv_width + r] = o.x;
            k_cache_f[p * kv_width + r + d] = o.y;
        }
    }
}

void main() {
    uint i = linear_workgroup(), half_dim = pc.head_dim / 2;
    uint q_pairs = pc.n_heads * half_dim, kv_pairs = pc.n_kv_heads * half_dim;
    uint heads = pc.n_heads + pc.n_kv_heads;
    // uniform per workgroup
    if (i >= (QK_NORM != 0 ? heads + kv_pairs : q_pairs + 2 * kv_pairs)) return;
#ifdef WEIGHT_BLOCK
    weights_unit_init();
#endif
    float s = rms_scale(pc.n_cols, pc.eps);
    uint p = pc.pos0 + (pc.use_pos != 0 ? pos_buf[0] : 0);
    if (QK_NORM != 0) {
        if (i < heads) {
            normed_head(i < pc.n_heads, i < pc.n_heads ? i : i - pc.n_heads, s, p);
            return;
        }
        uint r = 2 * (i - heads);
        vec2 acc = pair_v(r, 1);
        acc = vec2(workgroup_sum(acc.x), workgroup_sum(acc.y)) * s;
        if (gl_LocalInvocationID.x != 0) return;
        if (BIAS != 0) acc += vec2(bias_v[r], bias_v[r + 1]);
        v_cache[p * kv_pairs + i - heads] = acc;
        return;
    }
    vec2 acc = vec2(0.0);
    uint r, d = pair_stride();  // rows r and r + d of Q, K (or V, adjacent: d = 1)
    if (i < q_pairs) {
        r = first_row(i);
        acc = pair_q(r, d);
    } else if (i < q_pairs + kv_pairs) {
        r = first_row(i - q_pairs);
        acc = pair_k(r, d);
    } else {
        r = 2 * (i - q_pairs - kv_pairs);
        d = 1;
        acc = pair_v(r, 1);
    }
    acc = vec2(workgroup_sum(acc.x), workgroup_sum(acc.y)) * s;
    if (gl_LocalInvocationID.x != 0) return;
    if (BIAS != 0) {
        if (i < q_pairs) acc += vec2(bias_q[r], bias_q[r + d]);
        else if (i < q_pairs + kv_pairs) acc += vec2(bias_k[r], bias_k[r + d]);
        else acc += vec2(bias_v[r], bias_v[r + 1]);
    }
    if (i < q_pairs) {
        if (NEOX != 0) {
            vec2 o = rotate(acc, p, i);
            q_out_f[r] = o.x;
            q_out_f[r + d] = o.y;
        } else {
            q_out[i] = rotate(acc, p, i);
        }
    } else if (i < q_pairs + kv_pairs) {
        uint j = i - q_pairs;
        if (NEOX != 0) {
            vec2 o = rotate(acc, p, j);
            k_cache_f[p * 2 * kv_pairs + r] = o.x;
            k_cache_f[p * 2 * kv_pairs + r + d] = o.y;
        } else {
            k_cache[p * kv_pairs + j] = rotate(acc, p, j);
        }
    } else {
        v_cache[p * kv_pairs + i - q_pairs - kv_pairs] = acc;
    }
}
