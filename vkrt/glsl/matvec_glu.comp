#version 450
// The gated MLP's input half for one decode token, in one dispatch (Shazeer 2020, "GLU
// Variants"; transformers' LlamaMLP): out[n] = silu(Wg[n] . n(x)) * (Wu[n] . n(x)), with
// n(x) the RMSNorm of x (rms_in.glsl) and silu(g) = g / (1 + exp(-g)), or with
// specialization constant 1 GELU = 1 gelu.glsl's GELU-tanh (Gemma's GeGLU); it replaces
// rmsnorm, the gate and up products and silu_mul (three dependent dispatches).
// Wg (binding 0), Wu (binding 3): [n_rows, n_cols] as the GGUF stores them, one type for both
// (weights.glsl); x: [n_cols] f32 (the residual stream); norm_w: [n_cols] f32; out: [n_rows]
// f32. A workgroup computes ROWS consecutive rows (specialization constant 2, default 1),
// each x load serving ROWS rows of both matrices; block types are walked a unit of 32
// weights at a time (weights.glsl unit_dot, x through unit_x.glsl: STAGE_X), as matvec.comp. Dispatch:
// spread(ceil(n_rows / ROWS)) workgroups (grid.glsl); n_cols % 4 == 0 (% 32 for block
// types).
#extension GL_GOOGLE_include_directive : require
#ifdef XQ
#extension GL_EXT_spirv_intrinsics : require   // unit_xq.glsl
#endif
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

layout(constant_id = 2) const uint ROWS = 1;
vec4 x_at(uint i) { return x_weighted(i); }
#ifdef WEIGHT_BLOCK
#include "unit_x.glsl"
#endif

void main() {
    uint n0 = linear_workgroup() * ROWS;
    if (n0 >= pc.n_rows) return;  // uniform per workgroup
#ifdef WEIGHT_BLOCK
    weights_unit_init();
#endif
    float s = rms_scale(pc.n_cols, pc.eps);
    uint lane = gl_LocalInvocationID.x, width = gl_WorkGroupSize.x;
    uint last = pc.n_rows - 1;     // rows past it read it again and are not written
    float g[ROWS], u[ROWS];
    for (uint r = 0; r < ROWS; ++r) g[r] = u[r] = 0.0;
#ifdef WEIGHT_BLOCK
    uint blocks = pc.n_cols / WEIGHT_BLOCK, units = row_units(pc.n_cols);
    for (uint k0 = 0; k0 < units; k0 += unit_chunk()) {
        vec4 xv[8];
        load_unit_x(k0, units, xv);
        uint k = k0 + unit_lane();
        if (k >= units) continue;
        uint b = k / UNITS, un = k % UNITS;
        for (uint r = 0; r < ROWS; ++r) {
            uint o = (min(n0 + r, last) * blocks + b) * WEIGHT_BLOCK_BYTES;
            g[r] += unit_dot(o, un, unit_q0(), SPLIT, xv);
            u[r] += unit_dot_up(o, un, unit_q0(), SPLIT, xv);
        }
    }
#else
    for (uint k = lane; k < pc.n_cols / 4; k += width) {
        vec4 xv = x_weighted(k);
        for (uint r = 0; r < ROWS; ++r) {
            uint n = min(n0 + r, last);
            g[r] += dot(weight4(n, k, pc.n_cols), xv);
            u[r] += dot(weight4_up(n, k, pc.n_cols), xv);
        }
    }
#endif
    for (uint r = 0; r < ROWS; ++r) {
        float gs = workgroup_sum(g[r]) * s;     // every invocation: uniform control flow
        float us = workgroup_sum(u[r]) * s;
        if (lane == 0 && n0 + r < pc.n_rows)
            dst[n0 + r] = (GELU != 0 ? gelu_tanh(gs) : gs / (1.0 + exp(-gs))) * us;
    }
}
