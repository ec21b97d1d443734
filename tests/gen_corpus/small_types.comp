#version 450
// 16- and 8-bit storage (llama.cpp's f16 and q8 weights): float16_t and int8_t/uint8_t buffers,
// 16/8-bit push-constant members, 16- and 64-bit spec constants.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 64) in;
layout(constant_id = 0) const float16_t SCALE = float16_t(0.5);
layout(constant_id = 1) const int64_t BIAS = -3;
layout(constant_id = 2) const uint16_t GROUP = uint16_t(32);
layout(set = 0, binding = 0) readonly buffer Q { int8_t q[]; };
layout(set = 0, binding = 1) readonly buffer S { float16_t s[]; };
layout(set = 0, binding = 2) readonly buffer U { u8vec4 u[]; };
layout(set = 0, binding = 3) writeonly buffer O { f16vec2 o[]; };
layout(push_constant) uniform Push { float16_t gain; uint8_t shift; uint16_t n; f16vec4 bias4; uint tail; } pc;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n) return;
    float16_t v = float16_t(q[i] >> pc.shift) * s[i / uint(GROUP)] * SCALE * pc.gain;
    o[i] = f16vec2(v + pc.bias4.x + float16_t(BIAS), float16_t(u[i].x) + float16_t(pc.tail));
}
