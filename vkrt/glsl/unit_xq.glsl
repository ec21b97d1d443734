// A unit's input x as 16-bit integers, for the integer dot products of the decode products'
// XQ variants (matvec_xq_*, matvec_add_xq_*, matvec_glu_xq_*, qkv_rope_xq_*; XQ defined).
// Declared once however often weights.glsl includes it. The including .comp enables
// GL_EXT_spirv_intrinsics at its top (an #extension directive precedes the code).
//
// The 32 elements of a unit (xv[0..7], weights.glsl unit_runs) share a power-of-two step
// dx = 2^(E - 15), E the exponent of m = max |x| (m = f 2^E, 0.5 <= f < 1): x^ = dx q,
// q = round_to_nearest_even(x / dx) clamped to [-32768, 32767], so |x - x^| <= dx / 2, or
// dx where the clamp bites (m / dx rounds to 32768). x / dx is exact (a power of two), so
// the rounding is the only one and numpy reproduces it bit for bit (tests/weight_blocks.py
// `quantize_units`). q is held as two planes of bytes, q = 256 hi + lo with lo unsigned
// (0..255) and hi signed (-128..127), four elements per word in the element order of
// xv[i]: plane words xq_lo[i], xq_hi[i]. A weight unit's integers w (bytes of a word, as
// the block stores them) then give sum w q with the packed 4x8-bit dot products of
// SPV_KHR_integer_dot_product (OpSDot, OpUDot, OpSUDot; Vulkan's shaderIntegerDotProduct):
// 256 dot(w, hi) + dot(w, lo), exact in 32 bits (|sum| <= 32 * 128 * 32768 = 2^27), so a
// unit's product is dx times integers scaled by the block's scales: the product of the
// dequantized weights with x^, rounded once per unit. This is llama.cpp's q8_1 activation
// quantization (ggml-cuda mmvq) with 16 bits instead of 8.
// A unit whose sum is not finite (an infinity or NaN in x) or whose m is below 1e-30 takes
// the float path (weights.glsl unit_dot): IEEE results kept, no step overflows.
#ifndef UNIT_XQ_DECLARED
#define UNIT_XQ_DECLARED
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot8(uint a, uint b, spirv_literal int packed_4x8);     // OpSDot: signed x signed
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4451)
uint udot8(uint a, uint b, spirv_literal int packed_4x8);    // OpUDot: unsigned x unsigned
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot8(uint a, uint b, spirv_literal int packed_4x8);    // OpSUDot: signed a x unsigned b

uint xq_lo[8], xq_hi[8];   // this invocation's unit: q's byte planes
float xq_dx;               // its step
int xq_s[2];               // sum of q over run x (xv[0..3]) and run y (xv[4..7])
bool xq_ok;                // false: the float path

// sum over word i's four elements of w q, w four unsigned (0..255) or signed bytes.
int xq_dot_u(uint w, uint i) { return 256 * sudot8(xq_hi[i], w, 0) + int(udot8(w, xq_lo[i], 0)); }
int xq_dot_s(uint w, uint i) { return 256 * sdot8(xq_hi[i], w, 0) + sudot8(w, xq_lo[i], 0); }

// Sets the unit's planes from its 32 elements.
void xq_quantize(vec4 xv[8]) {
    vec4 m4 = abs(xv[0]), s4 = xv[0];
    for (uint i = 1; i < 8; ++i) {
        m4 = max(m4, abs(xv[i]));
        s4 += xv[i];
    }
    float m = max(max(m4.x, m4.y), max(m4.z, m4.w));
    float s = s4.x + s4.y + s4.z + s4.w;
    xq_ok = !isinf(s) && !isnan(s) && m >= 1.0e-30;
    int e;
    frexp(m, e);
    xq_dx = ldexp(1.0, e - 15);
    float inv = ldexp(1.0, 15 - e);
    int sa = 0, sb = 0;
    for (uint i = 0; i < 8; ++i) {
        // + 1.5 2^23 rounds to an integer in the low mantissa bits: the low 16 bits of the
        // float are q in two's complement.
        uvec4 b = floatBitsToUint(min(xv[i] * inv, 32767.0) + 12582912.0);
        uint lo = (b.x & 0xFFu) | (b.y & 0xFFu) << 8 | (b.z & 0xFFu) << 16 | b.w << 24;
        uint hi = (b.x >> 8 & 0xFFu) | (b.y >> 8 & 0xFFu) << 8 | (b.z >> 8 & 0xFFu) << 16
                  | (b.w >> 8 & 0xFFu) << 24;
        xq_lo[i] = lo;
        xq_hi[i] = hi;
        int sum4 = 256 * sdot8(hi, 0x01010101u, 0) + int(udot8(lo, 0x01010101u, 0));
        if (i < 4) sa += sum4; else sb += sum4;
    }
    xq_s[0] = sa;
    xq_s[1] = sb;
}
#endif
