#version 450
// Decode attention split over the KV cache (flash-decoding: Dao et al. 2023, "Flash-Decoding
// for long-context inference"): one query token at position pos0 attends to cache positions
// 0 ..= pos0, cut into splits of `chunk` positions; workgroup (h, s) runs the online softmax
// of attention.comp over split s for query head h and writes its partial state, which
// attention_combine.comp merges. One workgroup per head (attention.comp) leaves most of a
// large GPU idle at decode; heads x splits fill it.
// q: [n_heads, head_dim] f32 (after RoPE); k_cache, v_cache: [n_ctx, n_kv_heads, head_dim] f32;
// part: [n_heads, n_splits, head_dim + 2] f32: acc[0..head_dim) = sum_p w_p * v_p (not yet
// divided), then m (the split's largest score) and l = sum_p w_p, with w_p = exp(s_p - m)
// (the weight() of attention.comp: no NaN from infinite scores).
// local_size_x must equal head_dim, a multiple of 4. Dispatch: (n_heads, n_splits, 1) with
// n_splits = ceil((pos0 + 1) / chunk), so every split holds at least one position.
// Latency, not bandwidth, bounds this kernel at decode: every loop runs to the workgroup size
// (a specialization constant), so the compiler unrolls it and the loads of a block are in
// flight together (a loop to a push-constant bound issued one dependent load per trip).
// A position is scored by LANES consecutive invocations (specialization constant 2; a power
// of two dividing head_dim / 4 and at most the subgroup size, kernels.split_score_lanes):
// lane i takes the vec4 columns i, i + LANES, ... of the K row, so each load of a subgroup
// covers LANES adjacent vec4 of a row (where one invocation per row, the rows
// n_kv_heads * head_dim apart, touched one sector per invocation), and the lanes' partial
// dots are added by a
// shuffle tree (subgroupShuffleXor over LANES / 2, ..., 1) in a fixed order, so every lane
// holds the same sum. A block of head_dim positions takes LANES such passes; the scores go
// through shared memory to the invocation of their position, which computes its weight once
// for the block.
// Push constants: n_heads, n_kv_heads, head_dim, pos0, chunk (u32), scale (f32).
// Specialization constant 1 WINDOW (as attention.comp): W > 0 attends to the last W
// positions only; splits wholly before them write an empty state.
// Variant attention_split_pos (POS_BUFFER): binding 4 holds a u32 added to pos0 (replay); the
// grid is then sized for the longest position and splits past the query's position write an
// empty state (m = -inf, l = 0), which the merge weighs 0.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "reduce.glsl"
#include "kv.glsl"
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { KV_T4 k_cache[]; };
layout(set = 0, binding = 2) readonly buffer V { KV_T v_cache[]; };
layout(set = 0, binding = 3) writeonly buffer Part { float part[]; };
layout(push_constant) uniform Push {
    uint n_heads; uint n_kv_heads; uint head_dim; uint pos0; uint chunk; float scale;
} pc;
#ifdef POS_BUFFER
layout(set = 0, binding = 4) readonly buffer Pos { uint pos_buf[]; };
#endif
layout(constant_id = 1) const uint WINDOW = 0;
layout(constant_id = 2) const uint LANES = 1;
const uint B = gl_WorkGroupSize.x;   // == head_dim
const uint SLOTS = B / LANES;        // positions scored per pass
shared vec4 q_s[B / 4];
shared float s_s[B];
shared float w_s[B];

#include "inf.glsl"

float weight(float s, float mx) {
    if (mx == NEG_INF) return 0.0;
    return s == mx ? 1.0 : exp(s - mx);
}

void main() {
    uint h = gl_WorkGroupID.x, split = gl_WorkGroupID.y, d = gl_LocalInvocationID.x;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint row = pc.n_kv_heads * B;
#ifdef POS_BUFFER
    uint pos0 = pc.pos0 + pos_buf[0];
#else
    uint pos0 = pc.pos0;
#endif
    // inclusive; last < first (nothing to do) for a split past the query's position
    uint first = split * pc.chunk, last = min(first + pc.chunk - 1, pos0);
    if (WINDOW != 0 && pos0 >= WINDOW) first = max(first, pos0 + 1 - WINDOW);
    q_s[d / 4][d % 4] = q[h * B + d] * pc.scale;
    barrier();
    float m = NEG_INF, l = 0.0, acc = 0.0;
    uint lane = d % LANES, slot = d / LANES;
    for (uint base = first; base <= last; base += B) {   // uniform: every invocation runs it
        [[unroll]] for (uint r = 0; r < LANES; ++r) {
            uint i = r * SLOTS + slot, p = min(base + i, last);   // a row the cache holds
            uint k0 = (p * row + kvh * B) / 4 + lane;
            float part_dot = 0.0;
            [[unroll]] for (uint j = 0; j < B / 4; j += LANES)
                part_dot += dot(q_s[j + lane], vec4(k_cache[k0 + j]));
            [[unroll]] for (uint o = LANES / 2; o > 0; o /= 2)
                part_dot += subgroupShuffleXor(part_dot, o);
            if (lane == 0) s_s[i] = part_dot;
        }
        barrier();
        float s = base + d <= last ? s_s[d] : NEG_INF;
        float block_max = max(m, workgroup_max(s));
        float e = weight(s, block_max);        // 0 past `last`
        w_s[d] = e;
        float correction = weight(m, block_max);
        l = l * correction + workgroup_sum(e);
        acc *= correction;
        barrier();
        // Rows past `last` weigh 0; their index is clamped to `last` (a row the cache holds).
        uint v0 = kvh * B + d;
        for (uint j = 0; j < B; ++j) acc += w_s[j] * float(v_cache[min(base + j, last) * row + v0]);
        m = block_max;
        barrier();
    }
    uint o = (h * gl_NumWorkGroups.y + split) * (B + 2);
    part[o + d] = acc;
    if (d == 0) {
        part[o + B] = m;
        part[o + B + 1] = l;
    }
}
