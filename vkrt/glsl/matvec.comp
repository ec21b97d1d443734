#version 450
// Matrix-vector product for decode: y[n] = sum_k W[n, k] * x[x_offset + k], f32 accumulation.
// W: [n_rows, n_cols] as the GGUF stores it (weights.glsl: f32, f16, bf16, Q8_0 or Q4_1, one
// variant each, vkrt/glsl/variants.json), PyTorch's Linear weight [out, in]; x: f32 with the
// input vector at element x_offset; y: [n_rows] f32.
// Dispatch: spread(ceil(n_rows / ROWS)) workgroups (grid.glsl). ROWS (specialization
// constant 1, default 1): with 1 the workgroup computes one row; with more, each of its ROWS
// subgroups computes its own row (workgroup size = ROWS x the subgroup size, whole
// subgroups) and reduces with subgroupAdd alone: many short rows (the logits) in fewer,
// fuller workgroups. n_cols % 4 == 0 (% 32 for block types) and x_offset % 4 == 0 (vec4
// loads; the host checks both).
// Variant matvec_add_* (ADD_OUT): y[n] += the product instead, the residual add of a decode
// step folded into its output projection (each y[n] is read and written by one invocation).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
#include "weights.glsl"
layout(set = 0, binding = 1) readonly buffer X { vec4 x[]; };
#ifdef ADD_OUT
layout(set = 0, binding = 2) buffer Y { float y[]; };
#else
layout(set = 0, binding = 2) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform Push { uint n_cols; uint x_offset; uint n_rows; } pc;

layout(constant_id = 1) const uint ROWS = 1;

void main() {
    uint cols4 = pc.n_cols / 4, x0 = pc.x_offset / 4;
    uint n = linear_workgroup() * ROWS + (ROWS > 1 ? gl_SubgroupID : 0);
    // Uniform per workgroup (ROWS 1: the reduction's barriers stay safe) or per subgroup.
    if (n >= pc.n_rows) return;
    uint lane = ROWS > 1 ? gl_SubgroupInvocationID : gl_LocalInvocationID.x;
    uint width = ROWS > 1 ? gl_SubgroupSize : gl_WorkGroupSize.x;
    float acc = 0.0;
    for (uint k = lane; k < cols4; k += width) acc += dot(weight4(n, k, pc.n_cols), x[x0 + k]);
    if (ROWS > 1) acc = subgroupAdd(acc);
    else acc = workgroup_sum(acc);      // ROWS is a constant: uniform control flow
#ifdef ADD_OUT
    if (lane == 0) y[n] += acc;
#else
    if (lane == 0) y[n] = acc;
#endif
}
