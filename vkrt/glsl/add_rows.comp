#version 450
// Add consecutive rows of a table in place: x[t, i] += table[row0 + t, i] for t < n_tokens,
// i < width. OPT's learned positions: token t at position pos0 + t adds row pos0 + t + 2 of
// embed_positions (row0 = pos0 + 2, the offset of transformers' OPTLearnedPositionalEmbedding).
// x: [n_tokens, width] f32 (may hold more rows; only n_tokens are touched);
// table: [rows, width] f32 with rows >= row0 + n_tokens. Push constants: width, row0, n_tokens.
// Dispatch: (ceil(width / local_size_x), tokens spread over y and z (grid.glsl)); the
// workgroups past n_tokens that the spread adds return.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer Table { float table[]; };
layout(push_constant) uniform Push { uint width; uint row0; uint n_tokens; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x, t = token_index();
    if (i < pc.width && t < pc.n_tokens) x[t * pc.width + i] += table[(pc.row0 + t) * pc.width + i];
}
