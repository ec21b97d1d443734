#version 450
// Matrix-matrix product for prefill: y[t, n] = sum_k x[t, k] * W[n, k], f32 accumulation.
// x: [n_tokens, n_cols] f32; W: [n_rows, n_cols] as the GGUF stores it (weights.glsl: f32,
// f16, bf16, Q8_0 or Q4_1, one variant each, vkrt/glsl/variants.json; PyTorch Linear layout
// [out, in]); y: [n_tokens, n_rows] f32; n_cols % 4 == 0 (% 32 for block types).
// One workgroup per (output row, tile of TOKENS tokens): each W row is read (and decoded)
// once per tile; the invocations split k and reduce with subgroupAdd (no barrier when the
// workgroup size is the subgroup size). Dispatch: (min(n_rows, limit_x), ceil(n_tokens /
// TOKENS), ceil(n_rows / limit_x)): rows past maxComputeWorkGroupCount.x spill into z.
#extension GL_GOOGLE_include_directive : require
#include "reduce.glsl"
#include "weights.glsl"
layout(constant_id = 1) const uint TOKENS = 8;
layout(set = 0, binding = 1) readonly buffer X { vec4 x[]; };
layout(set = 0, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n_cols; uint n_rows; uint n_tokens; } pc;

void main() {
    uint n = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
    uint t0 = gl_WorkGroupID.y * TOKENS, cols4 = pc.n_cols / 4;
    if (n >= pc.n_rows) return;  // uniform per workgroup
    // Loops run to the constant TOKENS so the compiler keeps acc[] in registers; rows past
    // n_tokens re-read the last row and are not stored.
    float acc[TOKENS];
    uint row[TOKENS];
    for (uint j = 0; j < TOKENS; ++j) {
        acc[j] = 0.0;
        row[j] = min(t0 + j, pc.n_tokens - 1) * cols4;
    }
    for (uint k = gl_LocalInvocationID.x; k < cols4; k += gl_WorkGroupSize.x) {
        vec4 wv = weight4(n, k, pc.n_cols);
        for (uint j = 0; j < TOKENS; ++j) acc[j] += dot(wv, x[row[j] + k]);
    }
    for (uint j = 0; j < TOKENS; ++j) {
        float s = workgroup_sum(acc[j]);
        if (gl_LocalInvocationID.x == 0 && t0 + j < pc.n_tokens) y[(t0 + j) * pc.n_rows + n] = s;
    }
}
