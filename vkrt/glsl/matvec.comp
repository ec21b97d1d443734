#version 450
// Matrix-vector product for decode: y[n] = sum_k W[n, k] * x[x_offset + k], f32 accumulation.
// W: [n_rows, n_cols] as the GGUF stores it (weights.glsl: f32, f16, bf16, Q8_0 or Q4_1, one
// variant each, vkrt/glsl/variants.json), PyTorch's Linear weight [out, in]; x: f32 with the
// input vector at element x_offset; y: [n_rows] f32.
// Dispatch: spread(n_rows) workgroups (grid.glsl), one per output row. n_cols % 4 == 0
// (% 32 for block types) and x_offset % 4 == 0 (vec4 loads; the host checks both).
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

void main() {
    uint n = linear_workgroup(), cols4 = pc.n_cols / 4, x0 = pc.x_offset / 4;
    if (n >= pc.n_rows) return;  // uniform per workgroup: the reduction's barriers stay safe
    float acc = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < cols4; k += gl_WorkGroupSize.x)
        acc += dot(weight4(n, k, pc.n_cols), x[x0 + k]);
    acc = workgroup_sum(acc);
#ifdef ADD_OUT
    if (gl_LocalInvocationID.x == 0) y[n] += acc;
#else
    if (gl_LocalInvocationID.x == 0) y[n] = acc;
#endif
}
