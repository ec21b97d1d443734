#version 450
// Shaped like llama.cpp's argmax.comp: the SpecId idiom, shared index and value arrays,
// int32 output.
layout(constant_id = 0) const uint BLOCK_SIZE = 32;
layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;
layout(push_constant) uniform parameter { uint ncols; uint nrows; } p;
layout(binding = 0) readonly buffer A { float data_a[]; };
layout(binding = 1) writeonly buffer D { int data_d[]; };
shared int amax[BLOCK_SIZE];
shared float tmp[BLOCK_SIZE];
void main() {
    const uint row = gl_WorkGroupID.y * 512 + gl_WorkGroupID.x;
    const uint col = gl_LocalInvocationID.x;
    if (row >= p.nrows) return;
    amax[col] = int(col);
    tmp[col] = col < p.ncols ? data_a[row * p.ncols + col] : -1.0 / 0.0;
    barrier();
    for (uint s = BLOCK_SIZE / 2; s > 0; s >>= 1) {
        if (col < s && tmp[col] < tmp[col + s]) { tmp[col] = tmp[col + s]; amax[col] = amax[col + s]; }
        barrier();
    }
    if (col == 0) data_d[row] = amax[0];
}
