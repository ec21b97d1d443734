"""Prefill and decode speed of a GGUF model on one Vulkan device in each barrier arm, side by
side in one process, with the stream's counters and host phases, and (optionally)
token-exactness of both arms against transformers' greedy decode.

    python bench/decode.py [--model PATH] [--prompt-tokens 128] [--tokens 64] [--rounds 2]
                           [--arms tracked,always] [--reference]

Prints one JSON object. The arms alternate round by round on one loaded model (the tracker's
`always` switch is the only difference), so their ratio is measured side by side. Times are
wall clock on the host (the host waits on the GPU at every token, so wall = GPU + host).
TPOT = decode time / (generated tokens - 1). Per-token counters are those of the last decode
steps (total minus the prompt's forward, over generated tokens - 1).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from vkrt.models.default_model import find_default_model
from vkrt.models.generate import generate
from vkrt.models.gguf import load_gguf
from vkrt.models.llama import Llama
from vkrt.runtime.device import Device


def run_arm(model: Llama, prompt: list[int], tokens: int) -> dict:
    s = model.stream
    before = s.counters.snapshot()
    s.profiler.phases_ns.clear()
    r = generate(model, prompt, tokens)
    total = s.counters.since(before)
    # The decode steps alone: the same generation with one token is the prompt's forward.
    before = s.counters.snapshot()
    generate(model, prompt, 1)
    prompt_only = s.counters.since(before)
    n = len(r.tokens) - 1
    per = {k: round((total[k] - prompt_only[k]) / n, 2) for k in
           ("dispatches", "barriers", "stages", "barriers_raw", "barriers_waw", "barriers_war",
            "barriers_transfer")}
    return {"prefill_tok_s": r.prefill_tok_s, "decode_tok_s": r.decode_tok_s,
            "tpot_ms": 1e3 * r.decode_s / max(n, 1), "per_decoded_token": per,
            "host_phases_ms": {k: round(v / 1e6, 1) for k, v in s.profiler.phases_ns.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arms", default="tracked,always")
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--reference", action="store_true",
                    help="also compare each arm's 32 greedy tokens with transformers fp32 (CPU)")
    args = ap.parse_args()
    arms = args.arms.split(",")
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
        runs = {arm: [] for arm in arms}
        for _ in range(args.rounds):
            for arm in arms:
                model.stream.tracker.always = arm == "always"
                runs[arm].append(run_arm(model, prompt, args.tokens))
        for arm, rs in runs.items():
            out[arm] = {
                "decode_tok_s": [round(r["decode_tok_s"], 1) for r in rs],
                "prefill_tok_s": [round(r["prefill_tok_s"], 1) for r in rs],
                "tpot_ms_median": round(statistics.median(r["tpot_ms"] for r in rs), 3),
                "per_decoded_token": rs[-1]["per_decoded_token"],
                "host_phases_ms_last": rs[-1]["host_phases_ms"]}
        if len(arms) == 2:
            a, b = (statistics.median(r["decode_tok_s"] for r in runs[arm]) for arm in arms)
            out[f"decode_ratio_{arms[0]}_over_{arms[1]}"] = round(a / b, 3)
        if args.reference:
            import sys
            sys.path.insert(0, "tests")
            from reference import TransformersReference

            expected = TransformersReference(path).greedy(prompt[:16], 32)
            for arm in arms:
                model.stream.tracker.always = arm == "always"
                got = generate(model, prompt[:16], 32).tokens
                out[arm]["token_exact_32"] = got == expected
                out[arm]["first_divergence"] = next(
                    (i for i, (x, y) in enumerate(zip(got, expected)) if x != y), None)
        model.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
