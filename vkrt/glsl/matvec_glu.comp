#version 450
// The gated MLP's input half for one decode token, in one dispatch (Shazeer 2020, "GLU
// Variants"; transformers' LlamaMLP): out[n] = silu(Wg[n] . n(x)) * (Wu[n] . n(x)), with
// n(x) the RMSNorm of x (rms_in.glsl) and silu(g) = g / (1 + exp(-g)), or with
// specialization constant 1 GELU = 1 gelu.glsl's GELU-tanh (Gemma's GeGLU); it replaces
// rmsnorm, the gate and up products and silu_mul (three dependent dispatches).
// Wg (binding 0), Wu (binding 3): [n_rows, n_cols] as the GGUF stores them, one type for both
// (weights.glsl); x: [n_cols] f32 (the residual stream); norm_w: [n_cols] f32; out: [n_rows]
// f32. Dispatch: spread(n_rows) workgroups (grid.glsl), one per output row; n_cols % 4 == 0
// (% 32 for block types).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
#include "gelu.glsl"
#include "weights.glsl"
#define WEIGHT_BINDING 3
#define W_(name) name##_up
#include "weights.glsl"
#undef WEIGHT_BINDING
#undef W_
layout(set = 0, binding = 1) readonly buffer X { vec4 x[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(set = 0, binding = 4) readonly buffer NormW { vec4 norm_w[]; };
layout(push_constant) uniform Push { uint n_cols; uint n_rows; float eps; } pc;
layout(constant_id = 1) const uint GELU = 0;
#include "rms_in.glsl"

void main() {
    uint n = linear_workgroup();
    if (n >= pc.n_rows) return;  // uniform per workgroup
    float s = rms_scale(pc.n_cols, pc.eps);
    float g = 0.0, u = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < pc.n_cols / 4; k += gl_WorkGroupSize.x) {
        vec4 xv = x_weighted(k);
        g += dot(weight4(n, k, pc.n_cols), xv);
        u += dot(weight4_up(n, k, pc.n_cols), xv);
    }
    g = workgroup_sum(g) * s;
    u = workgroup_sum(u) * s;
    if (gl_LocalInvocationID.x == 0)
        dst[n] = (GELU != 0 ? gelu_tanh(g) : g / (1.0 + exp(-g))) * u;
}
