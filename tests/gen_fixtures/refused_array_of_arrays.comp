#version 450
// A 2 x 3 array of storage buffers: Vulkan's descriptor arrays have one dimension. Refused
// as "array of arrays of descriptors".
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { float v[]; } bufs[2][3];
void main() { bufs[1][2].v[0] = 1.0; }
