#version 450
// Decode attention split over the KV cache (flash-decoding: Dao et al. 2023, "Flash-Decoding
// for long-context inference"), one workgroup per KV head and split: one query token at
// position pos0 attends to cache positions 0 ..= pos0, cut into splits of `chunk` positions;
// workgroup (kvh, s) runs the online softmax (Milakov & Gimelshein 2018) over split s for the
// GROUP query heads kvh * GROUP .. kvh * GROUP + GROUP - 1 that share KV head kvh
// (grouped-query attention: n_heads = n_kv_heads * GROUP), so each K and V row of the split
// is read once for all of them, and writes their partial states, which
// attention_combine.comp merges. One workgroup per query head reading its whole cache
// (attention_decode.comp) streams a head's K and V through one SM; KV heads x splits spread
// them over the GPU.
// q: [n_heads, head_dim] f32 (after RoPE); k_cache, v_cache: [n_ctx, n_kv_heads, head_dim] f32,
// or f16 in the `_kvf16` variants (kv.glsl); part: [n_heads, n_splits, head_dim + 2] f32:
// acc[0..head_dim) = sum_p w_p * v_p (not yet divided), then m (the split's largest score)
// and l = sum_p w_p, with w_p = weight(s_p, m) (as attention.comp: -inf weighs 0, an all
// -inf split has m = -inf and l = 0, +inf scores share the weight).
// The workgroup takes its split in passes of BLOCK positions, three phases each:
// - scores: LANES consecutive invocations score one position (a power of two dividing
//   HEAD_DIM / 4, at most the subgroup size, kernels.split_score_lanes): lane i reads the
//   vec4 columns i, i + LANES, ... of the K row once and dots them with every head's q;
//   each head's partial dots are added by a shuffle tree (subgroupShuffleXor over
//   LANES / 2, ..., 1: the same sum on every lane, a fixed order) into shared memory;
// - softmax: invocation (head r, position j) finds the head's new maximum over the pass's
//   scores and writes weight(s, m); the head's first invocation also rescales its running
//   sum l by c = weight(m_old, m) and adds the pass's weights (the same function of the
//   same inputs, so the same bits);
// - V: invocation (plane, g) weighs vec4 g of the rows plane, plane + PLANES, ... of the
//   pass for every head (acc = acc * c + sum w v), PLANES consecutive invocations sharing g;
//   after the last pass the planes' sums are added by a shuffle tree over PLANES (a power of
//   two, at most the subgroup size).
// Every loop but the passes' runs to specialization constants and is unrolled, so a pass's
// loads are in flight together. Two barriers per pass: after the scores, after the weights.
// The next pass overwrites the scores only once every invocation is past this pass's second
// barrier (done reading them), and the weights and c only past its own first barrier (every
// invocation done with this pass's V); the running maxima alternate between two slots by
// pass, so none is written while another invocation reads it.
// Rows past `last` in a pass score -inf and weigh 0; their index is clamped to `last` (a row
// the cache holds).
// Specialization constants: 0 = local_size_x (HEAD_DIM / 4 * PLANES), 1 = WINDOW (W > 0:
// only the last W positions, a sliding-window layer; splits wholly before them write an
// empty state), 2 = LANES, 3 = PLANES, 4 = GROUP, 5 = HEAD_DIM (a multiple of 4).
// BLOCK = local_size_x / LANES positions per pass; the host's chunk is a multiple of it
// (kernels.attention_chunk). Dispatch: (n_kv_heads, n_splits, 1) with n_splits =
// ceil((pos0 + 1) / chunk), so every split holds at least one position.
// Push constants: n_kv_heads, pos0, chunk (u32), scale (f32).
// Variant attention_split_pos (POS_BUFFER): binding 4 holds a u32 added to pos0 (replay); the
// grid is then sized for the longest position and splits past the query's position write an
// empty state (m = -inf, l = 0), which the merge weighs 0.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x_id = 0) in;
#include "kv.glsl"
layout(set = 0, binding = 0) readonly buffer Q { vec4 q[]; };
layout(set = 0, binding = 1) readonly buffer K { KV_T4 k_cache[]; };
layout(set = 0, binding = 2) readonly buffer V { KV_T4 v_cache[]; };
layout(set = 0, binding = 3) writeonly buffer Part { float part[]; };
layout(push_constant) uniform Push { uint n_kv_heads; uint pos0; uint chunk; float scale; } pc;
#ifdef POS_BUFFER
layout(set = 0, binding = 4) readonly buffer Pos { uint pos_buf[]; };
#endif
layout(constant_id = 1) const uint WINDOW = 0;
layout(constant_id = 2) const uint LANES = 1;
layout(constant_id = 3) const uint PLANES = 1;
layout(constant_id = 4) const uint GROUP = 1;
layout(constant_id = 5) const uint HEAD_DIM = 64;
const uint T = gl_WorkGroupSize.x;   // == HEAD_DIM / 4 * PLANES
const uint G = HEAD_DIM / 4;         // vec4 per row of a head
const uint BLOCK = T / LANES;        // positions per pass
const uint KR = G / LANES;           // vec4 of a K row per lane; V rows per plane and pass
const uint GB = GROUP * BLOCK;
shared vec4 q_s[GROUP * G];          // [head][vec4], scaled
shared float s_s[GB];                // the pass's scores, [head][position]
shared float w_s[GB];                // their weights
shared float m_s[2 * GROUP];         // running maxima, [pass parity][head]
shared float l_s[GROUP];             // running sums of weights
shared float c_s[GROUP];             // the pass's rescaling of acc and l

#include "inf.glsl"

float weight(float s, float mx) {
    if (mx == NEG_INF) return 0.0;
    return s == mx ? 1.0 : exp(s - mx);
}

void main() {
    uint kvh = gl_WorkGroupID.x, split = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    uint h0 = kvh * GROUP;                          // this workgroup's first query head
    uint row = pc.n_kv_heads * G, head = kvh * G;   // in vec4s
#ifdef POS_BUFFER
    uint pos0 = pc.pos0 + pos_buf[0];
#else
    uint pos0 = pc.pos0;
#endif
    // inclusive; last < first (nothing to do) for a split past the query's position
    uint first = split * pc.chunk, last = min(first + pc.chunk - 1, pos0);
    if (WINDOW != 0 && pos0 >= WINDOW) first = max(first, pos0 + 1 - WINDOW);
    for (uint i = t; i < GROUP * G; i += T) q_s[i] = q[h0 * G + i] * pc.scale;
    for (uint r = t; r < GROUP; r += T) {
        m_s[r] = NEG_INF;
        l_s[r] = 0.0;
    }
    barrier();
    uint lane = t % LANES, slot = t / LANES;    // scores: position slot, columns lane + LANES j
    uint plane = t % PLANES, g = t / PLANES;    // V: vec4 g of rows plane + PLANES j
    vec4 acc[GROUP];
    [[unroll]] for (uint r = 0; r < GROUP; ++r) acc[r] = vec4(0.0);
    uint pass = 0;
    for (uint base = first; base <= last; base += BLOCK, ++pass) {   // uniform
        uint k0 = min(base + slot, last) * row + head + lane;
        vec4 k[KR];
        [[unroll]] for (uint j = 0; j < KR; ++j) k[j] = vec4(k_cache[k0 + j * LANES]);
        [[unroll]] for (uint r = 0; r < GROUP; ++r) {
            float d = 0.0;
            [[unroll]] for (uint j = 0; j < KR; ++j) d += dot(q_s[r * G + lane + j * LANES], k[j]);
            [[unroll]] for (uint o = LANES / 2; o > 0; o /= 2) d += subgroupShuffleXor(d, o);
            if (lane == r % LANES) s_s[r * BLOCK + slot] = base + slot <= last ? d : NEG_INF;
        }
        barrier();                      // the pass's scores are in s_s
        uint cur = pass % 2 * GROUP, nxt = (pass + 1) % 2 * GROUP;
        for (uint i = t; i < GB; i += T) {
            uint r = i / BLOCK, j0 = r * BLOCK;
            float mx = m_s[cur + r];
            [[unroll]] for (uint j = 0; j < BLOCK; ++j) mx = max(mx, s_s[j0 + j]);
            w_s[i] = weight(s_s[i], mx);
            if (i == j0) {
                float l = 0.0;
                [[unroll]] for (uint j = 0; j < BLOCK; ++j) l += weight(s_s[j0 + j], mx);
                float c = weight(m_s[cur + r], mx);
                l_s[r] = l_s[r] * c + l;
                c_s[r] = c;
                m_s[nxt + r] = mx;
            }
        }
        barrier();                      // the weights, c and the new maxima are in place
        [[unroll]] for (uint r = 0; r < GROUP; ++r) acc[r] *= c_s[r];
        [[unroll]] for (uint j = 0; j < KR; ++j) {
            uint p = plane + j * PLANES;
            vec4 v = vec4(v_cache[min(base + p, last) * row + head + g]);
            [[unroll]] for (uint r = 0; r < GROUP; ++r) acc[r] += w_s[r * BLOCK + p] * v;
        }
    }
    uint n_splits = gl_NumWorkGroups.y;
    [[unroll]] for (uint r = 0; r < GROUP; ++r) {
        [[unroll]] for (uint o = PLANES / 2; o > 0; o /= 2) acc[r] += subgroupShuffleXor(acc[r], o);
        if (plane == r % PLANES) {
            uint o = ((h0 + r) * n_splits + split) * (HEAD_DIM + 2) + 4 * g;
            part[o] = acc[r].x;
            part[o + 1] = acc[r].y;
            part[o + 2] = acc[r].z;
            part[o + 3] = acc[r].w;
        }
    }
    for (uint r = t; r < GROUP; r += T) {   // m_s and l_s as the last pass left them
        uint o = ((h0 + r) * n_splits + split) * (HEAD_DIM + 2) + HEAD_DIM;
        part[o] = m_s[pass % 2 * GROUP + r];
        part[o + 1] = l_s[r];
    }
}
