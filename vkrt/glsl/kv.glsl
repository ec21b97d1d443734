// The paged KV cache's element type, for the kernels that write or read it (kv_write.comp,
// rope_kv_write.comp, attention_paged.comp). Default f32. Under KV_F16 (the `_kvf16`
// variants, vkrt/glsl/variants.json) the cache holds f16: GL_EXT_shader_16bit_storage
// stores 16-bit floats in storage buffers and converts them to and from f32 on each access
// (OpFConvert; Vulkan's storageBuffer16BitAccess feature, which the device enables where it
// has it), so all arithmetic stays f32 and only the stored K and V are rounded to f16.
// Reading is exact; storing rounds as the device converts f32 to f16: Vulkan leaves round to
// nearest even or toward zero to the implementation ("Precision and Operation of SPIR-V
// Instructions"; lavapipe rounds to nearest even, which tests/test_kernels.py checks bit for
// bit), and magnitudes past 65504 become infinities.
// KV_T: one element; KV_T2, KV_T4: two and four (a vec2 or vec4 of f32 converts to and from
// them with a constructor: KV_T4(v), vec4(k)).
#ifdef KV_F16
#extension GL_EXT_shader_16bit_storage : require
#define KV_T float16_t
#define KV_T2 f16vec2
#define KV_T4 f16vec4
#else
#define KV_T float
#define KV_T2 vec2
#define KV_T4 vec4
#endif
