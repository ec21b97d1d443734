#version 450
// Columns into a wider matrix: dst[t, col0 + i] = src[t, i] for t < n_tokens, i < width.
// Places the logits of one slice of the output rows (a weight larger than one binding,
// multiplied slice by slice) into the full [tokens, n_vocab] logits.
// src: [n_tokens, width] f32; dst: [n_tokens, dst_width] f32, col0 + width <= dst_width.
// Push constants: width, dst_width, col0, n_tokens.
// Dispatch: (ceil(width / local_size_x), tokens spread over y and z (grid.glsl)).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { float dst[]; };
layout(push_constant) uniform Push { uint width; uint dst_width; uint col0; uint n_tokens; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x, t = token_index();
    if (i < pc.width && t < pc.n_tokens) dst[t * pc.dst_width + pc.col0 + i] = src[t * pc.width + i];
}
