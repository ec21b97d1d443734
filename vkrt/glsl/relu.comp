#version 450
// ReLU in place: x[i] = max(x[i], 0) for i < n (NaN stays NaN, as torch.relu keeps it).
// x: [n] f32. Push constants: n. Dispatch: spread(ceil(n / local_size_x)) workgroups (grid.glsl).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform Push { uint n; } pc;

void main() {
    uint i = linear_workgroup() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i < pc.n && x[i] < 0.0) x[i] = 0.0;
}
