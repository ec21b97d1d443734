"""Model runners: turn a `SchedulerOutput` into one model step and a token per sampling
sequence (vLLM v1's vllm/v1/worker/gpu_model_runner.py, host side).

Both have the same interface, used by the engine on its thread:

    start(seq)                       a sequence was admitted (its prefill runs next)
    submit(plan) -> step             the step is on its way (`RunnerStep`)
    collect(step) -> {seq: Sampled}  for every sequence that sampled
    execute(plan)                    collect(submit(plan))
    release(seq)                     it finished or was aborted: drop its state

A step may be collected after the next one is submitted (asynchronous scheduling) when it
`overlaps`: every token it samples is greedy and none wants its log-probabilities (which
need the logits on the host), so the next step's decode of that sequence
takes it on the GPU (`BatchInput.prev_rows`, vkrt/models/batch.py); its id is PENDING_TOKEN
on the host until then.

`BatchRunner` (a model with a batched forward, `execute_batch`, over a paged KV cache):
every step is ONE `execute_batch` call over the flattened tokens of every scheduled sequence
(`BatchInput`, built from the block tables of `vkrt.serve.kv_cache.KVCacheManager`).
Every family vkrt loads has one (the Llama-like families: vkrt/models/llama_batch.py; OPT:
vkrt/models/opt_batch.py). `SingleSequenceRunner` (a model without `execute_batch`): batch
size 1 over `stream_tokens`, one sequence at a time, its model's own contiguous KV cache.

Sampling is per sequence: greedy takes the model's argmax (computed on the GPU); otherwise
the sequence's logits row is drawn from with its own temperature, top_p and PCG64 generator
seeded by `SamplingParams.seed_of(index)` (`vkrt.models.generate._sample`, the same draw as
`generate`), so a seeded sequence gives the same tokens alone or batched with any others.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Iterator, NamedTuple

import numpy as np

from vkrt.errors import VkrtError
from vkrt.models.generate import (GenerationResult, Sampling, _sample, logprobs_of, penalized,
                                  stream_tokens)
from vkrt.serve.kv_cache import KVCacheManager
from vkrt.serve.request import LENGTH, STOP, Sequence
from vkrt.serve.scheduler import PENDING_TOKEN, ScheduledSeq, SchedulerOutput


def batched_model(model) -> Any:
    """The object with `execute_batch` and `setup_paged_cache` behind a `vkrt.Model`
    (`model.lm`, the family's model, or the model itself), or None when it has none."""
    for candidate in (getattr(model, "lm", None), model):
        if candidate is not None and callable(getattr(candidate, "execute_batch", None)):
            return candidate
    return None


class Sampled(NamedTuple):
    """A sequence's token from a step: its id, the finish reason it causes ("stop",
    "length") or None, and where the request asks for them (`SamplingParams.logprobs`) its
    log-probability and the (id, log-probability) of the most likely ids
    (`vkrt.models.generate.logprobs_of`), else None. `prompt_logprobs`
    (`SamplingParams.prompt_logprobs`, with the sequence's first token only): the same for
    each prompt token from the second on, given the ones before it."""
    token: int
    finish_reason: str | None
    logprobs: tuple[float, list[tuple[int, float]]] | None = None
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


def _sampling_of(seq: Sequence) -> Sampling:
    p = seq.request.params
    return Sampling(p.temperature, p.top_p, p.seed_of(seq.index))


def _finish_reason(s: ScheduledSeq, token: int, stop_ids: frozenset) -> str | None:
    """"stop" at an end-of-generation id, "length" when `token`, sampled by `s`, is its
    sequence's max_tokens-th output, else None; end-of-generation ids do not stop a sequence
    whose request sets `ignore_eos`."""
    if token in stop_ids and not s.seq.request.params.ignore_eos:
        return STOP
    if s.num_outputs >= s.seq.request.max_tokens:
        return LENGTH
    return None


class RunnerStep:
    """A submitted step: its `plan`, the sampling entries with their logit rows
    (`sampling`: (ScheduledSeq, row)), the rows of prompt tokens whose log-probabilities a
    request asks for (`prompt_rows`: (sequence, position q, row): the row of token q - 1,
    which predicts token q), the model's pending step (`pending`: `result()` waits), and
    whether the engine may submit the next step before collecting this one (`overlaps`:
    every token it samples is the GPU's argmax and no logits go to the host)."""

    def __init__(self, plan: SchedulerOutput, sampling: list[tuple[ScheduledSeq, int]],
                 pending, overlaps: bool, prompt_rows: list = ()):
        self.plan, self.sampling, self.pending, self.overlaps = plan, sampling, pending, overlaps
        self.prompt_rows = list(prompt_rows)


# The runner of the started (not yet shut down) engine of each model: the model's paged KV
# cache is that engine's, and no other engine may replace it meanwhile (`BatchRunner.activate`).
_ACTIVE: "weakref.WeakKeyDictionary[Any, BatchRunner]" = weakref.WeakKeyDictionary()
_ACTIVE_LOCK = threading.Lock()


class BatchRunner:
    """One `execute_batch` per step over a paged KV cache.

    lm: has `setup_paged_cache(num_blocks, block_size, kv_dtype, max_batch)` (by
    `setup_cache`: the engine calls it when it is made, before its thread starts, and
    `activate` when it starts), `paged_cache_info`, `paged_kv_dtype`, `paged_products`,
    `paged_coop_tiles`, `batch_products(max_batch)`, `batch_coop_tiles(max_batch)` and
    `submit_batch(BatchInput, want_logits) -> PendingStep` (vkrt.models.batch). kv: the
    block manager whose tables the slots come from; kv_dtype: the cache's elements (float32
    or float16); max_batch: the engine's sequences per step, which chooses the products'
    kernels and matmul_coop's tiles (the cache keeps them for its life:
    vkrt/models/batch.py, batch invariance). stop_ids:
    end-of-generation ids (`Tokenizer.eog_ids`). Counters: `steps`, `batched_tokens`
    (tokens over every step), `max_seqs_in_step`."""

    def __init__(self, lm, kv: KVCacheManager, stop_ids=(), kv_dtype: str = "float32",
                 max_batch: int | None = None):
        self.lm, self.kv, self.kv_dtype, self.max_batch = lm, kv, kv_dtype, max_batch
        self.products = lm.batch_products(max_batch)
        self.coop_tiles = lm.batch_coop_tiles(max_batch)
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self._rngs: dict[Sequence, tuple[Sampling, np.random.Generator | None]] = {}
        self._rows: dict[Sequence, int] = {}   # logit row of each sampler of the last step
        # Prompt log-probabilities computed so far (SamplingParams.prompt_logprobs): entry
        # q - 1 is prompt token q's; None once given out with the sequence's first token.
        self._prompt_lps: dict[Sequence, list | None] = {}
        self.steps = self.batched_tokens = self.max_seqs_in_step = 0
        self.fed_tokens = 0      # tokens whose id came from the step before, on the GPU

    def _cache_is_mine(self) -> bool:
        return (self.lm.paged_cache_info == (self.kv.num_blocks, self.kv.block_size)
                and self.lm.paged_kv_dtype == self.kv_dtype
                and self.lm.paged_products == self.products
                and self.lm.paged_coop_tiles == self.coop_tiles)

    def setup_cache(self) -> None:
        """Allocate the model's paged KV cache for `kv`'s blocks of `kv_dtype` and the
        products' kernels and tiles of `max_batch`, or keep the one the model has when it has
        those already (another engine's, made before: the model is not touched then). Raises
        VkrtError when another engine that runs the model (started, not shut down) holds a
        cache of other blocks, dtype, kernels or tiles; what `setup_paged_cache` raises
        (ValueError, DeviceMemoryError)."""
        if not self._cache_is_mine():
            with _ACTIVE_LOCK:
                busy = _ACTIVE.get(self.lm)
            if busy is not None and busy is not self:
                raise VkrtError(
                    f"the model runs in another engine, whose KV cache has "
                    f"{busy.kv.num_blocks} blocks of {busy.kv.block_size} ({busy.kv_dtype}, "
                    f"max_batch {busy.max_batch}): shut it down before making one with "
                    f"{self.kv.num_blocks} blocks of {self.kv.block_size} ({self.kv_dtype}, "
                    f"max_batch {self.max_batch})")
            self.lm.setup_paged_cache(self.kv.num_blocks, self.kv.block_size, self.kv_dtype,
                                      self.max_batch)

    def activate(self) -> None:
        """The engine starts: this runner's engine runs the model from now on (its KV cache
        allocated again if another engine, not running, replaced it since). Raises
        VkrtError when another started engine runs the model (one at a time)."""
        with _ACTIVE_LOCK:
            busy = _ACTIVE.get(self.lm)
            if busy is not None and busy is not self:
                raise VkrtError("the model already runs in another engine: shut that one "
                                "down first (one engine per model at a time)")
            _ACTIVE[self.lm] = self
        self.setup_cache()

    def deactivate(self) -> None:
        """The engine stopped running the model."""
        with _ACTIVE_LOCK:
            if _ACTIVE.get(self.lm) is self:
                del _ACTIVE[self.lm]

    def start(self, seq: Sequence) -> None:
        s = _sampling_of(seq)
        rng = (np.random.Generator(np.random.PCG64(s.seed)) if s.temperature > 0 else None)
        self._rngs[seq] = (s, rng)
        if seq.request.params.prompt_logprobs is not None:
            self._prompt_lps[seq] = []

    def running(self, seq: Sequence) -> bool:
        return seq in self._rngs

    def release(self, seq: Sequence) -> None:
        self._rngs.pop(seq, None)
        self._prompt_lps.pop(seq, None)

    def prepare(self, scheduled: list[ScheduledSeq]):
        """(BatchInput, the sampling entries of `scheduled` with their logit rows, the prompt
        rows: `RunnerStep`'s `sampling` and `prompt_rows`).

        BatchInput (u32 arrays): token_ids [T], positions [T], seq_of_token [T] (row of
        block_tables), slot_mapping [T] (block_tables[s][pos // block_size] * block_size +
        pos % block_size), block_tables [S, max blocks of any of them] (rows padded with
        0, never read past a sequence's own positions), logit_tokens [R] (index in T of
        the last token of each sampling sequence, and of each prompt token but the last of a
        sequence whose request asks for prompt log-probabilities, those not computed yet, in
        token order); prompt (bool [T]): the token's position
        lies inside its sequence's prompt (a generated token recomputed after a preemption
        stays a generated one: its role, and so its product's kernel, is its own);
        prev_rows [T] (u32, or None when no token needs it): for a PENDING_TOKEN (a decode
        of the token the last submitted step samples) that step's logit row, else NO_ROW.
        Raises RuntimeError for a PENDING_TOKEN that step does not sample (a bug)."""
        from vkrt.models.batch import NO_ROW, BatchInput

        bs = self.kv.block_size
        tables = [self.kv.block_table(s.seq) for s in scheduled]
        block_tables = np.zeros((len(scheduled), max(len(t) for t in tables)), np.uint32)
        ids, positions, rows, logit_tokens, sampling, prompt_rows = [], [], [], [], [], []
        t = 0
        for i, s in enumerate(scheduled):
            block_tables[i, :len(tables[i])] = tables[i]
            n = s.n_tokens
            ids.append(np.asarray(s.seq.token_ids[s.start:s.start + n], np.int64))
            positions.append(np.arange(s.start, s.start + n, dtype=np.uint32))
            rows.append(np.full(n, i, np.uint32))
            done = self._prompt_lps.get(s.seq)
            if done is not None:     # rows of prompt tokens 1 .. P - 1 not computed yet
                for q in range(max(s.start + 1, len(done) + 1),
                               min(s.start + n + 1, s.seq.num_prompt_tokens)):
                    prompt_rows.append((s.seq, q, len(logit_tokens)))
                    logit_tokens.append(t + q - 1 - s.start)
            t += n
            if s.samples:
                sampling.append((s, len(logit_tokens)))
                logit_tokens.append(t - 1)
        positions = np.concatenate(positions)
        seq_of_token = np.concatenate(rows)
        token_ids = np.concatenate(ids)
        prev_rows = None
        pending = np.flatnonzero(token_ids == PENDING_TOKEN)
        if pending.size:
            prev_rows = np.full(len(token_ids), NO_ROW, np.uint32)
            for t in pending:
                seq = scheduled[seq_of_token[t]].seq
                if seq not in self._rows or positions[t] != seq.num_tokens - 1:
                    raise RuntimeError(f"{seq}: position {positions[t]} is pending, not a "
                                       "token of the step submitted last")
                prev_rows[t] = self._rows[seq]
            token_ids[pending] = 0
        prompt_len = np.array([s.seq.num_prompt_tokens for s in scheduled], np.int64)
        prompt = positions < prompt_len[seq_of_token]
        slot_mapping = (block_tables[seq_of_token, positions // bs] * bs
                        + positions % bs).astype(np.uint32)
        batch = BatchInput(token_ids=token_ids.astype(np.uint32), positions=positions,
                           seq_of_token=seq_of_token, slot_mapping=slot_mapping,
                           block_tables=block_tables,
                           logit_tokens=np.asarray(logit_tokens, np.uint32), prompt=prompt,
                           prev_rows=prev_rows)
        return batch, sampling, prompt_rows

    def submit(self, plan: SchedulerOutput) -> RunnerStep:
        """Submit the step: one `submit_batch` of every scheduled sequence's tokens (logits
        to the host only when a sequence samples by drawing, adjusts its logits or asks for
        log-probabilities: the step then does not overlap). Raises whatever the model
        raises (the engine fails the step's requests)."""
        if not self._cache_is_mine():
            raise VkrtError("the model's paged KV cache was replaced by another engine's "
                            "while this one ran it")
        batch, sampling, prompt_rows = self.prepare(plan.scheduled)
        on_gpu = not prompt_rows and all(
            self._rngs[s.seq][1] is None and s.seq.request.params.logprobs is None
            and not s.seq.request.params.adjusts_logits for s, _ in sampling)
        pending = self.lm.submit_batch(batch, want_logits=not on_gpu)
        self._rows = {s.seq: r for s, r in sampling}
        self.steps += 1
        self.batched_tokens += len(batch.token_ids)
        self.max_seqs_in_step = max(self.max_seqs_in_step, len(plan.scheduled))
        if batch.prev_rows is not None:
            from vkrt.models.batch import NO_ROW
            self.fed_tokens += int((batch.prev_rows != NO_ROW).sum())
        return RunnerStep(plan, sampling, pending, on_gpu, prompt_rows)

    def collect(self, step: RunnerStep) -> dict[Sequence, Sampled]:
        """Wait for the step; a token for each sequence whose chunk reached its last token
        (greedy: the model's argmax, or the host's of the penalized logits where the request
        sets a penalty; else drawn from its logits row, penalized, with its generator), with
        its log-probabilities (of the model's logits) where its request asks for them."""
        out = step.pending.result()
        result = {}
        for seq, q, r in step.prompt_rows:
            done = self._prompt_lps.get(seq)
            if done is not None and len(done) == q - 1:   # (not released, not computed)
                done.append(logprobs_of(np.asarray(out.logits[r]), seq.token_ids[q],
                                        seq.request.params.prompt_logprobs))
        for s, r in step.sampling:
            entry = self._rngs.get(s.seq)
            if entry is None:     # released meanwhile: stopped, aborted or failed
                continue
            sampling, rng = entry
            p = s.seq.request.params
            logits = None if out.logits is None else np.asarray(out.logits[r])
            if p.adjusts_logits:
                seq = s.seq
                logits = penalized(logits, seq.token_ids[:seq.num_prompt_tokens],
                                   seq.token_ids[seq.num_prompt_tokens:], p.presence_penalty,
                                   p.frequency_penalty, p.repetition_penalty, p.logit_bias)
            if rng is not None:
                token = _sample(logits, sampling, rng)
            elif p.adjusts_logits:
                token = int(np.argmax(logits))
            else:
                token = int(out.argmax[r])
            k = p.logprobs
            lp = None if k is None else logprobs_of(np.asarray(out.logits[r]), token, k)
            prompt_lps = self._prompt_lps.get(s.seq)
            if prompt_lps is not None:
                self._prompt_lps[s.seq] = None       # given out once, with the first token
            result[s.seq] = Sampled(token, _finish_reason(s, token, self.stop_ids), lp,
                                    prompt_lps)
        return result

    def execute(self, plan: SchedulerOutput) -> dict[Sequence, Sampled]:
        """`collect(submit(plan))`; {} for an empty plan."""
        return self.collect(self.submit(plan)) if plan.scheduled else {}


class SingleSequenceRunner:
    """Advances the running sequence by one token per step with batch size 1: each sequence
    is its own `stream_tokens` iterator over the model's one KV cache, so only one may be in
    progress at a time (`Scheduler(max_num_seqs=1)` guarantees it). Its first `execute`
    prefills the whole prompt (the scheduler's chunking is not used)."""

    def __init__(self, model):
        self.model = model
        self._seqs: dict[Sequence, tuple[Iterator[int], GenerationResult]] = {}

    def start(self, seq: Sequence) -> None:
        """Begin `seq` (its prefill runs at the next `execute`)."""
        result = GenerationResult(seq.num_prompt_tokens)
        eog = () if seq.request.params.ignore_eos else self.model.tokenizer.eog_ids
        tokens = stream_tokens(self.model.lm, seq.request.prompt_ids, seq.request.max_tokens,
                               _sampling_of(seq), eog, result=result)
        self._seqs[seq] = (tokens, result)

    def running(self, seq: Sequence) -> bool:
        return seq in self._seqs

    def submit(self, plan: SchedulerOutput) -> RunnerStep:
        """Run the step now (`execute`); it never overlaps the next."""
        return RunnerStep(plan, [], self.execute(plan), overlaps=False)

    def collect(self, step: RunnerStep) -> dict[Sequence, Sampled]:
        """The tokens `submit` computed already."""
        return step.pending

    def execute(self, plan: SchedulerOutput) -> dict[Sequence, Sampled]:
        """One step: the next token of every scheduled sequence, with its finish reason
        ("stop" at an end-of-generation token, "length" at max_tokens, else None); no
        log-probabilities (the engine refuses requests for them here)."""
        out = {}
        for seq in plan.seqs:
            tokens, result = self._seqs[seq]
            token = next(tokens)
            reason = (STOP if result.stopped_at_eos else
                      LENGTH if len(result.tokens) >= seq.request.max_tokens else None)
            out[seq] = Sampled(token, reason)
        return out

    def activate(self) -> None:
        """The engine starts (nothing to claim: the model's own contiguous KV cache)."""

    def deactivate(self) -> None:
        """The engine stopped."""

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's state (steps already submitted finish on the GPU, unread)."""
        entry = self._seqs.pop(seq, None)
        if entry is not None:
            entry[0].close()
