#version 450
// RMSNorm (Zhang & Sennrich 2019; llama.cpp ggml_rms_norm then multiply by weight):
// out[t, i] = x[t, i] / sqrt(mean_i(x[t, :]^2) + eps) * w[i].
// x, out: [n_rows, n] f32; w: [n] f32. Dispatch: spread(n_rows) workgroups (grid.glsl), one
// per row. Rows whose squares overflow f32 (|x| beyond ~1.8e19) are normed after an exact
// power-of-two scaling (below), so any finite row gives a finite result.
// Variant `add_rmsnorm` (RESIDUAL): the residual add before the norm, in the same dispatch:
// x[t, i] += r[t, i] (written back: x is the residual stream), then out = the norm of the
// sum, bit for bit add.comp then rmsnorm.comp (each invocation reads back only the elements
// it wrote). r: [n_rows, n] f32 at binding 3.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
#include "inf.glsl"
#ifdef RESIDUAL
layout(set = 0, binding = 0) buffer X { float x[]; };
layout(set = 0, binding = 3) readonly buffer R { float r[]; };
#else
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
#endif
layout(set = 0, binding = 1) readonly buffer W { float w[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n; float eps; uint n_rows; } pc;

void main() {
    if (linear_workgroup() >= pc.n_rows) return;  // uniform per workgroup
    uint row = linear_workgroup() * pc.n, lid = gl_LocalInvocationID.x;
    float ss = 0.0;
#ifdef RESIDUAL
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) {
        float v = x[row + i] + r[row + i];
        x[row + i] = v;
        ss += v * v;
    }
#else
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) ss += x[row + i] * x[row + i];
#endif
    float total = workgroup_sum(ss);
    float pre = 1.0;   // x is normed as x * pre: 1 unless the sum of squares overflows
    float scale;
    if (!isinf(total)) {   // uniform: every invocation has the same sum
        scale = 1.0 / sqrt(total / float(pc.n) + pc.eps);
    } else {
        // |x| past the f32 range of squares: the norm of x * pre, pre = 2^(2 - e) with e
        // the exponent of max|x| (exact, a normal float), eps * pre^2 (as rms_in.glsl).
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
        dst[row + i] = x[row + i] * pre * scale * w[i];
}
