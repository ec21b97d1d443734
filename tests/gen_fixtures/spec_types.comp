#version 450
// Spec constants of every scalar type, negative and out-of-int32 defaults, declared out of
// id order; a composite and an expression built from spec constants (not listed: no SpecId).
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 1) in;
layout(constant_id = 1000) const uint LATE = 7u;
layout(constant_id = 0) const bool B_TRUE = true;
layout(constant_id = 1) const bool B_FALSE = false;
layout(constant_id = 2) const int I32 = -7;
layout(constant_id = 3) const uint U32 = 4000000000u;
layout(constant_id = 4) const float F32 = -0.25;
layout(constant_id = 5) const double F64 = -1.0e300;
layout(constant_id = 6) const int64_t I64 = -5000000000l;
layout(constant_id = 7) const uint64_t U64 = 9000000000000000000ul;
layout(constant_id = 8) const int16_t I16 = -2s;
layout(constant_id = 9) const uint16_t U16 = 65535us;
layout(constant_id = 10) const float16_t F16 = -1.5hf;
layout(constant_id = 11) const int I32_MIN = -2147483648;
layout(constant_id = 12) const float F_TINY = 1.0e-30;
const uvec2 PAIR = uvec2(LATE, 5u);
const uint TWICE = LATE * 2u;
layout(set = 0, binding = 0) buffer O { double o[]; };
void main() {
    double s = double(F32) + F64 + double(I64) + double(U64) + double(I16) + double(U16);
    s += double(F16) + double(I32) + double(U32) + double(PAIR.y + TWICE) + double(F_TINY);
    o[0] = (B_TRUE && !B_FALSE) ? s : double(I32_MIN);
}
