#version 450
// RoPE of Q and K at each token's own position and the KV-cache write by slot mapping, in one
// dispatch (the batched runner, vkrt/models/batch.py: rope.comp's rope_positions twice and
// kv_write.comp, fused). For token t at position p = positions[t] and slot s = slots[t]:
//   q_out[t] = rope(q[t], p), k_cache[s] = rope(k[t], p), v_cache[s] = v[t],
// rope as rope.comp (the same pairs by NEOX, the same arithmetic from the host's cos_sin
// table). q, q_out: [n_tokens, n_heads * head_dim] f32; k, v: [n_tokens, n_kv_heads *
// head_dim] f32; cos_sin: [n_positions, head_dim / 2] vec2 f32; positions, slots: [n_tokens]
// u32; k_cache, v_cache: [n_slots, n_kv_heads * head_dim] f32 (f16 in the `_kvf16` variant:
// kv.glsl, K rotated in f32 and rounded to f16 as it is stored). The host checks every
// position against n_positions and every slot against n_slots before the step (a padded
// token writes the reserved scratch slot).
// Invocation (p, t): pair p of Q's row (p < n_heads * head_dim / 2) and, when p is inside
// K's row, pair p of K and the two V elements of that pair. Dispatch: (ceil(n_heads *
// head_dim / 2 / local_size_x), tokens spread over y and z (grid.glsl)). Push constants:
// n_heads, n_kv_heads, head_dim. Specialization constant 1: NEOX (rope.comp's).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "kv.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Q { vec2 q[]; };
layout(set = 0, binding = 1) readonly buffer K { vec2 k[]; };
layout(set = 0, binding = 2) readonly buffer V { vec2 v[]; };
layout(set = 0, binding = 3) readonly buffer CosSin { vec2 cos_sin[]; };
layout(set = 0, binding = 4) readonly buffer Positions { uint positions[]; };
layout(set = 0, binding = 5) readonly buffer Slots { uint slots[]; };
layout(set = 0, binding = 6) writeonly buffer QOut { vec2 q_out[]; };
layout(set = 0, binding = 7) writeonly buffer KCache { KV_T2 k_cache[]; };
layout(set = 0, binding = 8) writeonly buffer VCache { KV_T2 v_cache[]; };
// Scalar views for the halves (NEOX) layout.
layout(set = 0, binding = 0) readonly buffer QF { float q_f[]; };
layout(set = 0, binding = 1) readonly buffer KF { float k_f[]; };
layout(set = 0, binding = 6) writeonly buffer QOutF { float q_out_f[]; };
layout(set = 0, binding = 7) writeonly buffer KCacheF { KV_T k_cache_f[]; };
layout(constant_id = 1) const uint NEOX = 0;
layout(push_constant) uniform Push { uint n_heads; uint n_kv_heads; uint head_dim; } pc;

// Pair p of row SRC_ROW of SRC (rows of PAIRS pairs) rotated by r into row DST_ROW of DST,
// stored as T (one element) or T2 (a pair): rope.comp's two layouts and arithmetic.
#define ROTATE(SRC, SRC_F, DST, DST_F, T, T2, PAIRS, SRC_ROW, DST_ROW)                    \
    if (NEOX != 0) {                                                                       \
        uint e = (p / half_dim) * pc.head_dim + p % half_dim;                              \
        uint a = (SRC_ROW) * 2 * (PAIRS) + e, o = (DST_ROW) * 2 * (PAIRS) + e;             \
        float x0 = SRC_F[a], x1 = SRC_F[a + half_dim];                                     \
        DST_F[o] = T(x0 * r.x - x1 * r.y);                                                 \
        DST_F[o + half_dim] = T(x0 * r.y + x1 * r.x);                                      \
    } else {                                                                               \
        vec2 w = SRC[(SRC_ROW) * (PAIRS) + p];                                             \
        DST[(DST_ROW) * (PAIRS) + p] = T2(vec2(w.x * r.x - w.y * r.y,                      \
                                               w.x * r.y + w.y * r.x));                    \
    }

void main() {
    uint p = gl_GlobalInvocationID.x, t = token_index();
    uint half_dim = pc.head_dim / 2;
    uint q_pairs = pc.n_heads * half_dim, kv_pairs = pc.n_kv_heads * half_dim;
    if (p >= q_pairs) return;
    vec2 r = cos_sin[positions[t] * half_dim + p % half_dim];
    ROTATE(q, q_f, q_out, q_out_f, float, vec2, q_pairs, t, t)
    if (p < kv_pairs) {
        uint slot = slots[t];
        ROTATE(k, k_f, k_cache, k_cache_f, KV_T, KV_T2, kv_pairs, t, slot)
        v_cache[slot * kv_pairs + p] = KV_T2(v[t * kv_pairs + p]);
    }
}
