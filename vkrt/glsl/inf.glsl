// IEEE infinities and NaNs of 32-bit floats, kept: the SignedZeroInfNanPreserve execution
// mode for width 32 (SPIR-V 1.4 core, SPV_KHR_float_controls before; capability 4466, mode
// 4461). Without it Vulkan lets an implementation assume that no operand or result is an
// infinity or NaN (Vulkan spec, "Precision and Operation of SPIR-V Instructions"), so a
// comparison with -inf, a masked score or an overflow test may be compiled away. gen-spirv
// reflects the mode (`signed_zero_inf_nan_preserve` in modules.json) and the runtime refuses
// a device without shaderSignedZeroInfNanPreserveFloat32 (vkrt/runtime/pipeline.py).
#ifndef VKRT_INF_GLSL
#define VKRT_INF_GLSL
#extension GL_EXT_spirv_intrinsics : require
spirv_execution_mode(capabilities = [4466], 4461, 32);
const float NEG_INF = -1.0 / 0.0;
#endif
