#version 450
// local_size_x = 64 together with local_size_x_id = 0: the spec constant's default is 64.
layout(local_size_x = 64, local_size_x_id = 0) in;
layout(set = 0, binding = 0) writeonly buffer O { uint o[]; };
void main() { o[gl_GlobalInvocationID.x] = gl_WorkGroupSize.x; }
