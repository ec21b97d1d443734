#version 450
// x[i] *= s for i < n (Gemma's embedding scale, sqrt(n_embd), on the embedded rows).
// x: [n] f32. Dispatch: spread(ceil(n / local_size_x)) workgroups (grid.glsl).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform Push { uint n; float s; } pc;

void main() {
    uint i = linear_workgroup() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    x[i] *= pc.s;
}
