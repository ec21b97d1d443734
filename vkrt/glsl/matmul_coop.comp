#version 450
// Matrix-matrix product for prefill on cooperative matrices (tensor cores): y[t, n] =
// sum_k x[t, k] * W[n, k], i.e. Y[T, N] = X[T, K] * W[N, K]^T. x: [n_tokens, n_cols] f32;
// W: [n_rows, n_cols] as the GGUF stores it (weights.glsl, one variant per type,
// vkrt/glsl/variants.json); y: [n_tokens, n_rows] f32; n_cols % 4 == 0 (% 32 for block types).
// The products run in f16 with f32 accumulation: x is rounded to f16 as it is loaded into
// shared memory, W dequantized (in f32, as weights.glsl reads it) and rounded to f16 there too,
// and each subgroup multiplies TM x TK by TK x TN tiles of them with coopMatMulAdd into f32
// accumulators (GL_KHR_cooperative_matrix / SPV_KHR_cooperative_matrix, subgroup scope; the
// shape one the device lists in vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR, Vulkan spec
// "Cooperative Matrices"; 16 x 16 x 16 f16 -> f32 on NVIDIA). The f16 rounding of both
// operands bounds the error at about 2 * 2^-11 of sum |x w| (tests/test_kernels.py states the
// bound); an |x| past 65504 becomes infinite in f16 (ggml-vulkan's mul_mm.comp stages both
// operands in shared memory as FLOAT_TYPE, f16, in its cooperative-matrix builds too).
// A workgroup computes BM tokens x BN rows: SG_M x SG_N subgroups, each an (BM / SG_M) x
// (BN / SG_N) block of CM x CN accumulators; for each step of BK = 32 columns it loads the
// x and W tiles into shared memory once (rows padded by 8 halves, so that every row starts
// 16-byte aligned as coopMatLoad needs and rows fall on different banks), having fetched
// them into registers DEPTH steps before (the global loads overlap the products, as
// ggml-vulkan's mul_mm.comp and CUTLASS's pipelined mainloops do; a type that reads in two
// phases, weights.glsl WEIGHT_RAW4, is held as its words and dequantized at the store).
// Out-of-range tokens, rows and columns load as 0 (the tails of T, N and K); results are stored straight
// into y when a whole accumulator lies inside y and n_rows % 4 == 0 (the 16-byte alignment
// coopMatStore needs), else through a per-subgroup staging tile in shared memory, element by
// element with bounds. The workgroup must be SG_M * SG_N full subgroups (local_size_x =
// SG_M * SG_N * subgroup size; NVIDIA's subgroups are always 32 wide and full).
// Split K (SG_K > 1, for few tokens: the batched runner's decode products): the workgroup's
// subgroups form SG_K groups of SG_M x SG_N, each step covers SG_K * BK columns, and group g
// multiplies the g-th BK of them, so SG_K steps' loads are in flight where one was (a step
// waits on one memory latency; at 8-64 tokens the steps, not the products, set the time).
// The groups' accumulators are then added in the order g = 0, 1, ..., SG_K - 1 (a fixed
// order: deterministic; split-K as in CUTLASS's "serial split-K", kept inside one
// workgroup): for SG_K > 2, where they fit in the x and W tiles' shared memory, free after
// the last step, groups 0 .. SG_K - 2 store their elements there at once and the last group
// adds them in order (two barriers); else one accumulator at a time through the staging
// tiles (two barriers per group and accumulator). The same additions in the same order
// either way, so the same bits (bench/README.md, 2026-12-06, fifteenth session: 0.7-3% off
// the 32x32:2x2x8 decode tile's products; with SG_K = 2 the element-wise path lost).
// NBUF = 2: the x and W tiles are double-buffered in shared memory: step s's products read
// buffer s % 2 while its invocations store step s + 1's tiles (fetched DEPTH steps
// before) into the other, and one barrier per step ends both (the stores of step s + 1 go
// to the buffer step s - 1's products read, which all finished before the barrier ending
// step s - 1). NBUF = 1: one buffer, two barriers per step (every subgroup is done with
// the step before, then the stores are visible). The products and their order are the
// same either way, and so are the bits.
// Specialization constants: 0 = local_size_x, 1 = TM, 2 = TN, 3 = TK (the cooperative matrix
// shape; TK divides 32 and TM, TN, TK are multiples of 8), 4 = BM, 5 = BN (multiples of
// SG_M * TM and SG_N * TN), 6 = SG_M, 7 = SG_N, 8 = SG_K, 9 = NBUF (1 or 2; shared memory:
// NBUF * SG_K * (BM + BN) * 80 bytes of tiles, SG_M * SG_N * TM * TN * 4 of staging),
// 10 = DEPTH (steps fetched ahead into registers, 1 or more: (BM + BN) * SG_K * 32 * 4 /
// local_size_x bytes of registers per invocation and step; the products are the same).
// Split K across workgroups (n_splits > 1, for products of too few row tiles to fill the
// GPU, as each workgroup's steps run one after another; bench/README.md, 2026-12-05,
// eleventh session, has the measurement): the steps of BK * SG_K columns are cut into
// n_splits runs of ceil(steps / n_splits), workgroup (tile, y) takes run y % n_splits of
// token tile y / n_splits and writes its sum, not the output: partial p of token t goes to y row
// y_row0 + p * n_tokens + t, and sum_splits.comp adds the partials in the order p = 0, 1, ...
// (CUTLASS's "parallel split-K": a second kernel reduces; a fixed order, deterministic).
// n_splits = 1: the product as without the split, y rows y_row0 + t.
// Dispatch: (min(row tiles, limit_x), ceil(n_tokens / BM) * n_splits, ceil(row tiles /
// limit_x)) with row tiles = ceil(n_rows / BN): tiles past maxComputeWorkGroupCount.x spill
// into z. Push constants: n_cols, n_rows, n_tokens, token0 (the first token row of x the
// product covers: rows token0 .. token0 + n_tokens - 1; the batched runner's roles,
// vkrt/models/batch.py), y_row0 (y's row of the first token: token0, or 0 for partials),
// n_splits.
// The GLU build (GLU defined: matmul_coop_glu_<type>, vkrt/glsl/variants.json): y[t, n] =
// act(sum_k x[t, k] * Wg[n, k]) * sum_k x[t, k] * Wu[n, k], with Wg at binding 0 and Wu (up,
// the same type and shape) at binding 3; act is SiLU, or GELU-tanh where specialization
// constant 11 (GELU) is 1. A step's W tile is gate's BN rows then up's (WN = 2 * BN rows in
// shared memory), every subgroup multiplies the one x tile by both, and the activation is
// applied to the f32 accumulators before the store: gate, up and silu_mul in one dispatch,
// for the batched decode (vkrt/models/batch.py) and a prompt (vkrt/models/llama.py). n_splits
// must be 1.
// An output's sum is the same chains of coopMatMulAdd over the k steps in order (one chain
// per k group, the chains added in group order) whatever BM, BN, SG_M and SG_N are, so its
// bits depend on SG_K but not on the rest of the tile (the batched runner's batch
// invariance: its table keeps one SG_K; tests/test_kernels.py checks both where the device
// has the shape).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x_id = 0) in;
#include "weights.glsl"
#ifdef GLU
#include "gelu.glsl"
#define WEIGHT_BINDING 3
#define W_(name) name##_up
#include "weights.glsl"
#undef WEIGHT_BINDING
#undef W_
layout(constant_id = 11) const uint GELU = 0;
const uint G = 2;                         // products per output: gate (binding 0) and up
#else
const uint G = 1;
#endif
layout(constant_id = 1) const uint TM = 16;
layout(constant_id = 2) const uint TN = 16;
layout(constant_id = 3) const uint TK = 16;
layout(constant_id = 4) const uint BM = 64;
layout(constant_id = 5) const uint BN = 64;
layout(constant_id = 6) const uint SG_M = 2;
layout(constant_id = 7) const uint SG_N = 2;
layout(constant_id = 8) const uint SG_K = 1;
layout(constant_id = 9) const uint NBUF = 1;
layout(constant_id = 10) const uint DEPTH = 1;
layout(set = 0, binding = 1) readonly buffer X { vec4 x[]; };
layout(set = 0, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n_cols; uint n_rows; uint n_tokens; uint token0; uint y_row0; uint n_splits;
} pc;

const uint NT = gl_WorkGroupSize.x;
const uint BK = 32;                       // columns per step and group (a Q8_0 / Q4_1 block)
const uint KQ = SG_K * BK / 4;            // vec4 columns per step
const uint WN = G * BN;                   // rows of a step's W tile (GLU: gate's, then up's)
const uint XL = BM * KQ, WL = WN * KQ;    // vec4 of a step's x and W tiles
const uint XP = (XL + NT - 1) / NT, WP = (WL + NT - 1) / NT;   // per invocation
const uint S4 = (BK + 8) / 4;             // f16vec4 per shared row: 80 bytes
const uint SM = BM / SG_M, SN = BN / SG_N;  // one subgroup's tokens and rows
const uint CM = SM / TM, CN = SN / TN;    // its accumulators along tokens and rows
shared f16vec4 xs[NBUF * SG_K * BM * S4]; // [buffer][group][token][k]
shared f16vec4 ws[NBUF * SG_K * WN * S4]; // [buffer][group][row][k]: W^T column-major
shared float stage[SG_M * SG_N * TM * TN];

// Elements 4q .. 4q + 3 of row r of a step's W tile: gate's row n0 + r, or (GLU, r >= BN)
// up's row n0 + r - BN; where the type reads in two phases (WEIGHT_RAW4, weights.glsl), the
// registers hold its words (WREG) and w_value decodes them when the tile is stored, so that
// the loads stay in flight until then (dequantizing at the fetch waits on them at once);
// 0 words decode to 0.
#ifdef WEIGHT_RAW4
#define WREG WEIGHT_RAW_T
#define WREG_ZERO WEIGHT_RAW_ZERO
WREG w_tile4(uint n0, uint r, uint q) {
#ifdef GLU
    if (r >= BN) return raw4_up(n0 + r - BN, q, pc.n_cols);
#endif
    return raw4(n0 + r, q, pc.n_cols);
}
vec4 w_value(WREG v, uint q) { return decode4(v, 4 * q % WEIGHT_BLOCK); }
#else
#define WREG vec4
#define WREG_ZERO vec4(0.0)
WREG w_tile4(uint n0, uint r, uint q) {
#ifdef GLU
    if (r >= BN) return weight4_up(n0 + r - BN, q, pc.n_cols);
#endif
    return weight4(n0 + r, q, pc.n_cols);
}
vec4 w_value(WREG v, uint q) { return v; }
#endif

// Step k0's x and W tiles (vec4 columns k0 .. k0 + KQ - 1) into this invocation's registers.
// Element i of a step's x tile is token i / KQ, column quad i % KQ, which is group
// (i % KQ) / (BK / 4)'s; the W tile likewise by row.
void fetch(out vec4 xr[XP], out WREG wr[WP], uint k0, uint t0, uint n0, uint cols4) {
    [[unroll]] for (uint p = 0; p < XP; ++p) {
        uint i = gl_LocalInvocationID.x + p * NT, t = i / KQ, q = k0 + i % KQ;
        xr[p] = i < XL && t0 + t < pc.n_tokens && q < cols4
                ? x[(pc.token0 + t0 + t) * cols4 + q] : vec4(0.0);
    }
    [[unroll]] for (uint p = 0; p < WP; ++p) {
        uint i = gl_LocalInvocationID.x + p * NT, r = i / KQ, q = k0 + i % KQ;
        wr[p] = i < WL && n0 + r % BN < pc.n_rows && q < cols4 ? w_tile4(n0, r, q) : WREG_ZERO;
    }
}

// The registers' tiles of the step from vec4 column k0 into shared buffer `buf`, rounded to
// f16 (a two-phase type's words decoded at their column: k0 + q, whose place in the block
// a 256-element block needs); in shared memory each group's columns are a tile of their
// own: [buffer][group][token or row][k].
void store(vec4 xr[XP], WREG wr[WP], uint buf, uint k0) {
    [[unroll]] for (uint p = 0; p < XP; ++p) {
        uint i = gl_LocalInvocationID.x + p * NT, q = i % KQ;
        if (i < XL)
            xs[((buf * SG_K + q / (BK / 4)) * BM + i / KQ) * S4 + q % (BK / 4)] = f16vec4(xr[p]);
    }
    [[unroll]] for (uint p = 0; p < WP; ++p) {
        uint i = gl_LocalInvocationID.x + p * NT, q = i % KQ;
        if (i < WL)
            ws[((buf * SG_K + q / (BK / 4)) * WN + i / KQ) * S4 + q % (BK / 4)]
                = f16vec4(w_value(wr[p], k0 + q));
    }
}

// The x and W tiles' shared memory as floats after the last step (the split's reduction):
// float j is half j % 2 of f16vec4 j / 2 of xs, then of ws, its bits moved unchanged.
const uint XS_N = NBUF * SG_K * BM * S4, WS_N = NBUF * SG_K * WN * S4;
void tile_float_store(uint j, float v) {
    f16vec2 h = unpackFloat2x16(floatBitsToUint(v));
    uint k = j / 2;
    if (k < XS_N) {
        if (j % 2 == 0) xs[k].xy = h; else xs[k].zw = h;
    } else {
        if (j % 2 == 0) ws[k - XS_N].xy = h; else ws[k - XS_N].zw = h;
    }
}
float tile_float_load(uint j) {
    uint k = j / 2;
    f16vec4 v = k < XS_N ? xs[k] : ws[k - XS_N];
    return uintBitsToFloat(packFloat2x16(j % 2 == 0 ? v.xy : v.zw));
}

void main() {
    uint tile = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
    uint split = gl_WorkGroupID.y % pc.n_splits;
    uint n0 = tile * BN, t0 = gl_WorkGroupID.y / pc.n_splits * BM;
    if (n0 >= pc.n_rows) return;  // uniform per workgroup
    uint cols4 = pc.n_cols / 4;
    // This workgroup's run of steps: vec4 columns kb .. ke - 1 (all of them unsplit)
    uint run = (cols4 + KQ - 1) / KQ;
    run = (run + pc.n_splits - 1) / pc.n_splits * KQ;
    uint kb = min(split * run, cols4), ke = min(kb + run, cols4);
    uint yr0 = pc.y_row0 + split * pc.n_tokens;   // y's row of token 0
    uint sg = gl_SubgroupID, g = sg / (SG_M * SG_N), sr = sg % (SG_M * SG_N);
    uint sm0 = sr / SG_N * SM, sn0 = sr % SG_N * SN;
    coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> acc[G * CM * CN];
    [[unroll]] for (uint i = 0; i < G * CM * CN; ++i)
        acc[i] = coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0.0);
    // The next DEPTH steps' x and W are fetched into registers while this step's products
    // run (loads in flight across the products and barriers: a register ring of DEPTH
    // steps); every loop runs to specialization constants and is unrolled, so the
    // accumulators and buffers stay in registers.
    vec4 xr[DEPTH][XP];
    WREG wr[DEPTH][WP];
    [[unroll]] for (uint d = 0; d < DEPTH; ++d)
        if (kb + d * KQ < ke) fetch(xr[d], wr[d], kb + d * KQ, t0, n0, cols4);
    if (NBUF == 2) {
        store(xr[0], wr[0], 0, kb);
        barrier();
    }
    // Step s = (k0 - kb) / KQ + d of the run is in registers slot d = s % DEPTH (k0 steps by
    // DEPTH steps, d is constant after unrolling), and its slot is refilled with step
    // s + DEPTH once stored.
    for (uint k0 = kb, s0 = 0; k0 < ke; k0 += DEPTH * KQ, s0 += DEPTH) {
        [[unroll]] for (uint d = 0; d < DEPTH; ++d) {
            uint ks = k0 + d * KQ, s = s0 + d;
            if (ks >= ke) break;          // uniform per workgroup
            uint kf = ks + DEPTH * KQ;    // the step this slot fetches next
            if (NBUF == 1) {
                barrier();                // every subgroup is done with the last step's tiles
                store(xr[d], wr[d], 0, ks);
                barrier();
                if (kf < ke) fetch(xr[d], wr[d], kf, t0, n0, cols4);
            } else if (kf < ke) {
                fetch(xr[d], wr[d], kf, t0, n0, cols4);   // step s was stored a step ago
            }
            uint xb = (s % NBUF) * SG_K * BM, wb = (s % NBUF) * SG_K * WN;
            [[unroll]] for (uint kk = 0; kk < BK / TK; ++kk) {
                coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB> b[G * CN];
                [[unroll]] for (uint j = 0; j < G * CN; ++j)   // product j / CN's
                    coopMatLoad(b[j], ws, (wb + g * WN + j / CN * BN + sn0 + j % CN * TN) * S4
                                          + kk * TK / 4, S4,
                                gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0; i < CM; ++i) {
                    coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA> a;
                    coopMatLoad(a, xs, (xb + g * BM + sm0 + i * TM) * S4 + kk * TK / 4, S4,
                                gl_CooperativeMatrixLayoutRowMajor);
                    [[unroll]] for (uint j = 0; j < G * CN; ++j)
                        acc[j / CN * CM * CN + i * CN + j % CN] = coopMatMulAdd(
                            a, b[j], acc[j / CN * CM * CN + i * CN + j % CN]);
                }
            }
            if (NBUF == 2) {
                uint dn = (d + 1) % DEPTH;   // step s + 1's slot
                if (ks + KQ < ke) store(xr[dn], wr[dn], (s + 1) % 2, ks + KQ);
                barrier();                // the next step's tiles stored; this step's read
            }
        }
    }
    // Split K: the groups' sums added in the order g = 0, 1, ..., SG_K - 1 into the last
    // group's accumulators, which are the outputs. Element e of accumulator i of lane `lane`
    // is the same output in every group (one type, one layout), so for SG_K > 2, where the
    // other groups' elements fit in the tiles' memory (uniform), each stores its own at once
    // (loops unrolled: an element indexed at run time moves the accumulators out of
    // registers, 16-70% slower in the same measurement), as float
    // (((g * SG_M * SG_N + sr) * G * CM * CN + i) * L + e) * subgroup size + lane.
    uint L = uint(acc[0].length()), NA = G * CM * CN;
    bool in_tiles = SG_K > 2
                    && (SG_K - 1) * SG_M * SG_N * NA * L * gl_SubgroupSize <= 2 * (XS_N + WS_N);
    if (in_tiles) {
        barrier();                        // every subgroup is done with the last step's tiles
        uint j0 = (g * SG_M * SG_N + sr) * NA * L * gl_SubgroupSize + gl_SubgroupInvocationID;
        if (g < SG_K - 1)
            [[unroll]] for (uint i = 0; i < NA; ++i)
                [[unroll]] for (uint e = 0; e < uint(acc[i].length()); ++e)
                    tile_float_store(j0 + (i * L + e) * gl_SubgroupSize, acc[i][e]);
        barrier();
        if (g == SG_K - 1) {
            uint j1 = sr * NA * L * gl_SubgroupSize + gl_SubgroupInvocationID;
            uint gs = SG_M * SG_N * NA * L * gl_SubgroupSize;   // floats per group
            [[unroll]] for (uint i = 0; i < NA; ++i)
                [[unroll]] for (uint e = 0; e < uint(acc[i].length()); ++e) {
                    uint j = j1 + (i * L + e) * gl_SubgroupSize;
                    float s = tile_float_load(j);
                    [[unroll]] for (uint gg = 1; gg < SG_K - 1; ++gg)
                        s = s + tile_float_load(j + gg * gs);
                    acc[i][e] = s + acc[i][e];
                }
        }
    }
    // Else group gg - 1 leaves the sum of groups 0 .. gg - 1 in `stage`, one accumulator of
    // each subgroup at a time, and group gg adds its own to it.
    if (!in_tiles) {                      // (SG_K = 1: no loop)
        [[unroll]] for (uint gg = 1; gg < SG_K; ++gg) {
            [[unroll]] for (uint i = 0; i < G * CM * CN; ++i) {
                if (g == gg - 1)
                    coopMatStore(acc[i], stage, sr * TM * TN, TN,
                                 gl_CooperativeMatrixLayoutRowMajor);
                barrier();                // uniform: the sum so far is in `stage`
                if (g == gg) {
                    coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> s;
                    coopMatLoad(s, stage, sr * TM * TN, TN, gl_CooperativeMatrixLayoutRowMajor);
                    acc[i] = s + acc[i];
                }
                barrier();                // group gg has read `stage` before it is written
            }
        }
    }
    if (g != SG_K - 1) return;            // uniform per subgroup
#ifdef GLU
    // act(gate) * up, element by element: both accumulators hold their elements alike.
    [[unroll]] for (uint i = 0; i < CM * CN; ++i)
        for (uint e = 0; e < acc[i].length(); ++e) {
            float gv = acc[i][e];
            acc[i][e] = (GELU != 0 ? gelu_tanh(gv) : gv / (1.0 + exp(-gv))) * acc[CM * CN + i][e];
        }
#endif
    uint lane = gl_SubgroupInvocationID, base = sr * TM * TN;
    [[unroll]] for (uint i = 0; i < CM; ++i) {
        uint t = t0 + sm0 + i * TM;
        [[unroll]] for (uint j = 0; j < CN; ++j) {
            uint n = n0 + sn0 + j * TN;
            if (t >= pc.n_tokens || n >= pc.n_rows) continue;   // uniform per subgroup
            if (t + TM <= pc.n_tokens && n + TN <= pc.n_rows && pc.n_rows % 4 == 0) {
                coopMatStore(acc[i * CN + j], y, (yr0 + t) * pc.n_rows + n, pc.n_rows,
                             gl_CooperativeMatrixLayoutRowMajor);
                continue;
            }
            coopMatStore(acc[i * CN + j], stage, base, TN, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint e = lane; e < TM * TN; e += gl_SubgroupSize) {
                uint dt = e / TN, dn = e % TN;
                if (t + dt < pc.n_tokens && n + dn < pc.n_rows)
                    y[(yr0 + t + dt) * pc.n_rows + n + dn] = stage[base + e];
            }
            subgroupBarrier();            // the tile is read before the next store
        }
    }
}
