#version 450
// Merge the per-split partial states of attention_split.comp into the attention output of
// one query token: with M = max_s m_s and c_s = exp(m_s - M) (weight(): 0 for an all -inf
// split, 1 for the split holding the maximum), out[h, d] = sum_s c_s acc_s[d] / sum_s c_s l_s,
// and zeros when every score was -inf (as attention.comp).
// part: [n_heads, n_splits, head_dim + 2] f32 (acc..., m, l); out: [n_heads, head_dim] f32.
// local_size_x must equal head_dim. Dispatch: (n_heads, 1, 1).
// Push constants: head_dim, n_splits (u32).
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Part { float part[]; };
layout(set = 0, binding = 1) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint head_dim; uint n_splits; } pc;

#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "inf.glsl"

float weight(float s, float mx) {
    if (mx == NEG_INF) return 0.0;
    return s == mx ? 1.0 : exp(s - mx);
}

// The loops take U splits at a time, their loads first, then the sums in split order (the
// same order as one split at a time, so the same bits): a load used by the next
// instruction would wait a memory latency per split.
const uint U = 4;

void main() {
    uint h = gl_WorkGroupID.x, d = gl_LocalInvocationID.x, stride = pc.head_dim + 2;
    uint base = h * pc.n_splits * stride, n = pc.n_splits, whole = n - n % U;
    float mx = NEG_INF;
    for (uint s = 0; s < whole; s += U) {
        float m[U];
        [[unroll]] for (uint j = 0; j < U; ++j) m[j] = part[base + (s + j) * stride + pc.head_dim];
        [[unroll]] for (uint j = 0; j < U; ++j) mx = max(mx, m[j]);
    }
    for (uint s = whole; s < n; ++s) mx = max(mx, part[base + s * stride + pc.head_dim]);
    float l = 0.0, acc = 0.0;
    for (uint s = 0; s < whole; s += U) {
        float m[U], ls[U], a[U];
        [[unroll]] for (uint j = 0; j < U; ++j) {
            uint o = base + (s + j) * stride;
            m[j] = part[o + pc.head_dim];
            ls[j] = part[o + pc.head_dim + 1];
            a[j] = part[o + d];
        }
        [[unroll]] for (uint j = 0; j < U; ++j) {
            float c = weight(m[j], mx);
            l += c * ls[j];
            acc += c * a[j];
        }
    }
    for (uint s = whole; s < n; ++s) {
        uint o = base + s * stride;
        float c = weight(part[o + pc.head_dim], mx);
        l += c * part[o + pc.head_dim + 1];
        acc += c * part[o + d];
    }
    dst[h * pc.head_dim + d] = l > 0.0 ? acc / l : 0.0;
}
