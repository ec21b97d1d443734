#version 450
// Causal scaled-dot-product attention with grouped-query heads over the KV cache, one
// workgroup per (query head, token), online softmax over blocks of positions (Milakov &
// Gimelshein 2018; FlashAttention, Dao et al. 2022). Query token t sits at position pos0 + t
// and attends to cache positions 0 ..= pos0 + t; query head h reads KV head
// h / (n_heads / n_kv_heads).
// q: [n_tokens, n_heads, head_dim] f32 (after RoPE); k_cache, v_cache: [n_ctx, n_kv_heads,
// head_dim] f32, or f16 in the `_kvf16` variants (kv.glsl); out: [n_tokens, n_heads,
// head_dim] f32.
// local_size_x must equal head_dim, a multiple of 4: invocation d owns output dimension d
// and, while scoring, cache position (block start + d). Dispatch: (n_heads, tokens spread
// over y and z (grid.glsl)). Loops run to the workgroup size (a specialization constant) so
// the compiler unrolls them and a block's loads are in flight together; K is read as vec4;
// each weight is computed once, by the invocation of its position (attention_split.comp,
// the decode form, is built the same way).
// Push constants: n_heads, n_kv_heads, head_dim, pos0 (u32), scale (f32; scores are
// (q * scale) . k, so they overflow only where the scaled score leaves the f32 range).
// Specialization constant 1 WINDOW: 0 attends to every earlier position; W > 0 only to the
// last W (positions p with last - p < W: a sliding-window layer, as transformers'
// sliding-window causal mask and llama.cpp's LLAMA_SWA_TYPE_STANDARD mask them).
// Infinite scores (masked keys, or scores past the f32 range) never give NaN: a score of -inf
// weighs 0 and a row whose scores are all -inf gives zeros (a fully masked row); scores of
// +inf share the weight equally and finite scores then weigh 0 (the limit of softmax as
// those scores grow). A NaN score (inf * 0 in the dot) gives NaN, as torch's softmax does.
// This relies on IEEE infinities, which Vulkan guarantees only under the
// SignedZeroInfNanPreserve execution mode ("Precision and Operation of SPIR-V Instructions").
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
#include "kv.glsl"
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { KV_T4 k_cache[]; };
layout(set = 0, binding = 2) readonly buffer V { KV_T v_cache[]; };
layout(set = 0, binding = 3) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push {
    uint n_heads; uint n_kv_heads; uint head_dim; uint pos0; float scale;
} pc;
layout(constant_id = 1) const uint WINDOW = 0;
const uint B = gl_WorkGroupSize.x;   // == head_dim
shared vec4 q_s[B / 4];
shared float w_s[B];

#include "inf.glsl"

// exp(s - mx) for s <= mx, without NaN when both are infinite: an all -inf prefix (mx = -inf)
// weighs nothing yet, and a score equal to the maximum weighs exactly 1 (also +inf = +inf).
float weight(float s, float mx) {
    if (mx == NEG_INF) return 0.0;
    return s == mx ? 1.0 : exp(s - mx);
}

void main() {
    uint h = gl_WorkGroupID.x, t = token_index(), d = gl_LocalInvocationID.x;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint row = pc.n_kv_heads * B;
    uint last = pc.pos0 + t;  // inclusive
    uint first = WINDOW != 0 && last >= WINDOW ? last + 1 - WINDOW : 0;  // inclusive
    q_s[d / 4][d % 4] = q[(t * pc.n_heads + h) * B + d] * pc.scale;
    barrier();
    // Online softmax: m is the largest score so far, l = sum weight(s, m), acc = sum
    // weight(s, m) * v[d]. l >= 1 once any score is above -inf (the maximum weighs 1).
    float m = NEG_INF, l = 0.0, acc = 0.0;
    for (uint base = first / B * B; base <= last; base += B) {   // uniform per workgroup
        uint p = base + d;
        float s = NEG_INF;
        if (p <= last && p >= first) {
            uint k0 = (p * row + kvh * B) / 4;
            s = 0.0;
            for (uint j = 0; j < B / 4; ++j) s += dot(q_s[j], vec4(k_cache[k0 + j]));
        }
        float block_max = max(m, workgroup_max(s));
        float e = weight(s, block_max);        // 0 outside first ..= last
        w_s[d] = e;
        float correction = weight(m, block_max);
        l = l * correction + workgroup_sum(e);
        acc *= correction;
        barrier();
        // Rows outside first ..= last weigh 0; their index is clamped into it (a row the
        // cache holds, inside the window).
        uint v0 = kvh * B + d;
        for (uint j = 0; j < B; ++j)
            acc += w_s[j] * float(v_cache[clamp(base + j, first, last) * row + v0]);
        m = block_max;
        barrier();
    }
    dst[(t * pc.n_heads + h) * B + d] = l > 0.0 ? acc / l : 0.0;
}
