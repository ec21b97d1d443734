#version 450
// target-env: vulkan1.3
// local_size_x_id / local_size_z_id for SPIR-V 1.6: OpExecutionModeId LocalSizeId (glslang
// also keeps an undecorated composite). Spec id 3 is also a named constant (SpecId 3 twice).
layout(local_size_x_id = 3, local_size_y = 2, local_size_z_id = 5) in;
layout(constant_id = 3) const uint WG_X = 1;
layout(set = 0, binding = 0) buffer O { uint o[]; };
void main() { o[gl_LocalInvocationIndex] = WG_X * gl_WorkGroupSize.x * gl_WorkGroupSize.z; }
