"""The token loop: prefill the prompt, then decode one token at a time over the KV cache.

Greedy decoding never brings logits to the host: the GPU's argmax writes the next token id
into a buffer that the next step's embedding lookup reads directly, and the host reads those 4
bytes once per token (the one read that drains the queue) to stream text and stop at EOS.
Sampling (temperature > 0) reads the last logits row and draws on the host.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from vkrt.errors import VkrtError
from vkrt.models.llama import Llama

KV_CACHE_STEP = 256  # positions


@dataclass(frozen=True)
class Sampling:
    """temperature 0 means greedy (argmax on the GPU); otherwise softmax(logits / temperature)
    restricted to the smallest set of tokens whose probability reaches `top_p` (nucleus
    sampling, Holtzman et al. 2020), drawn with numpy's PCG64 seeded by `seed`."""
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class GenerationResult:
    """Token ids and timings of one `generate` call (seconds, wall clock)."""
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stopped_at_eos: bool = False

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first over the time spent producing them (the first comes from
        the prefill)."""
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s else 0.0


def _sample(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    z = logits.astype(np.float64) / s.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = int(np.searchsorted(np.cumsum(p[order]), s.top_p) + 1)
    top = order[:keep]
    return int(rng.choice(top, p=p[top] / p[top].sum()))


def check_context(n_ctx: int, n_prompt: int, max_tokens: int) -> None:
    """Raise VkrtError unless 1 <= n_prompt and n_prompt + max_tokens <= n_ctx (the model's
    context length from its metadata)."""
    if n_prompt == 0:
        raise VkrtError("the prompt is empty: nothing to condition on")
    if n_prompt + max_tokens > n_ctx:
        raise VkrtError(f"prompt of {n_prompt} tokens + --max-tokens {max_tokens} = "
                        f"{n_prompt + max_tokens} exceeds the model's context of {n_ctx} tokens")


def generate(model: Llama, prompt_ids: list[int], max_tokens: int,
             sampling: Sampling = Sampling(), eos_id: int | None = None,
             on_token: Callable[[int], None] | None = None) -> GenerationResult:
    """Generate up to `max_tokens` tokens after `prompt_ids`, stopping after `eos_id`.

    `on_token(id)` is called as each token is produced (for streaming).
    Raises: VkrtError when the prompt is empty or prompt + max_tokens exceeds the model's
    context (`n_ctx` from the GGUF).
    """
    hp, s = model.hp, model.stream
    n_prompt = len(prompt_ids)
    check_context(hp.n_ctx, n_prompt, max_tokens)
    if model.max_seq < n_prompt + max_tokens:
        # Grown in steps of KV_CACHE_STEP positions so that a run of short generations keeps
        # its buffers (and the descriptor sets that name them).
        steps = -(-(n_prompt + max_tokens) // KV_CACHE_STEP)
        model.setup_caches(min(hp.n_ctx, steps * KV_CACHE_STEP))
    rng = np.random.Generator(np.random.PCG64(sampling.seed))
    greedy = sampling.temperature <= 0.0
    result = GenerationResult(n_prompt)
    t0 = time.perf_counter()
    a = model.activations(n_prompt)
    s.write(a.ids, np.asarray(prompt_ids, np.uint32))
    ids_buffer, n_tokens, pos = a.ids, n_prompt, 0
    for step in range(max_tokens):
        model.forward(ids_buffer, n_tokens, pos)
        if greedy:
            token = int(s.read(a.token)[0])
            ids_buffer = a.token        # the next embedding reads the argmax in place
        else:
            token = _sample(s.read(a.logits.rows(0, 1))[0], sampling, rng)
            s.write(a.ids, np.array([token], np.uint32))
            ids_buffer = a.ids
        if step == 0:
            t1 = time.perf_counter()
            result.prefill_s = t1 - t0
        pos += n_tokens
        n_tokens = 1
        result.tokens.append(token)
        if on_token is not None:
            on_token(token)
        if eos_id is not None and token == eos_id:
            result.stopped_at_eos = True
            break
    result.decode_s = time.perf_counter() - t1 if result.tokens else 0.0
    return result
