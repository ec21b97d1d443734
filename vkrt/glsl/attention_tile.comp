#version 450
// Causal scaled-dot-product attention with grouped-query heads for prefill, on tiles of query
// tokens (the loop order of FlashAttention-2, Dao 2023: a tile of queries stays in registers
// while tiles of keys and values stream through shared memory). Same contract as
// attention.comp: query token t sits at position pos0 + t and attends to cache positions
// 0 ..= pos0 + t (the last WINDOW of them when WINDOW > 0); query head h reads KV head
// h / (n_heads / n_kv_heads).
// q: [n_tokens, n_heads, head_dim] f32 (after RoPE); k_cache, v_cache: [n_ctx, n_kv_heads,
// head_dim] f32, or f16 in the `_kvf16` variant (kv.glsl); out: [n_tokens, n_heads,
// head_dim] f32. head_dim % 4 == 0.
// Workgroup (h, tile) owns QT consecutive query tokens of head h. LQ = local_size_x / QT
// consecutive invocations own one query, lane i of them the vec4 columns i, i + LQ, ... of
// its q and of its output (interleaved: the LQ lanes of a query read LQ adjacent vec4 of a
// shared K or V row, distinct banks, and the queries of a subgroup read the same addresses,
// a broadcast). For each tile of KT cache positions, K and V rows are staged in shared memory
// once for the QT queries; each query scores the tile (its lanes' partial dots added by a
// shuffle tree, subgroupShuffleXor over LQ / 2, ..., 1, in a fixed order, so its lanes hold
// the same score), then updates its online softmax (Milakov & Gimelshein 2018) once per
// tile: m the largest score so far, l = sum weight(s, m), acc = sum weight(s, m) * v. No
// reduction spans the workgroup (attention.comp runs two per block of positions per token),
// and each staged K and V element serves QT queries.
// Specialization constants: 0 = local_size_x (QT * LQ; LQ a power of two dividing
// head_dim / 4, at most the subgroup size, and a query's lanes in one subgroup: invocations
// fill subgroups in order of gl_LocalInvocationID.x, as on every driver vkrt runs on),
// 1 = WINDOW (as attention.comp), 2 = HEAD_DIM, 3 = QT, 4 = KT (2 * KT * HEAD_DIM * 4 bytes of
// shared memory). Dispatch: (n_heads, query tiles over y and z (grid.glsl)),
// tiles = ceil(n_tokens / QT). Push constants: n_heads, n_kv_heads, head_dim, pos0, n_tokens
// (u32), scale (f32).
// Numerics: every product and sum in f32; the scores and weights are attention.comp's
// functions of the same inputs, summed in another order (per tile of KT positions, not per
// block of head_dim), so the two kernels agree to rounding, not bit for bit. Infinite and
// NaN scores behave as in attention.comp (weight(): -inf weighs 0, a row all -inf gives
// zeros, a NaN score gives NaN).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x_id = 0) in;
#include "grid.glsl"
#include "kv.glsl"
layout(set = 0, binding = 0) readonly buffer Q { vec4 q[]; };
layout(set = 0, binding = 1) readonly buffer K { KV_T4 k_cache[]; };
layout(set = 0, binding = 2) readonly buffer V { KV_T4 v_cache[]; };
layout(set = 0, binding = 3) writeonly buffer Out { vec4 dst[]; };
layout(push_constant) uniform Push {
    uint n_heads; uint n_kv_heads; uint head_dim; uint pos0; uint n_tokens; float scale;
} pc;
layout(constant_id = 1) const uint WINDOW = 0;
layout(constant_id = 2) const uint HEAD_DIM = 64;
layout(constant_id = 3) const uint QT = 32;
layout(constant_id = 4) const uint KT = 32;
const uint NT = gl_WorkGroupSize.x;
const uint LQ = NT / QT;             // lanes per query
const uint D4 = HEAD_DIM / 4;        // vec4 columns of a row
const uint DL = D4 / LQ;             // vec4 columns per lane
shared vec4 k_s[KT * D4];
shared vec4 v_s[KT * D4];

#include "inf.glsl"

// exp(s - mx) for s <= mx, without NaN when both are infinite (attention.comp's weight()).
float weight(float s, float mx) {
    if (mx == NEG_INF) return 0.0;
    return s == mx ? 1.0 : exp(s - mx);
}

void main() {
    uint h = gl_WorkGroupID.x, t0 = token_index() * QT, tid = gl_LocalInvocationID.x;
    if (t0 >= pc.n_tokens) return;                       // uniform per workgroup
    // Queries past the last token repeat it and store nothing.
    uint lane = tid % LQ, t = min(t0 + tid / LQ, pc.n_tokens - 1);
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint row4 = pc.n_kv_heads * D4;                      // vec4 per cache position
    uint last = pc.pos0 + t;                             // this query's positions, inclusive
    uint first = WINDOW != 0 && last >= WINDOW ? last + 1 - WINDOW : 0;
    // The tile's positions: from its first query's first to its last query's last.
    uint t1 = min(t0 + QT, pc.n_tokens) - 1;
    uint lo = WINDOW != 0 && pc.pos0 + t0 >= WINDOW ? pc.pos0 + t0 + 1 - WINDOW : 0;
    uint hi = pc.pos0 + t1;
    vec4 qv[DL], acc[DL];
    [[unroll]] for (uint i = 0; i < DL; ++i) {
        qv[i] = q[(t * pc.n_heads + h) * D4 + i * LQ + lane] * pc.scale;
        acc[i] = vec4(0.0);
    }
    float m = NEG_INF, l = 0.0;
    for (uint base = lo; base <= hi; base += KT) {       // uniform per workgroup
        barrier();                                       // the last tile is consumed
        // Rows past `hi` load row `hi` (one the cache holds); no query weighs them.
        [[unroll]] for (uint r = 0; r < (KT * D4 + NT - 1) / NT; ++r) {
            uint e = tid + r * NT;
            if (e >= KT * D4) break;
            uint o = min(base + e / D4, hi) * row4 + kvh * D4 + e % D4;
            k_s[e] = vec4(k_cache[o]);
            v_s[e] = vec4(v_cache[o]);
        }
        barrier();
        float s[KT];
        float tile_max = m;
        [[unroll]] for (uint j = 0; j < KT; ++j) {
            float dot_part = 0.0;
            [[unroll]] for (uint i = 0; i < DL; ++i)
                dot_part += dot(qv[i], k_s[j * D4 + i * LQ + lane]);
            [[unroll]] for (uint o = LQ / 2; o > 0; o /= 2)
                dot_part += subgroupShuffleXor(dot_part, o);
            uint p = base + j;
            s[j] = p >= first && p <= last ? dot_part : NEG_INF;
            tile_max = max(tile_max, s[j]);
        }
        float correction = weight(m, tile_max);
        l *= correction;
        [[unroll]] for (uint i = 0; i < DL; ++i) acc[i] *= correction;
        [[unroll]] for (uint j = 0; j < KT; ++j) {
            float w = weight(s[j], tile_max);            // 0 outside first ..= last
            l += w;
            [[unroll]] for (uint i = 0; i < DL; ++i) acc[i] += w * v_s[j * D4 + i * LQ + lane];
        }
        m = tile_max;
    }
    if (t0 + tid / LQ >= pc.n_tokens) return;            // after the last barrier
    [[unroll]] for (uint i = 0; i < DL; ++i)
        dst[(t * pc.n_heads + h) * D4 + i * LQ + lane] = l > 0.0 ? acc[i] / l : vec4(0.0);
}
