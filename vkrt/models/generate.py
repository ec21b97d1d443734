"""The token loop: prefill the prompt, then decode one token at a time over the KV cache.

The prompt is prefilled in chunks of `batch_size` tokens (one submission each), so a long
prefill can be interrupted (KeyboardInterrupt is raised between chunks) and show progress.

Greedy decoding never brings logits to the host: the GPU's argmax writes the next token id
into a slot of the token ring (`Activations.tokens`) that the next step's embedding lookup
reads directly. Decode steps are replayed where the family supports it (VKRT_REPLAY, on by
default: `Decoder.replay_decode`, one vkQueueSubmit per token and nothing recorded), else, and
while timestamps are on (they time recorded commands), recorded each token. The loop runs `inflight - 1` steps ahead (VKRT_INFLIGHT): step j + 1 is
recorded and submitted before the host reads step j's 4 bytes (a `Readback` that waits for
step j's submission only), so the host records while the GPU runs. At the stop token the
steps already submitted beyond it are discarded: their tokens are never read, never reach
`on_token` or the result (`GenerationResult.discarded_steps`); at `max_tokens` no step beyond
is submitted. Sampling (temperature > 0) reads the last logits row, draws on the host and
writes the id back: one step at a time, as before.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol

import numpy as np

from vkrt import config
from vkrt.errors import ConfigError, VkrtError


class CausalLM(Protocol):
    """What the token loop needs of a model family (vkrt.models.llama.Llama,
    vkrt.models.opt.OPT): hyperparameters with `n_ctx` (context length, tokens), its stream,
    a KV cache of `max_seq` positions grown by `setup_caches`, scratch `activations(n_tokens)`
    with `ids` (u32 `[tokens]`), `tokens` (the token ring) and `logits`, and `forward`, which
    records one step over `n_tokens` ids at positions pos0.. writing the last row's argmax into
    `token_out`."""
    hp: object
    stream: object
    max_seq: int

    def setup_caches(self, max_seq: int) -> None: ...
    def activations(self, n_tokens: int, logit_rows: int = 1): ...
    def forward(self, ids, n_tokens: int, pos0: int, all_logits: bool = False,
                token_out=None) -> None: ...


KV_CACHE_STEP = 256  # positions
BATCH_SIZE = 64      # prompt tokens per prefill chunk (one submission each)


@dataclass(frozen=True)
class Sampling:
    """temperature 0 means greedy (argmax on the GPU); otherwise softmax(logits / temperature)
    restricted to the smallest set of tokens whose probability reaches `top_p` (nucleus
    sampling, Holtzman et al. 2020), drawn with numpy's PCG64 seeded by `seed`."""
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        """Raises ConfigError (one line) unless temperature is finite and >= 0, top_p in
        (0, 1], and seed None or an integer in [0, 2**64) (what PCG64 takes)."""
        t, p, seed = self.temperature, self.top_p, self.seed
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0, got {t!r}")
        if not (isinstance(p, (int, float)) and 0 < p <= 1):   # also refuses nan
            raise ConfigError(f"top_p must be in (0, 1], got {p!r}")
        if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool)
                                     and 0 <= seed < 2 ** 64):
            raise ConfigError(f"seed must be an integer from 0 to 2**64 - 1, got {seed!r}")


@dataclass
class GenerationResult:
    """Token ids and timings of one `generate` call (seconds, wall clock)."""
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stopped_at_eos: bool = False   # stopped at one of `stop_ids` (EOS, EOT, EOM)
    discarded_steps: int = 0   # steps submitted past the stop token, their tokens never read

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first over the time spent producing them (the first comes from
        the prefill)."""
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s else 0.0


def _shifted(logits: np.ndarray, why: str) -> tuple[np.ndarray, float]:
    """(x, top): the logits in float64 and their maximum, for softmax(x - top). +inf logits
    share all the mass, softmax's limit as they grow (x becomes 0 there and -inf elsewhere,
    top 0), so nothing computes inf - inf = NaN. `why` ends the errors' message.

    Raises: VkrtError when a logit is NaN or every logit is -inf (no distribution)."""
    x = logits.astype(np.float64)
    if np.isnan(x).any():
        raise VkrtError(f"the logits hold NaN (at id {int(np.flatnonzero(np.isnan(x))[0])}): "
                        f"{why}")
    top = x.max()
    if top == -np.inf:
        raise VkrtError(f"every one of the {x.size} logits is -inf: {why}")
    if top == np.inf:
        x = np.where(x == np.inf, 0.0, -np.inf)
        top = 0.0
    return x, float(top)


def logprobs_of(logits: np.ndarray, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """logits: [vocab] floats (one row); token: an id below vocab; k >= 0. Returns the
    natural-log probability of `token` under softmax(logits), the model's own
    distribution (before temperature and top_p, as vLLM's default "raw" logprobs), and the
    `k` most likely ids with theirs, most likely first (equal ones: the lower id first).
    Computed in float64 as logits - logsumexp(logits); +inf logits share all the mass (as
    `_sample`), -inf ones get -inf.

    Raises: VkrtError when a logit is NaN or every logit is -inf (no distribution)."""
    x, top = _shifted(logits, "no log-probabilities")
    with np.errstate(divide="ignore"):
        lp = x - (top + np.log(np.exp(x - top).sum()))
    k = min(k, lp.size)
    best = np.argpartition(-lp, k - 1)[:k] if 0 < k < lp.size else np.arange(lp.size)[:k]
    best = sorted(best.tolist(), key=lambda i: (-lp[i], i))
    return float(lp[token]), [(int(i), float(lp[i])) for i in best]


def penalized(logits: np.ndarray, prompt_ids, output_ids, presence: float = 0.0,
              frequency: float = 0.0, repetition: float = 1.0, bias=()) -> np.ndarray:
    """The logits (float32 [vocab]) a penalized sequence samples from, a new array:
    repetition (> 0; 1 off) first, over the ids of the prompt and the output so far: a
    positive logit divided by it, a negative one multiplied (CTRL, Keskar et al. 2019, as
    vLLM and llama.cpp apply it); then OpenAI's presence and frequency penalties over the
    output's ids: logit[j] -= frequency * count[j] + presence * (count[j] > 0) (OpenAI's
    API reference, "Parameter details"; vLLM's order); last `bias`, (id, value) pairs
    (OpenAI's logit_bias): logit[id] += value."""
    x = np.array(logits, np.float32)
    n = x.size
    out = np.asarray([i for i in output_ids if 0 <= i < n], np.int64)
    if repetition != 1:
        seen = np.unique(np.concatenate([np.asarray([i for i in prompt_ids if 0 <= i < n],
                                                    np.int64), out]))
        v = x[seen]
        x[seen] = np.where(v > 0, v / np.float32(repetition), v * np.float32(repetition))
    if presence or frequency:
        counts = np.bincount(out, minlength=n).astype(np.float32)
        x -= np.float32(frequency) * counts + np.float32(presence) * (counts > 0)
    for i, v in bias:
        x[i] += np.float32(v)
    return x


def _sample(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    """One id drawn from softmax(logits / temperature) restricted to the top-p nucleus.
    The maximum is subtracted before dividing, so every z is <= 0 and the maximum's is 0:
    a temperature so small that the division overflows gives z = -inf for every other token,
    probability 1 for the maximum (greedy), never inf - inf = nan. Logits of -inf have
    probability 0; +inf ones share all of it (softmax's limit, `_shifted`).

    Raises: VkrtError when a logit is NaN or every logit is -inf (no distribution)."""
    x, top = _shifted(logits, "nothing to sample from")
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        z = (x - top) / s.temperature
    p = np.exp(z)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = int(np.searchsorted(np.cumsum(p[order]), s.top_p) + 1)
    top = order[:keep]
    return int(rng.choice(top, p=p[top] / p[top].sum()))


def check_context(n_ctx: int, n_prompt: int, max_tokens: int) -> None:
    """Raise ConfigError unless max_tokens is an integer >= 1; VkrtError unless 1 <= n_prompt
    and n_prompt + max_tokens <= n_ctx (the model's context length from its metadata)."""
    if not (isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1):
        raise ConfigError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if n_prompt == 0:
        raise VkrtError("the prompt is empty: nothing to condition on")
    if n_prompt + max_tokens > n_ctx:
        raise VkrtError(f"prompt of {n_prompt} token{'' if n_prompt == 1 else 's'} + "
                        f"{max_tokens} new = {n_prompt + max_tokens} exceeds the model's "
                        f"context of {n_ctx} tokens")


def stream_tokens(model: CausalLM, prompt_ids: list[int], max_tokens: int,
                  sampling: Sampling = Sampling(), stop_ids: Iterable[int] = (),
                  batch_size: int = BATCH_SIZE,
                  on_prefill: Callable[[int], None] | None = None, trace: str | None = None,
                  result: GenerationResult | None = None) -> Iterator[int]:
    """Yield up to `max_tokens` token ids after `prompt_ids` as they are produced, stopping
    after any id of `stop_ids` (give `Tokenizer.eog_ids`: EOS, EOT, EOM).

    The prompt is prefilled in chunks of `batch_size` tokens at consecutive positions; a
    KeyboardInterrupt (Ctrl-C) raised while a chunk runs takes effect when it returns.
    `on_prefill(n)` is called after each chunk with the n prompt tokens it processed (for a
    progress bar). `result`, when given, is filled in as tokens come (ids, timings: the time
    the consumer spends between tokens counts as decode time). `trace`: write a Chrome trace
    event file of the call there when the iterator ends or is closed (host phases, GPU
    dispatches where the device has timestamps; `Stream.start_trace`). Closing the iterator
    early leaves submitted steps to finish on the GPU; their tokens are never read.
    Raises: VkrtError when the prompt is empty or prompt + max_tokens exceeds the model's
    context (`hp.n_ctx`); ConfigError when batch_size < 1. Both are raised by the call itself,
    before any work, not at the first `next()`.
    """
    hp = model.hp
    n_prompt = len(prompt_ids)
    check_context(hp.n_ctx, n_prompt, max_tokens)
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ConfigError(f"batch size must be an integer >= 1, got {batch_size!r}")
    result = GenerationResult(n_prompt) if result is None else result
    return _run(model, list(prompt_ids), max_tokens, sampling, frozenset(int(i) for i in stop_ids),
                batch_size, on_prefill, trace, result)


def generate(model: CausalLM, prompt_ids: list[int], max_tokens: int,
             sampling: Sampling = Sampling(), stop_ids: Iterable[int] = (),
             on_token: Callable[[int], None] | None = None, batch_size: int = BATCH_SIZE,
             on_prefill: Callable[[int], None] | None = None,
             trace: str | None = None) -> GenerationResult:
    """`stream_tokens` run to the end: the ids and timings of one generation. `on_token(id)`
    is called as each token is produced (for streaming). Raises as `stream_tokens`."""
    result = GenerationResult(len(prompt_ids))
    for token in stream_tokens(model, prompt_ids, max_tokens, sampling, stop_ids, batch_size,
                               on_prefill, trace, result):
        if on_token is not None:
            on_token(token)
    return result


def _run(model: CausalLM, prompt_ids: list[int], max_tokens: int, sampling: Sampling,
         stop: frozenset, batch_size: int, on_prefill, trace: str | None,
         result: GenerationResult) -> Iterator[int]:
    hp, s = model.hp, model.stream
    n_prompt = len(prompt_ids)
    if model.max_seq < n_prompt + max_tokens:
        # Grown in steps of KV_CACHE_STEP positions so that a run of short generations keeps
        # its buffers (and the descriptor sets that name them).
        steps = -(-(n_prompt + max_tokens) // KV_CACHE_STEP)
        model.setup_caches(min(hp.n_ctx, steps * KV_CACHE_STEP))
    timing = s.timing
    if trace is not None:
        s.start_trace()
    try:
        t0 = time.perf_counter()
        prompt = np.asarray(prompt_ids, np.uint32)
        a = model.activations(min(n_prompt, batch_size))
        # Every chunk but the last: K/V into the cache, one submission each (the next chunk's
        # write into the ids waits for this chunk's embedding to have read them), logits unused.
        pos = 0
        while n_prompt - pos > batch_size:
            s.write(a.ids, prompt[pos:pos + batch_size])
            model.forward(a.ids, batch_size, pos)
            s.submit()
            pos += batch_size
            if on_prefill is not None:
                on_prefill(batch_size)
        s.write(a.ids, prompt[pos:])
        first = _Start(a.ids, n_prompt - pos, pos, on_prefill)
        if sampling.temperature <= 0.0:
            yield from _greedy(model, a, first, max_tokens, stop, result, t0)
        else:
            rng = np.random.Generator(np.random.PCG64(sampling.seed))
            yield from _sampled(model, a, first, max_tokens, sampling, rng, stop, result, t0)
    finally:
        if trace is not None:
            s.write_trace(trace)
            s.profiler.events = s.profiler.gpu_events = None
            s.timing = timing


@dataclass
class _Start:
    """The first step of the loop: the prompt's last chunk (`n_tokens` ids at `pos`)."""
    ids: object
    n_tokens: int
    pos: int
    on_prefill: Callable[[int], None] | None


def _emit(result: GenerationResult, token: int, t0: float, stop: frozenset,
          first: _Start) -> bool:
    """Append `token`; True when it is a stop token."""
    if not result.tokens:
        result.prefill_s = time.perf_counter() - t0
        if first.on_prefill is not None:
            first.on_prefill(first.n_tokens)
    result.tokens.append(token)
    if token in stop:
        result.stopped_at_eos = True
        return True
    return False


def _greedy(model: CausalLM, a, first: _Start, max_tokens: int, stop: frozenset,
            result: GenerationResult, t0: float) -> Iterator[int]:
    s = model.stream
    ring = a.tokens
    ahead = s.inflight - 1            # steps submitted beyond the one being read
    ids, n_tokens, pos = first.ids, first.n_tokens, first.pos
    issued, in_flight = 0, deque()    # Readbacks of submitted steps, oldest first
    # Timestamps (VKRT_TIMESTAMPS, a trace) time recorded commands: replay only without them.
    replay = config.REPLAY.value and getattr(model, "replayable", False) and not s.timing
    t1 = None
    try:
        while True:
            while issued < max_tokens and len(in_flight) <= ahead:
                out = ring[issued % len(ring)]
                if replay and issued >= 1:     # step 0 is the prompt's (last) chunk
                    in_flight.append(model.replay_decode(issued))
                else:
                    model.forward(ids, n_tokens, pos, token_out=out)
                    if replay and issued == 0 and max_tokens > 1:
                        # Where the first replayed step runs, in the same submission.
                        model.set_position(pos + n_tokens)
                    in_flight.append(s.read_later(out))
                    s.submit()
                ids, pos, n_tokens = out, pos + n_tokens, 1
                issued += 1
            if not in_flight:
                break
            token = int(in_flight.popleft().get()[0])
            stopped = _emit(result, token, t0, stop, first)
            if t1 is None:
                t1 = time.perf_counter()
            yield token
            if stopped:
                break
    finally:
        result.discarded_steps = len(in_flight)   # submitted past the stop: never read
        result.decode_s = time.perf_counter() - t1 if t1 is not None else 0.0


def _sampled(model: CausalLM, a, first: _Start, max_tokens: int, sampling: Sampling, rng,
             stop: frozenset, result: GenerationResult, t0: float) -> Iterator[int]:
    s = model.stream
    n_tokens, pos = first.n_tokens, first.pos
    t1 = None
    try:
        for _ in range(max_tokens):
            model.forward(a.ids, n_tokens, pos)
            token = _sample(s.read(a.logits.rows(0, 1))[0], sampling, rng)
            pos += n_tokens
            n_tokens = 1
            stopped = _emit(result, token, t0, stop, first)
            if t1 is None:
                t1 = time.perf_counter()
            yield token
            if stopped:
                break
            s.write(a.ids, np.array([token], np.uint32))
    finally:
        result.decode_s = time.perf_counter() - t1 if t1 is not None else 0.0
