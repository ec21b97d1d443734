#version 450
// The attention block's input half for one decode token at position p, in one dispatch:
// RMSNorm of x (rms_in.glsl), the Q, K and V products, RoPE on Q and K (adjacent pairs, as
// rope.comp), Q into q_out and K, V into row p of the KV cache. It replaces rmsnorm, three
// products, two rope dispatches and copy_rows (three dependent stages).
// Wq (binding 0): [n_heads * head_dim, n_cols], Wk (binding 3), Wv (binding 4):
// [n_kv_heads * head_dim, n_cols], as the GGUF stores them, one type for all three
// (weights.glsl); x: [n_cols] f32; norm_w: [n_cols] f32; cos_sin: [positions, head_dim / 2]
// vec2 f32 (rope.comp); q_out: [n_heads * head_dim] f32; k_cache, v_cache: [rows,
// n_kv_heads * head_dim] f32; pos: [1] u32.
// p = pos0 + pos[0] when use_pos is 1 (a replayed step, which advances pos on the GPU), else
// pos0.
// Dispatch: spread((n_heads + 2 n_kv_heads) * head_dim / 2) workgroups (grid.glsl), one per
// pair of output rows (2i, 2i + 1) of the stacked [Q; K; V] rows: RoPE rotates exactly such a
// pair, so a workgroup owns whole rotations. Which matrix a pair falls in is uniform per
// workgroup. n_cols % 4 == 0 (% 32 for block types).
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
layout(push_constant) uniform Push {
    uint n_cols; uint n_heads; uint n_kv_heads; uint head_dim; uint pos0; uint use_pos;
    float eps;
} pc;
#include "rms_in.glsl"

vec2 rotate(vec2 v, uint p, uint pair) {
    vec2 r = cos_sin[p * (pc.head_dim / 2) + pair % (pc.head_dim / 2)];
    return vec2(v.x * r.x - v.y * r.y, v.x * r.y + v.y * r.x);
}

void main() {
    uint i = linear_workgroup(), half_dim = pc.head_dim / 2, cols4 = pc.n_cols / 4;
    uint q_pairs = pc.n_heads * half_dim, kv_pairs = pc.n_kv_heads * half_dim;
    if (i >= q_pairs + 2 * kv_pairs) return;  // uniform per workgroup
    float s = rms_scale(pc.n_cols, pc.eps);
    uint p = pc.pos0 + (pc.use_pos != 0 ? pos_buf[0] : 0);
    vec2 acc = vec2(0.0);
    if (i < q_pairs) {
        for (uint k = gl_LocalInvocationID.x; k < cols4; k += gl_WorkGroupSize.x) {
            vec4 xv = x_weighted(k);
            acc += vec2(dot(weight4(2 * i, k, pc.n_cols), xv),
                        dot(weight4(2 * i + 1, k, pc.n_cols), xv));
        }
    } else if (i < q_pairs + kv_pairs) {
        uint r = 2 * (i - q_pairs);
        for (uint k = gl_LocalInvocationID.x; k < cols4; k += gl_WorkGroupSize.x) {
            vec4 xv = x_weighted(k);
            acc += vec2(dot(weight4_k(r, k, pc.n_cols), xv), dot(weight4_k(r + 1, k, pc.n_cols), xv));
        }
    } else {
        uint r = 2 * (i - q_pairs - kv_pairs);
        for (uint k = gl_LocalInvocationID.x; k < cols4; k += gl_WorkGroupSize.x) {
            vec4 xv = x_weighted(k);
            acc += vec2(dot(weight4_v(r, k, pc.n_cols), xv), dot(weight4_v(r + 1, k, pc.n_cols), xv));
        }
    }
    acc = vec2(workgroup_sum(acc.x), workgroup_sum(acc.y)) * s;
    if (gl_LocalInvocationID.x != 0) return;
    if (i < q_pairs) {
        q_out[i] = rotate(acc, p, i);
    } else if (i < q_pairs + kv_pairs) {
        uint j = i - q_pairs;
        k_cache[p * kv_pairs + j] = rotate(acc, p, j);
    } else {
        v_cache[p * kv_pairs + i - q_pairs - kv_pairs] = acc;
    }
}
