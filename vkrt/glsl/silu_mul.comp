#version 450
// SiLU-gated MLP activation (Shazeer 2020, "GLU Variants"): out = silu(gate) * up,
// silu(g) = g / (1 + exp(-g)). gate, up, out: [n] f32.
// Dispatch: spread(ceil(n / local_size_x)) workgroups (grid.glsl).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Gate { float gate[]; };
layout(set = 0, binding = 1) readonly buffer Up { float up[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n; } pc;

void main() {
    uint i = linear_workgroup() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float g = gate[i];
    dst[i] = g / (1.0 + exp(-g)) * up[i];
}
