#version 450
// The attention's output projection for one decode token, merging the split partials of
// attention_split.comp as it reads them and adding into the residual stream:
//   y[n] += sum_c W[n, c] * attn[c],  attn[h * head_dim + d] = merge_h(d),
// merge_h(d) = sum_s c_s acc_s[d] / sum_s c_s l_s with M = max_s m_s, c_s = weight(m_s, M)
// (0 for an all -inf split, 1 for the split holding the maximum), and 0 when every score was
// -inf: attention_combine.comp's formula, in its order over s, so the merged values are its
// own. It replaces attention_combine, matvec and add (three dependent dispatches, two
// stages); every workgroup merges the columns it reads (the partials are small and stay in
// the cache), trading that repeated arithmetic for a stage.
// W: [n_rows, n_heads * head_dim] as the GGUF stores it (weights.glsl); part: [n_heads,
// n_splits, head_dim + 2] f32 (acc..., m, l); y: [n_rows] f32. head_dim % 4 == 0.
// Dispatch: spread(n_rows) workgroups (grid.glsl), one per output row.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
#include "weights.glsl"
layout(set = 0, binding = 1) readonly buffer Part { float part[]; };
layout(set = 0, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n_cols; uint n_rows; uint head_dim; uint n_splits; } pc;

const float NEG_INF = -1.0 / 0.0;

float weight(float s, float mx) {
    if (mx == NEG_INF) return 0.0;
    return s == mx ? 1.0 : exp(s - mx);
}

// Elements 4k .. 4k + 3 of the merged attention output (one head: head_dim % 4 == 0). The
// loops over splits go UNROLL at a time (a constant inner loop the compiler unrolls: those
// loads are in flight together), in order over s.
const uint UNROLL = 4;

vec4 merged(uint k) {
    uint stride = pc.head_dim + 2, h = 4 * k / pc.head_dim, d = 4 * k % pc.head_dim;
    uint base = h * pc.n_splits * stride;
    float mx = NEG_INF;
    for (uint s0 = 0; s0 < pc.n_splits; s0 += UNROLL)
        for (uint s = s0; s < s0 + UNROLL; ++s)
            if (s < pc.n_splits) mx = max(mx, part[base + s * stride + pc.head_dim]);
    float l = 0.0;
    vec4 acc = vec4(0.0);
    for (uint s0 = 0; s0 < pc.n_splits; s0 += UNROLL) {
        for (uint s = s0; s < s0 + UNROLL; ++s) {
            if (s < pc.n_splits) {
                uint o = base + s * stride;
                float c = weight(part[o + pc.head_dim], mx);
                l += c * part[o + pc.head_dim + 1];
                acc += c * vec4(part[o + d], part[o + d + 1], part[o + d + 2], part[o + d + 3]);
            }
        }
    }
    return l > 0.0 ? acc / l : vec4(0.0);
}

void main() {
    uint n = linear_workgroup();
    if (n >= pc.n_rows) return;  // uniform per workgroup
    float acc = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < pc.n_cols / 4; k += gl_WorkGroupSize.x)
        acc += dot(weight4(n, k, pc.n_cols), merged(k));
    acc = workgroup_sum(acc);
    if (gl_LocalInvocationID.x == 0) y[n] += acc;
}
