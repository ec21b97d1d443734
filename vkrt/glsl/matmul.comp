#version 450
// Matrix-matrix product for prefill: y[t, n] = sum_k x[t, k] * W[n, k], f32 accumulation.
// x: [n_tokens, n_cols] f32; W: [n_rows, n_cols] as the GGUF stores it (weights.glsl: f32,
// f16, bf16, Q8_0 or Q4_1, one variant each, vkrt/glsl/variants.json; PyTorch Linear layout
// [out, in]); y: [n_tokens, n_rows] f32; n_cols % 4 == 0 (% 32 for block types).
// One workgroup per (ROWS output rows, tile of TOKENS tokens): each W row is read (and
// decoded) once per tile, each x row once per ROWS rows; the invocations split k (invocation
// i sums k = i, i + local_size_x, ...) and reduce with subgroupAdd (no barrier when the
// workgroup size is the subgroup size). An output's sum runs that loop and that reduction
// whatever ROWS and TOKENS are, so its bits depend on neither (the batched runner's batch
// invariance, vkrt/models/batch.py; tests/test_kernels.py checks it).
// Specialization constants: 0 = local_size_x, 1 = TOKENS, 2 = ROWS. Dispatch:
// (min(row groups, limit_x), ceil(n_tokens / TOKENS), ceil(row groups / limit_x)) with row
// groups = ceil(n_rows / ROWS): groups past maxComputeWorkGroupCount.x spill into z.
// token0: the first token row of x and y the product covers (rows token0 .. token0 +
// n_tokens - 1 of both; the batched runner's roles, vkrt/models/batch.py).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "reduce.glsl"
#include "weights.glsl"
layout(constant_id = 1) const uint TOKENS = 8;
layout(constant_id = 2) const uint ROWS = 1;
layout(set = 0, binding = 1) readonly buffer X { vec4 x[]; };
layout(set = 0, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n_cols; uint n_rows; uint n_tokens; uint token0; }
    pc;

void main() {
    uint n0 = (gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x) * ROWS;
    uint t0 = gl_WorkGroupID.y * TOKENS, cols4 = pc.n_cols / 4, last = pc.n_rows - 1;
    if (n0 >= pc.n_rows) return;  // uniform per workgroup
    // Loops run to the constants TOKENS and ROWS and are unrolled, so acc[] stays in
    // registers; tokens past n_tokens re-read the last token and rows past n_rows the last
    // row, neither stored.
    float acc[ROWS * TOKENS];
    uint row[TOKENS];
    [[unroll]] for (uint i = 0; i < ROWS * TOKENS; ++i) acc[i] = 0.0;
    [[unroll]] for (uint j = 0; j < TOKENS; ++j)
        row[j] = (pc.token0 + min(t0 + j, pc.n_tokens - 1)) * cols4;
    for (uint k = gl_LocalInvocationID.x; k < cols4; k += gl_WorkGroupSize.x) {
        vec4 wv[ROWS];
        [[unroll]] for (uint r = 0; r < ROWS; ++r) wv[r] = weight4(min(n0 + r, last), k, pc.n_cols);
        [[unroll]] for (uint j = 0; j < TOKENS; ++j) {
            vec4 xv = x[row[j] + k];
            [[unroll]] for (uint r = 0; r < ROWS; ++r) acc[r * TOKENS + j] += dot(wv[r], xv);
        }
    }
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
        [[unroll]] for (uint j = 0; j < TOKENS; ++j) {
            float s = workgroup_sum(acc[r * TOKENS + j]);
            if (gl_LocalInvocationID.x == 0 && t0 + j < pc.n_tokens && n0 + r < pc.n_rows)
                y[(pc.token0 + t0 + j) * pc.n_rows + n0 + r] = s;
        }
    }
}
