#version 450
// KV-cache write by slot mapping (the batched runner, vkrt/models/batch.py; vLLM's
// reshape_and_cache): k_cache[slots[t]] = k[t] and v_cache[slots[t]] = v[t] for t < n_tokens.
// k, v: [n_tokens, width] f32 (K after RoPE); slots: [n_tokens] u32, token t's KV-cache slot
// (physical block * block_size + offset in the block); k_cache, v_cache: [n_slots, width] f32
// (f16 in the `_kvf16` variant: kv.glsl, each value rounded to f16 as it is stored).
// The host checks every slot against n_slots before the step (a padded token writes the
// reserved scratch slot). Dispatch: (ceil(width / local_size_x), tokens spread over y and z
// (grid.glsl)). Push constants: width.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "kv.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer K { float k[]; };
layout(set = 0, binding = 1) readonly buffer V { float v[]; };
layout(set = 0, binding = 2) readonly buffer Slots { uint slots[]; };
layout(set = 0, binding = 3) writeonly buffer KCache { KV_T k_cache[]; };
layout(set = 0, binding = 4) writeonly buffer VCache { KV_T v_cache[]; };
layout(push_constant) uniform Push { uint width; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x, t = token_index();
    if (i >= pc.width) return;
    uint slot = slots[t];
    k_cache[slot * pc.width + i] = KV_T(k[t * pc.width + i]);
    v_cache[slot * pc.width + i] = KV_T(v[t * pc.width + i]);
}
