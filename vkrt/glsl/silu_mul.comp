#version 450
// Gated MLP activation (Shazeer 2020, "GLU Variants"): out = act(gate) * up; act is SiLU,
// silu(g) = g / (1 + exp(-g)), or with specialization constant 1 GELU = 1 (Gemma's GeGLU) the tanh
// approximation of GELU, as torch's gelu(approximate="tanh") (transformers'
// gelu_pytorch_tanh): 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), tanh(u) computed
// as 1 - 2 / (exp(2u) + 1) (exp has a precision bound in Vulkan; tanh's is inherited).
// gate, up, out: [n] f32.
// Dispatch: spread(ceil(n / local_size_x)) workgroups (grid.glsl).
#extension GL_GOOGLE_include_directive : require
#include "grid.glsl"
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Gate { float gate[]; };
layout(set = 0, binding = 1) readonly buffer Up { float up[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n; } pc;
layout(constant_id = 1) const uint GELU = 0;

void main() {
    uint i = linear_workgroup() * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    float g = gate[i];
    if (GELU != 0) {
        float u = 0.7978845608028654 * (g + 0.044715 * g * g * g);   // sqrt(2 / pi)
        dst[i] = 0.5 * g * (1.0 + (1.0 - 2.0 / (exp(2.0 * u) + 1.0))) * up[i];
    } else {
        dst[i] = g / (1.0 + exp(-g)) * up[i];
    }
}
