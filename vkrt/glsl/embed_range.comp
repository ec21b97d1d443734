#version 450
// Embedding lookup from one slice of a table: out[t, :] = table[ids[t] - row0, :] dequantized
// to f32, for the tokens whose id lies in row0 .. row0 + n_rows - 1; other tokens' rows are
// left untouched. A table larger than one storage-buffer binding (maxStorageBufferRange) is
// bound as slices of rows, one dispatch each: every id in the vocabulary is written by
// exactly one.
// table: [n_rows, n_embd] (rows row0 ..) as the GGUF stores it (weights.glsl, one variant
// per type, vkrt/glsl/variants.json); ids: [n_tokens] u32; out: [n_tokens, n_embd] f32.
// Push constants: n_embd, row0, n_rows, n_tokens.
// Dispatch: (ceil(n_embd / local_size_x), tokens spread over y and z (grid.glsl)).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "weights.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 1) readonly buffer Ids { uint ids[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n_embd; uint row0; uint n_rows; uint n_tokens; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x, t = token_index();
    if (i >= pc.n_embd || t >= pc.n_tokens) return;
    uint r = ids[t] - pc.row0;  // wraps past n_rows for ids below row0
    if (r < pc.n_rows) dst[t * pc.n_embd + i] = weight1(r, i, pc.n_embd);
}
