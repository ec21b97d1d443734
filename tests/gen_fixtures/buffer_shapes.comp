#version 450
// Arrays of buffers (fixed and runtime-sized) and structs inside blocks.
#extension GL_EXT_nonuniform_qualifier : require
layout(local_size_x = 8, local_size_y = 8) in;
struct Item { vec4 pos; uint id; float w[3]; };
layout(set = 0, binding = 0) readonly buffer Items { uint n; Item items[]; };
layout(set = 0, binding = 1) buffer Arr { float x[]; } arr[4];
layout(set = 0, binding = 2) readonly buffer Rt { float y[]; } rt[];
void main() {
    uint i = gl_GlobalInvocationID.x;
    arr[i % 4].x[i] = items[i].pos.x + items[i].w[2] + rt[nonuniformEXT(i)].y[0] + float(n);
}
