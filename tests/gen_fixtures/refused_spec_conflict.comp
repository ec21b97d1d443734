#version 450
// Spec id 0 is both the workgroup width (default 1) and WG (default 64): unspecialized, they
// would differ. Refused: "SpecId 0 is declared twice with different type/default".
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(set = 0, binding = 0) buffer O { uint o[]; };
void main() { o[0] = WG + gl_WorkGroupSize.x; }
