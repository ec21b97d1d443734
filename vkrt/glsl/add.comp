#version 450
// Residual add in place: x[i] += y[i]. x, y: [n] f32.
// Dispatch: spread(ceil(n / local_size_x)) workgroups (grid.glsl).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n; } pc;

void main() {
    uint i = linear_workgroup() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i < pc.n) x[i] += y[i];
}
