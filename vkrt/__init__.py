"""vkrt: LLM inference on any Vulkan GPU from ahead-of-time compiled SPIR-V.

Parts: `vkrt.gen` (gen-spirv: GLSL -> SPIR-V + reflected metadata), `vkrt.runtime` (device,
memory, pipelines, stream), `vkrt.models` (GGUF loading, Llama forward, generation).
"""
__version__ = "0.1.0"
