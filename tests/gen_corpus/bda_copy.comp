#version 450
// Buffer-device-address kernel: GL_EXT_buffer_reference pointers in the push constants,
// directly, inside a struct and in an array, next to a uint64_t and a 16-byte vector.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(local_size_x = 128) in;
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Src { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) writeonly buffer Dst { vec4 v[]; };
struct Segment { Src src; uint64_t count; };
layout(push_constant) uniform Push { Dst dst; Segment seg; Src extra[2]; vec4 scale; uint n; } pc;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n || uint64_t(i) >= pc.seg.count) return;
    pc.dst.v[i] = (pc.seg.src.v[i] + pc.extra[0].v[i] + pc.extra[1].v[i]) * pc.scale;
}
