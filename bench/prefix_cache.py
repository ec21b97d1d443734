"""Time to first token of a multi-turn conversation with and without prefix caching, side by
side on one loaded model, and whether the replies are the same.

    python bench/prefix_cache.py [--model M] [--turns 4] [--tokens 16] [--rounds 2]
        [--max-batch 1] [--device N]

A conversation as `vkrt chat` holds it: a system message, then `--turns` user messages, each
turn's prompt the whole history through the model's chat template (so turn t's prompt starts
with turn t - 1's), `--tokens` greedy tokens per reply. It runs in an `Engine` (vkrt/serve/
engine.py; `--max-batch` sequences per step, 1 as `vkrt chat`) with `prefix_caching=True`
and in one with `prefix_caching=False`, alternating, `--rounds` times each; every engine starts
with an empty cache. Per turn: the prompt's tokens, those the cache held
(`RequestOutput.cached_tokens`) and TTFT (`RequestOutput.ttft_s`: arrival to first token,
which is the prompt's prefill) as the median over rounds; `ttft_cached_over_uncached` per turn;
`identical`: every reply the same token ids in every run (prefix caching computes the same
bits, vkrt/serve/kv_cache.py). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SYSTEM = ("You are a careful assistant. Answer in one or two sentences, plainly, without "
          "lists, and say so when you do not know.")
QUESTIONS = ["What is a KV cache?", "Why does it grow with the context?",
             "How does paging it into blocks help a server?",
             "And what does caching a prompt's prefix save?",
             "Which requests share prefixes in practice?",
             "What is the catch?"]


def conversation(model, prefix_caching: bool, turns: int, tokens: int,
                 max_batch: int) -> list[dict]:
    """One conversation in a fresh engine: per turn {"prompt_tokens", "cached_tokens",
    "ttft_ms", "reply": token ids}. Raises SystemExit when a request fails."""
    from vkrt.serve.engine import Engine
    from vkrt.serve.request import SamplingParams

    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    with Engine(model, max_queue=1, max_batch=max_batch,
                prefix_caching=prefix_caching) as engine:
        for t in range(turns):
            messages.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            ids = engine.encode_chat(messages)
            outs = list(engine.generate(ids, SamplingParams(max_tokens=tokens)))
            last = outs[-1]
            if last.error:
                raise SystemExit(f"turn {t}: {last.error}")
            reply = [i for o in outs for i in o.token_ids]
            messages.append({"role": "assistant",
                             "content": "".join(o.delta for o in outs)})
            out.append({"prompt_tokens": len(ids), "cached_tokens": last.cached_tokens,
                        "ttft_ms": last.ttft_s * 1e3, "reply": reply})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=1)
    args = ap.parse_args()

    import vkrt
    from vkrt.models.default_model import find_default_model

    path = args.model or find_default_model()
    runs = {True: [], False: []}
    with vkrt.load(path, device=args.device) as model:
        conversation(model, True, 1, 2, args.max_batch)      # warm: pipelines, buckets
        for _ in range(args.rounds):
            for cached in (True, False):
                runs[cached].append(conversation(model, cached, args.turns, args.tokens,
                                                 args.max_batch))
    replies = {tuple(tuple(t["reply"]) for t in run) for mode in runs.values() for run in mode}
    rows = []
    for t in range(args.turns):
        on = statistics.median(run[t]["ttft_ms"] for run in runs[True])
        off = statistics.median(run[t]["ttft_ms"] for run in runs[False])
        rows.append({"turn": t + 1, "prompt_tokens": runs[True][0][t]["prompt_tokens"],
                     "cached_tokens": runs[True][0][t]["cached_tokens"],
                     "ttft_ms_cached": round(on, 1), "ttft_ms_uncached": round(off, 1),
                     "ttft_cached_over_uncached": round(on / off, 3)})
    print(json.dumps({"model": path, "max_batch": args.max_batch, "tokens": args.tokens,
                      "rounds": args.rounds, "identical": len(replies) == 1, "turns": rows},
                     indent=1))
    return 0 if len(replies) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
