#version 450
// Push constants ending with an array of vec4 (ArrayStride 16) after an array of mat2
// (ArrayStride 16, MatrixStride 8): 0 + 2 x 16 + 3 x 16 = 80 bytes.
layout(local_size_x = 1) in;
layout(push_constant) uniform P { mat2 ms[2]; vec4 tail[3]; } pc;
layout(set = 0, binding = 0) writeonly buffer O { float o[]; };
void main() { o[0] = pc.ms[1][1][0] + pc.tail[2].w; }
