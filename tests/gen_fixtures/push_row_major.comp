#version 450
// Push constants ending with a row-major matrix (size = rows x MatrixStride, not columns x)
// after an explicit offset 8: 8 + 8 (vec2) + 4 rows x 8 = 48 bytes.
layout(local_size_x = 1) in;
layout(push_constant) uniform P { layout(offset = 8) vec2 v; layout(row_major) mat2x4 rm; } pc;
layout(set = 0, binding = 0) writeonly buffer O { float o[]; };
void main() { o[0] = pc.v.y + pc.rm[1][3]; }
