#version 450
// Greedy sampling on the GPU: out[0] = the smallest index of the largest of
// logits[offset .. offset + n) (torch.argmax's tie rule). logits: f32; out: [1] u32.
// All -inf gives 0 (as torch). NaN compares false and is skipped; torch would pick it.
// Any workgroup size (local_size_x, specialization constant 0). Push constants: n, offset.
// Dispatch: (1, 1, 1), one workgroup.
// Variant argmax_rows (ROWS): one workgroup per row r < n_rows, dispatch (n_rows, 1, 1):
// out[r] = the argmax of logits[offset + r * n .. offset + (r + 1) * n) (the batched
// runner's logit rows, vkrt/models/batch.py; each row reduced alone, as the plain kernel does).
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(set = 0, binding = 1) writeonly buffer Out { uint token[]; };
layout(push_constant) uniform Push { uint n; uint offset; } pc;
#extension GL_GOOGLE_include_directive : require
#include "inf.glsl"
shared float best_value[gl_WorkGroupSize.x];
shared uint best_index[gl_WorkGroupSize.x];

void main() {
    uint lid = gl_LocalInvocationID.x;
#ifdef ROWS
    uint offset = pc.offset + gl_WorkGroupID.x * pc.n;
#else
    uint offset = pc.offset;
#endif
    float bv = NEG_INF;
    uint bi = 0xFFFFFFFFu;  // "none": loses every comparison below
    for (uint i = lid; i < pc.n; i += gl_WorkGroupSize.x) {
        float v = logits[offset + i];
        // Strided ascending i keeps the first maximum; the first element seen is taken even
        // when it is -inf, so an all -inf row yields index 0.
        if (v > bv || bi == 0xFFFFFFFFu) { bv = v; bi = i; }
    }
    best_value[lid] = bv;
    best_index[lid] = bi;
    barrier();
    // Tree over any workgroup size, not only powers of two: each step folds the upper
    // ceil-half onto the lower half (slot lid + half, when it exists, into slot lid).
    for (uint width = gl_WorkGroupSize.x; width > 1; width = (width + 1) / 2) {
        uint half_width = (width + 1) / 2;
        if (lid + half_width < width) {
            float ov = best_value[lid + half_width];
            uint oi = best_index[lid + half_width];
            bool better = ov > best_value[lid] || (ov == best_value[lid] && oi < best_index[lid]);
            if (oi != 0xFFFFFFFFu && (better || best_index[lid] == 0xFFFFFFFFu)) {
                best_value[lid] = ov;
                best_index[lid] = oi;
            }
        }
        barrier();
    }
    #ifdef ROWS
    if (lid == 0) token[gl_WorkGroupID.x] = best_index[0];
#else
    if (lid == 0) token[0] = best_index[0];
#endif
}
