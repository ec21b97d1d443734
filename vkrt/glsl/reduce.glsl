// Workgroup-wide reductions over shared memory (tree reduction; the workgroup size must be a
// power of two). Every invocation of the workgroup must call them (they contain barriers).
// The includer needs no declarations: this file sets local_size_x from spec id 0.
layout(local_size_x_id = 0) in;
shared float reduce_scratch[gl_WorkGroupSize.x];

float workgroup_sum(float v) {
    uint lid = gl_LocalInvocationID.x;
    reduce_scratch[lid] = v;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {
        if (lid < s) reduce_scratch[lid] += reduce_scratch[lid + s];
        barrier();
    }
    float r = reduce_scratch[0];
    barrier();
    return r;
}

float workgroup_max(float v) {
    uint lid = gl_LocalInvocationID.x;
    reduce_scratch[lid] = v;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {
        if (lid < s) reduce_scratch[lid] = max(reduce_scratch[lid], reduce_scratch[lid + s]);
        barrier();
    }
    float r = reduce_scratch[0];
    barrier();
    return r;
}
