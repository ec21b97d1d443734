"""The batched forward over a paged KV cache, family-independent: one engine step of several
sequences at once, as vLLM's GPU model runner runs it (vllm/v1/worker/gpu_model_runner.py):
the new tokens of every scheduled sequence flattened into one list of T tokens, each with its
position in its own sequence, the row of the block table it belongs to and the KV-cache slot
its K/V goes to. `PagedBatch` (mixed into a family's model) owns the paged cache, the step's
device tensors, the checks and the bucket capture/replay; the family supplies the step's
dispatches and its per-position tables:
- the Llama-like families: vkrt/models/llama_batch.py (`LlamaBatch`: RoPE tables, RoPE at
  each token's position);
- OPT: vkrt/models/opt_batch.py (`OPTBatch`: learned positions at each token's position + 2).

KV cache (`setup_paged_cache(num_blocks, block_size, kv_dtype)`): per layer, K and V of
`[num_blocks * block_size + 1, kv width]` f32 or f16 (`_paged_kv_width`: Llama's n_head_kv *
head_dim, OPT's n_embd), slot = block * block_size + offset; the last slot is reserved
scratch (padded tokens write it, no real token reads it). A block table row lists a
sequence's physical block ids in order: position j of sequence s is slot
`block_tables[s][j // block_size] * block_size + j % block_size`. Positions run below
max_positions = min(n_ctx, num_blocks * block_size) (n_ctx: the family's context, OPT's
max_position_embeddings); the family's tables (`_paged_tables(max_positions)`) cover them.

One step (`submit_batch`; `execute_batch` waits for it too): the token ids, positions,
sequence rows, slot mapping, previous-step rows, block table rows and logit rows are written
into device tensors (u32, `StepInputs`), generated tokens' rows first and prompt tokens' after
them (`StepShape`); the step's first records copy them in where the host cannot map them
(`StepInputs.upload`) and give the tokens whose ids the host did not know the greedy tokens
of the step before (`feed_sampled`, from `PagedCache.sampled`), then the family's
`batch_step` runs:
embedding, per layer the norms and products, K and V written by slot mapping (`kv_write`)
BEFORE attention, so a prefill chunk attends to its own keys in the same step and decode
tokens mix with it; attention over each token's own sequence through its block table
(`attention_paged`); the MLP; the final norm, logits and argmax of the `logit_tokens` rows
only (`argmax_rows`), and the last record copies those argmax rows into `PagedCache.sampled`
for the step after. The command buffer does not depend on those values: each part is padded
to a bucket (1, 2, 4, ..., MAX_REPLAY_TOKENS; R, the logit rows, likewise up to the bucket)
and each (decode bucket, prompt bucket, logit bucket) step is captured once and replayed
(vkrt/runtime/replay.py), captured again when the activations, the KV cache or the bucket's
input tensors are reallocated. Asynchronous scheduling (vkrt/serve/engine.py): a step may be
submitted while the one before is still running, its decodes naming that step's logit rows
(`BatchInput.prev_rows`); each bucket then has two `StepInputs` and two recordings (phases
0 and 1), the second taken while the first's step is not collected (`PendingStep`), so
writing a step's inputs never waits for the GPU. Padded tokens are token 0 at position 0
of a scratch block-table row whose every block is the scratch slot's, so they write and read
only that slot. More tokens of a role than the largest bucket (long prefill chunks) are recorded each
step, unpadded.

Batch invariance (what each family's `batch_step` keeps): a sequence's logits are
bit-identical whatever else is in the batch and however its prompt is chunked. Every kernel
of the step computes each token's row alone in an order fixed by its own data. The products
run on the kernel the device's table names for the token's role and the engine's max_batch
(`Table.batch_products_for`, vkrt/tuning.py), chosen when the paged KV cache is set up and
fixed for its life: a generated token ("decode": `matmul`, few columns, one weight row per
workgroup; in engines of many sequences on the GPU, `matmul_coop` with the columns split K
ways, and a short product's columns also split across workgroups, its partial sums added in
order by `sum_splits`, the split fixed by the weight's shape: `Kernels.k_splits`; where the
engine's rule has a `glu_tile`, its gate and up products and their activation in one
`glu_coop` dispatch) or a prompt token ("prompt": `matmul_tiled` on a GPU). Each computes a
token's row in one order whatever the token count (never the decode matvecs). So a
request's bits do not depend on what shares its steps, but may differ between engines of
different max_batch. A token's role is a property of the token (`BatchInput.prompt`: is its
position inside its prompt), not of the step, so a prompt chunked differently, or generated
tokens recomputed after a preemption, keep their kernels. Every logit row takes the "decode"
product. Norms run one row per workgroup, attention one workgroup per (head, token) over
blocks of positions from its first visible position (attention.comp's order). Padding never
changes a real token's row.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from vkrt import config
from vkrt.kernels import KV_DTYPES
from vkrt.models.scratch import arena, kv_cache, kv_cache_bytes
from vkrt.runtime.dispatch import Copy, Dispatch
from vkrt.runtime.memory import Buffer
from vkrt.runtime.tensor import Tensor
from vkrt.weight_types import RAW4_DTYPES

MAX_REPLAY_TOKENS = 64    # the largest bucket: more tokens per step are recorded, unpadded
NO_ROW = 0xFFFFFFFF       # BatchInput.prev_rows: the token's id is in token_ids
# The share of the device-local heap that vkrt's buffers (weights, activations, the paged KV
# cache) may take when the KV cache is sized for the device (`max_paged_blocks`): vLLM's
# default gpu_memory_utilization, 0.9 (vllm/config/cache.py).
KV_MEMORY_FRACTION = 0.9


def bucket(n: int) -> int:
    """The batch-size bucket of `n` tokens (or logit rows): the least power of two >= n; 0 for
    0 (a step returning no logits)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


@dataclass
class BatchInput:
    """One engine step, flattened (vllm/v1/worker/gpu_model_runner.py): T tokens of S sequences."""
    token_ids: np.ndarray     # u32 [T] the new tokens of every scheduled sequence, sequence after sequence
    positions: np.ndarray     # u32 [T] each token's position in its own sequence
    seq_of_token: np.ndarray  # u32 [T] the row of block_tables each token belongs to
    slot_mapping: np.ndarray  # u32 [T] KV-cache slot its K/V is written to: block_tables[s][pos // block_size] * block_size + pos % block_size
    block_tables: np.ndarray  # u32 [S, max_blocks_per_seq] physical block ids per sequence (unused entries any value)
    logit_tokens: np.ndarray  # u32 [R] indices into the T tokens whose logits the step returns (the last token of each sequence that samples this step)
    prompt: np.ndarray | None = None  # bool [T] a prompt token (True) or a generated one; None: every token a prompt token
    prev_rows: np.ndarray | None = None  # u32 [T] NO_ROW, or the logit row of the step submitted just before whose greedy token is this token (its token_ids entry is then not used); None: all NO_ROW


@dataclass(frozen=True)
class StepShape:
    """The rows of one step's device tensors: `decode` rows of generated tokens first, then
    `prompt` rows of prompt tokens (each part padded to its bucket when replayed), `logits`
    logit rows."""
    decode: int
    prompt: int
    logits: int

    @property
    def tokens(self) -> int:
        return self.decode + self.prompt


@dataclass
class BatchOutput:
    argmax: np.ndarray              # u32 [R] greedy token per logit row (computed on the GPU)
    logits: np.ndarray | None       # f32 [R, n_vocab] when asked for, else None


@dataclass
class PagedCache:
    """The paged KV cache of every layer: `k[i]`, `v[i]` views of `[n_slots, kv_width]` f32 or
    f16 (n_slots = num_blocks * block_size + 1, the last the scratch slot) in `buffer`
    (`KVBuffers`), the family's per-position tables for positions 0 .. max_positions - 1
    (`tables`, name -> tensor: `_paged_tables`), and the block-table width the device
    tensors hold (`table_width` blocks: enough for max_positions)."""
    num_blocks: int
    block_size: int
    buffer: object
    k: list
    v: list
    tables: dict
    max_positions: int
    table_width: int
    products: dict      # token role ("decode", "prompt") -> its products' kernel
    coop_tiles: tuple   # matmul_coop's tiles for the engine (Kernels.batch_coop_tiles)
    sampled: Tensor     # u32 [rows]: the last step's argmax rows (read by the next step's feed_sampled)
    # decode products of fewer rows and at least split_min_steps steps split K across
    # workgroups (Kernels.batch_split, Kernels.k_splits)
    split_rows: int = 0
    split_min_steps: int = 1
    # the decode rows' gate and up products of glu_rows (min, max) rows and their
    # activation in one dispatch on this tile (Kernels.batch_glu, Kernels.glu_coop); None: not
    glu_tile: tuple | None = None
    glu_rows: tuple[int, int] = (0, 0)
    glu_raw_rows: tuple[int, int] = (0, 0)   # glu_rows for gates of RAW4_DTYPES
    # output view's name -> f32 partial sums of its split products (`PagedBatch._partials`)
    partials: dict = field(default_factory=dict)

    def fuses_glu(self, gate: Tensor) -> bool:
        """Whether the decode rows' products of `gate` (and its up) run fused: a tile, and
        gate's rows within glu_raw_rows for the types matmul_coop fetches as words
        (`RAW4_DTYPES`), within glu_rows for the others (bounds included)."""
        lo, hi = self.glu_raw_rows if gate.dtype in RAW4_DTYPES else self.glu_rows
        return self.glu_tile is not None and lo <= gate.shape[0] <= hi

    def most_split_rows(self) -> int:
        """The largest split_rows of the decode products: the engine's, or a tile's own
        (`BatchCoopTile.split_rows`) where larger; it sizes the partial sums."""
        return max([self.split_rows, *(t.split_rows or 0 for t in self.coop_tiles)])

    @property
    def scratch_slot(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        """Bytes held (allocation sizes, as `Device.bytes_in_use` counts them): the K/V
        buffers, the tables' and the split products' partial sums'."""
        return (self.buffer.allocation_bytes + self.sampled.buffer.allocation_bytes
                + sum(t.buffer.allocation_bytes for t in self.tables.values())
                + sum(t.buffer.allocation_bytes for t in self.partials.values()))

    def close(self) -> None:
        self.buffer.close()
        self.sampled.buffer.close()
        for t in (*self.tables.values(), *self.partials.values()):
            t.buffer.close()


class StepInputs:
    """A bucket's device tensors (u32, one buffer): `ids`, `positions`, `seq`, `slots`,
    `prev_rows` [T] (NO_ROW, or the previous step's logit row whose greedy token the token
    is: `Kernels.feed_sampled`), `logit_rows` [T] (R of them used), `tables` [T + 1,
    table_width] (row T: the scratch row), `argmax` [T]; `inputs` every view but argmax, the
    bytes written each step. Where the host cannot map the buffer (a discrete GPU), the host
    writes `host_inputs`, a staging buffer of its own, and the step's first record copies it
    in (`upload`), so that writing a step's inputs never waits for another step."""

    def __init__(self, device, n_tokens: int, table_width: int):
        T, W = n_tokens, table_width
        layout = {"ids": ("uint32", (T,)), "positions": ("uint32", (T,)),
                  "seq": ("uint32", (T,)), "slots": ("uint32", (T,)),
                  "prev_rows": ("uint32", (T,)), "logit_rows": ("uint32", (T,)),
                  "tables": ("uint32", (T + 1, W)), "argmax": ("uint32", (T,))}
        self.buffer, views = arena(device, layout, name=f"batch_inputs[{T}]")
        self.n_tokens, self.table_width = T, W
        for key, view in views.items():
            setattr(self, key, view)
        end = self.argmax.offset   # everything before argmax is written each step
        self.inputs = Tensor(self.buffer, 0, end, "uint32", (end // 4,), "batch_inputs")
        self.staging = None
        self.host_inputs = self.inputs
        if self.buffer.mapped is None:
            try:
                self.staging = Buffer(device, end, host_visible=True,
                                      name=f"batch_inputs[{T}] staging")
            except BaseException:
                self.buffer.close()
                raise
            self.host_inputs = Tensor(self.staging, 0, end, "uint32", (end // 4,),
                                      "batch_inputs staging")

    def upload(self) -> list[Copy]:
        """The records that bring `host_inputs` into `inputs` (none where they are one)."""
        return [] if self.staging is None else [Copy(self.host_inputs, self.inputs, "upload")]

    def pack(self, fields: dict[str, np.ndarray]) -> np.ndarray:
        """The bytes of `inputs`: each field's u32 values at its view's offset."""
        host = np.zeros(self.inputs.shape[0], np.uint32)
        for key, values in fields.items():
            view = getattr(self, key)
            start = view.offset // 4
            host[start:start + values.size] = values.reshape(-1)
        return host

    def close(self) -> None:
        self.buffer.close()
        if self.staging is not None:
            self.staging.close()


class PendingStep:
    """A submitted step (`PagedBatch.submit_batch`): `result()` waits for it and returns its
    `BatchOutput` (once; later calls return the same). Until then its step inputs stay
    reserved, so the next step is written into the bucket's other inputs."""

    def __init__(self, busy: dict, key, n_rows: int, readback=None):
        self._busy, self._key, self.n_rows = busy, key, n_rows
        self._readback, self._output = readback, None

    @property
    def done(self) -> bool:
        return self._output is not None

    def result(self) -> BatchOutput:
        if self._output is None:
            R = self.n_rows
            argmax = (self._readback.get()[:R].copy() if R else np.zeros(0, np.uint32))
            self._output = BatchOutput(np.asarray(argmax, np.uint32), None)
            self._readback = None
        if self._busy.get(self._key) is self:
            del self._busy[self._key]
        return self._output


class PagedBatch:
    """The batched runner of a family's model (mixed in): `setup_paged_cache`,
    `execute_batch`, `paged_cache_info`. Uses the model's `hp` (n_vocab, n_ctx, n_layer),
    device, stream and activations. The family defines `_paged_kv_width()` (elements per K
    or V row), `_paged_tables(max_positions)` (its per-position tables, uploaded: name ->
    Tensor), `_batch_activations(T, R)` and `batch_step(inputs, T, R)` (the step's dispatches)."""

    _paged: PagedCache | None = None
    _step_inputs: dict | None = None      # bucket (or recorded T) -> StepInputs
    _batch_replays: dict | None = None    # (stream serial, shape, phase) -> Recording
    _busy_inputs: dict | None = None      # _step_inputs key -> its uncollected step
    _last_rows = 0                        # logit rows of the step submitted last (prev_rows < it)

    # -- what the family supplies (vkrt/models/llama_batch.py, vkrt/models/opt_batch.py) ---
    def _paged_kv_width(self) -> int:
        """Elements per K (or V) row of one layer's cache."""
        raise NotImplementedError

    def _paged_tables(self, max_positions: int) -> dict[str, Tensor]:
        """The family's per-position tables for positions 0 .. max_positions - 1, uploaded
        (freed with the paged cache)."""
        raise NotImplementedError

    def _batch_activations(self, T: int, R: int):
        """The model's activations, large enough for T tokens and R logit rows."""
        raise NotImplementedError

    def batch_step(self, inputs: StepInputs, shape: StepShape) -> list[Dispatch]:
        """The dispatches of one step of shape.tokens tokens (generated tokens' rows first,
        then prompt tokens') and shape.logits logit rows reading `inputs`' device tensors
        (nothing recorded): logits of the R rows in `acts.logits` rows 0 .. R - 1, their
        argmax in `inputs.argmax`."""
        raise NotImplementedError

    # -- shared by the families' steps ---------------------------------------------------
    def _batch_linear(self, x: Tensor, name: str, y: Tensor,
                      shape: StepShape) -> list[Dispatch]:
        """y = x W^T (+ b) for the step's f32 rows (x [T, in], y [T, out]; W = the model's
        `name`.weight, b = `name`.bias when present): the generated tokens' rows on the
        "decode" role's kernel, the prompt tokens' on the "prompt" role's (`_role_products`;
        batch invariance, the module docstring)."""
        k, w, p = self.k, self.w, self._paged
        weight, out = w[name + ".weight"], []
        for role, row0, n in (("decode", 0, shape.decode), ("prompt", shape.decode,
                                                              shape.prompt)):
            if not n:
                continue
            products = self._role_products(role)
            splits = 1
            if role == "decode" and products["batched"] == "matmul_coop":
                splits = k.k_splits(weight, p.split_rows, p.coop_tiles, p.split_min_steps)
            if splits == 1:
                out.append(k.linear(x, weight, y, n, name=name, token0=row0, **products))
                continue
            part = self._partials(y)
            out += [k.linear(x, weight, y, n, name=name, token0=row0, k_splits=splits,
                             partials=part, **products),
                    k.sum_splits(part, y, n, weight.shape[0], splits, row0, name=name + ".sum")]
        if name + ".bias" in w:
            out.append(k.bias_add(y, w[name + ".bias"], shape.tokens, name=name + ".bias"))
        return out

    def _batch_glu(self, x: Tensor, blk: str, gate_y: Tensor, up_y: Tensor, act: Tensor,
                   shape: StepShape, n_ff: int, gelu: bool) -> list[Dispatch]:
        """act = silu(x W_gate^T) * (x W_up^T) (GELU-tanh with `gelu`) for the step's rows (x
        [T, n_embd], act [T, n_ff]; W = `blk`ffn_gate / ffn_up .weight): the generated tokens'
        rows in one `glu_coop` dispatch where the paged cache says so (`PagedCache.fuses_glu`,
        no biases), the prompt tokens' (and all rows otherwise) as
        two products into gate_y and up_y and `silu_mul` over those rows. Which path a row
        takes depends on the engine and the weights alone, never on what shares the step
        (batch invariance)."""
        k, w, p = self.k, self.w, self._paged
        gate, up = w[blk + "ffn_gate.weight"], w[blk + "ffn_up.weight"]
        fused = (shape.decode and p.fuses_glu(gate)
                 and blk + "ffn_gate.bias" not in w and blk + "ffn_up.bias" not in w)
        if not fused:
            return [*self._batch_linear(x, blk + "ffn_gate", gate_y, shape),
                    *self._batch_linear(x, blk + "ffn_up", up_y, shape),
                    k.silu_mul(gate_y, up_y, act, shape.tokens * n_ff,
                               name=blk + "ffn_silu_mul", gelu=gelu)]
        out = [k.glu_coop(x, gate, up, act, shape.decode, p.glu_tile, gelu=gelu,
                          name=blk + "ffn_glu")]
        if shape.prompt:
            row0, rows = shape.decode, shape.tokens
            products = self._role_products("prompt")
            out += [k.linear(x, gate, gate_y, shape.prompt, name=blk + "ffn_gate", token0=row0,
                             **products),
                    k.linear(x, up, up_y, shape.prompt, name=blk + "ffn_up", token0=row0,
                             **products),
                    k.silu_mul(gate_y.rows(row0, rows), up_y.rows(row0, rows),
                               act.rows(row0, rows), shape.prompt * n_ff,
                               name=blk + "ffn_silu_mul", gelu=gelu)]
        return out

    def _partials(self, y: Tensor) -> Tensor:
        """The partial sums of the split products writing `y` (one buffer per output view,
        so that products writing different views, as K and V, share no bytes): f32 of 2 *
        `PagedCache.most_split_rows` * the most decode tokens of a step, what
        `Kernels.k_splits` can ask (splits * rows < split_rows + rows); made on first use,
        freed with the paged cache."""
        p = self._paged
        part = p.partials.get(y.name)
        if part is None:
            n = 2 * p.most_split_rows() * p.sampled.shape[0]
            part = p.partials[y.name] = Tensor(Buffer(self.device, 4 * n,
                                                      name=f"batch_partials.{y.name}"),
                                               0, 4 * n, "float32", (n,), f"partials.{y.name}")
        return part

    def _role_products(self, role: str) -> dict:
        """`Kernels.linear`'s arguments for the products of tokens of `role` ("decode":
        generated tokens and every logit row; "prompt"): the kernel (`batched`) and the
        `matmul_coop` tiles (`coop_tiles`), fixed with the paged KV cache
        (`setup_paged_cache`)."""
        return {"batched": self._paged.products[role], "coop_tiles": self._paged.coop_tiles}

    # -- the KV cache --------------------------------------------------------------------
    @staticmethod
    def _check_kv_dtype(kv_dtype: str) -> int:
        """Bytes per element of a `KV_DTYPES` dtype. Raises ValueError for any other."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype {kv_dtype!r}: the kernels read "
                             f"{' or '.join(KV_DTYPES)}")
        return np.dtype(kv_dtype).itemsize

    def _kv_view_limit(self) -> int:
        """The most bytes of one layer's K (or V) view: maxStorageBufferRange (one binding)
        and maxMemoryAllocationSize (the buffer it lives in, `kv_cache`)."""
        d = self.device
        return min(d.max_storage_buffer_range, d.max_memory_allocation_size)

    def paged_cache_bytes(self, num_blocks: int, block_size: int,
                          kv_dtype: str = "float32") -> int:
        """Device bytes `setup_paged_cache(num_blocks, block_size, kv_dtype)` allocates for K
        and V (the family's per-position tables and the step inputs not counted). Raises
        ValueError for a kv_dtype outside `KV_DTYPES`."""
        self._check_kv_dtype(kv_dtype)
        return kv_cache_bytes(self.device, self.hp.n_layer, num_blocks * block_size + 1,
                              self._paged_kv_width(), kv_dtype)

    def max_paged_blocks(self, block_size: int, kv_dtype: str = "float32",
                         memory_fraction: float = KV_MEMORY_FRACTION) -> int:
        """The most blocks of `block_size` slots a paged KV cache may have on this device:
        one layer's K (or V) within maxStorageBufferRange and maxMemoryAllocationSize (the
        views are spread over buffers of at most that: `kv_cache`), all of them within
        `memory_fraction` of the device-local heap less the bytes vkrt's device buffers hold
        already (the weights, the activations so far; not the staging buffers, which are host
        memory on a discrete GPU, nor a paged cache of before and its step inputs, which
        `setup_paged_cache` frees). 0 when not one block fits. Raises ValueError for a
        kv_dtype outside `KV_DTYPES`."""
        d = self.device
        slot = self._paged_kv_width() * self._check_kv_dtype(kv_dtype)
        by_range = (self._kv_view_limit() // slot - 1) // block_size
        freed = sum(i.buffer.allocation_bytes for i in (self._step_inputs or {}).values())
        held = d.bytes_in_use - (0 if self._paged is None else self._paged.nbytes)
        held -= d.staging_bytes_in_use + freed
        budget = int(memory_fraction * d.device_local_bytes) - held
        per_block = 2 * self.hp.n_layer * block_size * slot
        n = max(0, min(by_range, budget // per_block))
        while n > 0 and self.paged_cache_bytes(n, block_size, kv_dtype) > budget:  # alignment
            n -= 1
        return n

    def setup_paged_cache(self, num_blocks: int, block_size: int,
                          kv_dtype: str = "float32", max_batch: int | None = None) -> None:
        """Allocate the paged KV cache: `num_blocks` blocks of `block_size` slots per layer
        for K and V of `kv_dtype` (float32, like `setup_caches`' cache, or float16: K and V
        rounded to f16 as they are stored, all arithmetic f32; vkrt/glsl/kv.glsl) and one
        scratch slot, and the family's tables for positions below min(n_ctx, num_blocks *
        block_size); frees a previous paged cache (its recorded steps are captured again).
        `max_batch` (the engine's sequences per step; None: not known) chooses the products'
        kernel per token role and `matmul_coop`'s tiles for the cache's life
        (`Kernels.batch_products`, `Kernels.batch_coop_tiles`; `paged_products`,
        `paged_coop_tiles`).
        Raises: ValueError for num_blocks or block_size < 1, a kv_dtype no kernel reads or
        float16 on a device without storageBuffer16BitAccess, or when one layer's K (or V)
        cache passes the device's maxStorageBufferRange; DeviceMemoryError when the device
        cannot hold it (then no paged cache is left, the old one freed too)."""
        if not (isinstance(num_blocks, (int, np.integer)) and num_blocks >= 1
                and isinstance(block_size, (int, np.integer)) and block_size >= 1):
            raise ValueError(f"setup_paged_cache: num_blocks {num_blocks!r} and block_size "
                             f"{block_size!r} must be integers >= 1")
        itemsize = self._check_kv_dtype(kv_dtype)
        if kv_dtype == "float16" and not self.device.features.get("storageBuffer16BitAccess"):
            raise ValueError(f"setup_paged_cache: a float16 KV cache needs the device feature "
                             f"storageBuffer16BitAccess, which {self.device.name} lacks")
        hp = self.hp
        width = self._paged_kv_width()
        n_slots = num_blocks * block_size + 1
        limit = self._kv_view_limit()
        if n_slots * width * itemsize > limit:
            raise ValueError(f"setup_paged_cache: {num_blocks} blocks of {block_size} slots are "
                             f"{n_slots * width * itemsize} bytes of K per layer, more than "
                             f"the device's maxStorageBufferRange and maxMemoryAllocationSize "
                             f"allow ({limit} bytes)")
        self._close_paged()
        max_positions = min(hp.n_ctx, num_blocks * block_size)
        buffer, k, v = kv_cache(self.device, hp.n_layer, n_slots, width,
                                self._paged_kv_name, kv_dtype)
        rows = max(MAX_REPLAY_TOKENS, bucket(max_batch or 0))
        try:
            tables = self._paged_tables(max_positions)
        except BaseException:
            buffer.close()      # nothing half-allocated stays
            raise
        try:
            sampled = Buffer(self.device, 4 * rows, name="batch_sampled")
        except BaseException:
            buffer.close()
            for table in tables.values():
                table.buffer.close()
            raise
        self._paged = PagedCache(int(num_blocks), int(block_size), buffer, k, v, tables,
                                 max_positions, -(-max_positions // block_size),
                                 self.k.batch_products(max_batch),
                                 self.k.batch_coop_tiles(max_batch),
                                 Tensor(sampled, 0, 4 * rows, "uint32", (rows,),
                                        "batch_sampled"),
                                 *self.k.batch_split(max_batch),
                                 *self.k.batch_glu(max_batch))
        self._last_rows = 0

    @staticmethod
    def _paged_kv_name(i: int, what: str) -> str:
        return f"blk.{i}.paged_{what}"

    @property
    def paged_cache_info(self) -> tuple[int, int] | None:
        """(num_blocks, block_size) of the paged KV cache, or None before `setup_paged_cache`."""
        p = self._paged
        return None if p is None else (p.num_blocks, p.block_size)

    def batch_products(self, max_batch: int | None = None) -> dict[str, str]:
        """The products' kernel per token role that `setup_paged_cache(..., max_batch)` would
        choose (`Kernels.batch_products`)."""
        return self.k.batch_products(max_batch)

    def batch_coop_tiles(self, max_batch: int | None = None) -> tuple:
        """The `matmul_coop` tiles that `setup_paged_cache(..., max_batch)` would choose
        (`Kernels.batch_coop_tiles`)."""
        return self.k.batch_coop_tiles(max_batch)

    @property
    def paged_products(self) -> dict[str, str] | None:
        """The kernel of the products per token role ("decode", "prompt") that the paged KV
        cache's steps run, or None before `setup_paged_cache`."""
        return None if self._paged is None else dict(self._paged.products)

    @property
    def paged_coop_tiles(self) -> tuple | None:
        """The `matmul_coop` tiles of the paged KV cache's steps, or None before
        `setup_paged_cache`."""
        return None if self._paged is None else self._paged.coop_tiles

    @property
    def paged_kv_dtype(self) -> str | None:
        """The paged KV cache's element dtype (float32 or float16), or None before
        `setup_paged_cache`."""
        return None if self._paged is None else self._paged.k[0].dtype

    def _close_paged(self) -> None:
        if self._batch_replays:
            for rec in self._batch_replays.values():
                self.stream.drop(rec)
        self._batch_replays = {}
        for inputs in (self._step_inputs or {}).values():
            inputs.close()
        self._step_inputs = {}
        self._busy_inputs = {}
        if self._paged is not None:
            self._paged.close()
            self._paged = None

    # -- one step ------------------------------------------------------------------------
    def validate_batch(self, b: BatchInput) -> None:
        """Check a step before anything is written. Raises ValueError (one line naming the
        field and the numbers): a field that is not a u32 numpy array of its shape, T = 0,
        a token id past the vocabulary, a row past block_tables, a position at or past the
        paged cache's positions or its block-table row, a block a token reads outside the
        cache, a slot outside it, a slot_mapping entry that is not its position's slot, a slot
        written twice, a logit row outside the T tokens, a previous-step row (`prev_rows`)
        that step did not return, no paged cache."""
        p = self._paged
        if p is None:
            raise ValueError("execute_batch: no paged KV cache (call setup_paged_cache first)")
        for name, ndim in (("token_ids", 1), ("positions", 1), ("seq_of_token", 1),
                           ("slot_mapping", 1), ("block_tables", 2), ("logit_tokens", 1)):
            a = getattr(b, name)
            if not isinstance(a, np.ndarray) or a.dtype != np.uint32 or a.ndim != ndim:
                what = (f"{a.dtype} {list(a.shape)}" if isinstance(a, np.ndarray)
                        else type(a).__name__)
                raise ValueError(f"BatchInput.{name}: {what}, expected a {ndim}-D uint32 array")
        T = b.token_ids.shape[0]
        if T == 0:
            raise ValueError("BatchInput.token_ids: 0 tokens, expected at least 1")
        for name in ("positions", "seq_of_token", "slot_mapping"):
            if getattr(b, name).shape[0] != T:
                raise ValueError(f"BatchInput.{name}: {getattr(b, name).shape[0]} entries for "
                                 f"{T} tokens")
        if b.prompt is not None and (not isinstance(b.prompt, np.ndarray)
                                     or b.prompt.dtype != np.bool_ or b.prompt.shape != (T,)):
            what = (f"{b.prompt.dtype} {list(b.prompt.shape)}" if isinstance(b.prompt, np.ndarray)
                    else type(b.prompt).__name__)
            raise ValueError(f"BatchInput.prompt: {what}, expected a bool array of the {T} "
                             "tokens or None")
        if b.prev_rows is not None:
            a = b.prev_rows
            if not (isinstance(a, np.ndarray) and a.dtype == np.uint32 and a.shape == (T,)):
                what = (f"{a.dtype} {list(a.shape)}" if isinstance(a, np.ndarray)
                        else type(a).__name__)
                raise ValueError(f"BatchInput.prev_rows: {what}, expected a uint32 array of "
                                 f"the {T} tokens or None")
            bad = (a != NO_ROW) & (a >= min(self._last_rows, p.sampled.shape[0]))
            if bad.any():
                t = int(np.argmax(bad))
                raise ValueError(f"BatchInput.prev_rows: token {t} takes row {a[t]} of the "
                                 f"step before, which returned {self._last_rows} rows")
        S, W = b.block_tables.shape
        R = b.logit_tokens.shape[0]

        def first_bad(mask: np.ndarray) -> int | None:
            return int(np.argmax(mask)) if mask.any() else None

        checks = [
            ("token_ids", b.token_ids >= self.hp.n_vocab,
             lambda t: f"token {t} is id {b.token_ids[t]}, past the vocabulary of "
                       f"{self.hp.n_vocab}"),
            ("seq_of_token", b.seq_of_token >= S,
             lambda t: f"token {t} is in row {b.seq_of_token[t]}, past the {S} rows of "
                       "block_tables"),
            ("positions", b.positions >= p.max_positions,
             lambda t: f"token {t} is at position {b.positions[t]}, past the "
                       f"{p.max_positions} positions of the paged KV cache (min(n_ctx, "
                       "num_blocks * block_size))"),
            ("positions", b.positions // p.block_size >= W,
             lambda t: f"token {t} is at position {b.positions[t]}, past its block-table row "
                       f"of {W} blocks of {p.block_size}"),
            ("logit_tokens", b.logit_tokens >= T,
             lambda r: f"row {r} is token {b.logit_tokens[r]}, past the {T} tokens"),
        ]
        for name, mask, message in checks:
            bad = first_bad(mask)
            if bad is not None:
                raise ValueError(f"BatchInput.{name}: {message(bad)}")
        # Every block a token reads (its sequence's blocks up to its own position's).
        last = np.zeros(S, np.int64) - 1
        np.maximum.at(last, b.seq_of_token.astype(np.int64), b.positions // p.block_size)
        used = np.arange(W)[None, :] <= last[:, None]
        bad = used & (b.block_tables >= p.num_blocks)
        if bad.any():
            s, j = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"BatchInput.block_tables: row {s} block {j} is "
                             f"{b.block_tables[s, j]}, past the {p.num_blocks} blocks of the "
                             "paged KV cache")
        want = (b.block_tables[b.seq_of_token, b.positions // p.block_size].astype(np.int64)
                * p.block_size + b.positions % p.block_size)
        bad = first_bad(b.slot_mapping != want)
        if bad is not None:
            raise ValueError(f"BatchInput.slot_mapping: token {bad} (row {b.seq_of_token[bad]}, "
                             f"position {b.positions[bad]}) writes slot {b.slot_mapping[bad]}, "
                             f"its block table says {want[bad]}")
        slots, counts = np.unique(b.slot_mapping, return_counts=True)
        if (counts > 1).any():
            slot = slots[np.argmax(counts > 1)]
            tokens = np.flatnonzero(b.slot_mapping == slot)[:2]
            raise ValueError(f"BatchInput.slot_mapping: slot {slot} is written by tokens "
                             f"{tokens[0]} and {tokens[1]}")
        if R > self._max_logit_rows():
            raise ValueError(f"BatchInput.logit_tokens: {R} rows of {self.hp.n_vocab} logits "
                             f"pass the device's maxStorageBufferRange (at most "
                             f"{self._max_logit_rows()} rows)")

    def _max_logit_rows(self) -> int:
        return self.device.max_storage_buffer_range // (4 * self.hp.n_vocab)

    def execute_batch(self, batch: BatchInput, want_logits: bool = False) -> BatchOutput:
        """Run one step and wait for it: `submit_batch(batch, want_logits).result()`."""
        return self.submit_batch(batch, want_logits).result()

    def submit_batch(self, batch: BatchInput, want_logits: bool = False) -> PendingStep:
        """Submit one step of T tokens (`BatchInput`) over the paged KV cache; its
        `PendingStep.result()` is the greedy token of each `logit_tokens` row
        (`BatchOutput.argmax`, u32 [R]) and, with `want_logits`, their logits (f32 [R,
        n_vocab]). K/V of the T tokens are written into their slots before attention. The
        generated tokens take the device rows first, the prompt tokens after them
        (`StepShape`); with at most MAX_REPLAY_TOKENS of each, each part is padded to its
        bucket and the step replayed (VKRT_REPLAY, no timestamps), else recorded.

        Does not wait for the step (with want_logits it does: the logits live in the
        activations, which the next step overwrites), nor for the step before it: its inputs
        go to the other of the bucket's two `StepInputs` when the one is still reserved by an
        uncollected step (with both reserved, it waits for phase 0's step). A token whose
        `prev_rows` entry is a logit row of the step submitted just before takes that row's
        greedy token on the GPU (`Kernels.feed_sampled`: every step starts with it and ends
        copying its argmax rows into `PagedCache.sampled`), so the host may schedule step
        n + 1 before it has read step n's tokens.
        Raises: ValueError from `validate_batch` (nothing is written then)."""
        self.validate_batch(batch)
        p, s = self._paged, self.stream
        T, R = batch.token_ids.shape[0], batch.logit_tokens.shape[0]
        prompt = np.ones(T, bool) if batch.prompt is None else batch.prompt
        D = T - int(prompt.sum())
        replay = (max(D, T - D) <= MAX_REPLAY_TOKENS and config.REPLAY.value
                  and not s.timing)
        D_b, P_b = (bucket(D), bucket(T - D)) if replay else (D, T - D)
        T_b = D_b + P_b
        R_b = min(bucket(R), T_b) if replay else R
        shape = StepShape(D_b, P_b, R_b)
        inputs_key, inputs = self._inputs(T_b, replay)
        phase = inputs_key[1]
        # Device row of each token: generated tokens from row 0, prompt tokens from row D_b,
        # each in their order; the padded rows between are scratch tokens.
        row = np.empty(T, np.int64)
        row[~prompt] = np.arange(D)
        row[prompt] = D_b + np.arange(T - D)
        # Sequences as rows of the device table: the rows tokens name, in order; the scratch
        # row (T_b) for padded tokens. Unused block entries become the scratch block.
        rows, seq = np.unique(batch.seq_of_token, return_inverse=True)
        W = min(batch.block_tables.shape[1], p.table_width)
        tables = np.full((T_b + 1, p.table_width), p.num_blocks, np.uint32)
        tables[:len(rows), :W] = np.minimum(batch.block_tables[rows, :W], p.num_blocks)

        def placed(values: np.ndarray, pad: int) -> np.ndarray:
            out = np.full(T_b, pad, np.uint32)
            out[row] = values
            return out

        fields = {
            "ids": placed(batch.token_ids, 0),
            "positions": placed(batch.positions, 0),
            "seq": placed(seq.astype(np.uint32), T_b),
            "slots": placed(batch.slot_mapping, p.scratch_slot),
            "prev_rows": placed(batch.prev_rows if batch.prev_rows is not None
                                else np.full(T, NO_ROW, np.uint32), NO_ROW),
            "logit_rows": np.concatenate([row[batch.logit_tokens].astype(np.uint32),
                                          np.zeros(T_b - R, np.uint32)]),
            "tables": tables}
        s.write(inputs.host_inputs, inputs.pack(fields))
        a = self._batch_activations(T_b, R_b)
        self._last_rows = R
        if replay:
            t0 = time.perf_counter_ns()
            slot = (s.serial, shape, phase)
            key = (slot, a.arena.serial, p.buffer.serial, inputs.buffer.serial,
                   p.sampled.buffer.serial, s.tracker.always)
            rec = self._batch_replays.get(slot)
            if rec is None or rec.key != key:
                if rec is not None:
                    s.drop(rec)
                records = self._step_records(inputs, shape)
                s.profiler.add("build", t0)
                rec = self._batch_replays[slot] = s.capture(records, readback=inputs.argmax,
                                                            key=key)
            readback = s.replay(rec, inputs.argmax)
        else:
            t0 = time.perf_counter_ns()
            records = self._step_records(inputs, shape)
            s.profiler.add("build", t0)
            s.record(records, flush_every=config.PREFILL_FLUSH.value if T_b > 1 else 0)
            readback = s.read_later(inputs.argmax.rows(0, R)) if R else None
            s.submit()
        pending = PendingStep(self._busy_inputs, inputs_key, R, readback)
        self._busy_inputs[inputs_key] = pending
        if want_logits:
            out = pending.result()
            out.logits = (s.read(a.logits.rows(0, R)) if R
                          else np.zeros((0, self.hp.n_vocab), np.float32))
        return pending

    def _step_records(self, inputs: StepInputs, shape: StepShape) -> list:
        """A step's records: its inputs' upload (`StepInputs.upload`), the ids of tokens
        sampled by the step before (`feed_sampled`), the family's `batch_step`, and the copy
        of its argmax rows into `PagedCache.sampled` for the step after."""
        p = self._paged
        records = inputs.upload()
        records.append(self.k.feed_sampled(inputs.ids, inputs.prev_rows, p.sampled,
                                           shape.tokens))
        records += self.batch_step(inputs, shape)
        n = min(shape.logits, p.sampled.shape[0])
        if n:
            records.append(Copy(inputs.argmax.rows(0, n), p.sampled.rows(0, n), "sampled"))
        return records

    def _inputs(self, n_tokens: int, replayed: bool) -> tuple[tuple, StepInputs]:
        """(key: (count or "recorded", phase), the step inputs) of a replayed step of
        n_tokens rows (two per count: phase 0, or 1 while phase 0's are reserved by an
        uncollected step), or of a recorded one (two kept, each the largest so far). With
        both reserved, phase 0's step is waited for (`PendingStep.result`: its output stays
        with it)."""
        keys = [(n_tokens if replayed else "recorded", phase) for phase in (0, 1)]
        free = [k for k in keys if k not in self._busy_inputs]
        if not free:
            self._busy_inputs[keys[0]].result()
            free = keys[:1]
        key = free[0]
        cur = self._step_inputs.get(key)
        if cur is None or cur.n_tokens < n_tokens:
            if cur is not None:
                cur.close()
            cur = self._step_inputs[key] = StepInputs(self.device, n_tokens,
                                                      self._paged.table_width)
        return key, cur
