// RMSNorm folded into the input of a product (Zhang & Sennrich 2019, as rmsnorm.comp):
// with n(x) = x * s * norm_w, s = 1 / sqrt(mean(x^2) + eps), a row of W times n(x) is
// s * sum_k W[k] * (x[k] * norm_w[k]); every workgroup computes s itself (the row is small
// next to the matrix), so the norm needs no dispatch and no barrier of its own.
// The includer declares `x` (vec4[], the input row from element 0) and `norm_w` (vec4[]), and
// includes reduce.glsl first; every invocation must call rms_scale (uniform control flow).
// Past the f32 range: when the sum of squares overflows (|x| beyond ~1.8e19, or many large
// elements), x is scaled by 2^-e, e the exponent of max|x| (frexp: the largest element lands
// in [0.5, 1)), exactly and without subnormals (ldexp), and n(x) is computed from that:
// the norm is invariant to the scale but for eps, which becomes eps * 2^-2e. isinf needs
// the infinities kept (inf.glsl). Every invocation sees the same sum, so the branch is uniform.
#include "inf.glsl"
int rms_shift = 0;   // e above, or 0: x_weighted scales by 2^-rms_shift
float rms_scale(uint n_cols, float eps) {
    float ss = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < n_cols / 4; k += gl_WorkGroupSize.x)
        ss += dot(x[k], x[k]);
    float total = workgroup_sum(ss);
    if (!isinf(total)) return 1.0 / sqrt(total / float(n_cols) + eps);
    float amax = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < n_cols / 4; k += gl_WorkGroupSize.x) {
        vec4 a = abs(x[k]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    frexp(workgroup_max(amax), rms_shift);
    ss = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < n_cols / 4; k += gl_WorkGroupSize.x) {
        vec4 v = ldexp(x[k], ivec4(-rms_shift));
        ss += dot(v, v);
    }
    return 1.0 / sqrt(workgroup_sum(ss) / float(n_cols) + ldexp(eps, -2 * rms_shift));
}

// Elements 4k .. 4k + 3 of x * norm_w (the normed row before the scale s), scaled by
// 2^-rms_shift.
vec4 x_weighted(uint k) { return ldexp(x[k], ivec4(-rms_shift)) * norm_w[k]; }
