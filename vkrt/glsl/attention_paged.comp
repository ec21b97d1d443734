#version 450
// Causal grouped-query attention over a PAGED KV cache (the batched runner,
// vkrt/models/batch.py; vLLM's paged attention, Kwon et al. 2023): one workgroup per (query
// head, token) of a flattened batch of tokens from several sequences. Token t belongs to
// sequence s = seq_of_token[t] (a row of block_tables), sits at position p = positions[t]
// of it and attends to its own sequence's positions 0 ..= p (the last WINDOW only, when
// WINDOW > 0), position j being KV-cache slot block_tables[s * table_width + j / block_size]
// * block_size + j % block_size.
// The arithmetic is attention.comp's (online softmax over blocks of head_dim positions from
// the first one the token sees, the same loops), so a token's result depends only on its
// own position and its sequence's keys: never on the other tokens of the batch or on their
// number (batch invariance).
// q: [n_tokens, n_heads, head_dim] f32 (after RoPE); k_cache, v_cache: [n_slots, n_kv_heads,
// head_dim] f32 (f16 in the `_kvf16` variant: kv.glsl, read as f32); out: [n_tokens, n_heads,
// head_dim] f32; positions, seq_of_token: [n_tokens] u32; block_tables: [rows, table_width]
// u32 physical block ids. The host checks every slot a token can reach against n_slots
// before the step.
// local_size_x must equal head_dim, a multiple of 4. Dispatch: (n_heads, tokens spread over
// y and z (grid.glsl)). Push constants: n_heads, n_kv_heads, block_size, table_width (u32),
// scale (f32). Specialization constant 1 WINDOW as attention.comp's. Infinities as there.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "reduce.glsl"
#include "kv.glsl"
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { KV_T4 k_cache[]; };
layout(set = 0, binding = 2) readonly buffer V { KV_T v_cache[]; };
layout(set = 0, binding = 3) writeonly buffer Out { float dst[]; };
layout(set = 0, binding = 4) readonly buffer Positions { uint positions[]; };
layout(set = 0, binding = 5) readonly buffer SeqOfToken { uint seq_of_token[]; };
layout(set = 0, binding = 6) readonly buffer BlockTables { uint block_tables[]; };
layout(push_constant) uniform Push {
    uint n_heads; uint n_kv_heads; uint block_size; uint table_width; float scale;
} pc;
layout(constant_id = 1) const uint WINDOW = 0;
const uint B = gl_WorkGroupSize.x;   // == head_dim
shared vec4 q_s[B / 4];
shared float w_s[B];
shared uint slot_s[B];   // the KV-cache slot of each position of the current block

#include "inf.glsl"

float weight(float s, float mx) {
    if (mx == NEG_INF) return 0.0;
    return s == mx ? 1.0 : exp(s - mx);
}

void main() {
    uint h = gl_WorkGroupID.x, t = token_index(), d = gl_LocalInvocationID.x;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint row = pc.n_kv_heads * B;
    uint last = positions[t];  // inclusive
    uint table = seq_of_token[t] * pc.table_width;
    uint first = WINDOW != 0 && last >= WINDOW ? last + 1 - WINDOW : 0;  // inclusive
    q_s[d / 4][d % 4] = q[(t * pc.n_heads + h) * B + d] * pc.scale;
    float m = NEG_INF, l = 0.0, acc = 0.0;
    for (uint base = first / B * B; base <= last; base += B) {   // uniform per workgroup
        // Position base + d, clamped into first ..= last (a slot the sequence holds).
        uint j = clamp(base + d, first, last);
        slot_s[d] = block_tables[table + j / pc.block_size] * pc.block_size
                    + j % pc.block_size;
        barrier();
        uint p = base + d;
        float s = NEG_INF;
        if (p <= last && p >= first) {
            uint k0 = (slot_s[d] * row + kvh * B) / 4;
            s = 0.0;
            for (uint i = 0; i < B / 4; ++i) s += dot(q_s[i], vec4(k_cache[k0 + i]));
        }
        float block_max = max(m, workgroup_max(s));
        float e = weight(s, block_max);
        w_s[d] = e;
        float correction = weight(m, block_max);
        l = l * correction + workgroup_sum(e);
        acc *= correction;
        barrier();
        uint v0 = kvh * B + d;
        for (uint i = 0; i < B; ++i) acc += w_s[i] * float(v_cache[slot_s[i] * row + v0]);
        m = block_max;
        barrier();
    }
    dst[(t * pc.n_heads + h) * B + d] = l > 0.0 ? acc / l : 0.0;
}
