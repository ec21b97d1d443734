#version 450
// LayerNorm (Ba et al. 2016; torch.nn.LayerNorm with elementwise affine, as OPT uses it):
// out[t, i] = (x[t, i] - mean) / sqrt(var + eps) * w[i] + b[i], mean and var (biased, over n)
// of row t. Two passes over the row: the mean, then the mean of squared deviations.
// x, out: [n_rows, n] f32; w, b: [n] f32. Push constants: n, eps (f32), n_rows.
// Dispatch: spread(n_rows) workgroups (grid.glsl), one per row; workgroups past n_rows return.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer W { float w[]; };
layout(set = 0, binding = 2) readonly buffer B { float b[]; };
layout(set = 0, binding = 3) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n; float eps; uint n_rows; } pc;

void main() {
    if (linear_workgroup() >= pc.n_rows) return;  // uniform per workgroup
    uint row = linear_workgroup() * pc.n, lid = gl_LocalInvocationID.x;
    float s = 0.0;
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) s += x[row + i];
    float mean = workgroup_sum(s) / float(pc.n);
    float ss = 0.0;
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) {
        float d = x[row + i] - mean;
        ss += d * d;
    }
    float inv = 1.0 / sqrt(workgroup_sum(ss) / float(pc.n) + pc.eps);
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x)
        dst[row + i] = (x[row + i] - mean) * inv * w[i] + b[i];
}
