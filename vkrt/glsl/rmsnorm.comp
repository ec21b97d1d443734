#version 450
// RMSNorm (Zhang & Sennrich 2019; llama.cpp ggml_rms_norm then multiply by weight):
// out[t, i] = x[t, i] / sqrt(mean_i(x[t, :]^2) + eps) * w[i].
// x, out: [n_rows, n] f32; w: [n] f32. Dispatch: spread(n_rows) workgroups (grid.glsl), one
// per row.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer W { float w[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n; float eps; uint n_rows; } pc;

void main() {
    if (linear_workgroup() >= pc.n_rows) return;  // uniform per workgroup
    uint row = linear_workgroup() * pc.n, lid = gl_LocalInvocationID.x;
    float ss = 0.0;
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) ss += x[row + i] * x[row + i];
    float scale = 1.0 / sqrt(workgroup_sum(ss) / float(pc.n) + pc.eps);
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) dst[row + i] = x[row + i] * scale * w[i];
}
