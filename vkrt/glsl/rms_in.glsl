// RMSNorm folded into the input of a product (Zhang & Sennrich 2019, as rmsnorm.comp):
// with n(x) = x * s * norm_w, s = 1 / sqrt(mean(x^2) + eps), a row of W times n(x) is
// s * sum_k W[k] * (x[k] * norm_w[k]); every workgroup computes s itself (the row is small
// next to the matrix), so the norm needs no dispatch and no barrier of its own.
// The includer declares `x` (vec4[], the input row from element 0) and `norm_w` (vec4[]), and
// includes reduce.glsl first; every invocation must call rms_scale (uniform control flow).
// Past the f32 range: when the sum of squares overflows (|x| beyond ~1.8e19, or many large
// elements), x is multiplied by rms_pre = 2^(2 - e), e the exponent of max|x| (frexp), so
// that the largest element lands in [2, 4): a power of two, exact and a normal float (the
// overflow needs e >= 57, and e <= 128), and 1.0 otherwise, so the ordinary path costs one
// multiply. n(x) is computed from the scaled row: the norm is invariant to the scale but for
// eps, which becomes eps * rms_pre^2. isinf needs the infinities kept (inf.glsl). Every
// invocation sees the same sum, so the branch is uniform.
#include "inf.glsl"
float rms_pre = 1.0;
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
    int e;
    frexp(workgroup_max(amax), e);
    rms_pre = ldexp(1.0, 2 - e);
    ss = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < n_cols / 4; k += gl_WorkGroupSize.x) {
        vec4 v = x[k] * rms_pre;
        ss += dot(v, v);
    }
    return 1.0 / sqrt(workgroup_sum(ss) / float(n_cols) + eps * rms_pre * rms_pre);
}

// Elements 4k .. 4k + 3 of x * norm_w (the normed row before the scale s), times rms_pre.
vec4 x_weighted(uint k) { return x[k] * rms_pre * norm_w[k]; }
