"""What the engine, the scheduler and the model runner pass between them: per-request
sampling parameters, a request and its state, the output of one engine step for one request.

Shaped after vLLM v1 (vllm/sampling_params.py, vllm/v1/request.py, vllm/outputs.py): a
request carries its own `SamplingParams`; every step yields a `RequestOutput` per request
that made progress, holding only what is new (`delta` text and token ids).
"""
from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from vkrt.errors import ConfigError


MAX_LOGPROBS = 20      # most likely alternatives per token (OpenAI's top_logprobs bound)


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability (natural log, under the model's softmax before
    temperature and top_p): `token_id`, its text `token` (the id decoded alone), `logprob`
    (None for a prompt's first token: nothing predicts it), and `top`: the (id, text,
    logprob) of the most likely ids at that position, most likely first
    (SamplingParams.logprobs or prompt_logprobs of them)."""
    token_id: int
    token: str
    logprob: float | None
    top: tuple[tuple[int, str, float], ...] = ()


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded.

    max_tokens: tokens to generate at most per sequence (int >= 1; None: up to the model's
    context). temperature: 0 greedy, else softmax sampling at that temperature (>= 0, finite).
    top_p: nucleus mass in (0, 1]. seed: None (random) or an int in [0, 2**64); sequence i of
    `n` draws with seed + i. stop: strings that end the text where they first occur, matched
    on the detokenized text across token boundaries, not included in the output. n: how many
    sequences (choices) to generate for the prompt. ignore_eos: go on past end-of-generation
    tokens up to max_tokens (vLLM's `ignore_eos`; for throughput runs, bench/batched.py).
    logprobs: None, or each generated token's log-probability and those of the `logprobs`
    (0 .. MAX_LOGPROBS) most likely ids at its position (`TokenLogprob`; the model's
    distribution before temperature and top_p). Such a request's steps bring the logits to
    the host: they are collected before the next is scheduled. prompt_logprobs: the same
    for every prompt token from the second on, given the ones before it (vLLM's
    `prompt_logprobs`; `RequestOutput.prompt_logprobs`): such a sequence computes its whole
    prompt (no prefix cache hit).
    presence_penalty, frequency_penalty (each in [-2, 2], 0 off; OpenAI's): subtracted from
    the logit of every id the sequence generated so far, once and per occurrence.
    repetition_penalty (> 0, 1 off; vLLM's and llama.cpp's, after CTRL, Keskar et al. 2019):
    the logits of ids in the prompt or generated so far are divided by it where positive and
    multiplied where negative (`vkrt.models.generate.penalized`). logit_bias: (id, value)
    pairs, value in [-100, 100], added to those ids' logits (OpenAI's; ids below the
    model's vocabulary, which the engine checks). A sequence with any of these
    (`adjusts_logits`) has its token, greedy too, chosen on the host from its adjusted
    logits, so its steps are collected before the next is scheduled; logprobs stay the
    model's own.
    Raises ConfigError (one line naming the field) for a value out of range."""
    max_tokens: int | None = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self):
        if self.max_tokens is not None and not (
                isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise ConfigError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (isinstance(self.n, int) and self.n >= 1):
            raise ConfigError(f"n must be an integer >= 1, got {self.n!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and not isinstance(v, bool)
                                      and 0 <= v <= MAX_LOGPROBS):
                raise ConfigError(f"{name} must be None or an integer from 0 to "
                                  f"{MAX_LOGPROBS}, got {v!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and -2 <= v <= 2):
                raise ConfigError(f"{name} must be a number from -2 to 2, got {v!r}")
        r = self.repetition_penalty
        if not (isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r)
                and r > 0):
            raise ConfigError(f"repetition_penalty must be a finite number > 0, got {r!r}")
        bias = tuple((i, v) for i, v in (self.logit_bias.items() if isinstance(
            self.logit_bias, dict) else self.logit_bias))
        for i, v in bias:
            if not (isinstance(i, int) and not isinstance(i, bool) and i >= 0
                    and isinstance(v, (int, float)) and not isinstance(v, bool)
                    and -100 <= v <= 100):
                raise ConfigError(f"logit_bias must map token ids >= 0 to numbers from -100 "
                                  f"to 100, got {i!r}: {v!r}")
        if len({i for i, _ in bias}) != len(bias):
            raise ConfigError(f"logit_bias names a token id twice: {bias!r}")
        object.__setattr__(self, "logit_bias", bias)
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise ConfigError(f"stop must hold non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        from vkrt.models.generate import Sampling

        Sampling(self.temperature, self.top_p, self.seed)   # temperature, top_p, seed checks

    @property
    def adjusts_logits(self) -> bool:
        """Some penalty or bias changes the logits."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1 or bool(self.logit_bias))

    def seed_of(self, index: int) -> int | None:
        """The seed sequence `index` draws with (None stays None: random)."""
        return None if self.seed is None else (self.seed + index) % 2 ** 64


class RequestStatus(enum.Enum):
    WAITING = "waiting"      # in the scheduler's waiting queue (no sequence admitted yet)
    RUNNING = "running"      # admitted: the runner advances its sequences every step
    FINISHED = "finished"    # done: every sequence stopped, or aborted


# finish_reason values (OpenAI's, plus "abort" as vLLM reports a cancelled request and
# "error" for a failure inside the engine).
STOP, LENGTH, ABORT, ERROR = "stop", "length", "abort", "error"


@dataclass
class RequestOutput:
    """What one engine step produced for one request's current sequence `index`.

    delta: new text (possibly ""), token_ids: the new token ids. finished: this sequence is
    done, finish_reason "stop" (an end-of-generation token or a stop string), "length"
    (max_tokens or the context), "abort" or "error" (then `error` holds the message).
    request_finished: the last output of the request (all `n` sequences done).
    prompt_tokens / completion_tokens: counts so far (completion summed over sequences).
    cached_tokens: of the prompt, the positions taken from the prefix cache (the first
    sequence's first admission; 0 before it). logprobs: one `TokenLogprob` per id of
    `token_ids` when the request asked for them, else None. prompt_logprobs: with a
    sequence's first output when the request asks for them, one `TokenLogprob` per prompt
    token (the first's logprob None: nothing before it), else None.
    ttft_s, tpot_s: time to first token (from arrival) and mean time per output token after
    the first, seconds, on the request's last output (None before)."""
    request_id: str
    index: int
    delta: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    request_finished: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass(eq=False)
class Request:
    """One request: its prompt token ids, `params`, and `sink(output)`, called on the engine
    thread with each `RequestOutput` (it must not block: hand the output over, e.g. with
    `loop.call_soon_threadsafe`). The engine owns everything below `sink`."""
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: Callable[[RequestOutput], None]
    status: RequestStatus = RequestStatus.WAITING
    arrival: float = field(default_factory=time.perf_counter)
    seqs: list["Sequence"] = field(default_factory=list)   # n, made by __post_init__
    completion_tokens: int = 0     # over every sequence so far
    first_token_at: float | None = None
    last_token_at: float | None = None
    abort_requested: bool = False

    def __post_init__(self):
        if not self.seqs:
            self.seqs = [Sequence(self, i, list(self.prompt_ids))
                         for i in range(self.params.n)]

    @property
    def finished(self) -> bool:
        """Every sequence of the request has stopped."""
        return all(s.status is RequestStatus.FINISHED for s in self.seqs)

    @property
    def cached_tokens(self) -> int:
        """Prompt positions the first sequence's first admission took from the prefix
        cache (0 before it is admitted)."""
        return self.seqs[0].num_cached_tokens or 0

    @property
    def max_tokens(self) -> int:
        """Tokens this request may generate per sequence (params.max_tokens, filled in by
        the engine when None)."""
        return self.params.max_tokens


@dataclass(eq=False)
class Sequence:
    """One sequence (choice `index` of its request's `n`): what the scheduler schedules, the
    KV-cache manager gives a block table, and the model runner advances (vLLM v1 fans `n`
    out into child requests the same way). Hashed by identity.

    token_ids: the prompt's ids, then each generated id as it is sampled.
    num_computed_tokens: leading positions of `token_ids` whose K/V are in the cache; the
    sequence is in prefill while fewer than the prompt's, decodes one token a step after.
    num_cached_tokens: of its prompt, the positions its first admission took from the
    prefix cache instead of computing them (None before it is admitted)."""
    request: Request
    index: int
    token_ids: list[int]
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None
    status: RequestStatus = RequestStatus.WAITING

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def max_kv_tokens(self) -> int:
        """Positions whose K/V this sequence may ever write: the prompt and every generated
        token but the last (which is returned, never fed back)."""
        return self.num_prompt_tokens + self.request.max_tokens - 1

    def __repr__(self) -> str:
        return (f"Sequence({self.request.request_id}#{self.index}, {self.num_tokens} tokens, "
                f"{self.num_computed_tokens} computed, {self.status.value})")
