#version 450
// Rotary position embedding (Su et al. 2021, RoFormer) on the GGUF's row order: llama.cpp's
// converter permutes Q/K rows so that each head rotates ADJACENT pairs (2i, 2i+1)
// (convert_hf_to_gguf.py, LlamaModel.permute). For token t at position pos0 + t:
//   a = (pos0 + t) * inv_freq[i];  (x0, x1) -> (x0 cos a - x1 sin a, x0 sin a + x1 cos a).
// src: [n_tokens, n_heads, head_dim] f32; inv_freq: [head_dim / 2] f32, computed on the host
// as transformers does (1 / theta^(2i / head_dim) in f32); dst: rows of n_heads * head_dim f32,
// token t written at row dst_row + t (dst_row = pos0 writes K straight into the KV cache).
// Dispatch: (ceil(n_heads * head_dim / 2 / local_size_x), n_tokens, 1).
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Src { vec2 src[]; };
layout(set = 0, binding = 1) readonly buffer InvFreq { float inv_freq[]; };
layout(set = 0, binding = 2) writeonly buffer Dst { vec2 dst[]; };
layout(push_constant) uniform Push { uint n_heads; uint head_dim; uint pos0; uint dst_row; } pc;

void main() {
    uint p = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
    uint half_dim = pc.head_dim / 2, pairs = pc.n_heads * half_dim;
    if (p >= pairs) return;
    float a = float(pc.pos0 + t) * inv_freq[p % half_dim];
    float c = cos(a), s = sin(a);
    vec2 v = src[t * pairs + p];
    dst[(pc.dst_row + t) * pairs + p] = vec2(v.x * c - v.y * s, v.x * s + v.y * c);
}
