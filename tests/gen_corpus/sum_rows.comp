#version 450
// Shaped like llama.cpp's sum_rows.comp: the SpecId idiom with a float weight spec constant
// on another id, a generic unary push-constant head with fastdiv constants.
layout(constant_id = 0) const uint BLOCK_SIZE = 32;
layout(constant_id = 1) const float WEIGHT = 1.0;
layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;
layout(push_constant) uniform parameter {
    uint n_cols; uint ne01; uint ne02; uint nb01; uint nb02; uint nb03; uint nb11; uint nb12;
    uint nb13; float weight; uint misalign_offsets; uint ne0_12mp; uint ne0_12L; uint ne0_1mp;
    uint ne0_1L;
} p;
layout(binding = 0) readonly buffer A { float data_a[]; };
layout(binding = 1) writeonly buffer D { float data_d[]; };
shared float tmp[BLOCK_SIZE];
void main() {
    const uint row = gl_WorkGroupID.x;
    const uint col = gl_LocalInvocationID.x;
    tmp[col] = 0.0;
    for (uint i = col; i < p.n_cols; i += BLOCK_SIZE) tmp[col] += data_a[row * p.nb01 + i];
    barrier();
    for (int s = int(BLOCK_SIZE) / 2; s > 0; s >>= 1) {
        if (col < s) tmp[col] += tmp[col + s];
        barrier();
    }
    if (col == 0) data_d[row] = tmp[0] * p.weight * WEIGHT;
}
