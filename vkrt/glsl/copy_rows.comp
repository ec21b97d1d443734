#version 450
// Row copy into a larger buffer: dst[(dst_row + t) * width + i] = src[t * width + i].
// Writes V into the KV cache at the current positions.
// src: [n_tokens, width] f32; dst: [rows, width] f32. Dispatch: (ceil(width / local_size_x),
// tokens spread over y and z (grid.glsl)).
// Variant copy_rows_pos (POS_BUFFER): binding 2 holds a u32 added to dst_row (replay).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
#include "kv.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { KV_T dst[]; };
layout(push_constant) uniform Push { uint width; uint dst_row; } pc;
#ifdef POS_BUFFER
layout(set = 0, binding = 2) readonly buffer Pos { uint pos_buf[]; };
#endif

void main() {
    uint i = gl_GlobalInvocationID.x, t = token_index();
#ifdef POS_BUFFER
    uint row = pc.dst_row + pos_buf[0] + t;
#else
    uint row = pc.dst_row + t;
#endif
    if (i < pc.width) dst[row * pc.width + i] = KV_T(src[t * pc.width + i]);
}
