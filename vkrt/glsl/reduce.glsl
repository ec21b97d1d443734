// Workgroup-wide sum and max: a subgroup reduction, then (only when the workgroup holds
// several subgroups) one pass over per-subgroup partials in shared memory. With the workgroup
// size specialized to the device's subgroup size (8 on lavapipe, 32 on NVIDIA) no barrier
// runs at all: on lavapipe a barrier switches every invocation's coroutine, and a
// shared-memory tree reduction made matvec 4x slower than this (measured, 1536x576).
// Every invocation of the workgroup must call these (uniform control flow).
// The includer gets local_size_x from specialization constant 0.
// Any subgroup size (the spec allows any power of two from 1 to 128) and any workgroup size:
// a subgroup that is partial (workgroup size not a multiple of the subgroup size, or smaller
// than one subgroup) reduces over its active invocations only (GL_KHR_shader_subgroup).
// The number of partials is reduce_subgroups(), not gl_NumSubgroups alone: lavapipe (Mesa,
// LLVM 15) reports gl_NumSubgroups = floor(workgroup / subgroup size), 1 for a workgroup of
// 12 with subgroups of 8, while its partial subgroup has gl_SubgroupID 1; its partial was
// dropped. Every ID below the count is present (each subgroup holds at most
// gl_SubgroupSize invocations), so no slot of reduce_partial is read before it is written.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
shared float reduce_partial[gl_WorkGroupSize.x];
shared float reduce_result;
// Up to this many partials every invocation sums them itself; past it subgroup 0 reduces
// them with a subgroup operation and shares the result: with attention_decode's 32
// subgroups, one serial shared-memory load per partial decoded 966 tok/s on an H200 against
// 983-985 this way (bench/README.md).
const uint REDUCE_SERIAL = 8;

uint reduce_subgroups() {
    return max(gl_NumSubgroups, (gl_WorkGroupSize.x + gl_SubgroupSize - 1) / gl_SubgroupSize);
}

float workgroup_sum(float v) {
    v = subgroupAdd(v);
    uint n = reduce_subgroups();
    if (n == 1) return v;
    if (subgroupElect()) reduce_partial[gl_SubgroupID] = v;
    barrier();
    if (n > REDUCE_SERIAL) {
        if (gl_SubgroupID == 0) {
            float r = 0.0;
            for (uint i = gl_SubgroupInvocationID; i < n; i += gl_SubgroupSize)
                r += reduce_partial[i];
            r = subgroupAdd(r);
            if (subgroupElect()) reduce_result = r;
        }
        barrier();
        return reduce_result;
    }
    float r = 0.0;
    for (uint i = 0; i < n; ++i) r += reduce_partial[i];
    barrier();
    return r;
}

float workgroup_max(float v) {
    v = subgroupMax(v);
    uint n = reduce_subgroups();
    if (n == 1) return v;
    if (subgroupElect()) reduce_partial[gl_SubgroupID] = v;
    barrier();
    if (n > REDUCE_SERIAL) {
        if (gl_SubgroupID == 0) {
            float r = reduce_partial[0];
            for (uint i = gl_SubgroupInvocationID; i < n; i += gl_SubgroupSize)
                r = max(r, reduce_partial[i]);
            r = subgroupMax(r);
            if (subgroupElect()) reduce_result = r;
        }
        barrier();
        return reduce_result;
    }
    float r = reduce_partial[0];
    for (uint i = 1; i < n; ++i) r = max(r, reduce_partial[i]);
    barrier();
    return r;
}
