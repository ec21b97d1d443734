#version 450
// Matrix-matrix product for prefill: y[t, n] = sum_k x[t, k] * W[n, k].
// x: [n_tokens, n_cols] f32; W: [n_rows, n_cols] f32 (PyTorch Linear layout [out, in]);
// y: [n_tokens, n_rows] f32. Shared-memory tiling, TILE x TILE outputs per workgroup.
// Dispatch: (ceil(n_rows / TILE), ceil(n_tokens / TILE), 1).
#define TILE 16
layout(local_size_x = TILE, local_size_y = TILE) in;
layout(set = 0, binding = 0) readonly buffer Wt { float w[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n_cols; uint n_rows; uint n_tokens; } pc;
shared float w_tile[TILE][TILE + 1];
shared float x_tile[TILE][TILE + 1];

void main() {
    uint lx = gl_LocalInvocationID.x, ly = gl_LocalInvocationID.y;
    uint n0 = gl_WorkGroupID.x * TILE, t0 = gl_WorkGroupID.y * TILE;
    float acc = 0.0;
    for (uint k0 = 0; k0 < pc.n_cols; k0 += TILE) {
        // Thread (lx, ly) loads W[n0 + ly, k0 + lx] and x[t0 + ly, k0 + lx].
        uint k = k0 + lx;
        w_tile[ly][lx] = (n0 + ly < pc.n_rows && k < pc.n_cols) ? w[(n0 + ly) * pc.n_cols + k] : 0.0;
        x_tile[ly][lx] = (t0 + ly < pc.n_tokens && k < pc.n_cols) ? x[(t0 + ly) * pc.n_cols + k] : 0.0;
        barrier();
        for (uint j = 0; j < TILE; ++j) acc += x_tile[ly][j] * w_tile[lx][j];
        barrier();
    }
    uint n = n0 + lx, t = t0 + ly;
    if (n < pc.n_rows && t < pc.n_tokens) y[t * pc.n_rows + n] = acc;
}
