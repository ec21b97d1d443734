#version 450
// Embedding lookup: out[t, :] = table[ids[t], :], dequantized to f32.
// table: [n_vocab, n_embd] as the GGUF stores it (weights.glsl: f32, f16, bf16, Q8_0 or Q4_1,
// one variant each, vkrt/glsl/variants.json; n_embd % 32 == 0 for block types);
// ids: [n_tokens] u32; out: [n_tokens, n_embd] f32.
// Dispatch: (ceil(n_embd / local_size_x), tokens spread over y and z (grid.glsl)).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "weights.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 1) readonly buffer Ids { uint ids[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n_embd; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x, t = token_index();
    if (i >= pc.n_embd) return;
    dst[t * pc.n_embd + i] = weight1(ids[t], i, pc.n_embd);
}
