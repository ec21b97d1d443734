#version 450
// Decode attention in one dispatch: one query token at position pos0 attends to cache
// positions 0 ..= pos0, DIM_SPLITS workgroups per query head, the whole softmax in shared
// memory. Split attention (attention_split.comp + attention_combine.comp) takes two
// dependent dispatches; this kernel takes one and fills each workgroup instead: groups of up
// to 4 invocations score a position (vec4 loads of one K row, added with subgroup shuffles),
// then the workgroup weighs V with (position lane, vec4 of dims) invocations and sums the
// lanes in a tree. Every workgroup of a head scores all of its positions and weighs V for
// its share of the head's dims: one workgroup reads all of a head's cache through one SM, so
// its time grows with the context; the split spreads it. Needs subgroups of at least 4
// invocations and the scores of every position in shared memory: the host uses it only then,
// and while the cache holds at most MAX_POSITIONS positions (vkrt/kernels.py: the crossover).
// q: [n_heads, head_dim] f32 (after RoPE); k_cache, v_cache: [n_ctx, n_kv_heads, head_dim] f32;
// out: [n_heads, head_dim] f32 = sum_p w_p v_p / sum_p w_p, w_p = exp(s_p - max_p s_p) with
// the weight() of attention.comp (an all -inf row gives zeros, +inf scores share the weight).
// Specialization constants: 0 = local_size_x (a multiple of head_dim / 4), 1 = HEAD_DIM (a
// multiple of 4), 2 = MAX_POSITIONS (pos0 + 1 must not exceed it), 3 = DIM_SPLITS (dividing
// head_dim / 4), 4 = WINDOW (0: every position; W > 0: only the last W, a sliding-window
// layer as attention.comp; the scores before them are -inf). Dispatch: (n_heads, DIM_SPLITS, 1).
// Push constants: n_heads, n_kv_heads, pos0 (u32), scale (f32).
// Variant attention_decode_pos (POS_BUFFER): binding 4 holds a u32 added to pos0 (replay).
#extension GL_GOOGLE_include_directive : require
#include "reduce.glsl"
#include "kv.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
layout(constant_id = 1) const uint HEAD_DIM = 64;
layout(constant_id = 2) const uint MAX_POSITIONS = 1024;
layout(constant_id = 3) const uint DIM_SPLITS = 1;
layout(constant_id = 4) const uint WINDOW = 0;
layout(set = 0, binding = 0) readonly buffer Q { vec4 q[]; };
layout(set = 0, binding = 1) readonly buffer K { KV_T4 k_cache[]; };
layout(set = 0, binding = 2) readonly buffer V { KV_T4 v_cache[]; };
layout(set = 0, binding = 3) writeonly buffer Out { vec4 dst[]; };
layout(push_constant) uniform Push { uint n_heads; uint n_kv_heads; uint pos0; float scale; } pc;
#ifdef POS_BUFFER
layout(set = 0, binding = 4) readonly buffer Pos { uint pos_buf[]; };
#endif
const uint T = gl_WorkGroupSize.x;
const uint G = HEAD_DIM / 4;          // vec4s per row of a head
const uint GV = G / DIM_SPLITS;       // vec4s of a V row this workgroup weighs
const uint LANES = T / GV;            // positions weighed at once in the V pass
const uint UNROLL = 16;
const uint C = G % 4 == 0 ? 4 : (G % 2 == 0 ? 2 : 1);   // invocations per scored position
const uint PER = G / C;               // vec4s of a K row per invocation
const uint SLOTS = T / C;             // positions scored at once
const uint K_UNROLL = 4;
shared vec4 q_s[G];
shared float w_s[MAX_POSITIONS];      // scores, then weights
shared vec4 acc_s[T];

#include "inf.glsl"

float weight(float s, float mx) {
    if (mx == NEG_INF) return 0.0;
    return s == mx ? 1.0 : exp(s - mx);
}

void main() {
    uint h = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint row = pc.n_kv_heads * G, head = kvh * G;   // in vec4s
#ifdef POS_BUFFER
    uint n = pc.pos0 + pos_buf[0] + 1;
#else
    uint n = pc.pos0 + 1;
#endif
    uint lo = WINDOW != 0 && n > WINDOW ? n - WINDOW : 0;   // first position attended
    if (t < G) q_s[t] = q[h * G + t] * pc.scale;
    barrier();
    // Scores: C consecutive invocations share a position, each reading PER consecutive vec4
    // of its K row (so a subgroup's loads cover whole rows), and add their parts with
    // subgroup shuffles (the C are in one subgroup: subgroups hold whole aligned groups of
    // at least 4). KV_UNROLL positions per invocation are in flight together.
    uint slot = t / C, c = t % C;
    float mx = NEG_INF;
    for (uint base = slot; base < n; base += SLOTS * K_UNROLL) {
        for (uint u = 0; u < K_UNROLL; ++u) {
            uint p = base + u * SLOTS;
            float s = 0.0;
            if (p < n && p >= lo) {
                for (uint j = c * PER; j < c * PER + PER; ++j)
                    s += dot(q_s[j], vec4(k_cache[p * row + head + j]));
            }
            if (C >= 2) s += subgroupShuffleXor(s, 1);   // every invocation: uniform flow
            if (C >= 4) s += subgroupShuffleXor(s, 2);
            if (p < n) {
                if (p < lo) s = NEG_INF;
                if (c == 0) w_s[p] = s;
                mx = max(mx, s);
            }
        }
    }
    mx = workgroup_max(mx);
    barrier();                          // every score is in w_s
    float l = 0.0;
    for (uint p = t; p < n; p += T) {
        float e = weight(w_s[p], mx);
        w_s[p] = e;
        l += e;
    }
    l = workgroup_sum(l);
    barrier();                          // every weight is in w_s
    // V: invocation (lane, g) weighs rows lane, lane + LANES, ... of vec4 g of the
    // workgroup's part of the head. The inner loop runs to a constant, so the compiler
    // unrolls it and UNROLL rows' loads are in flight together (a loop to n issued one
    // dependent load per trip: 14 us per layer on an H200).
    uint lane = t / GV, g = gl_WorkGroupID.y * GV + t % GV;
    vec4 acc = vec4(0.0);
    for (uint base = lane; base < n; base += LANES * UNROLL) {
        for (uint u = 0; u < UNROLL; ++u) {
            uint p = base + u * LANES;
            if (p < n && p >= lo) acc += w_s[p] * vec4(v_cache[p * row + head + g]);
        }
    }
    acc_s[t] = acc;
    barrier();
    // Tree over the lanes, any count: each step folds the upper ceil-half onto the lower.
    for (uint width = LANES; width > 1; width = (width + 1) / 2) {
        uint half_width = (width + 1) / 2;
        if (lane + half_width < width) acc_s[t] += acc_s[t + half_width * GV];
        barrier();
    }
    if (t < GV) dst[h * G + g] = l > 0.0 ? acc_s[t] / l : vec4(0.0);
}
