#version 450
// Per-head RMSNorm of Q and K, then RoPE, for one decode token at position p, in place: the
// second half of a fused decode step's attention input for the families with Q/K norms
// (qwen3, gemma3: modeling_qwen3.py Qwen3Attention q_norm / k_norm over head_dim, before
// apply_rotary_pos_emb), after qkv_rope.comp (QK_NORM) wrote Q and K unnormed and unrotated.
// Head h of Q (h < n_heads) or of K (row p of the cache, head h - n_heads):
//   y_e = x_e / sqrt(mean_e(x_e^2) + eps) * w_e  (w: q_norm or k_norm, [head_dim] f32),
//   then pair j rotated by cos_sin[p, j] (rope.comp: pairs (2j, 2j + 1), or (j, j + D / 2)
//   when NEOX, specialization constant 1).
// q: [n_heads * head_dim] f32; k_cache: [rows, n_kv_heads * head_dim] f32; cos_sin:
// [positions, head_dim / 2] vec2 f32; pos: [1] u32; p = pos0 + pos[0] when use_pos is 1
// (a replayed step), else pos0.
// Dispatch: n_heads + n_kv_heads workgroups (grid.glsl), one per head; invocation lid owns
// pairs lid, lid + local_size_x, ... of its head: it reads them twice (the sum of squares,
// then the norm) and only it writes them, so the update in place needs no barrier.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
layout(set = 0, binding = 0) buffer Q { float q[]; };
layout(set = 0, binding = 1) buffer KCache { float k_cache[]; };
layout(set = 0, binding = 2) readonly buffer QNorm { float q_norm_w[]; };
layout(set = 0, binding = 3) readonly buffer KNorm { float k_norm_w[]; };
layout(set = 0, binding = 4) readonly buffer CosSin { vec2 cos_sin[]; };
layout(set = 0, binding = 5) readonly buffer Pos { uint pos_buf[]; };
layout(constant_id = 1) const uint NEOX = 0;
layout(push_constant) uniform Push {
    uint n_heads; uint n_kv_heads; uint head_dim; uint pos0; uint use_pos; float eps;
} pc;

// Element e of the head's pair j, and its partner e + pair_stride().
uint first_row(uint j) { return NEOX != 0 ? j : 2 * j; }
uint pair_stride() { return NEOX != 0 ? pc.head_dim / 2 : 1; }

vec2 load_pair(bool is_q, uint o, uint e, uint d) {
    return is_q ? vec2(q[o + e], q[o + e + d]) : vec2(k_cache[o + e], k_cache[o + e + d]);
}

void main() {
    uint h = linear_workgroup();
    if (h >= pc.n_heads + pc.n_kv_heads) return;   // uniform per workgroup
    uint half_dim = pc.head_dim / 2, d = pair_stride(), lid = gl_LocalInvocationID.x;
    uint p = pc.pos0 + (pc.use_pos != 0 ? pos_buf[0] : 0);
    bool is_q = h < pc.n_heads;
    uint o = is_q ? h * pc.head_dim
                  : p * pc.n_kv_heads * pc.head_dim + (h - pc.n_heads) * pc.head_dim;
    float ss = 0.0;
    for (uint j = lid; j < half_dim; j += gl_WorkGroupSize.x) {
        vec2 v = load_pair(is_q, o, first_row(j), d);
        ss += dot(v, v);
    }
    float scale = 1.0 / sqrt(workgroup_sum(ss) / float(pc.head_dim) + pc.eps);
    for (uint j = lid; j < half_dim; j += gl_WorkGroupSize.x) {
        uint e = first_row(j);
        vec2 w = is_q ? vec2(q_norm_w[e], q_norm_w[e + d]) : vec2(k_norm_w[e], k_norm_w[e + d]);
        vec2 v = load_pair(is_q, o, e, d) * scale * w;
        vec2 r = cos_sin[p * half_dim + j];
        vec2 y = vec2(v.x * r.x - v.y * r.y, v.x * r.y + v.y * r.x);
        if (is_q) {
            q[o + e] = y.x;
            q[o + e + d] = y.y;
        } else {
            k_cache[o + e] = y.x;
            k_cache[o + e + d] = y.y;
        }
    }
}
