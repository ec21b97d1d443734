#version 450
// llama.cpp's SpecId idiom (soft_max, argmax, sum_rows, ...): SpecId 0 is both BLOCK_SIZE
// (default 32) and the workgroup width (local_size_x_id = 0, default 1). glslang emits two
// spec constants with SpecId 0. Accepted: `defaults` [32, 1] on the entry, `local_size` says
// the real unspecialized width (1), and get_pipeline insists on an explicit value.
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
