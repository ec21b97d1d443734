#version 450
// Every access qualifier on its own binding, plus per-member qualifiers.
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer R { float r[]; };
layout(set = 0, binding = 1) writeonly buffer W { float w[]; };
layout(set = 0, binding = 2) readonly writeonly buffer N { float n[]; };
layout(set = 0, binding = 3) buffer P { float p[]; };
layout(set = 0, binding = 4) restrict readonly buffer RR { float rr[]; };
layout(set = 0, binding = 5) coherent buffer C { uint c[]; };
layout(set = 0, binding = 6) volatile buffer V { uint v[]; };
layout(set = 0, binding = 7) restrict writeonly buffer RW { float rw[]; };
layout(set = 0, binding = 8) buffer Mixed { readonly uint mixed_n; float mixed[]; };
layout(set = 0, binding = 9) buffer AllRO { readonly uint allro_n; readonly float allro[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    w[i] = r[i] + rr[i] + allro[i] + float(allro_n);
    p[i] += 1.0;
    atomicAdd(c[0], 1u);
    v[i] = v[i] + 1u;
    rw[i] = 0.0;
    mixed[i] = float(mixed_n);
}
