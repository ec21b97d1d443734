"""Continuous batching: which sequences run in one engine step, and how many of their tokens
(vLLM v1's vllm/v1/core/sched/scheduler.py, reduced: no priorities).

Every `schedule()` builds one step under a token budget (`max_num_batched_tokens`) and a
sequence limit (`max_num_seqs`), in this order:

1. decodes: every running sequence with one token left to compute (its last sampled one)
   gets 1 token;
2. prefill chunks of running sequences with more left (chunked prefill: a prompt longer
   than the budget left is split over several steps; also a sequence recomputing after a
   preemption);
3. admissions, unless this step preempted: waiting sequences, first come first served,
   while a sequence slot, budget and KV blocks for their first chunk are left. A sequence
   whose prompt starts with blocks the KV-cache manager has cached (prefix caching,
   vkrt/serve/kv_cache.py) takes them and starts computing after them.

Every full prompt block a step computes is cached as the step is scheduled, so a sequence
admitted later in the same step (another of the same request's `n`) can take it: in a
step, every token's K/V are written before any attention reads them.

A sequence samples a token in a step only when that step's chunk reaches its last token.
Once the step is submitted, `on_submitted` advances `num_computed_tokens` and appends
PENDING_TOKEN for each token the step samples, so the next step can be scheduled while this
one runs (asynchronous scheduling, as vLLM v1's `--async-scheduling`: the next decode's
input is that token, which the model runner feeds on the GPU); `update_from_output` puts the
sampled ids in their place when the step is collected. A sequence whose pending tokens reach
its max_tokens is not scheduled again. The engine retires what stopped (`finish_seq`,
`finish_request`), which frees its KV blocks at once, so the next step admits into them (a
step in flight that still writes a freed block is ordered before any later step on the
queue).

KV blocks are taken lazily, chunk by chunk (`KVCacheManager.allocate_slots`). When the pool
runs dry for a running sequence, the latest admitted running sequence not yet scheduled
this step is preempted by recompute (vLLM's default): its blocks are freed, it goes back to
the head of the waiting queue keeping its tokens, and its next prefill recomputes prompt and
output (the tokens, hence the output, are the same: sampling state stays with the runner).
No deadlock: a request one of whose sequences could never fit the whole cache alone is
refused by `add_request` (VkrtError, HTTP 400); any other progresses once it is the only one
running, and the preempted go back first in line.

Without a KV-cache manager (`kv=None`: the batch-1 runner, whose model keeps its own
contiguous cache), there is no block accounting and the budget is unbounded.

Not thread-safe by itself: the engine calls it under its lock.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vkrt.errors import VkrtError
from vkrt.serve.kv_cache import KVCacheManager, blocks_for
from vkrt.serve.request import Request, RequestStatus, Sequence

DEFAULT_MAX_BATCH = 8              # sequences per step where the model has execute_batch
DEFAULT_MAX_BATCHED_TOKENS = 256   # tokens per step: decodes plus prefill chunks
PENDING_TOKEN = -1                 # Sequence.token_ids: sampled by a step not collected yet


class QueueFullError(VkrtError):
    """The waiting queue holds `max_queue` requests already (HTTP 429)."""


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: `n_tokens` tokens from position `start` (its
    `num_computed_tokens` when scheduled). `samples`: the chunk ends at the sequence's last
    token (when scheduled), so the step returns its next token, the sequence's
    `num_outputs`-th (counted from 1)."""
    seq: Sequence
    start: int
    n_tokens: int
    samples: bool = field(init=False)

    def __post_init__(self):
        self.samples = self.start + self.n_tokens == self.seq.num_tokens

    @property
    def num_outputs(self) -> int:
        return self.start + self.n_tokens + 1 - self.seq.num_prompt_tokens


@dataclass
class SchedulerOutput:
    """What one step runs: `scheduled` (decodes first, then prefill chunks, each sequence
    once), `admitted` (the sequences among them that start this step) and
    `num_batched_tokens` (the sum of their n_tokens, <= max_num_batched_tokens)."""
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.n_tokens for s in self.scheduled)

    @property
    def seqs(self) -> list[Sequence]:
        return [s.seq for s in self.scheduled]


class Scheduler:
    """FIFO continuous-batching scheduler.

    max_queue: requests that may wait with none of their sequences admitted (>= 1);
    `add_request` raises QueueFullError past it. max_num_seqs: sequences running at once
    (1 for the batch-1 runner). max_num_batched_tokens: tokens one step computes at most,
    decodes and prefill chunks together (>= max_num_seqs, so that every running sequence can
    decode; None: unbounded). kv: the block manager (None: no block accounting)."""

    def __init__(self, max_queue: int, max_num_seqs: int = 1,
                 max_num_batched_tokens: int | None = None,
                 kv: KVCacheManager | None = None):
        if not (isinstance(max_queue, int) and max_queue >= 1):
            raise VkrtError(f"max_queue must be an integer >= 1, got {max_queue!r}")
        if not (isinstance(max_num_seqs, int) and max_num_seqs >= 1):
            raise VkrtError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
        if max_num_batched_tokens is not None and not (
                isinstance(max_num_batched_tokens, int)
                and max_num_batched_tokens >= max_num_seqs):
            raise VkrtError(f"max_num_batched_tokens must be an integer >= max_num_seqs "
                            f"({max_num_seqs}), got {max_num_batched_tokens!r}")
        self.max_queue, self.max_num_seqs = max_queue, max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []      # in admission order
        self.num_preemptions = 0

    # -- requests in and out ----------------------------------------------------------------

    def num_waiting_requests(self) -> int:
        """Requests none of whose sequences is admitted yet (what max_queue bounds)."""
        return len({id(s.request) for s in self.waiting
                    if s.request.status is RequestStatus.WAITING})

    def num_running_requests(self) -> int:
        return len({id(s.request) for s in self.running})

    def add_request(self, request: Request) -> None:
        """Queue the sequences of `request`. Raises QueueFullError when `max_queue` requests
        wait already; VkrtError when one sequence (prompt + max_tokens - 1 positions) needs
        more KV blocks than the whole cache has."""
        if self.kv is not None:
            seq = request.seqs[0]
            need = blocks_for(seq.max_kv_tokens, self.kv.block_size)
            if need > self.kv.num_blocks:
                raise VkrtError(
                    f"prompt of {seq.num_prompt_tokens} token"
                    f"{'' if seq.num_prompt_tokens == 1 else 's'} + max_tokens "
                    f"{request.max_tokens} needs {need} KV blocks of {self.kv.block_size} "
                    f"tokens; the whole cache holds {self.kv.num_blocks} (--kv-blocks)")
        waiting = self.num_waiting_requests()
        if waiting >= self.max_queue:
            raise QueueFullError(f"the server is busy: {self.num_running_requests()} running "
                                 f"and {waiting} waiting (--max-queue {self.max_queue}); "
                                 "retry later")
        request.status = RequestStatus.WAITING
        for seq in request.seqs:
            seq.status = RequestStatus.WAITING
            self.waiting.append(seq)

    def finish_seq(self, seq: Sequence) -> None:
        """Retire one sequence (running or waiting): its KV blocks go back to the pool now."""
        if seq.status is RequestStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is RequestStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = RequestStatus.FINISHED
        if self.kv is not None:
            self.kv.free(seq)

    def finish_request(self, request: Request) -> None:
        """Retire every sequence of `request` (an abort, an error, or its last one stopped)."""
        for seq in request.seqs:
            if seq.status is not RequestStatus.FINISHED:
                self.finish_seq(seq)
        request.status = RequestStatus.FINISHED

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ---------------------------------------------------------------------------

    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recompute (vLLM's default): drop `seq`'s KV blocks and put it back
        at the head of the waiting queue with nothing computed; its tokens so far stay, so
        its next prefill recomputes prompt + output and it goes on where it stopped."""
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = RequestStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def schedule(self) -> SchedulerOutput:
        """The next step: decodes, then prefill chunks of running sequences still in prefill
        (chunked prefill, or recomputing after a preemption), then admissions (see the
        module docstring). KV blocks for every scheduled token are allocated here; when
        the pool runs dry for a running sequence, the latest admitted running sequence not
        yet scheduled this step is preempted (possibly that sequence itself)."""
        out = SchedulerOutput()
        budget = (self.max_num_batched_tokens if self.max_num_batched_tokens is not None
                  else float("inf"))
        # A sequence whose last token is sampled (pending: its step is not collected) has
        # nothing more to compute.
        active = [q for q in self.running if q.num_output_tokens < q.request.max_tokens]
        decodes = [q for q in active if q.num_tokens - q.num_computed_tokens == 1]
        prefills = [q for q in active if q.num_tokens - q.num_computed_tokens > 1]
        scheduled: set[int] = set()
        preemptions_before = self.num_preemptions
        for seq in decodes + prefills:
            if budget <= 0:
                break
            if seq.status is not RequestStatus.RUNNING:
                continue                 # preempted earlier in this loop
            n = int(min(seq.num_tokens - seq.num_computed_tokens, budget))
            if self.kv is not None:
                while not self.kv.allocate_slots(seq, n):
                    victims = [q for q in self.running if id(q) not in scheduled]
                    victim = victims[-1]          # `seq` itself is among them
                    self._preempt(victim)
                    if victim is seq:
                        break
                if seq.status is not RequestStatus.RUNNING:
                    continue
                self.kv.cache_blocks(seq, seq.num_computed_tokens + n)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            scheduled.add(id(seq))
            budget -= n
        # No admission in a step that had to preempt (the pool is short already).
        while (self.waiting and self.num_preemptions == preemptions_before
               and len(self.running) < self.max_num_seqs and budget > 0):
            seq = self.waiting[0]
            # A waiting sequence has nothing computed (`_preempt`) but what the prefix
            # cache holds.
            # (A sequence that wants every prompt token's logits computes them all.)
            cached = ([] if self.kv is None or seq.request.params.prompt_logprobs is not None
                      else self.kv.cached_prefix(seq))
            start = len(cached) * self.kv.block_size if cached else seq.num_computed_tokens
            n = int(min(seq.num_tokens - start, budget))
            if self.kv is not None:
                if not self.kv.allocate_slots(seq, n, cached):
                    break        # first come, first served: later ones wait behind it
                seq.num_computed_tokens = start
                self.kv.cache_blocks(seq, start + n)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = seq.num_computed_tokens
            self.waiting.popleft()
            seq.status = seq.request.status = RequestStatus.RUNNING
            self.running.append(seq)
            out.admitted.append(seq)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            budget -= n
        return out

    def on_submitted(self, plan: SchedulerOutput) -> None:
        """The step is submitted: each scheduled sequence has computed its n_tokens, and one
        that samples grows by a PENDING_TOKEN (`update_from_output` replaces it). Sequences
        retired meanwhile are skipped."""
        for s in plan.scheduled:
            if s.seq.status is not RequestStatus.RUNNING:
                continue
            s.seq.num_computed_tokens = s.start + s.n_tokens
            if s.samples:
                s.seq.token_ids.append(PENDING_TOKEN)

    def update_from_output(self, plan: SchedulerOutput, sampled: dict[Sequence, int]) -> None:
        """The step is collected: the token each sequence in `sampled` (seq -> token id)
        sampled takes its PENDING_TOKEN's place (also in a sequence preempted since: its
        tokens are recomputed). Sequences retired meanwhile are skipped."""
        for s in plan.scheduled:
            if s.seq.status is RequestStatus.FINISHED or s.seq not in sampled:
                continue
            index = s.start + s.n_tokens
            assert s.seq.token_ids[index] == PENDING_TOKEN, (s.seq, index)
            s.seq.token_ids[index] = int(sampled[s.seq])
