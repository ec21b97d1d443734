// The input row of a decode product over a block type, a unit at a time (weights.glsl
// unit_dot). The includer includes weights.glsl (its block type) first and defines
// `vec4 x_at(uint i)`: vec4 i of the input row. A workgroup walks a row's units in chunks
// of unit_chunk() units: invocation `lane` takes unit k0 + unit_lane() and its parts
// unit_q0(), unit_q0() + SPLIT, ... (weights.glsl unit_dot(o, u, unit_q0(), SPLIT, xv));
// load_unit_x gives it their x (xv[q] and xv[4 + q] for its parts q).
// SPLIT (specialization constant 6, 1, 2 or 4; it divides the workgroup size): invocations
// per unit. 1: a unit per invocation (its header decoded once for 32 weights, but
// consecutive invocations read words and x 1 unit apart); 4: a word per invocation
// (consecutive invocations read consecutive words and vec4 of x).
// On the H200 (bench/README.md, 2026-12-02) 2 and 4 were 2-8x slower than 1 as written (the
// parts index xv per invocation): vkrt/tuning.py uses 1.
// STAGE_X (specialization constant 7, with SPLIT 1 only): 1 stages each chunk's x through
// shared memory, loaded by consecutive invocations in order (coalesced), read back from a
// stride of 9 vec4 (144 bytes: each 8 invocations of a 16-byte load hit distinct banks);
// two barriers per chunk. The stage is declared only then (its size is 0 vec4 + 1).
// XQ (the integer variants): load_unit_x also quantizes the unit (unit_xq.glsl) when SPLIT
// is 1; a split unit takes the float path.
// UNIT_X_V (qkv_rope.comp's variants whose V matrix has a type of its own, of the same
// WEIGHT_BLOCK and UNITS): load_unit_x_runs(..., true) gives the x of V's units, whose runs
// are weights.glsl unit_runs_v; load_unit_x is load_unit_x_runs(..., false).
layout(constant_id = 6) const uint SPLIT = 1;
layout(constant_id = 7) const uint STAGE_X = 0;
shared vec4 x_stage[gl_WorkGroupSize.x * 9 * STAGE_X + 1];

uint row_units(uint n_cols) { return n_cols / WEIGHT_BLOCK * UNITS; }
uint unit_chunk() { return gl_WorkGroupSize.x / SPLIT; }
uint unit_lane() { return gl_LocalInvocationID.x / SPLIT; }
uint unit_q0() { return gl_LocalInvocationID.x % SPLIT; }

// The runs of unit u of a block: of V's type when `v` (UNIT_X_V), else of the includer's.
uvec2 unit_runs_of(uint u, bool v) {
#ifdef UNIT_X_V
    if (v) return unit_runs_v(u);
#endif
    return unit_runs(u);
}

// The vec4 index in the row of vec4 i (0..7) of unit k's x.
uint unit_x4(uint k, uint i, bool v) {
    uvec2 run = ((k / UNITS) * WEIGHT_BLOCK + unit_runs_of(k % UNITS, v)) / 4;
    return (i < 4 ? run.x : run.y) + i % 4;
}

// xv = the x of this invocation's parts of unit k0 + unit_lane() (when it is below `units`;
// stale otherwise), units of V's type when `v`. Every invocation calls it once per chunk, k0
// and v uniform (the barriers of STAGE_X).
void load_unit_x_runs(uint k0, uint units, out vec4 xv[8], bool v) {
    uint lane = gl_LocalInvocationID.x, width = gl_WorkGroupSize.x, k = k0 + unit_lane();
    if (STAGE_X != 0 && SPLIT == 1) {
        barrier();                      // the chunk before is read
        for (uint c = lane; c < 8 * width; c += width) {
            uint kc = k0 + c / 8;
            if (kc < units) x_stage[c / 8 * 9 + c % 8] = x_at(unit_x4(kc, c % 8, v));
        }
        barrier();
        for (uint i = 0; i < 8; ++i) xv[i] = x_stage[lane * 9 + i];
    } else if (k < units) {
        for (uint q = unit_q0(); q < 4; q += SPLIT) {
            xv[q] = x_at(unit_x4(k, q, v));
            xv[4 + q] = x_at(unit_x4(k, 4 + q, v));
        }
    }
#ifdef XQ
    xq_quantize(xv);                    // (stale past `units`: not used there)
    xq_ok = xq_ok && SPLIT == 1;        // a split unit's invocations hold parts of it
#endif
}

void load_unit_x(uint k0, uint units, out vec4 xv[8]) { load_unit_x_runs(k0, units, xv, false); }
