"""A numpy model behind the batched interface (`setup_paged_cache`, `execute_batch`) that
emulates a paged KV cache faithfully, for the continuous-batching tests (no GPU).

`submit_batch` (computed at once; `execute_batch` is it and its result) first gives the tokens
that `BatchInput.prev_rows` names the previous step's argmax rows, as `feed_sampled` does on a
GPU, then writes every token's (id, position, role: `BatchInput.prompt`, a prompt
token or a generated one, whose products run on different kernels on a GPU) into its
`slot_mapping` slot (the K/V write), then computes each requested logit row from what it
reads back through `block_tables[seq][q // block_size] * block_size + q % block_size` for q =
0 .. pos (the attention reads): the logits are a hash of that history. A slot read before
anything was written raises; a slot written by another sequence, or holding another position,
changes the history and so the tokens; so does a token given the wrong role. Any mixing of
block tables, slot mapping, positions, roles or chunks between sequences therefore shows up as a token that differs from `reference()`, which runs
the same function over the plain (unpaged) history, one sequence alone.
"""
from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from vkrt.models.batch import NO_ROW, BatchInput, BatchOutput
from vkrt.models.generate import Sampling, _sample, penalized

N_VOCAB = 64
EOS = 0


class UnwrittenSlotError(RuntimeError):
    """A KV slot was read before any token was written to it."""


def logits_of(history: list[tuple[int, int, bool]]) -> np.ndarray:
    """f32 [N_VOCAB]: a hash of the (token id, position, is a prompt token) of positions 0 ..
    pos."""
    key = zlib.crc32(np.asarray(history, np.uint32).tobytes())
    return (np.random.default_rng(key).standard_normal(N_VOCAB) * 3).astype(np.float32)


def reference(prompt: list[int], max_tokens: int, temperature: float = 0.0,
              top_p: float = 1.0, seed: int | None = None,
              penalties: tuple[float, float, float] | None = None,
              stop_at_eos: bool = True) -> list[int]:
    """The tokens one sequence gets alone, without any paging (stops after EOS unless not
    `stop_at_eos`, as `ignore_eos`); `penalties`: (presence, frequency, repetition) applied
    to each step's logits (`vkrt.models.generate.penalized`)."""
    hist = list(prompt)
    s = Sampling(temperature, top_p, seed)
    rng = np.random.Generator(np.random.PCG64(seed)) if temperature > 0 else None
    out = []
    for _ in range(max_tokens):
        logits = logits_of([(t, q, q < len(prompt)) for q, t in enumerate(hist)])
        if penalties is not None:
            logits = penalized(logits, prompt, out, *penalties)
        token = int(np.argmax(logits)) if rng is None else _sample(logits, s, rng)
        out.append(token)
        hist.append(token)
        if token == EOS and stop_at_eos:
            break
    return out


def piece(token: int) -> str:
    return f"<{token}>"


class FakeDetok:
    def step(self, token: int) -> str:
        return piece(token)

    def finish(self) -> str:
        return ""


class FakeTokenizer:
    eog_ids = frozenset({EOS})
    bos_id = eos_id = None

    def stream(self, skip_special: bool = False) -> FakeDetok:
        return FakeDetok()

    def decode(self, ids: list[int], skip_special: bool = False,
               continuation: bool = False) -> str:
        return "".join(map(piece, ids))


class Done:
    """A step computed already (`PendingStep`'s interface)."""

    def __init__(self, out: BatchOutput):
        self.out = out

    def result(self) -> BatchOutput:
        return self.out


class FakePagedLM:
    """The paged model. Counters: `steps` (submit_batch calls), `tokens_per_step` and
    `seqs_per_step` (T and S of each call), `setups`, `fed_tokens` (tokens whose id was the
    step before's argmax row)."""

    max_slots = 1 << 20

    def __init__(self):
        self.kv_tokens = self.kv_pos = self.kv_prompt = self.paged_kv_dtype = None
        self.paged_products = self.paged_coop_tiles = None
        self.steps, self.tokens_per_step, self.seqs_per_step, self.setups = 0, [], [], 0
        self.delay_s = 0.0
        self.last_argmax = np.zeros(0, np.uint32)
        self.fed_tokens = 0

    @property
    def paged_cache_info(self):
        return None if self.kv_tokens is None else (len(self.kv_tokens) // self.block_size,
                                                    self.block_size)

    def max_paged_blocks(self, block_size: int, kv_dtype: str = "float32") -> int:
        """As a device with room for `max_slots` token slots (a class attribute tests set)."""
        return self.max_slots // block_size

    def batch_products(self, max_batch=None) -> dict:
        """As a table whose engines of 16 or more sequences decode on another kernel."""
        return {"decode": "wide" if max_batch and max_batch >= 16 else "narrow",
                "prompt": "prompt"}

    def batch_coop_tiles(self, max_batch=None) -> tuple:
        """As a table whose engines of 64 or more sequences split the columns otherwise."""
        return ("split 4",) if max_batch and max_batch >= 64 else ("split 8",)

    def setup_paged_cache(self, num_blocks: int, block_size: int,
                          kv_dtype: str = "float32", max_batch=None) -> None:
        if num_blocks * block_size > self.max_slots:
            from vkrt.errors import DeviceMemoryError
            raise DeviceMemoryError(f"allocating {num_blocks * block_size} slots on the fake "
                                    f"device: {self.max_slots} fit")
        self.paged_kv_dtype = kv_dtype
        self.paged_products = self.batch_products(max_batch)
        self.paged_coop_tiles = self.batch_coop_tiles(max_batch)
        self.block_size = block_size
        self.kv_tokens = np.zeros(num_blocks * block_size, np.int64)
        self.kv_pos = np.full(num_blocks * block_size, -1, np.int64)    # -1: never written
        self.kv_prompt = np.zeros(num_blocks * block_size, bool)
        self.setups += 1

    def submit_batch(self, batch: BatchInput, want_logits: bool = False) -> "Done":
        """The step, computed now: the tokens `prev_rows` names take the argmax rows of the
        step before, as `feed_sampled` gives them on a GPU."""
        if batch.prev_rows is not None:
            fed = batch.prev_rows != NO_ROW
            assert (batch.prev_rows[fed] < len(self.last_argmax)).all(), "a row not returned"
            ids = batch.token_ids.copy()
            ids[fed] = self.last_argmax[batch.prev_rows[fed]]
            batch = dataclasses.replace(batch, token_ids=ids)
            self.fed_tokens += int(fed.sum())
        out = self._run(batch, want_logits)
        self.last_argmax = out.argmax
        return Done(out)

    def execute_batch(self, batch: BatchInput, want_logits: bool = False) -> BatchOutput:
        return self.submit_batch(batch, want_logits).result()

    def _run(self, batch: BatchInput, want_logits: bool) -> BatchOutput:
        assert self.kv_tokens is not None, "execute_batch before setup_paged_cache"
        T = len(batch.token_ids)
        for name in ("token_ids", "positions", "seq_of_token", "slot_mapping"):
            a = getattr(batch, name)
            assert a.dtype == np.uint32 and a.shape == (T,), (name, a.dtype, a.shape)
        bt, lt = batch.block_tables, batch.logit_tokens
        assert bt.dtype == np.uint32 and bt.ndim == 2 and lt.dtype == np.uint32 and lt.ndim == 1
        assert int(batch.seq_of_token.max()) < bt.shape[0] and (lt < T).all()
        prompt = batch.prompt
        assert prompt is not None and prompt.dtype == bool and prompt.shape == (T,)
        bs = self.block_size
        # The K/V write: every token of the step, before any read.
        self.kv_tokens[batch.slot_mapping] = batch.token_ids
        self.kv_pos[batch.slot_mapping] = batch.positions
        self.kv_prompt[batch.slot_mapping] = prompt
        rows = []
        for i in lt:
            s, pos = int(batch.seq_of_token[i]), int(batch.positions[i])
            slots = [int(bt[s, q // bs]) * bs + q % bs for q in range(pos + 1)]
            if (self.kv_pos[slots] < 0).any():
                q = int(np.flatnonzero(self.kv_pos[slots] < 0)[0])
                raise UnwrittenSlotError(f"sequence row {s} reads position {q} (slot "
                                         f"{slots[q]}) before it was written")
            history = list(zip(self.kv_tokens[slots].tolist(), self.kv_pos[slots].tolist(),
                               self.kv_prompt[slots].tolist()))
            rows.append(logits_of(history))
        logits = np.stack(rows) if rows else np.zeros((0, N_VOCAB), np.float32)
        self.steps += 1
        self.tokens_per_step.append(T)
        self.seqs_per_step.append(bt.shape[0])
        if self.delay_s:
            import time
            time.sleep(self.delay_s)
        return BatchOutput(argmax=logits.argmax(axis=1).astype(np.uint32),
                           logits=logits if want_logits else None)


class _HParams:
    def __init__(self, n_ctx):
        self.n_ctx, self.n_vocab = n_ctx, N_VOCAB


class _Checkpoint:
    chat_template = None


class FakeModel:
    """What the engine uses of a `vkrt.Model`: hparams.n_ctx, tokenizer, encode, lm."""
    family = "fake"

    def __init__(self, n_ctx: int = 256, batched: bool = True):
        self.hparams = _HParams(n_ctx)
        self.tokenizer = FakeTokenizer()
        self.checkpoint = _Checkpoint()
        self.lm = FakePagedLM() if batched else object()

    def encode(self, prompt, chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            return [1 + ord(c) % (N_VOCAB - 1) for c in prompt]
        ids = [int(i) for i in prompt]
        if any(not 0 <= i < N_VOCAB for i in ids):
            from vkrt.errors import VkrtError
            raise VkrtError(f"token id outside the vocabulary of {N_VOCAB}")
        return ids
