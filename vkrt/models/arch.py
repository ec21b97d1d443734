"""Llama-like architectures as data: what each GGUF `general.architecture` vkrt runs means for
the forward (`Family`), and one file's hyperparameters and description read from its
`<arch>.*` metadata keys (`Arch`, what `vkrt.models.llama.Llama` builds its layers from).

A family is a `Family` entry in `FAMILIES`: its RoPE pair layout, which linear layers may carry
biases, whether Q and K are RMS-normed per head, where the norms sit, the MLP's activation,
the embedding scale, sliding-window layers, which `<arch>.*` keys it reads. A file whose keys
or tensors ask for anything else is refused before upload, naming the key or tensor.
Names from gguf-py's constants.py (Keys.LLM, Keys.Attention, Keys.Rope; MODEL_TENSORS) as
llama.cpp's convert_hf_to_gguf.py writes them (conversion/llama.py `LlamaModel`,
conversion/qwen.py `Qwen2Model`, `Qwen3Model`; conversion/base.py
`TextModel.set_gguf_parameters`, conversion/gemma.py `Gemma3Model`); the forward each means
as transformers' modeling_llama.py, modeling_qwen2.py, modeling_qwen3.py, modeling_gemma3.py
and llama.cpp's src/models/*.cpp compute it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vkrt.errors import ModelFormatError
from vkrt.models.gguf import SPECIAL_TOKEN_KEYS, GGUFFile

# `<arch>.*` keys every family reads (Arch.from_gguf implements each).
COMMON_KEYS = frozenset({
    "vocab_size", "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length",
    "rope.freq_base", "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
})
# Read by llama.cpp only for scaling types vkrt refuses (YaRN's original context) or never for
# the math (whether the model was fine-tuned with scaling).
HARMLESS_KEYS = frozenset({"rope.scaling.original_context_length", "rope.scaling.finetuned"})
ROPE_SCALING_TYPES = ("none", "linear")
# Linear layers that may carry a bias (transformers' LlamaConfig attention_bias: q, k, v and
# o_proj; mlp_bias: gate, up and down_proj; convert_hf_to_gguf.py names them
# blk.N.attn_{q,k,v,output}.bias and blk.N.ffn_{gate,up,down}.bias).
LINEAR_LAYERS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
QKV_LAYERS = ("attn_q", "attn_k", "attn_v")


@dataclass(frozen=True)
class Family:
    """What one `general.architecture` is (static; the file gives the sizes).

    rope_neox: RoPE rotates halves (i, i + head_dim / 2) of each head, as the file stores Q
    and K unpermuted (llama.cpp's LLAMA_ROPE_TYPE_NEOX: qwen2, qwen3); False: adjacent pairs
    (2i, 2i + 1), the rows `LlamaModel.permute` reorders for `llama` files.
    biases: linear layers (`LINEAR_LAYERS`) whose `.bias` tensor the file may hold.
    qk_norm: RMSNorm per head on Q and K before RoPE (`blk.N.attn_q_norm.weight`,
    `attn_k_norm.weight`, [head_dim] each; transformers' Qwen3Attention q_norm/k_norm).
    rope_freqs: `rope_freqs.weight` (llama3 RoPE frequency factors) may be present.
    default_theta: RoPE base when `<arch>.rope.freq_base` is absent.
    post_norms: RMSNorm of the attention and of the MLP output before each residual add
    (`blk.N.post_attention_norm.weight`, `post_ffw_norm.weight`; Gemma 2/3's "sandwich").
    gelu: the MLP is GELU-tanh(gate) * up (GeGLU) instead of SiLU(gate) * up.
    embed_scale: the embedded rows are multiplied by sqrt(n_embd) (input only, not the
    tied output).
    sliding_window: `<arch>.attention.sliding_window` gives sliding-window layers beside the
    global ones (llama.cpp's `load_swa_pattern(ml, swa_pattern)`: layer i slides unless
    i % swa_pattern == swa_pattern - 1, or `<arch>.attention.sliding_window_pattern` says),
    with RoPE base `<arch>.rope.freq_base_swa` (default 10000, llama-hparams.h
    rope_freq_base_train_swa).
    """
    rope_neox: bool
    biases: tuple[str, ...] = ()
    qk_norm: bool = False
    rope_freqs: bool = False
    default_theta: float = 10000.0
    post_norms: bool = False
    gelu: bool = False
    embed_scale: bool = False
    sliding_window: bool = False
    swa_pattern: int = 6

    @property
    def keys(self) -> frozenset[str]:
        """The `<arch>.*` keys this family reads."""
        extra = {"attention.sliding_window", "attention.sliding_window_pattern",
                 "rope.freq_base_swa"} if self.sliding_window else set()
        return COMMON_KEYS | extra


FAMILIES = {
    # Llama 1-3, SmolLM2, Mistral as LlamaForCausalLM: attention_bias / mlp_bias, llama3 or
    # linear RoPE scaling (conversion/llama.py).
    "llama": Family(rope_neox=False, biases=LINEAR_LAYERS, rope_freqs=True),
    # Qwen2 / Qwen2.5: q/k/v_proj biases, o_proj and the MLP without (transformers'
    # modeling_qwen2.py); RoPE base 1e6 is in the file (rope.freq_base).
    "qwen2": Family(rope_neox=True, biases=QKV_LAYERS),
    # Qwen3: no biases (attention_bias False in every released config), q_norm and k_norm
    # (modeling_qwen3.py Qwen3Attention).
    "qwen3": Family(rope_neox=True, qk_norm=True),
    # Gemma 3 (text): Q/K norms, norms before and after attention and MLP, GeGLU, embeddings
    # times sqrt(n_embd), 5 sliding-window layers to 1 global (llama.cpp src/models/gemma3.cpp;
    # modeling_gemma3.py). The converter stores each Gemma3RMSNorm weight w as 1 + w, so the
    # norms are plain RMSNorms of the stored weights.
    "gemma3": Family(rope_neox=True, qk_norm=True, post_norms=True, gelu=True,
                     embed_scale=True, sliding_window=True, default_theta=1e6),
}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Arch:
    """One file's architecture: its family's description and the hyperparameters its
    `<arch>.*` keys give (`Arch.from_gguf`).

    arch: `general.architecture`; rope_neox, qk_norm: from the `Family`; head_dim is
    `<arch>.attention.key_length` when present (value_length must equal it), else
    n_embd // n_head; rope_theta is `<arch>.rope.freq_base` (the family's default when
    absent); rope_scale is the linear RoPE scaling factor (`<arch>.rope.scaling.factor` with
    scaling type `linear` or no type, as llama.cpp's llama-model.cpp reads it; 1.0 when
    absent): angles are position * inv_freq / rope_scale (transformers' modeling_rope_utils
    `_compute_linear_scaling_rope_parameters`); tied_embeddings is True when there is no
    `output.weight` (the logits reuse token_embd); attn_scale: softmax(q k^T * attn_scale),
    1 / sqrt(head_dim) (llama.cpp's gemma3.cpp: 1 / sqrt(n_embd / n_head) for the 62-layer
    Gemma 3 27B, as its query_pre_attn_scalar); post_norms, gelu: from the family;
    embed_scale: the factor on embedded rows (sqrt(n_embd) or 1); window: the sliding
    window in positions (0: no sliding layers); swa_layers: per layer, whether it slides;
    rope_theta_swa: the RoPE base of sliding layers (their RoPE is unscaled).
    """

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_theta: float
    rms_eps: float
    n_ctx: int
    tied_embeddings: bool
    bos_id: int | None
    eos_id: int | None
    rope_scale: float = 1.0
    arch: str = "llama"
    rope_neox: bool = False
    qk_norm: bool = False
    attn_scale: float = 0.0        # 0: 1 / sqrt(head_dim), set in __post_init__
    post_norms: bool = False
    gelu: bool = False
    embed_scale: float = 1.0
    window: int = 0
    swa_layers: tuple[bool, ...] = ()
    rope_theta_swa: float = 10000.0

    def __post_init__(self):
        if not self.attn_scale:
            object.__setattr__(self, "attn_scale", 1.0 / float(np.sqrt(self.head_dim)))
        if not self.swa_layers:
            object.__setattr__(self, "swa_layers", (False,) * self.n_layer)

    @property
    def family(self) -> Family:
        return FAMILIES[self.arch]

    def layer_window(self, i: int) -> int:
        """Layer i's attention window in positions (0: it attends to every position)."""
        return self.window if self.swa_layers[i] else 0

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "Arch":
        """Raises ModelFormatError (one line naming the file and the key with its value) for
        an architecture no `Family` describes, a missing or inconsistent key, or an
        `<arch>.*` key vkrt does not implement (see COMMON_KEYS)."""
        arch = g.architecture
        if arch not in FAMILIES:
            raise ModelFormatError(f"{g.path}: unsupported architecture {arch!r} "
                                   "(general.architecture; supported: "
                                   f"{', '.join(map(repr, FAMILIES))})")
        family, prefix = FAMILIES[arch], arch + "."
        md = g.metadata
        for key, value in md.items():
            if key.startswith(prefix) and key[len(prefix):] not in family.keys \
                    and key[len(prefix):] not in HARMLESS_KEYS:
                raise ModelFormatError(f"{g.path}: metadata key {key!r} = {_short(value)} is "
                                       f"not implemented by vkrt's {arch} (refused, not "
                                       "ignored)")

        def need(key: str):
            if key not in md:
                raise ModelFormatError(f"{g.path}: missing metadata key {key!r}")
            return md[key]

        def integer(key: str, default: int | None = None) -> int:
            value = need(key) if default is None else md.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelFormatError(f"{g.path}: metadata key {key!r} is {_short(value)}, "
                                       "expected a positive integer")
            return value

        def number(key: str, default: float | None = None) -> float:
            value = need(key) if default is None else md.get(key, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not np.isfinite(value) or value <= 0:
                raise ModelFormatError(f"{g.path}: metadata key {key!r} is {_short(value)}, "
                                       "expected a positive finite number")
            return float(value)

        p = prefix
        n_embd = integer(p + "embedding_length")
        n_head = integer(p + "attention.head_count")
        if p + "attention.key_length" in md:
            head_dim = integer(p + "attention.key_length")
        elif n_embd % n_head:
            raise ModelFormatError(f"{g.path}: embedding_length {n_embd} is not a multiple "
                                   f"of head_count {n_head} and no {p}attention.key_length "
                                   "gives the head size")
        else:
            head_dim = n_embd // n_head
        v_dim = integer(p + "attention.value_length", head_dim)
        if v_dim != head_dim:
            raise ModelFormatError(f"{g.path}: {p}attention.value_length = {v_dim} differs "
                                   f"from the key head size {head_dim}: vkrt needs one head "
                                   "size for K and V")
        if head_dim % 2:
            raise ModelFormatError(f"{g.path}: head size {head_dim} is odd: RoPE rotates pairs")
        rope_dim = integer(p + "rope.dimension_count", head_dim)
        if rope_dim != head_dim:
            # transformers' Llama rotates whole heads (modeling_llama.py apply_rotary_pos_emb).
            raise ModelFormatError(f"{g.path}: {p}rope.dimension_count = {rope_dim} differs "
                                   f"from the head size {head_dim}: partial RoPE is not "
                                   "implemented")
        scaling = md.get(p + "rope.scaling.type", "linear")
        if scaling not in ROPE_SCALING_TYPES:
            raise ModelFormatError(f"{g.path}: {p}rope.scaling.type = {_short(scaling)} is "
                                   f"not implemented (supported: {', '.join(ROPE_SCALING_TYPES)})")
        rope_scale = number(p + "rope.scaling.factor", 1.0)
        if scaling == "none" and rope_scale != 1.0:
            raise ModelFormatError(f"{g.path}: {p}rope.scaling.factor = {rope_scale} with "
                                   f"{p}rope.scaling.type = 'none'")
        n_head_kv = integer(p + "attention.head_count_kv", n_head)
        if n_head % n_head_kv:
            raise ModelFormatError(f"{g.path}: head_count {n_head} is not a multiple of "
                                   f"head_count_kv {n_head_kv}")
        if "token_embd.weight" not in g._infos:
            raise ModelFormatError(f"{g.path}: no tensor 'token_embd.weight'")
        embd_shape = g.tensor_info("token_embd.weight").shape
        n_vocab = int(md.get(p + "vocab_size", embd_shape[0]))
        if embd_shape != (n_vocab, n_embd):
            raise ModelFormatError(f"{g.path}: token_embd.weight has shape {embd_shape}, "
                                   f"expected ({n_vocab}, {n_embd})")
        if "output.weight" in g._infos:
            out_shape = g.tensor_info("output.weight").shape
            if out_shape != (n_vocab, n_embd):
                raise ModelFormatError(f"{g.path}: output.weight has shape {out_shape}, "
                                       f"expected ({n_vocab}, {n_embd}) like token_embd.weight")
        tokens = md.get("tokenizer.ggml.tokens")
        if tokens is not None and len(tokens) != n_vocab:
            # llama.cpp refuses this too (llama-model.cpp checks token_embd against n_vocab):
            # an id past the embedding's rows would read outside the table on the GPU.
            raise ModelFormatError(f"{g.path}: the tokenizer has {len(tokens)} tokens but "
                                   f"token_embd.weight has {n_vocab} rows")
        for key in SPECIAL_TOKEN_KEYS:
            i = md.get(key)
            if i is not None and not (isinstance(i, int) and 0 <= i < n_vocab):
                raise ModelFormatError(f"{g.path}: {key} is {i!r}, outside the "
                                       f"{n_vocab}-token vocabulary")
        bos, eos = md.get("tokenizer.ggml.bos_token_id"), md.get("tokenizer.ggml.eos_token_id")
        n_layer = integer(p + "block_count")
        window, swa_layers, theta_swa = 0, (False,) * n_layer, 10000.0
        if family.sliding_window and p + "attention.sliding_window" in md:
            window = integer(p + "attention.sliding_window")
            swa_layers = _swa_layers(g.path, p + "attention.sliding_window_pattern",
                                     md.get(p + "attention.sliding_window_pattern",
                                            family.swa_pattern), n_layer)
            theta_swa = number(p + "rope.freq_base_swa", 10000.0)
        elif family.sliding_window:
            for key in ("attention.sliding_window_pattern", "rope.freq_base_swa"):
                if p + key in md:
                    raise ModelFormatError(f"{g.path}: metadata key {p + key!r} without "
                                           f"{p}attention.sliding_window")
        attn_scale = 1.0 / float(np.sqrt(head_dim))
        if arch == "gemma3" and n_layer == 62:
            attn_scale = 1.0 / float(np.sqrt(n_embd // n_head))
        return cls(
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=integer(p + "feed_forward_length"),
            n_vocab=n_vocab,
            rope_theta=number(p + "rope.freq_base", family.default_theta),
            rms_eps=number(p + "attention.layer_norm_rms_epsilon"),
            n_ctx=integer(p + "context_length"),
            tied_embeddings="output.weight" not in g._infos,
            bos_id=None if bos is None else int(bos),
            eos_id=None if eos is None else int(eos),
            rope_scale=rope_scale,
            arch=arch,
            rope_neox=family.rope_neox,
            qk_norm=family.qk_norm,
            attn_scale=attn_scale,
            post_norms=family.post_norms,
            gelu=family.gelu,
            embed_scale=float(np.sqrt(n_embd)) if family.embed_scale else 1.0,
            window=window,
            swa_layers=swa_layers,
            rope_theta_swa=theta_swa,
        )


def _swa_layers(path: str, key: str, pattern, n_layer: int) -> tuple[bool, ...]:
    """Which layers slide, from `<arch>.attention.sliding_window_pattern`: a period n (layer
    i slides unless i % n == n - 1; every layer when n is 0; llama-hparams.cpp
    `set_swa_pattern`) or one bool per layer. Raises ModelFormatError naming the key for
    anything else."""
    if isinstance(pattern, list):
        if len(pattern) != n_layer or not all(isinstance(b, bool) for b in pattern):
            raise ModelFormatError(f"{path}: metadata key {key!r} is {_short(pattern)}, "
                                   f"expected {n_layer} bools (one per layer) or a period")
        return tuple(pattern)
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 0:
        raise ModelFormatError(f"{path}: metadata key {key!r} is {_short(pattern)}, expected "
                               "a period (0: every layer slides) or one bool per layer")
    return tuple(pattern == 0 or i % pattern < pattern - 1 for i in range(n_layer))
