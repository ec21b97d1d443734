#version 450
// Two blocks aliased on binding 1 (dtype views of one buffer), a readonly buffer, spec
// constants of three types and an included helper.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int N = -3;
layout(constant_id = 2) const bool B = true;
layout(constant_id = 3) const float F = 1.5;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) buffer Bf { float b[]; };
layout(set = 0, binding = 1) readonly buffer Bh { uint bh[]; };
layout(push_constant) uniform P { uint n; float s; } pc;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < pc.n && B) b[i] = sq(a[i]) * pc.s * F + N + float(bh[0]);
}
