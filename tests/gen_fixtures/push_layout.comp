#version 450
// Push-constant block that starts at offset 16 and holds an array, a matrix and a struct.
layout(local_size_x = 32, local_size_y = 2, local_size_z = 1) in;
struct Inner { vec2 uv; uint k; };
layout(push_constant) uniform P {
    layout(offset = 16) uint n;
    float w[3];
    mat3 m;
    layout(row_major) mat2x3 r;
    Inner inner;
} pc;
layout(set = 0, binding = 0) buffer O { float o[]; };
void main() { o[gl_GlobalInvocationID.x] = pc.w[1] * pc.m[1][2] + pc.r[1][0] + pc.inner.uv.y + float(pc.n + pc.inner.k); }
