#version 450
// Rotary position embedding (Su et al. 2021, RoFormer) on the GGUF's row order. Pair i of a
// head (i < head_dim / 2) is, by specialization constant NEOX:
//   0: ADJACENT elements (2i, 2i+1): llama.cpp's converter permutes `llama` Q/K rows so
//      (convert_hf_to_gguf.py, LlamaModel.permute; llama.cpp's LLAMA_ROPE_TYPE_NORM);
//   1: HALVES (i, i + head_dim / 2): `qwen2`, `qwen3`, `gemma3` files store Q/K unpermuted,
//      as transformers' rotate_half reads them (llama.cpp's LLAMA_ROPE_TYPE_NEOX).
// For token t at position p = pos0 + t:
//   (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos), (cos, sin) = cos_sin[p, i].
// The angles come from a host table rather than sin/cos in the shader: GLSL.std.450 Sin/Cos
// only promise 2^-11 absolute error inside [-pi, pi] (Vulkan spec, "Precision and Operation
// of SPIR-V Instructions"), and NVIDIA's were 5e-6 off at 30 rad where lavapipe's were exact.
// src: [n_tokens, n_heads, head_dim] f32; cos_sin: [n_positions, head_dim / 2] vec2 f32;
// dst: rows of n_heads * head_dim f32, token t written at row dst_row + t (dst_row = pos0
// writes K straight into the KV cache).
// Dispatch: (ceil(n_heads * head_dim / 2 / local_size_x), tokens spread over y and z (grid.glsl)).
// Variant rope_pos (POS_BUFFER): binding 3 holds a u32 P added to pos0 (and to dst_row when
// push constant dst_at_pos is 1: K into the cache), so a recorded step can be replayed at the
// next position (the step advances P on the GPU).
// Variant rope_positions (POSITIONS): binding 3 holds positions [n_tokens] u32, token t's
// position in its own sequence (the batched runner, vkrt/models/batch.py): token t is rotated
// by the angles of position positions[t] and written at row dst_row + t (pos0 unused).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "kv.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Src { vec2 src[]; };
layout(set = 0, binding = 1) readonly buffer CosSin { vec2 cos_sin[]; };
layout(set = 0, binding = 2) writeonly buffer Dst { KV_T2 dst[]; };
// Scalar views of src and dst for the halves (NEOX) layout.
layout(set = 0, binding = 0) readonly buffer SrcF { float src_f[]; };
layout(set = 0, binding = 2) writeonly buffer DstF { KV_T dst_f[]; };
layout(constant_id = 1) const uint NEOX = 0;
#if defined(POSITIONS)
layout(push_constant) uniform Push { uint n_heads; uint head_dim; uint pos0; uint dst_row; } pc;
layout(set = 0, binding = 3) readonly buffer Positions { uint positions[]; };
#elif defined(POS_BUFFER)
layout(push_constant) uniform Push {
    uint n_heads; uint head_dim; uint pos0; uint dst_row; uint dst_at_pos;
} pc;
layout(set = 0, binding = 3) readonly buffer Pos { uint pos_buf[]; };
#else
layout(push_constant) uniform Push { uint n_heads; uint head_dim; uint pos0; uint dst_row; } pc;
#endif

void main() {
    uint p = gl_GlobalInvocationID.x, t = token_index();
    uint half_dim = pc.head_dim / 2, pairs = pc.n_heads * half_dim;
    if (p >= pairs) return;
#if defined(POSITIONS)
    uint position = positions[t], row_shift = 0;
#elif defined(POS_BUFFER)
    uint shift = pos_buf[0], row_shift = pc.dst_at_pos != 0 ? shift : 0;
    uint position = pc.pos0 + shift + t;
#else
    uint shift = 0, row_shift = 0;
    uint position = pc.pos0 + shift + t;
#endif
    vec2 r = cos_sin[position * half_dim + p % half_dim];
    if (NEOX != 0) {
        // element e of head h = p / half_dim and its partner e + half_dim
        uint e = (p / half_dim) * pc.head_dim + p % half_dim;
        uint a = t * 2 * pairs + e, o = (pc.dst_row + row_shift + t) * 2 * pairs + e;
        float x0 = src_f[a], x1 = src_f[a + half_dim];
        dst_f[o] = KV_T(x0 * r.x - x1 * r.y);
        dst_f[o + half_dim] = KV_T(x0 * r.y + x1 * r.x);
        return;
    }
    vec2 v = src[t * pairs + p];
    dst[(pc.dst_row + row_shift + t) * pairs + p] =
        KV_T2(vec2(v.x * r.x - v.y * r.y, v.x * r.y + v.y * r.x));
}
