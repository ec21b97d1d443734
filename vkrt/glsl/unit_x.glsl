// The input row of a decode product over a block type, a unit at a time (weights.glsl
// unit_dot). The includer includes weights.glsl (its block type) first and defines
// `vec4 x_at(uint i)`: vec4 i of the input row. A workgroup walks a row's units in chunks
// of local_size_x units, unit k0 + lane for each invocation; load_unit_x gives an
// invocation its unit's 8 vec4 of x (run x, then run y).
// STAGE_X (specialization constant 7): 0 reads them from x directly; 1 stages the chunk's x
// through shared memory: the workgroup's invocations load it in order (consecutive
// invocations, consecutive vec4: coalesced, where a unit per invocation alone reads 8
// vec4 128 bytes apart in each load), then each reads its unit's from a stride of 9 vec4
// (144 bytes: each 8 invocations of a 16-byte load hit distinct banks). Two barriers per
// chunk: for devices where they are cheap (a GPU; vkrt/tuning.py).
layout(constant_id = 7) const uint STAGE_X = 0;
shared vec4 x_stage[gl_WorkGroupSize.x * 9];

uint row_units(uint n_cols) { return n_cols / WEIGHT_BLOCK * UNITS; }

// The vec4 index in the row of vec4 i (0..7) of unit k's x.
uint unit_x4(uint k, uint i) {
    uvec2 run = ((k / UNITS) * WEIGHT_BLOCK + unit_runs(k % UNITS)) / 4;
    return (i < 4 ? run.x : run.y) + i % 4;
}

// xv = the x of unit k0 + lane (when it is below `units`; stale otherwise). Every
// invocation calls it once per chunk, k0 uniform (the barriers of STAGE_X).
void load_unit_x(uint k0, uint units, out vec4 xv[8]) {
    uint lane = gl_LocalInvocationID.x, width = gl_WorkGroupSize.x;
    if (STAGE_X != 0) {
        barrier();                      // the chunk before is read
        for (uint c = lane; c < 8 * width; c += width) {
            uint k = k0 + c / 8;
            if (k < units) x_stage[c / 8 * 9 + c % 8] = x_at(unit_x4(k, c % 8));
        }
        barrier();
        for (uint i = 0; i < 8; ++i) xv[i] = x_stage[lane * 9 + i];
    } else if (k0 + lane < units) {
        for (uint i = 0; i < 8; ++i) xv[i] = x_at(unit_x4(k0 + lane, i));
    }
}
