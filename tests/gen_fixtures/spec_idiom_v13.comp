#version 450
// target-env: vulkan1.3
// spec_idiom.comp for SPIR-V 1.6 (LocalSizeId): glslang now emits the workgroup's SpecId 0
// constant (default 1) before BLOCK_SIZE (32); the metadata is the same, `defaults` [32, 1].
layout(constant_id = 0) const uint BLOCK_SIZE = 32;
layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) writeonly buffer D { float d[]; };
shared float vals[BLOCK_SIZE];
void main() {
    uint tid = gl_LocalInvocationID.x;
    vals[tid] = a[tid];
    barrier();
    for (uint s = BLOCK_SIZE / 2; s > 0; s >>= 1) {
        if (tid < s) vals[tid] += vals[tid + s];
        barrier();
    }
    if (tid == 0) d[gl_WorkGroupID.x] = vals[0] / float(gl_WorkGroupSize.x);
}
