// RMSNorm folded into the input of a product (Zhang & Sennrich 2019, as rmsnorm.comp):
// with n(x) = x * s * norm_w, s = 1 / sqrt(mean(x^2) + eps), a row of W times n(x) is
// s * sum_k W[k] * (x[k] * norm_w[k]); every workgroup computes s itself (the row is small
// next to the matrix), so the norm needs no dispatch and no barrier of its own.
// The includer declares `x` (vec4[], the input row from element 0) and `norm_w` (vec4[]), and
// includes reduce.glsl first; every invocation must call rms_scale (uniform control flow).
float rms_scale(uint n_cols, float eps) {
    float ss = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < n_cols / 4; k += gl_WorkGroupSize.x)
        ss += dot(x[k], x[k]);
    return 1.0 / sqrt(workgroup_sum(ss) / float(n_cols) + eps);
}

// Elements 4k .. 4k + 3 of x * norm_w (the normed row before the scale s).
vec4 x_weighted(uint k) { return x[k] * norm_w[k]; }
