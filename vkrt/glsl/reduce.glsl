// Workgroup-wide sum and max: a subgroup reduction, then (only when the workgroup holds
// several subgroups) one pass over per-subgroup partials in shared memory. With the workgroup
// size specialized to the device's subgroup size (8 on lavapipe, 32 on NVIDIA) no barrier
// runs at all: on lavapipe a barrier switches every invocation's coroutine, and a
// shared-memory tree reduction made matvec 4x slower than this (measured, 1536x576).
// Every invocation of the workgroup must call these (uniform control flow).
// The includer gets local_size_x from specialization constant 0.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
shared float reduce_partial[gl_WorkGroupSize.x];

float workgroup_sum(float v) {
    v = subgroupAdd(v);
    if (gl_NumSubgroups == 1) return v;
    if (subgroupElect()) reduce_partial[gl_SubgroupID] = v;
    barrier();
    float r = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; ++i) r += reduce_partial[i];
    barrier();
    return r;
}

float workgroup_max(float v) {
    v = subgroupMax(v);
    if (gl_NumSubgroups == 1) return v;
    if (subgroupElect()) reduce_partial[gl_SubgroupID] = v;
    barrier();
    float r = reduce_partial[0];
    for (uint i = 1; i < gl_NumSubgroups; ++i) r = max(r, reduce_partial[i]);
    barrier();
    return r;
}
