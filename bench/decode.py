"""Prefill and decode speed of a GGUF model on one Vulkan device, with the stream's counters
and host phases, and (optionally) token-exactness against transformers' greedy decode.

    python bench/decode.py [--model PATH] [--prompt-tokens 128] [--tokens 64] [--reference]

Prints one JSON object. Times are wall clock on the host (the first slice waits on the GPU at
every token, so wall = GPU + host). TPOT = decode time / (generated tokens - 1).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from vkrt.models.default_model import find_default_model
from vkrt.models.generate import generate
from vkrt.models.gguf import load_gguf
from vkrt.models.llama import Llama
from vkrt.runtime.device import Device


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--reference", action="store_true",
                    help="also compare greedy tokens with transformers fp32 (CPU)")
    args = ap.parse_args()
    path = args.model or find_default_model()
    gguf = load_gguf(path)
    # A fixed, deterministic prompt of the requested length (ids drawn from the vocabulary).
    prompt = [int(i) for i in np.random.default_rng(0).integers(100, 40000, args.prompt_tokens)]
    out = {"model": path, "prompt_tokens": args.prompt_tokens, "tokens": args.tokens}
    with Device(args.device) as device:
        out["device"] = device.name
        t = time.perf_counter()
        model = Llama.from_gguf(device, gguf)
        out["load_s"] = round(time.perf_counter() - t, 2)
        generate(model, prompt[:8], 4)                            # warm pipelines, sets
        before = model.stream.counters.snapshot()
        model.stream.profiler.phases_ns.clear()
        r = generate(model, prompt, args.tokens)
        c = model.stream.counters.since(before)
        n = len(r.tokens)
        out.update(prefill_tok_s=round(r.prefill_tok_s, 1), decode_tok_s=round(r.decode_tok_s, 1),
                   tpot_ms=round(1e3 * r.decode_s / max(n - 1, 1), 3),
                   dispatches_per_token=c["dispatches"] // n, barriers_per_token=c["barriers"] // n,
                   host_phases_ms={k: round(v / 1e6, 1)
                                   for k, v in model.stream.profiler.phases_ns.items()})
        if args.reference:
            import sys
            sys.path.insert(0, "tests")
            from reference import TransformersReference

            expected = TransformersReference(path).greedy(prompt[:16], 32)
            got = generate(model, prompt[:16], 32).tokens
            out["token_exact_32"] = got == expected
            out["first_divergence"] = next((i for i, (a, b) in enumerate(zip(got, expected))
                                            if a != b), None)
        model.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
