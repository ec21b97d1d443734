#version 450
// SpecId 0 is an int (BLOCK_SIZE) and the uint workgroup width: one specialized value cannot
// be both types. Refused, naming the SpecId, both types and both constants.
layout(constant_id = 0) const int BLOCK_SIZE = 32;
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer O { int o[]; };
void main() { o[0] = BLOCK_SIZE + int(gl_WorkGroupSize.x); }
