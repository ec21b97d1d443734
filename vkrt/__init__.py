"""vkrt: LLM inference on any Vulkan GPU from ahead-of-time compiled SPIR-V.

    import vkrt
    with vkrt.load("model.gguf") as model:          # or a Hugging Face checkpoint folder
        for piece in model.generate("Once upon a time", max_tokens=32):
            print(piece, end="")

Parts: `vkrt.gen` (gen-spirv: GLSL -> SPIR-V + reflected metadata), `vkrt.runtime` (device,
memory, pipelines, stream), `vkrt.models` (model files, the model families, generation).
"""
__version__ = "0.1.0"


def load(path=None, device=None, progress: bool = False, kv_cache_dtype: str = "f32"):
    """`vkrt.models.model.load`: a model file or folder on a Vulkan device (imported on first
    use, so `import vkrt` stays light)."""
    from vkrt.models.model import load as _load

    return _load(path, device, progress, kv_cache_dtype)
