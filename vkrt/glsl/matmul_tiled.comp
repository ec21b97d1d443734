#version 450
// Matrix-matrix product for prefill, tiled through shared memory: y[t, n] = sum_k x[t, k] *
// W[n, k], f32 accumulation (blocked by 32 columns). x: [n_tokens, n_cols] f32; W: [n_rows,
// n_cols] as the GGUF stores it (weights.glsl, one variant per type, vkrt/glsl/variants.json;
// PyTorch Linear layout [out, in]); y: [n_tokens, n_rows] f32; n_cols % 4 == 0 (% 32 for
// block types).
// A workgroup computes a tile of ROWS output rows x TOKENS tokens: for each step of 32
// columns it decodes the W tile and loads the x tile into shared memory once, then every
// invocation accumulates a 4 x 4 block of outputs from them (the classic blocking of a GEMM,
// e.g. Volkov & Demmel 2008, "Benchmarking GPUs to tune dense linear algebra"). matmul.comp
// reads every x row once per output row; here each x element is read once per ROWS rows and
// each W element once per TOKENS tokens.
// Specialization constants: 0 = local_size_x = ROWS * TOKENS / 16, 1 = ROWS, 2 = TOKENS (both
// multiples of 4). Dispatch: (min(row tiles, limit_x), ceil(n_tokens / TOKENS), ceil(row
// tiles / limit_x)) with row tiles = ceil(n_rows / ROWS): tiles past
// maxComputeWorkGroupCount.x spill into z. Push constants: n_cols, n_rows, n_tokens, token0
// (the first token row of x and y the product covers: rows token0 .. token0 + n_tokens - 1;
// the batched runner's roles, vkrt/models/batch.py).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 0) in;
#include "weights.glsl"
layout(constant_id = 1) const uint ROWS = 32;
layout(constant_id = 2) const uint TOKENS = 64;
layout(set = 0, binding = 1) readonly buffer X { vec4 x[]; };
layout(set = 0, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n_cols; uint n_rows; uint n_tokens; uint token0; }
    pc;

const uint STEP = 32;                    // columns per step (a Q8_0 / Q4_1 block)
const uint T = gl_WorkGroupSize.x;
shared vec4 w_s[STEP * ROWS / 4];        // [k][row], 4 rows per vec4
shared vec4 x_s[STEP * TOKENS / 4];      // [k][token], 4 tokens per vec4

void main() {
    uint tile = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
    uint n0 = tile * ROWS, t0 = gl_WorkGroupID.y * TOKENS, tid = gl_LocalInvocationID.x;
    if (n0 >= pc.n_rows) return;  // uniform per workgroup
    uint cols4 = pc.n_cols / 4;
    uint r4 = tid % (ROWS / 4), tk4 = tid / (ROWS / 4);   // this invocation's 4 rows, 4 tokens
    vec4 acc[4] = vec4[4](vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0));   // [token][row]
    for (uint k0 = 0; k0 < cols4; k0 += STEP / 4) {
        // Loads run to constants (unrolled); out-of-range rows, tokens and columns are 0.
        for (uint i = tid; i < ROWS * STEP / 4; i += T) {
            uint r = i / (STEP / 4), q = i % (STEP / 4);
            vec4 v = n0 + r < pc.n_rows && k0 + q < cols4 ? weight4(n0 + r, k0 + q, pc.n_cols)
                                                        : vec4(0.0);
            for (uint e = 0; e < 4; ++e) w_s[(4 * q + e) * (ROWS / 4) + r / 4][r % 4] = v[e];
        }
        for (uint i = tid; i < TOKENS * STEP / 4; i += T) {
            uint t = i / (STEP / 4), q = i % (STEP / 4);
            vec4 v = t0 + t < pc.n_tokens && k0 + q < cols4
                         ? x[(pc.token0 + t0 + t) * cols4 + k0 + q] : vec4(0.0);
            for (uint e = 0; e < 4; ++e) x_s[(4 * q + e) * (TOKENS / 4) + t / 4][t % 4] = v[e];
        }
        barrier();
        // Blocked summation: a step's 32 products are summed apart, then added to acc, so
        // the rounding error grows with 32 + n_cols / 32 terms instead of n_cols (Higham,
        // "Accuracy and Stability of Numerical Algorithms", 2002, section 4.2).
        vec4 part[4] = vec4[4](vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0));
        for (uint k = 0; k < STEP; ++k) {
            vec4 wv = w_s[k * (ROWS / 4) + r4], xv = x_s[k * (TOKENS / 4) + tk4];
            for (uint j = 0; j < 4; ++j) part[j] += xv[j] * wv;
        }
        for (uint j = 0; j < 4; ++j) acc[j] += part[j];
        barrier();
    }
    for (uint j = 0; j < 4; ++j) {
        uint t = t0 + 4 * tk4 + j;
        if (t >= pc.n_tokens) break;
        for (uint e = 0; e < 4; ++e) {
            uint n = n0 + 4 * r4 + e;
            if (n < pc.n_rows) y[(pc.token0 + t) * pc.n_rows + n] = acc[j][e];
        }
    }
}
