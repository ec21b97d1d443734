#version 450
// A norm after a block, then the residual add (Gemma 2/3's post-attention and post-MLP
// norms: modeling_gemma3.py, llama.cpp src/models/gemma3.cpp): y[t, i] += x[t, i] /
// sqrt(mean_i(x[t, :]^2) + eps) * w[i], the arithmetic of rmsnorm.comp (its power-of-two
// scaling of rows whose squares overflow f32 included) then add.comp, in one dispatch.
// x: [n_rows, n] f32 (the block's output); w: [n] f32; y: [n_rows, n] f32 (the residual
// stream). Dispatch: spread(n_rows) workgroups (grid.glsl), one per row.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
#include "inf.glsl"
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer W { float w[]; };
layout(set = 0, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n; float eps; uint n_rows; } pc;

void main() {
    if (linear_workgroup() >= pc.n_rows) return;  // uniform per workgroup
    uint row = linear_workgroup() * pc.n, lid = gl_LocalInvocationID.x;
    float ss = 0.0;
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) ss += x[row + i] * x[row + i];
    float total = workgroup_sum(ss);
    float pre = 1.0;   // x is normed as x * pre: 1 unless the sum of squares overflows
    float scale;
    if (!isinf(total)) {   // uniform: every invocation has the same sum
        scale = 1.0 / sqrt(total / float(pc.n) + pc.eps);
    } else {   // as rmsnorm.comp
        float amax = 0.0;
        for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) amax = max(amax, abs(x[row + i]));
        int e;
        frexp(workgroup_max(amax), e);
        pre = ldexp(1.0, 2 - e);   // max|x| * pre in [2, 4), a normal power of two
        ss = 0.0;
        for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) {
            float v = x[row + i] * pre;
            ss += v * v;
        }
        scale = 1.0 / sqrt(workgroup_sum(ss) / float(pc.n) + pc.eps * pre * pre);
    }
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x)
        y[row + i] += x[row + i] * pre * scale * w[i];
}
