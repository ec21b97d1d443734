#version 450
// Shaped like llama.cpp's soft_max.comp: BLOCK_SIZE on SpecId 0 is also the workgroup width
// (local_size_x_id = 0), a tree reduction in shared memory, an optional mask, push constants
// of uints and floats.
#extension GL_EXT_control_flow_attributes : enable
layout(constant_id = 0) const uint BLOCK_SIZE = 32;
layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;
layout(push_constant) uniform parameter {
    uint KX; uint KY; uint ne00; uint ne01; uint ne02; uint ne12; uint ne13; uint nb11;
    uint nb12; uint nb13; float scale; float max_bias; float m0; float m1; uint n_head_log2;
    uint nrows_x; uint has_sinks;
} p;
layout(binding = 0) readonly buffer X { float data_a[]; };
layout(binding = 1) readonly buffer Y { float data_b[]; };
layout(binding = 2) readonly buffer Z { float data_c[]; };
layout(binding = 3) buffer D { float data_d[]; };
shared float vals[BLOCK_SIZE];
void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint rowx = gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x;
    float max_val = p.has_sinks != 0 ? data_c[0] : uintBitsToFloat(0xFF800000);
    [[unroll]] for (uint col = tid; col < p.KX; col += BLOCK_SIZE) {
        max_val = max(max_val, data_a[rowx * p.KX + col] * p.scale + data_b[col] * p.m0);
    }
    vals[tid] = max_val;
    barrier();
    [[unroll]] for (int s = int(BLOCK_SIZE) / 2; s > 0; s >>= 1) {
        if (tid < s) vals[tid] = max(vals[tid], vals[tid + s]);
        barrier();
    }
    max_val = vals[0];
    for (uint col = tid; col < p.KX; col += BLOCK_SIZE) {
        data_d[rowx * p.KX + col] = exp(data_a[rowx * p.KX + col] - max_val);
    }
}
