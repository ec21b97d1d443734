#version 450
// buffer_reference pointers (GL_EXT_buffer_reference, PhysicalStorageBuffer64) in a push
// constant block: 8 bytes each, directly (`dst`, type "pointer"), inside a struct (`pair`)
// and as an array (`arr`).
#extension GL_EXT_buffer_reference : require
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 4) buffer FloatBuf { float v[]; };
struct Pair { FloatBuf src; uint n; };
layout(push_constant) uniform Push { FloatBuf dst; Pair pair; FloatBuf arr[2]; uint k; } pc;
void main() {
    pc.dst.v[gl_GlobalInvocationID.x] = pc.pair.src.v[0] + pc.arr[1].v[0] + float(pc.k + pc.pair.n);
}
