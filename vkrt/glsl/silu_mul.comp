#version 450
// Gated MLP activation (Shazeer 2020, "GLU Variants"): out = act(gate) * up; act is SiLU,
// silu(g) = g / (1 + exp(-g)), or with specialization constant 1 GELU = 1 (Gemma's GeGLU)
// gelu.glsl's tanh approximation of GELU. gate, up, out: [n] f32.
// Dispatch: spread(ceil(n / local_size_x)) workgroups (grid.glsl).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "gelu.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Gate { float gate[]; };
layout(set = 0, binding = 1) readonly buffer Up { float up[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n; } pc;
layout(constant_id = 1) const uint GELU = 0;

void main() {
    uint i = linear_workgroup() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float g = gate[i];
    dst[i] = (GELU != 0 ? gelu_tanh(g) : g / (1.0 + exp(-g))) * up[i];
}
