#version 450
// The reduction of a product split across workgroups (matmul_coop.comp, n_splits > 1):
// y[y_row0 * n_rows + i] = part[0 * n + i] + part[1 * n + i] + ... + part[(n_splits - 1) * n
// + i] for i < n = n_tokens * n_rows, added left to right from partial 0 (a fixed order: the
// bits do not depend on the grid; one split copies). part: [n_splits, n_tokens, n_rows] f32;
// y: [rows, n_rows] f32 with rows >= y_row0 + n_tokens. Push constants: n (= n_tokens *
// n_rows), n_rows, y_row0, n_splits.
// Dispatch: spread(ceil(n / local_size_x)) workgroups (grid.glsl).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Part { float part[]; };
layout(set = 0, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n; uint n_rows; uint y_row0; uint n_splits; } pc;

void main() {
    uint i = linear_workgroup() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float s = part[i];
    for (uint p = 1; p < pc.n_splits; ++p) s += part[p * pc.n + i];
    y[pc.y_row0 * pc.n_rows + i] = s;
}
