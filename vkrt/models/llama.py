"""The Llama-like families on vkrt (`llama`, `qwen2`, `qwen3`, `gemma3`: vkrt/models/arch.py
describes each): weights from a GGUF, the forward pass as a list of dispatches.

Read `Llama.step` top to bottom: it is the architecture (Touvron et al. 2023; the layer
order of transformers' modeling_llama.py, with what the file's `Arch` adds: RoPE on halves,
Q/K/V biases, per-head Q/K norms, post-norms, GeGLU, the embedding scale and sliding-window
layers, as modeling_qwen2.py, modeling_qwen3.py and modeling_gemma3.py compute them),
emitted as data (a list of `Dispatch` records named after the GGUF tensors: `token_embd`, `blk.N.attn_q`, ...) that the stream records. Tensor
names are the GGUF's, so the loader needs no rename table. Shapes: `[tokens, hidden]`.

Weights stay as the GGUF stores them: matrices (and the embedding table) are uploaded as
their raw bytes, in any type of vkrt/weight_types.py (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS), and the kernels read those
types (see vkrt/kernels.py `WEIGHTS`); 1-D tensors (norms, biases) become f32. All weights
are views of a few large device-local buffers (`WeightArena`). Activations (views of one
buffer) and the KV cache (views of another) are f32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from vkrt import config, weight_types
from vkrt.errors import ModelFormatError
from vkrt.kernels import Kernels, attention_partials
from vkrt.models.decoder import Decoder
from vkrt.models.arch import QKV_LAYERS, Arch
from vkrt.models.gguf import GGUFFile
from vkrt.models.llama_batch import LlamaBatch
from vkrt.models.scratch import KVBuffers, aligned, arena, grow, kv_cache
from vkrt.runtime.device import Device
from vkrt.runtime.dispatch import Dispatch
from vkrt.runtime.memory import Buffer
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.stream import Stream
from vkrt.runtime.tensor import BLOCKS, Tensor, nbytes_of


def rope_table(head_dim: int, theta: float, n_positions: int, scale: float = 1.0,
               freq_factors: np.ndarray | None = None) -> np.ndarray:
    """(cos, sin) of every RoPE angle: f32 `[n_positions, head_dim / 2, 2]`.

    As transformers' default RoPE computes them (modeling_rope_utils
    `_compute_default_rope_parameters`, LlamaRotaryEmbedding.forward): inv_freq =
    1 / theta^(2i / head_dim) in f32, angle = position * inv_freq in f32, then cos and sin,
    here evaluated in f64 and rounded to f32 (correctly rounded, as torch's CPU f32 cos/sin
    are to within an ulp).
    Scaling, both as f32 divisions of inv_freq:
    - `scale` (linear scaling, `llama.rope.scaling.factor`): inv_freq / scale, as
      `_compute_linear_scaling_rope_parameters` does;
    - `freq_factors` (f32 `[head_dim / 2]`, the GGUF's `rope_freqs.weight`, which llama.cpp's
      convert_hf_to_gguf.py writes for rope_type "llama3"): inv_freq / freq_factors[i], as
      llama.cpp's ggml_rope_ext divides each pair's angle by its frequency factor. Equal up to
      rounding to transformers' `_compute_llama3_parameters` inv_freq.
    """
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    inv_freq = (1.0 / (np.float32(theta) ** exponent)).astype(np.float32)
    if scale != 1.0:
        inv_freq = (inv_freq / np.float32(scale)).astype(np.float32)
    if freq_factors is not None:
        inv_freq = (inv_freq / np.asarray(freq_factors, np.float32)).astype(np.float32)
    angle = (np.arange(n_positions, dtype=np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)
    return np.stack([np.cos(angle), np.sin(angle)], axis=-1).astype(np.float32)


# GGUF tensor type -> the dtype the kernels read it as (matrices are kept as stored): the
# type table's (vkrt/weight_types.py).
WEIGHT_DTYPES = weight_types.GGUF_DTYPES
# 1-D tensors (norms, biases) of these types are converted to f32 on the host (they are small).
VECTOR_TYPES = ("F32", "F16", "BF16")
CHUNK_LIMIT = 1 << 30  # largest weight allocation: min(this, maxMemoryAllocationSize)


class WeightArena:
    """Every weight of a model as views of a few device-local buffers.

    `WeightArena(device, sizes)` places tensors (name -> bytes) in order, each at an offset
    aligned to minStorageBufferOffsetAlignment, in buffers of at most
    min(maxMemoryAllocationSize, 1 GiB) bytes (a tensor larger than that gets a buffer of its
    own); nothing is allocated until `allocate()`. Attributes: `buffers` (after `allocate`),
    `place` (name -> (buffer index, offset)), `sizes` (bytes per buffer)."""

    def __init__(self, device: Device, sizes: dict[str, int]):
        self.device = device
        align = device.min_storage_buffer_offset_alignment
        chunk = min(device.max_memory_allocation_size, CHUNK_LIMIT)
        self.place: dict[str, tuple[int, int]] = {}
        self.sizes: list[int] = []
        end = 0
        for name, nbytes in sizes.items():
            start = aligned(end, align)
            if not self.sizes or (start + nbytes > chunk and end > 0):
                self.sizes.append(0)
                start = 0
            self.place[name] = (len(self.sizes) - 1, start)
            end = start + nbytes
            self.sizes[-1] = end
        self.buffers: list[Buffer] = []

    def allocate(self) -> None:
        """Allocate the buffers (DeviceMemoryError when they do not fit; none is kept)."""
        try:
            for i, nbytes in enumerate(self.sizes):
                self.buffers.append(Buffer(self.device, max(nbytes, 4), name=f"weights{i}"))
        except BaseException:
            self.close()
            raise

    def view(self, name: str, dtype: str, shape: tuple[int, ...]) -> Tensor:
        i, offset = self.place[name]
        return Tensor(self.buffers[i], offset, nbytes_of(dtype, shape, name), dtype, shape, name)

    @property
    def nbytes(self) -> int:
        """Bytes of device memory the weights take (allocation sizes)."""
        return sum(b.allocation_bytes for b in self.buffers if b.memory is not None)

    def close(self) -> None:
        for b in self.buffers:
            b.close()
        self.buffers = []


@dataclass
class Activations:
    """Scratch tensors for a forward over up to `n_tokens` tokens, `[tokens, width]` f32, with
    logits for up to `logit_rows` of them (1 for generation: a [tokens, n_vocab] view
    passes maxStorageBufferRange, 128 MiB on lavapipe, beyond 682 tokens of SmolLM2).
    All are disjoint views of one buffer (`arena`): the tracker orders them by byte range.

    `tokens` is the token ring: one `[1]` u32 slot per in-flight decode step (the stream's
    VKRT_INFLIGHT). Decode step j's argmax writes `tokens[j % len]` and step j + 1's
    embedding reads it; the host reads step j's token after submitting up to len - 1 later
    steps, each writing another slot, so no later step overwrites a token before the host
    has read it (generate.py). `token` is `tokens[0]`."""
    n_tokens: int
    logit_rows: int
    arena: Buffer
    ids: Tensor      # [tokens] u32
    x: Tensor        # [tokens, n_embd] residual stream
    xn: Tensor       # [tokens, n_embd] normed
    q: Tensor        # [tokens, n_head * head_dim]
    k: Tensor        # [tokens, n_head_kv * head_dim]
    v: Tensor        # [tokens, n_head_kv * head_dim]
    q_rope: Tensor   # [tokens, n_head * head_dim]
    kn: Tensor       # [tokens, n_head_kv * head_dim] K normed per head (qk_norm)
    attn: Tensor     # [tokens, n_head * head_dim]
    attn_part: Tensor  # decode attention's partial states (kernels.attention_partials)
    proj: Tensor     # [tokens, n_embd] attention or MLP output before the residual add
    gate: Tensor     # [tokens, n_ff]
    up: Tensor       # [tokens, n_ff]
    act: Tensor      # [tokens, n_ff]
    logits: Tensor   # [logit_rows, n_vocab]
    pos: Tensor      # [1] u32: the position of a replayed decode step (advanced on the GPU)
    tokens: list     # ring of [1] u32 tensors: the argmax of the last logits row, per step
    token: Tensor    # tokens[0]
    head: Tensor | None = None  # [logit_rows, slice rows]: one slice's logits (split output)
    # A prompt product's partial sums by the layer's product ("attn_k"), [splits x tokens x
    # rows] f32, its columns split across workgroups (Kernels.prefill_splits); one tensor
    # per product, so that a layer's products stay independent of each other.
    parts: dict[str, Tensor] = field(default_factory=dict)

    @classmethod
    def allocate(cls, device: Device, hp: Arch, n_tokens: int,
                 logit_rows: int, ring: int = 1, head_rows: int = 0,
                 partials: dict[str, int] | None = None) -> "Activations":
        """One buffer holding every view, each at an offset aligned to the device's
        minStorageBufferOffsetAlignment; `ring` token slots; `head` when the output matrix
        is split in slices of `head_rows` rows and several rows of logits are kept; `parts`
        of `partials` (a layer's product -> f32 elements)."""
        qw, kvw, T = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, n_tokens
        layout = {"ids": ("uint32", (T,)), "x": ("float32", (T, hp.n_embd)),
                  "xn": ("float32", (T, hp.n_embd)), "q": ("float32", (T, qw)),
                  "k": ("float32", (T, kvw)), "v": ("float32", (T, kvw)),
                  "q_rope": ("float32", (T, qw)), "kn": ("float32", (T, kvw)),
                  "attn": ("float32", (T, qw)),
                  "attn_part": ("float32", (attention_partials(hp.n_head, hp.head_dim),)),
                  "proj": ("float32", (T, hp.n_embd)), "gate": ("float32", (T, hp.n_ff)),
                  "up": ("float32", (T, hp.n_ff)), "act": ("float32", (T, hp.n_ff)),
                  "logits": ("float32", (logit_rows, hp.n_vocab))}
        if head_rows and logit_rows > 1:
            layout["head"] = ("float32", (logit_rows, head_rows))
        layout["pos"] = ("uint32", (1,))
        layout.update({f"token{j}": ("uint32", (1,)) for j in range(max(1, ring))})
        layout.update({f"part.{p}": ("float32", (n,)) for p, n in (partials or {}).items()})
        buffer, views = arena(device, layout)
        tokens = [views.pop(f"token{j}") for j in range(max(1, ring))]
        parts = {p: views.pop(f"part.{p}") for p in partials or {}}
        return cls(T, logit_rows, buffer, tokens=tokens, token=tokens[0], parts=parts, **views)

    def close(self) -> None:
        self.arena.close()


class Llama(LlamaBatch, Decoder):
    """A Llama-architecture model resident on one device.

    Build with `Llama.from_gguf(device, gguf)`. `setup_caches(max_seq)` allocates the KV cache:
    one buffer holding, per layer, `k_cache[i]` and `v_cache[i]`, views of
    `[max_seq, n_head_kv * head_dim]` of `kv_dtype` (f32 unless `vkrt.load` says f16). Decode
    steps can be replayed (`Decoder`).
    Several sequences at once over a paged KV cache: `setup_paged_cache`, `execute_batch`
    (`LlamaBatch`, vkrt/models/llama_batch.py, over vkrt/models/batch.py's `PagedBatch`).
    """

    replayable = True

    def __init__(self, device: Device, hp: Arch, weights: dict[str, Tensor],
                 stream: Stream, pipelines: PipelineCache,
                 rope_freqs: np.ndarray | None = None, arena: WeightArena | None = None,
                 slices: dict[str, list[tuple[int, Tensor]]] | None = None):
        self.device, self.hp, self.w = device, hp, weights
        # Tables larger than one binding (SPLIT): name -> [(first row, view of its rows)].
        self.slices = slices or {}
        self.arena = arena  # the buffers under `weights`
        self.rope_freqs = rope_freqs  # rope_freqs.weight, f32 [head_dim / 2], or None
        self.stream, self.pipelines = stream, pipelines
        self.acts: Activations | None = None
        self.kv: KVBuffers | None = None
        self.k_cache: list[Tensor] = []
        self.v_cache: list[Tensor] = []
        self.rope: Tensor | None = None   # rope_table for positions 0 .. max_seq - 1
        self.rope_swa: Tensor | None = None   # the sliding layers' table (hp.rope_theta_swa)
        self.max_seq = 0
        self.k = Kernels(pipelines, head_dim=hp.head_dim)
        self.attn_scale = hp.attn_scale  # softmax(q k^T * attn_scale)
        self._fused = [self.fused_parts(i) for i in range(hp.n_layer)]

    @classmethod
    def from_gguf(cls, device: Device, gguf: GGUFFile, progress: bool = False) -> "Llama":
        """Upload every tensor of `gguf` to `device` as the kernels read it: matrices as their
        stored bytes (the types of vkrt/weight_types.py; no f32 copy), 1-D tensors (norms,
        biases) as f32, all suballocated from a few buffers (`WeightArena`). Bytes are read
        from the file straight into mapped device memory, or through one scratch array of the
        largest tensor's size and the stream's staging when the device memory is not
        mappable: no second copy of the file in host memory (nothing of it is memory-mapped).
        The file's descriptor stays open: `gguf.close()` releases it. token_embd and output
        larger than the device's maxStorageBufferRange are bound as slices of rows
        (`slices`, `slice_rows`).

        Every tensor of the file is read by the forward or the file is refused, and every
        check runs before the first allocation.
        Raises: ModelFormatError (one line naming the file: unsupported architecture or
        metadata key; a missing, misshapen or unknown tensor; a tensor type the kernels do not
        read, e.g. IQ2_XS, or a matrix whose rows are not whole blocks of its type or whose
        stored size does not match its type and shape; another matrix larger than the
        device's maxStorageBufferRange as stored, or a table whose smallest aligned slice
        is),
        DeviceMemoryError when the weights do not fit.
        """
        from tqdm import tqdm

        hp = Arch.from_gguf(gguf)
        if hp.n_embd % 4 or hp.n_ff % 4 or hp.head_dim % 4:
            raise ModelFormatError(f"{gguf.path}: n_embd {hp.n_embd}, n_ff {hp.n_ff} and "
                                   f"head_dim {hp.head_dim} must be multiples of 4 (vec4 "
                                   "loads)")
        names = _expected_tensors(hp, gguf)
        rope_freqs = None
        if ROPE_FREQS in names:
            names.remove(ROPE_FREQS)
            rope_freqs = gguf.tensor_f32(ROPE_FREQS)
            bad = ~(np.isfinite(rope_freqs) & (rope_freqs > 0))
            if bad.any():
                i = int(np.argmax(bad))
                raise ModelFormatError(f"{gguf.path}: tensor {ROPE_FREQS!r}[{i}] is "
                                       f"{rope_freqs[i]}, expected a positive finite factor")
        limit = device.max_storage_buffer_range
        dtypes: dict[str, str] = {}
        split: dict[str, int] = {}   # SPLIT tables past one binding -> rows per slice
        for name in names:
            info = gguf.tensor_info(name)
            shape, gtype = info.shape, info.ggml_type
            if len(shape) == 1 and gtype in VECTOR_TYPES:
                dtype = "float32"
            elif len(shape) == 2 and gtype in WEIGHT_DTYPES:
                dtype = WEIGHT_DTYPES[gtype]
            else:
                supported = VECTOR_TYPES if len(shape) == 1 else tuple(WEIGHT_DTYPES)
                raise ModelFormatError(
                    f"{gguf.path}: tensor {name!r} {list(shape)} has type {gtype}, which vkrt's "
                    f"kernels do not read (supported: {', '.join(supported)})")
            if dtype in BLOCKS and shape[-1] % BLOCKS[dtype][0]:
                raise ModelFormatError(f"{gguf.path}: tensor {name!r} {list(shape)} {gtype}: "
                                       f"rows of {shape[-1]} are not whole blocks of "
                                       f"{BLOCKS[dtype][0]}")
            nbytes = nbytes_of(dtype, shape, name)
            if len(shape) == 2 and info.nbytes != _stored_bytes(dtype, shape):
                raise ModelFormatError(
                    f"{gguf.path}: tensor {name!r} {list(shape)} {gtype} holds {info.nbytes} "
                    f"bytes in the file, {_stored_bytes(dtype, shape)} by vkrt's type table")
            if nbytes > limit:
                what = (f"{gguf.path}: tensor {name!r} {list(shape)} {gtype} is {nbytes} bytes, "
                        f"more than the device's maxStorageBufferRange of {limit} bytes")
                align = device.min_storage_buffer_offset_alignment
                if name not in SPLIT:
                    raise ModelFormatError(f"{what} (only {' and '.join(SPLIT)} are split over "
                                           "rows; every other weight is bound whole)")
                split[name] = slice_rows(dtype, shape, limit, align)
                if split[name] == 0:
                    g = slice_rows(dtype, shape, None, align)
                    raise ModelFormatError(
                        f"{what}, and it cannot be split: its slices start at multiples of "
                        f"{g} rows (minStorageBufferOffsetAlignment {align}), and {g} rows are "
                        f"{g * _stored_bytes(dtype, (1, shape[1]))} bytes")
            dtypes[name] = dtype
        arena = WeightArena(device, {n: nbytes_of(d, gguf.tensor_info(n).shape)
                                     for n, d in dtypes.items()})
        arena.allocate()
        stream = Stream(device)
        weights: dict[str, Tensor] = {}
        try:
            raw = [n for n in dtypes if len(gguf.tensor_info(n).shape) == 2]  # as stored
            scratch = None
            for name in tqdm(dtypes, desc="loading weights", unit="tensor",
                             disable=not progress, leave=False):
                info = gguf.tensor_info(name)
                t = weights[name] = arena.view(name, dtypes[name], info.shape)
                if name not in raw:
                    stream.write(t, gguf.tensor_f32(name))
                elif t.buffer.mapped is not None:
                    # A new buffer no command names yet: the host writes it directly.
                    gguf.read_into(name, t.buffer.host_view()[t.offset:t.offset + info.nbytes])
                else:
                    if scratch is None:
                        scratch = np.empty(max(gguf.tensor_info(n).nbytes for n in raw), np.uint8)
                    gguf.read_into(name, scratch)
                    stream.write(t, scratch[:info.nbytes])
        except BaseException:
            stream.close()
            arena.close()
            raise
        slices = {name: row_slices(weights[name], rows) for name, rows in split.items()}
        return cls(device, hp, weights, stream, PipelineCache(device), rope_freqs, arena,
                   slices)

    # -- buffers ---------------------------------------------------------------------------
    def setup_caches(self, max_seq: int) -> None:
        """Allocate the KV cache (of `kv_dtype`) and the RoPE table for sequences of up to
        `max_seq` tokens (prompt + generated)."""
        hp = self.hp
        self._close_caches()
        table = rope_table(hp.head_dim, hp.rope_theta, max_seq, hp.rope_scale, self.rope_freqs)
        self.rope = self.stream.upload(table, name="rope")
        if any(hp.swa_layers):
            # Sliding layers: their own base, unscaled (llama.cpp get_rope_freq_base /
            # get_rope_freq_scale for SWA layers; transformers' Gemma3 "sliding_attention"
            # RoPE parameters).
            self.rope_swa = self.stream.upload(rope_table(hp.head_dim, hp.rope_theta_swa,
                                                          max_seq), name="rope_swa")
        self.kv, self.k_cache, self.v_cache = kv_cache(
            self.device, hp.n_layer, max_seq, hp.n_head_kv * hp.head_dim,
            lambda i, what: f"blk.{i}.{what}", self.kv_dtype)
        self.max_seq = max_seq

    def _close_caches(self) -> None:
        if self.kv is not None:
            self.kv.close()
            self.rope.buffer.close()
            if self.rope_swa is not None:
                self.rope_swa.buffer.close()
            self.kv = self.rope = self.rope_swa = None

    def activations(self, n_tokens: int, logit_rows: int = 1) -> Activations:
        """Scratch tensors for a forward of `n_tokens` tokens keeping `logit_rows` rows of
        logits and a token ring of `stream.inflight` slots; reallocated (larger) only when the
        current ones are too small (the old buffer is freed once in-flight steps are done)."""
        head = self.slices.get(self._output_name())
        head_rows = head[0][1].shape[0] if head else 0

        def allocate(n: int, rows: int, ring: int) -> Activations:
            # Only when the activations grow: the partials of a layer's product ("attn_k")
            # sized for its weights in every layer.
            products: dict[str, list[Tensor]] = {}
            for name, t in self.w.items():
                if name.startswith("blk.") and name.endswith(".weight") and len(t.shape) == 2:
                    products.setdefault(name.split(".")[2], []).append(t)
            sizes = {p: self.k.prefill_partials(ws, n) for p, ws in products.items()}
            return Activations.allocate(self.device, self.hp, n, rows, ring, head_rows,
                                        {p: size for p, size in sizes.items() if size})

        self.acts = grow(self.acts, n_tokens, logit_rows, self.stream.inflight, allocate)
        return self.acts

    # -- the forward -----------------------------------------------------------------------
    def _linear(self, x: Tensor, name: str, y: Tensor, T: int) -> list[Dispatch]:
        """y = x W^T (+ b when the file has `name.bias`) for T tokens: the GGUF tensor `name`;
        a prompt's product whose columns the table splits across workgroups
        (`Kernels.prefill_splits`) writes its partial sums to the activations' `parts` of
        its product and `sum_splits` adds them into y."""
        k, w = self.k, self.w
        weight = w[name + ".weight"]
        splits = k.prefill_splits(weight, T)
        if splits > 1:
            part = self.acts.parts[name.split(".")[2]]
            out = [k.linear(x, weight, y, T, name=name, k_splits=splits, partials=part),
                   k.sum_splits(part, y, T, weight.shape[0], splits, name=name + ".sum")]
        else:
            out = [k.linear(x, weight, y, T, name=name)]
        if name + ".bias" in w:
            out.append(k.bias_add(y, w[name + ".bias"], T, name=name + ".bias"))
        return out

    def fused_parts(self, i: int) -> tuple[bool, bool, bool, bool]:
        """Which parts of layer i a decode step runs fused (`_layer`), from the family and
        the file: (Q/K/V: `qkv_rope` with the input norm, RoPE on either layout, Q/K/V
        biases all three or none, per-head Q/K norms, the cache writes; Q/K/V of one dtype,
        or V's of a pair in weight_types.MIXED_QKV),
        (attention output: `matvec_add`, the residual add inside the product; no bias, no
        post-norm), (MLP input: `matvec_glu`, SiLU or GELU-tanh; no gate/up biases, gate/up
        of one dtype), (MLP output: as the attention output)."""
        hp, w, blk = self.hp, self.w, f"blk.{i}."

        def biased(layer: str) -> bool:
            return f"{blk}{layer}.bias" in w

        q, k, v = (w[f"{blk}attn_{m}.weight"].dtype for m in "qkv")
        qkv = (len({biased(layer) for layer in QKV_LAYERS}) == 1 and q == k
               and (v == q or (q, v) in weight_types.MIXED_QKV))
        glu = (not biased("ffn_gate") and not biased("ffn_up")
               and w[blk + "ffn_gate.weight"].dtype == w[blk + "ffn_up.weight"].dtype)
        return (qkv, not biased("attn_output") and not hp.post_norms, glu,
                not biased("ffn_down") and not hp.post_norms)

    def fusable(self, i: int) -> bool:
        """Whether layer i's decode step is wholly fused: 5 dispatches in 5 dependent stages
        (qkv_rope | attention | matvec_add | matvec_glu | matvec_add; `fused_parts`)."""
        return all(self.fused_parts(i))

    def _qkv_fused(self, i: int, a: Activations, pos0: int,
                   pos: Tensor | None) -> list[Dispatch]:
        """Q, K, V of one token in one dispatch (`qkv_rope`): the arithmetic of `_qkv`
        with the norm folded into the products, the biases inside, RoPE and the cache writes
        after them; a family with per-head Q/K norms adds `head_norm_rope` (a second
        stage)."""
        hp, k, w, blk = self.hp, self.k, self.w, f"blk.{i}."
        biases = qk_norm = None
        if blk + "attn_q.bias" in w:
            biases = tuple(w[f"{blk}{layer}.bias"] for layer in QKV_LAYERS)
        if hp.qk_norm:
            qk_norm = (w[blk + "attn_q_norm.weight"], w[blk + "attn_k_norm.weight"])
        return k.qkv_rope(a.x, w[blk + "attn_norm.weight"], w[blk + "attn_q.weight"],
                          w[blk + "attn_k.weight"], w[blk + "attn_v.weight"],
                          self.rope_swa if hp.swa_layers[i] else self.rope, a.q_rope,
                          self.k_cache[i], self.v_cache[i], hp.head_dim, pos0, hp.rms_eps,
                          a.pos, pos is not None, name=blk + "attn_qkv", neox=hp.rope_neox,
                          biases=biases, qk_norm=qk_norm)

    def _qkv(self, i: int, a: Activations, T: int, pos0: int,
             pos: Tensor | None) -> list[Dispatch]:
        """Q (RoPE'd into q_rope), K (RoPE'd into the cache) and V (into the cache) of T
        tokens, unfused: RMSNorm, the three products and their biases, the per-head Q/K
        norms, RoPE, the V copy."""
        hp, k, w, blk = self.hp, self.k, self.w, f"blk.{i}."
        k_cache, v_cache = self.k_cache[i], self.v_cache[i]
        out = [
            k.rmsnorm(a.x, w[blk + "attn_norm.weight"], a.xn, T, hp.rms_eps, blk + "attn_norm"),
            *self._linear(a.xn, blk + "attn_q", a.q, T),
            *self._linear(a.xn, blk + "attn_k", a.k, T),
            *self._linear(a.xn, blk + "attn_v", a.v, T),
        ]
        q, kk = a.q, a.k
        if hp.qk_norm:
            # RMSNorm of each head's Q and K before RoPE (modeling_qwen3.py Qwen3Attention:
            # q_norm, k_norm over head_dim): rows of head_dim, T * heads of them.
            out += [k.rmsnorm(a.q, w[blk + "attn_q_norm.weight"], a.attn, T * hp.n_head,
                              hp.rms_eps, blk + "attn_q_norm"),
                    k.rmsnorm(a.k, w[blk + "attn_k_norm.weight"], a.kn, T * hp.n_head_kv,
                              hp.rms_eps, blk + "attn_k_norm")]
            q, kk = a.attn, a.kn
        rope = self.rope_swa if hp.swa_layers[i] else self.rope
        return out + [
            k.rope(q, rope, a.q_rope, T, hp.n_head, hp.head_dim, pos0,
                   name=blk + "rope_q", pos=pos, neox=hp.rope_neox),
            k.rope(kk, rope, k_cache, T, hp.n_head_kv, hp.head_dim, pos0, dst_row=pos0,
                   name=blk + "rope_k", pos=pos, dst_at_pos=True,
                   neox=hp.rope_neox),  # K straight into the cache
            k.copy_rows(a.v, v_cache, T, pos0, name=blk + "v_cache", pos=pos),
        ]

    def _projection(self, i: int, a: Activations, src: Tensor, T: int, layer: str,
                    post_norm: str, residual: str, fused: bool) -> list[Dispatch]:
        """x += the output projection `layer` of src: fused, the add inside the product
        (`matvec_add`, one token); else the product (and its bias) into proj, then x +=
        proj, or x += rmsnorm(proj) * blk.i.<post_norm>.weight where the family puts a norm
        after the block (Gemma 3: modeling_gemma3.py post_attention_layernorm,
        post_feedforward_layernorm; `rmsnorm_add`)."""
        hp, k, w, blk = self.hp, self.k, self.w, f"blk.{i}."
        if fused:
            return [k.linear(src, w[blk + layer + ".weight"], a.x, 1, name=blk + layer,
                             accumulate=True)]
        out = self._linear(src, blk + layer, a.proj, T)
        if not hp.post_norms:
            return out + [k.add(a.x, a.proj, T * hp.n_embd, name=blk + residual)]
        return out + [k.rmsnorm_add(a.proj, w[blk + post_norm + ".weight"], a.x, T,
                                    hp.rms_eps, blk + post_norm)]

    def _layer(self, i: int, a: Activations, T: int, pos0: int, pos: Tensor | None,
               fuse: bool) -> list[Dispatch]:
        """Layer i for T tokens, as the family describes it: attention (`_qkv` or
        `_qkv_fused`, then attention over the cache, windowed on sliding layers) and the
        gated MLP, each added into the residual stream x (`_projection`). With `fuse` (one
        token, VKRT_FUSE) the parts `fused_parts` allows run fused; a wholly fused layer is 5
        dispatches, each depending on the one before. Without it, where the products run on
        cooperative matrices (a prompt on a GPU), gate, up and the activation are one
        `glu_coop` dispatch on `Kernels.prefill_glu_tile`'s tile when `fused_parts` allows
        the MLP input to fuse."""
        hp, k, w, blk = self.hp, self.k, self.w, f"blk.{i}."
        qkv_f, out_f, glu_f, down_f = self._fused[i] if fuse else (False,) * 4
        # head_norm_rope (the fused path's per-head norms) reads and writes K in f32: an f16
        # cache takes the unfused Q/K/V, whose K is normed and rotated before it is stored.
        qkv_f = qkv_f and not (hp.qk_norm and self.kv_dtype != "float32")
        out = self._qkv_fused(i, a, pos0, pos) if qkv_f else self._qkv(i, a, T, pos0, pos)
        out += k.attention(a.q_rope, self.k_cache[i], self.v_cache[i], a.attn, T, hp.n_head,
                           hp.n_head_kv, hp.head_dim, pos0, self.attn_scale, a.attn_part,
                           name=blk + "attn", pos=pos, window=hp.layer_window(i))
        out += self._projection(i, a, a.attn, T, "attn_output", "post_attention_norm",
                                "attn_residual", out_f)
        # A prompt's gate, up and activation as one product where the table has a tile
        # for them and the layer's gate and up may fuse (`fused_parts`).
        glu_tile = None if glu_f or not self._fused[i][2] else k.prefill_glu_tile(T)
        if glu_f:
            out.append(k.glu(a.x, w[blk + "ffn_norm.weight"], w[blk + "ffn_gate.weight"],
                             w[blk + "ffn_up.weight"], a.act, hp.rms_eps, name=blk + "ffn_glu",
                             gelu=hp.gelu))
        elif glu_tile is not None:
            out += [k.rmsnorm(a.x, w[blk + "ffn_norm.weight"], a.xn, T, hp.rms_eps,
                              blk + "ffn_norm"),
                    k.glu_coop(a.xn, w[blk + "ffn_gate.weight"], w[blk + "ffn_up.weight"],
                               a.act, T, glu_tile, gelu=hp.gelu, name=blk + "ffn_glu")]
        else:
            out += [
                k.rmsnorm(a.x, w[blk + "ffn_norm.weight"], a.xn, T, hp.rms_eps,
                          blk + "ffn_norm"),
                *self._linear(a.xn, blk + "ffn_gate", a.gate, T),
                *self._linear(a.xn, blk + "ffn_up", a.up, T),
                k.silu_mul(a.gate, a.up, a.act, T * hp.n_ff, name=blk + "ffn_silu_mul",
                           gelu=hp.gelu),
            ]
        return out + self._projection(i, a, a.act, T, "ffn_down", "post_ffw_norm",
                                      "ffn_residual", down_f)

    def row_tables(self) -> list:
        """The token embedding, unless it is also the output matrix (tied)."""
        if self.hp.tied_embeddings:
            return []
        name = "token_embd.weight"
        return [self.w[name], *(t for _, t in self.slices.get(name, ()))]

    def _output_name(self) -> str:
        return "token_embd.weight" if self.hp.tied_embeddings else "output.weight"

    def _embed(self, ids: Tensor, a: Activations, T: int) -> list[Dispatch]:
        """x = the embedding rows of T token ids: one lookup, or one per slice of a table
        larger than one binding (`embed_range`, each writing the ids of its rows)."""
        name = "token_embd.weight"
        if name not in self.slices:
            return [self.k.embed(self.w[name], ids, a.x, T, name="token_embd")]
        return [self.k.embed_range(t, row0, ids, a.x, T, name="token_embd")
                for row0, t in self.slices[name]]

    def _output(self, a: Activations, rows: int, x_row: int) -> list[Dispatch]:
        """Logits of `rows` rows of xn from row `x_row` (0 when rows > 1), over the output
        matrix's slices when it is split: one row into an aligned view of its columns, more
        rows into `head` and copied into their columns (`copy_block`)."""
        k, name = self.k, self._output_name()
        if name not in self.slices:
            return [k.linear(a.xn, self.w[name], a.logits, rows, x_row=x_row, name="output")]
        out = []
        for row0, w in self.slices[name]:
            n = w.shape[0]
            if rows > 1:
                out += [k.linear(a.xn, w, a.head, rows, name="output"),
                        k.copy_block(a.head, a.logits, rows, n, row0, name="output.copy")]
            else:
                cols = Tensor(a.logits.buffer, a.logits.offset + row0 * 4, n * 4, "float32",
                              (n,), f"logits[{row0}:{row0 + n}]")
                out.append(k.linear(a.xn, w, cols, 1, x_row=x_row, name="output"))
        return out

    def step(self, ids: Tensor, n_tokens: int, pos0: int,
             all_logits: bool = False, token_out: Tensor | None = None,
             pos: Tensor | None = None) -> list[Dispatch]:
        """The dispatches of one forward over `n_tokens` token ids (u32 in `ids`) at positions
        pos0 .. pos0 + n_tokens - 1, writing K/V into the cache. Nothing is recorded.
        One token runs the fused parts of each layer (`_layer`) that `fused_parts` and
        VKRT_FUSE allow.
        `pos` ([1] u32, P at run time): positions pos0 + P .. instead, for a step recorded
        once and replayed (`Decoder.replay_decode`); the caller keeps them in the cache.

        Once recorded, `acts.logits` holds `[n_tokens, n_vocab]` logits when `all_logits`,
        else the last token's `[n_vocab]` logits, and `token_out` (default `acts.token`, a
        `[1]` u32 view) its argmax (the greedy next token).
        Raises: ValueError when the positions exceed the KV cache.
        """
        hp, T, w, k = self.hp, n_tokens, self.w, self.k
        if pos0 + T > self.max_seq:
            raise ValueError(f"positions {pos0}..{pos0 + T - 1} exceed the KV cache of "
                             f"{self.max_seq} tokens (setup_caches)")
        a = self.activations(T, T if all_logits else 1)
        out = self._embed(ids, a, T)
        if hp.embed_scale != 1.0:   # Gemma: embeddings * sqrt(n_embd), the input only
            out.append(k.scale(a.x, T * hp.n_embd, hp.embed_scale, name="token_embd_scale"))
        fuse = T == 1 and config.FUSE.value
        for i in range(hp.n_layer):
            out += self._layer(i, a, T, pos0, pos, fuse)
        out.append(k.rmsnorm(a.x, w["output_norm.weight"], a.xn, T, hp.rms_eps, "output_norm"))
        out += self._output(a, T if all_logits else 1, 0 if all_logits else T - 1)
        last_row = (T - 1) * hp.n_vocab if all_logits else 0
        out.append(k.argmax(a.logits, a.token if token_out is None else token_out, hp.n_vocab,
                            last_row, name="argmax"))
        return out

    def close(self) -> None:
        """Free every buffer and the stream (pipelines are freed with the device)."""
        if self.acts is not None:
            self.acts.close()
        for b in {id(t.buffer): t.buffer for t in self.w.values()}.values():
            b.close()  # each weight buffer once (the arena's hold many views)
        self._close_caches()
        self._close_paged()
        self.stream.close()


# Tables split over rows when larger than one binding (maxStorageBufferRange): the embedding
# is read by `embed_range` per slice, the output product writes each slice's columns.
SPLIT = ("token_embd.weight", "output.weight")


def slice_rows(dtype: str, shape: tuple[int, int], limit: int | None, align: int) -> int:
    """Rows per slice of a [rows, cols] `dtype` matrix bound in slices of at most `limit`
    bytes: the most whole multiples of the granule that fit (0 when not one fits), where the
    granule is the fewest rows after which both the slice's bytes and its logits' f32
    columns start at a multiple of `align` (minStorageBufferOffsetAlignment); with `limit`
    None, the granule itself."""
    row = _stored_bytes(dtype, (1, shape[1]))
    align = max(align, 4)
    granule = math.lcm(align // math.gcd(row, align), align // 4)
    return granule if limit is None else limit // row // granule * granule


def row_slices(t: Tensor, rows: int) -> list[tuple[int, Tensor]]:
    """[(first row, view)] of `t` [n, cols] in slices of `rows` rows (the last may be
    shorter), views of t's buffer (block types: rows of whole blocks, the last view padded to
    a word as `nbytes_of` pads the whole)."""
    n, cols = t.shape
    row = _stored_bytes(t.dtype, (1, cols))
    return [(r0, Tensor(t.buffer, t.offset + r0 * row, nbytes_of(t.dtype, (m, cols)), t.dtype,
                        (m, cols), f"{t.name}[{r0}:{r0 + m}]"))
            for r0, m in ((r0, min(rows, n - r0)) for r0 in range(0, n, rows))]


def _stored_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a matrix of `dtype` as the file stores it (no padding), by the type table."""
    t = weight_types.BY_DTYPE[dtype]
    return shape[0] * shape[1] // t.block * t.block_bytes


ROPE_FREQS = "rope_freqs.weight"  # llama3 RoPE frequency factors, [head_dim / 2]


def _expected_tensors(hp: Arch, g: GGUFFile) -> list[str]:
    """The GGUF tensor names the forward reads (file order), checked present with the shapes
    it assumes; the biases and `rope_freqs.weight` the family allows (`hp.family`) are read
    when present, its per-head Q/K norms are required. Raises ModelFormatError naming the
    first missing, misshapen or unknown tensor (one the forward would not read: the file is
    refused rather than run with it ignored)."""

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
        if hp.qk_norm:
            shapes.update({b + "attn_q_norm.weight": (hp.head_dim,),
                           b + "attn_k_norm.weight": (hp.head_dim,)})
        if hp.post_norms:
            shapes.update({b + "post_attention_norm.weight": (hp.n_embd,),
                           b + "post_ffw_norm.weight": (hp.n_embd,)})
    present = set(g.tensor_names)
    for name, shape in shapes.items():
        if name not in present:
            raise ModelFormatError(f"{g.path}: missing tensor {name!r}")
        if tuple(g.tensor_info(name).shape) != shape:
            raise ModelFormatError(f"{g.path}: tensor {name!r} has shape "
                                   f"{tuple(g.tensor_info(name).shape)}, expected {shape}")
    optional = {ROPE_FREQS: (hp.head_dim // 2,)} if hp.family.rope_freqs else {}
    for i in range(hp.n_layer):
        for layer in hp.family.biases:
            name = f"blk.{i}.{layer}"
            optional[name + ".bias"] = (shapes[name + ".weight"][0],)
    for name in g.tensor_names:
        if name in shapes:
            continue
        if name not in optional:
            raise ModelFormatError(f"{g.path}: tensor {name!r} {list(g.tensor_info(name).shape)} "
                                   f"is not read by vkrt's {hp.arch} forward (refused, not "
                                   "ignored)")
        if tuple(g.tensor_info(name).shape) != optional[name]:
            raise ModelFormatError(f"{g.path}: tensor {name!r} has shape "
                                   f"{tuple(g.tensor_info(name).shape)}, expected {optional[name]}")
    if ROPE_FREQS in present and hp.rope_scale != 1.0:
        # transformers has one rope_type per model; llama.cpp would apply both.
        raise ModelFormatError(f"{g.path}: tensor {ROPE_FREQS!r} (llama3 RoPE scaling) together "
                               f"with llama.rope.scaling.factor = {hp.rope_scale}")
    return [n for n in g.tensor_names if n in shapes or n in optional]


def checkpoint_from_gguf(g: GGUFFile):
    """The registry's entry (vkrt.models.registry): a `llama` GGUF's hyperparameters,
    tokenizer and chat template, checked; `build(device, progress)` uploads the weights."""
    from vkrt.models.registry import Checkpoint
    from vkrt.models.tokenizer import Tokenizer

    hp = Arch.from_gguf(g)
    tokenizer = Tokenizer.from_metadata(g.metadata, g.path)

    def build(device: Device, progress: bool = False) -> Llama:
        try:
            return Llama.from_gguf(device, g, progress)
        finally:
            g.close()   # the weights are on the device (a later read reopens the file)

    return Checkpoint(g.path, hp.arch, hp, tokenizer, g.metadata.get("tokenizer.chat_template"),
                      build)
