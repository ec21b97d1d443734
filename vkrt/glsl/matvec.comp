#version 450
// Matrix-vector product for decode: y[n] = sum_k W[n, k] * x[x_offset + k], f32 accumulation.
// W: [n_rows, n_cols] as the GGUF stores it (weights.glsl, one variant per type,
// vkrt/glsl/variants.json), PyTorch's Linear weight [out, in]; x: f32 with the input vector
// at element x_offset; y: [n_rows] f32.
// A workgroup of local_size_x invocations (specialization constant 0) computes ROWS
// consecutive rows (specialization constant 1, default 1): every invocation walks the
// columns of all ROWS rows, so each x load serves ROWS rows. Block types are walked a unit
// of 32 weights at a time (weights.glsl unit_dot: the unit's scales read once), units k =
// lane, lane + local_size_x, ... of the row, their x loaded by unit_x.glsl (STAGE_X,
// specialization constant 7: through shared memory); the others (f32, f16, bf16) 4 columns
// at a time. The rows are then summed over the workgroup together (reduce_rows.glsl: one
// barrier), row r stored by invocation r. vkrt/tuning.py picks
// both constants per device class and shape.
// Dispatch: spread(ceil(n_rows / ROWS)) workgroups (grid.glsl); rows past n_rows (the last
// workgroup's) are neither read nor written. n_cols % 4 == 0 (% 32 for block types) and
// x_offset % 4 == 0 (vec4 loads; the host checks both).
// Variant matvec_add_* (ADD_OUT): y[n] += the product instead, the residual add of a decode
// step folded into its output projection (each y[n] is read and written by one invocation).
#extension GL_GOOGLE_include_directive : require
#ifdef XQ
#extension GL_EXT_spirv_intrinsics : require   // unit_xq.glsl
#endif
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
const uint REDUCE_ROWS = ROWS;
#include "reduce_rows.glsl"

vec4 x_at(uint i) { return x[pc.x_offset / 4 + i]; }
#ifdef WEIGHT_BLOCK
#include "unit_x.glsl"
#endif

void main() {
    uint n0 = linear_workgroup() * ROWS;
    if (n0 >= pc.n_rows) return;        // uniform per workgroup
#ifdef WEIGHT_BLOCK
    weights_unit_init();
#endif
    uint lane = gl_LocalInvocationID.x, width = gl_WorkGroupSize.x;
    // Rows past n_rows (the last workgroup's) read the last row again and are not written:
    // no branch between the loads of a unit's rows.
    uint last = pc.n_rows - 1;
    float acc[ROWS];
    for (uint r = 0; r < ROWS; ++r) acc[r] = 0.0;
#ifdef WEIGHT_BLOCK
    uint blocks = pc.n_cols / WEIGHT_BLOCK, units = row_units(pc.n_cols);
    for (uint k0 = 0; k0 < units; k0 += unit_chunk()) {
        vec4 xv[8];
        load_unit_x(k0, units, xv);
        uint k = k0 + unit_lane();
        if (k >= units) continue;
        uint b = k / UNITS, u = k % UNITS;
        for (uint r = 0; r < ROWS; ++r)
            acc[r] += unit_dot((min(n0 + r, last) * blocks + b) * WEIGHT_BLOCK_BYTES, u, unit_q0(), SPLIT, xv);
    }
#else
    for (uint k = lane; k < pc.n_cols / 4; k += width) {
        vec4 xv = x_at(k);
        for (uint r = 0; r < ROWS; ++r) acc[r] += dot(weight4(min(n0 + r, last), k, pc.n_cols), xv);
    }
#endif
    for (uint r = 0; r < ROWS; ++r) reduce_rows_put(r, acc[r]);   // uniform control flow
    barrier();
    for (uint r = lane; r < ROWS && n0 + r < pc.n_rows; r += width) {   // row r by lane r
#ifdef ADD_OUT
        y[n0 + r] += reduce_rows_get(r);
#else
        y[n0 + r] = reduce_rows_get(r);
#endif
    }
}
