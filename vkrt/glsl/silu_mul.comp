#version 450
// SiLU-gated MLP activation (Shazeer 2020, "GLU Variants"): out = silu(gate) * up,
// silu(g) = g / (1 + exp(-g)). gate, up, out: [n] f32. Dispatch: (ceil(n / local_size_x), 1, 1).
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Gate { float gate[]; };
layout(set = 0, binding = 1) readonly buffer Up { float up[]; };
layout(set = 0, binding = 2) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Push { uint n; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n) return;
    float g = gate[i];
    dst[i] = g / (1.0 + exp(-g)) * up[i];
}
