"""The Llama family on vkrt: weights from a GGUF, the forward pass as a list of dispatches.

Read `Llama.forward` top to bottom: it is the architecture (Touvron et al. 2023; the layer
order of transformers' modeling_llama.py). Tensor names are the GGUF's (`token_embd`,
`blk.N.attn_q`, ...), so the loader needs no rename table. Shapes: `[tokens, hidden]`.

Weights are dequantized to f32 on the host at load (gguf's numpy dequantizer) and uploaded
once; activations and the KV cache are f32 device buffers.
"""
from __future__ import annotations

from dataclasses import dataclass
from struct import pack

import numpy as np

from vkrt.errors import ModelFormatError
from vkrt.models.gguf import GGUFFile, LlamaHParams
from vkrt.runtime.device import Device
from vkrt.runtime.memory import Buffer
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.stream import Stream

ELEMENTWISE_BLOCK = 64   # workgroup size of elementwise kernels
ARGMAX_BLOCK = 256
MATMUL_TOKENS = 8        # tokens per matmul workgroup (each W row read once per tile)
F32 = 4


def _groups(n: int, block: int) -> int:
    return (n + block - 1) // block


def rope_table(head_dim: int, theta: float, n_positions: int) -> np.ndarray:
    """(cos, sin) of every RoPE angle: f32 `[n_positions, head_dim / 2, 2]`.

    As transformers' default RoPE computes them (modeling_rope_utils
    `_compute_default_rope_parameters`, LlamaRotaryEmbedding.forward): inv_freq =
    1 / theta^(2i / head_dim) in f32, angle = position * inv_freq in f32, then cos and sin,
    here evaluated in f64 and rounded to f32 (correctly rounded, as torch's CPU f32 cos/sin
    are to within an ulp).
    """
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    inv_freq = (1.0 / (np.float32(theta) ** exponent)).astype(np.float32)
    angle = (np.arange(n_positions, dtype=np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)
    return np.stack([np.cos(angle), np.sin(angle)], axis=-1).astype(np.float32)


@dataclass
class Activations:
    """Scratch buffers for a forward over up to `n_tokens` tokens, `[tokens, width]` f32, with
    logits for up to `logit_rows` of them (1 for generation: a [tokens, n_vocab] buffer
    passes maxStorageBufferRange, 128 MiB on lavapipe, beyond 682 tokens of SmolLM2)."""
    n_tokens: int
    logit_rows: int
    ids: Buffer      # [tokens] u32
    x: Buffer        # [tokens, n_embd] residual stream
    xn: Buffer       # [tokens, n_embd] normed
    q: Buffer        # [tokens, n_head * head_dim]
    k: Buffer        # [tokens, n_head_kv * head_dim]
    v: Buffer        # [tokens, n_head_kv * head_dim]
    q_rope: Buffer   # [tokens, n_head * head_dim]
    attn: Buffer     # [tokens, n_head * head_dim]
    proj: Buffer     # [tokens, n_embd] attention or MLP output before the residual add
    gate: Buffer     # [tokens, n_ff]
    up: Buffer       # [tokens, n_ff]
    act: Buffer      # [tokens, n_ff]
    logits: Buffer   # [logit_rows, n_vocab]
    token: Buffer    # [1] u32, argmax of the last logits row

    def close(self) -> None:
        for b in vars(self).values():
            if isinstance(b, Buffer):
                b.close()


class Llama:
    """A Llama-architecture model resident on one device.

    Build with `Llama.from_gguf(device, gguf)`. `setup_caches(max_seq)` allocates the KV cache:
    per layer `k_cache`, `v_cache` of `[max_seq, n_head_kv * head_dim]` f32.
    """

    def __init__(self, device: Device, hp: LlamaHParams, weights: dict[str, Buffer],
                 stream: Stream, pipelines: PipelineCache):
        self.device, self.hp, self.w = device, hp, weights
        self.stream, self.pipelines = stream, pipelines
        self.acts: Activations | None = None
        self.k_cache: list[Buffer] = []
        self.v_cache: list[Buffer] = []
        self.rope: Buffer | None = None   # rope_table for positions 0 .. max_seq - 1
        self.max_seq = 0
        p = pipelines.get_pipeline
        # Reductions run one subgroup per workgroup: no barriers (see glsl/reduce.glsl).
        sg = device.subgroup_size
        self.k_embed = p("embed", {0: ELEMENTWISE_BLOCK})
        self.k_rmsnorm = p("rmsnorm", {0: sg})
        self.k_matvec = p("matvec", {0: sg})
        self.k_matmul = p("matmul", {0: sg, 1: MATMUL_TOKENS})
        self.k_rope = p("rope", {0: ELEMENTWISE_BLOCK})
        self.k_copy_rows = p("copy_rows", {0: ELEMENTWISE_BLOCK})
        self.k_attention = p("attention", {0: hp.head_dim})
        self.k_silu_mul = p("silu_mul", {0: ELEMENTWISE_BLOCK})
        self.k_add = p("add", {0: ELEMENTWISE_BLOCK})
        self.k_argmax = p("argmax", {0: ARGMAX_BLOCK})
        self.attn_scale = 1.0 / float(np.sqrt(hp.head_dim))  # softmax(q k^T / sqrt(d))

    @classmethod
    def from_gguf(cls, device: Device, gguf: GGUFFile, progress: bool = False) -> "Llama":
        """Dequantize every tensor of `gguf` to f32 and upload it to `device`.

        Raises: ModelFormatError (unsupported architecture, missing tensor, wrong shape),
        DeviceMemoryError when the weights do not fit.
        """
        from tqdm import tqdm

        hp = LlamaHParams.from_gguf(gguf)
        if hp.n_embd % 4 or hp.n_ff % 4 or hp.head_dim % 2:
            raise ModelFormatError(f"{gguf.path}: n_embd {hp.n_embd} and n_ff {hp.n_ff} must be "
                                   f"multiples of 4 and head_dim {hp.head_dim} even")
        stream = Stream(device)
        weights: dict[str, Buffer] = {}
        names = _expected_tensors(hp, gguf)
        for name in tqdm(names, desc="loading weights", unit="tensor", disable=not progress,
                         leave=False):
            weights[name] = stream.upload(gguf.tensor_f32(name), name=name)
        return cls(device, hp, weights, stream, PipelineCache(device))

    # -- buffers ---------------------------------------------------------------------------
    def setup_caches(self, max_seq: int) -> None:
        """Allocate the KV cache and the RoPE table for sequences of up to `max_seq` tokens
        (prompt + generated)."""
        hp = self.hp
        for b in self.k_cache + self.v_cache + ([self.rope] if self.rope else []):
            b.close()
        self.rope = self.stream.upload(rope_table(hp.head_dim, hp.rope_theta, max_seq), name="rope")
        row = hp.n_head_kv * hp.head_dim * F32
        self.k_cache = [Buffer(self.device, max_seq * row, name=f"blk.{i}.k_cache")
                        for i in range(hp.n_layer)]
        self.v_cache = [Buffer(self.device, max_seq * row, name=f"blk.{i}.v_cache")
                        for i in range(hp.n_layer)]
        self.max_seq = max_seq

    def activations(self, n_tokens: int, logit_rows: int = 1) -> Activations:
        """Scratch buffers for a forward of `n_tokens` tokens keeping `logit_rows` rows of
        logits; reallocated (larger) only when the current ones are too small."""
        a = self.acts
        if a is not None and a.n_tokens >= n_tokens and a.logit_rows >= logit_rows:
            return a
        if a is not None:
            n_tokens, logit_rows = max(n_tokens, a.n_tokens), max(logit_rows, a.logit_rows)
            a.close()
        hp, d, T = self.hp, self.device, n_tokens
        qw, kvw = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim

        def buf(width: int, name: str) -> Buffer:
            return Buffer(d, T * width * F32, name=name)

        self.acts = Activations(
            T, logit_rows, buf(1, "ids"), buf(hp.n_embd, "x"), buf(hp.n_embd, "xn"), buf(qw, "q"),
            buf(kvw, "k"), buf(kvw, "v"), buf(qw, "q_rope"), buf(qw, "attn"),
            buf(hp.n_embd, "proj"), buf(hp.n_ff, "gate"), buf(hp.n_ff, "up"),
            buf(hp.n_ff, "act"),
            Buffer(d, logit_rows * hp.n_vocab * F32, name="logits"), Buffer(d, F32, name="token"))
        return self.acts

    # -- kernels ---------------------------------------------------------------------------
    def _linear(self, x: Buffer, weight: Buffer, y: Buffer, n_tokens: int, n_in: int,
                n_out: int, x_row: int = 0) -> None:
        """y[t, :] = weight @ x[x_row + t, :]; weight [n_out, n_in]."""
        s = self.stream
        assert n_in % 4 == 0, "matvec/matmul load vec4"
        if n_tokens == 1:
            s.dispatch(self.k_matvec, (weight, x, y), (n_out, 1, 1),
                       pack("<2I", n_in, x_row * n_in))
        else:
            assert x_row == 0
            s.dispatch(self.k_matmul, (weight, x, y), (n_out, _groups(n_tokens, MATMUL_TOKENS), 1),
                       pack("<3I", n_in, n_out, n_tokens))

    def _rmsnorm(self, x: Buffer, weight: Buffer, out: Buffer, n_tokens: int) -> None:
        self.stream.dispatch(self.k_rmsnorm, (x, weight, out), (n_tokens, 1, 1),
                             pack("<If", self.hp.n_embd, self.hp.rms_eps))

    def _elementwise(self, kernel, buffers, n: int) -> None:
        self.stream.dispatch(kernel, buffers, (_groups(n, ELEMENTWISE_BLOCK), 1, 1),
                             pack("<I", n))

    def _attention_block(self, layer: int, a: Activations, T: int, pos0: int) -> None:
        hp, s, w = self.hp, self.stream, self.w
        blk = f"blk.{layer}."
        qw, kvw = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        self._rmsnorm(a.x, w[blk + "attn_norm.weight"], a.xn, T)
        self._linear(a.xn, w[blk + "attn_q.weight"], a.q, T, hp.n_embd, qw)
        self._linear(a.xn, w[blk + "attn_k.weight"], a.k, T, hp.n_embd, kvw)
        self._linear(a.xn, w[blk + "attn_v.weight"], a.v, T, hp.n_embd, kvw)
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        half = hp.head_dim // 2
        s.dispatch(self.k_rope, (a.q, self.rope, a.q_rope),
                   (_groups(hp.n_head * half, ELEMENTWISE_BLOCK), T, 1),
                   pack("<4I", hp.n_head, hp.head_dim, pos0, 0))
        s.dispatch(self.k_rope, (a.k, self.rope, k_cache),
                   (_groups(hp.n_head_kv * half, ELEMENTWISE_BLOCK), T, 1),
                   pack("<4I", hp.n_head_kv, hp.head_dim, pos0, pos0))
        s.dispatch(self.k_copy_rows, (a.v, v_cache), (_groups(kvw, ELEMENTWISE_BLOCK), T, 1),
                   pack("<2I", kvw, pos0))
        s.dispatch(self.k_attention, (a.q_rope, k_cache, v_cache, a.attn), (hp.n_head, T, 1),
                   pack("<4If", hp.n_head, hp.n_head_kv, hp.head_dim, pos0, self.attn_scale))
        self._linear(a.attn, w[blk + "attn_output.weight"], a.proj, T, qw, hp.n_embd)
        self._elementwise(self.k_add, (a.x, a.proj), T * hp.n_embd)

    def _mlp_block(self, layer: int, a: Activations, T: int) -> None:
        hp, w = self.hp, self.w
        blk = f"blk.{layer}."
        self._rmsnorm(a.x, w[blk + "ffn_norm.weight"], a.xn, T)
        self._linear(a.xn, w[blk + "ffn_gate.weight"], a.gate, T, hp.n_embd, hp.n_ff)
        self._linear(a.xn, w[blk + "ffn_up.weight"], a.up, T, hp.n_embd, hp.n_ff)
        self._elementwise(self.k_silu_mul, (a.gate, a.up, a.act), T * hp.n_ff)
        self._linear(a.act, w[blk + "ffn_down.weight"], a.proj, T, hp.n_ff, hp.n_embd)
        self._elementwise(self.k_add, (a.x, a.proj), T * hp.n_embd)

    # -- the forward -----------------------------------------------------------------------
    def forward(self, ids: Buffer, n_tokens: int, pos0: int, all_logits: bool = False) -> None:
        """Record one forward over `n_tokens` token ids (u32 in `ids`) at positions
        pos0 .. pos0 + n_tokens - 1, writing K/V into the cache.

        Afterwards `acts.logits` holds `[n_tokens, n_vocab]` logits when `all_logits`, else
        the last token's `[n_vocab]` logits, and `acts.token` its argmax (greedy next token).
        Nothing waits: read the results through the stream.
        Raises: ValueError when the positions exceed the KV cache.
        """
        hp, T, w = self.hp, n_tokens, self.w
        if pos0 + T > self.max_seq:
            raise ValueError(f"positions {pos0}..{pos0 + T - 1} exceed the KV cache of "
                             f"{self.max_seq} tokens (setup_caches)")
        a = self.activations(T, T if all_logits else 1)
        self.stream.dispatch(self.k_embed, (w["token_embd.weight"], ids, a.x),
                             (_groups(hp.n_embd, ELEMENTWISE_BLOCK), T, 1),
                             pack("<I", hp.n_embd))
        for layer in range(hp.n_layer):
            self._attention_block(layer, a, T, pos0)
            self._mlp_block(layer, a, T)
        self._rmsnorm(a.x, w["output_norm.weight"], a.xn, T)
        output = w["token_embd.weight" if hp.tied_embeddings else "output.weight"]
        if all_logits:
            self._linear(a.xn, output, a.logits, T, hp.n_embd, hp.n_vocab)
            last_row = (T - 1) * hp.n_vocab
        else:
            self._linear(a.xn, output, a.logits, 1, hp.n_embd, hp.n_vocab, x_row=T - 1)
            last_row = 0
        self.stream.dispatch(self.k_argmax, (a.logits, a.token), (1, 1, 1),
                             pack("<2I", hp.n_vocab, last_row))

    def logits(self, token_ids: list[int]) -> np.ndarray:
        """Teacher-forced logits `[len(token_ids), n_vocab]` f32 of one forward from position 0."""
        T = len(token_ids)
        if self.max_seq < T:
            self.setup_caches(T)
        a = self.activations(T, T)
        self.stream.write(a.ids, np.asarray(token_ids, np.uint32))
        self.forward(a.ids, T, 0, all_logits=True)
        return self.stream.read(a.logits, np.float32, T * self.hp.n_vocab).reshape(T, -1)

    def close(self) -> None:
        """Free every buffer and the stream (pipelines are freed with the device)."""
        if self.acts is not None:
            self.acts.close()
        for b in [*self.w.values(), *self.k_cache, *self.v_cache, *([self.rope] if self.rope else [])]:
            b.close()
        self.stream.close()


def _expected_tensors(hp: LlamaHParams, g: GGUFFile) -> list[str]:
    """The GGUF tensor names the forward reads, checked present with the shapes it assumes.
    Raises ModelFormatError naming the first missing or misshapen tensor."""

    qw, kvw = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
    shapes = {"token_embd.weight": (hp.n_vocab, hp.n_embd), "output_norm.weight": (hp.n_embd,)}
    if not hp.tied_embeddings:
        shapes["output.weight"] = (hp.n_vocab, hp.n_embd)
    for i in range(hp.n_layer):
        b = f"blk.{i}."
        shapes.update({
            b + "attn_norm.weight": (hp.n_embd,), b + "attn_q.weight": (qw, hp.n_embd),
            b + "attn_k.weight": (kvw, hp.n_embd), b + "attn_v.weight": (kvw, hp.n_embd),
            b + "attn_output.weight": (hp.n_embd, qw), b + "ffn_norm.weight": (hp.n_embd,),
            b + "ffn_gate.weight": (hp.n_ff, hp.n_embd), b + "ffn_up.weight": (hp.n_ff, hp.n_embd),
            b + "ffn_down.weight": (hp.n_embd, hp.n_ff)})
    present = set(g.tensor_names)
    for name, shape in shapes.items():
        if name not in present:
            raise ModelFormatError(f"{g.path}: missing tensor {name!r}")
        if tuple(g.tensor_info(name).shape) != shape:
            raise ModelFormatError(f"{g.path}: tensor {name!r} has shape "
                                   f"{tuple(g.tensor_info(name).shape)}, expected {shape}")
    return list(shapes)
