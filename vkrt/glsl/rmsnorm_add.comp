#version 450
// A norm after a block, then the residual add (Gemma 2/3's post-attention and post-MLP
// norms: modeling_gemma3.py, llama.cpp src/models/gemma3.cpp): y[t, i] += x[t, i] /
// sqrt(mean_i(x[t, :]^2) + eps) * w[i], the arithmetic of rmsnorm.comp then add.comp in
// one dispatch. x: [n_rows, n] f32 (the block's output); w: [n] f32; y: [n_rows, n] f32 (the
// residual stream). Dispatch: spread(n_rows) workgroups (grid.glsl), one per row.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer W { float w[]; };
layout(set = 0, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n; float eps; uint n_rows; } pc;

void main() {
    if (linear_workgroup() >= pc.n_rows) return;  // uniform per workgroup
    uint row = linear_workgroup() * pc.n, lid = gl_LocalInvocationID.x;
    float ss = 0.0;
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) ss += x[row + i] * x[row + i];
    float scale = 1.0 / sqrt(workgroup_sum(ss) / float(pc.n) + pc.eps);
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) y[row + i] += x[row + i] * scale * w[i];
}
