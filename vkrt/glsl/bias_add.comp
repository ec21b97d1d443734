#version 450
// Bias add in place over rows: x[t * width + i] += b[i] for t < n_tokens, i < width (the
// bias of a linear layer, nn.Linear's y = x W^T + b; Llama's attention_bias / mlp_bias).
// x: [n_tokens, width] f32 (may hold more rows; only n_tokens are touched); b: [width] f32.
// Push constants: width, n_tokens (u32).
// Dispatch: (ceil(width / local_size_x), tokens spread over y and z (grid.glsl)); the
// workgroups past n_tokens that the spread adds return.
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };
layout(push_constant) uniform Push { uint width; uint n_tokens; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x, t = token_index();
    if (i < pc.width && t < pc.n_tokens) x[t * pc.width + i] += b[i];
}
