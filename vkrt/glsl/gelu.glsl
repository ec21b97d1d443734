// GELU's tanh approximation, as torch's gelu(approximate="tanh") (transformers'
// gelu_pytorch_tanh, Gemma's GeGLU): 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), with
// tanh(u) computed as 1 - 2 / (exp(2u) + 1): exp has a precision bound in Vulkan ("Precision
// and Operation of SPIR-V Instructions"), tanh's is only inherited from sinh and cosh.
float gelu_tanh(float g) {
    float u = 0.7978845608028654 * (g + 0.044715 * g * g * g);   // sqrt(2 / pi)
    return 0.5 * g * (1.0 + (1.0 - 2.0 / (exp(2.0 * u) + 1.0)));
}
