#version 450
// Embedding lookup: out[t, :] = table[ids[t], :].
// table: [n_vocab, n_embd] f32; ids: [n_tokens] u32; out: [n_tokens, n_embd] f32.
// Dispatch: (ceil(n_embd / local_size_x), tokens spread over y and z (grid.glsl)).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Table { float table[]; };
layout(set = 0, binding = 1) readonly buffer Ids { uint ids[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n_embd; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x, t = token_index();
    if (i >= pc.n_embd) return;
    dst[t * pc.n_embd + i] = table[ids[t] * pc.n_embd + i];
}
