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
// local_size_x must equal head_dim. Dispatch: (n_heads, n_splits, 1) with
// n_splits = ceil((pos0 + 1) / chunk), so every split holds at least one position.
// Push constants: n_heads, n_kv_heads, head_dim, pos0, chunk (u32), scale (f32).
// Variant attention_split_pos (POS_BUFFER): binding 4 holds a u32 added to pos0 (replay); the
// grid is then sized for the longest position and splits past the query's position write an
// empty state (m = -inf, l = 0), which the merge weighs 0.
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { float k_cache[]; };
layout(set = 0, binding = 2) readonly buffer V { float v_cache[]; };
layout(set = 0, binding = 3) writeonly buffer Part { float part[]; };
layout(push_constant) uniform Push {
    uint n_heads; uint n_kv_heads; uint head_dim; uint pos0; uint chunk; float scale;
} pc;
#ifdef POS_BUFFER
layout(set = 0, binding = 4) readonly buffer Pos { uint pos_buf[]; };
#endif
shared float q_s[gl_WorkGroupSize.x];
shared float p_s[gl_WorkGroupSize.x];

const float NEG_INF = -1.0 / 0.0;

float weight(float s, float mx) {
    if (mx == NEG_INF) return 0.0;
    return s == mx ? 1.0 : exp(s - mx);
}

void main() {
    const uint B = gl_WorkGroupSize.x;
    uint h = gl_WorkGroupID.x, split = gl_WorkGroupID.y, d = gl_LocalInvocationID.x;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint row = pc.n_kv_heads * pc.head_dim;
#ifdef POS_BUFFER
    uint pos0 = pc.pos0 + pos_buf[0];
#else
    uint pos0 = pc.pos0;
#endif
    // inclusive; last < first (nothing to do) for a split past the query's position
    uint first = split * pc.chunk, last = min(first + pc.chunk - 1, pos0);
    q_s[d] = q[h * pc.head_dim + d] * pc.scale;
    barrier();
    float m = NEG_INF, l = 0.0, acc = 0.0;
    for (uint base = first; base <= last; base += B) {
        uint p = base + d;
        float s = NEG_INF;
        if (p <= last) {
            uint k0 = p * row + kvh * pc.head_dim;
            s = 0.0;
            for (uint j = 0; j < pc.head_dim; ++j) s += q_s[j] * k_cache[k0 + j];
        }
        p_s[d] = s;
        barrier();
        float block_max = m;
        uint n = min(B, last + 1 - base);
        for (uint j = 0; j < n; ++j) block_max = max(block_max, p_s[j]);
        float correction = weight(m, block_max);
        l *= correction;
        acc *= correction;
        for (uint j = 0; j < n; ++j) {
            float e = weight(p_s[j], block_max);
            l += e;
            acc += e * v_cache[(base + j) * row + kvh * pc.head_dim + d];
        }
        m = block_max;
        barrier();
    }
    uint o = (h * gl_NumWorkGroups.y + split) * (pc.head_dim + 2);
    part[o + d] = acc;
    if (d == 0) {
        part[o + pc.head_dim] = m;
        part[o + pc.head_dim + 1] = l;
    }
}
