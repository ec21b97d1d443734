"""Prefill and decode speed of a GGUF model on one Vulkan device in each arm (barrier policy x
in-flight submissions), side by side in one process, with the stream's counters and host
phases, and (optionally) token-exactness of every arm against transformers' greedy decode.

    python bench/decode.py [--model PATH] [--prompt-tokens 128] [--tokens 64] [--rounds 2]
                           [--arms tracked,always] [--inflight 1,2] [--reference]

Prints one JSON object. Arms are named `<barriers>` (one --inflight value) or
`<barriers>/inflight<N>`; they alternate round by round on one loaded model (the model gets a
stream of N slots per arm, the tracker's `always` switch set), so ratios are measured side by
side. Times are wall clock on the host. TPOT = decode time / (generated tokens - 1).
Per-token counters are those of the last decode steps (total minus the prompt's forward, over
generated tokens - 1). `host_ms_per_token` splits the host's time per decoded token by phase
(build, record, submit, transfer; `wait` is time blocked on the GPU) and `host_busy_fraction`
is the share of TPOT the host spends not waiting: with inflight 1 host and GPU take turns
(TPOT = host + GPU), with 2 the host's work hides behind the GPU's when it is the smaller.
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
from vkrt.runtime.stream import Stream

PHASES = ("build", "record", "submit", "transfer", "wait")


def run_arm(model: Llama, prompt: list[int], tokens: int) -> dict:
    s = model.stream
    # The prompt's forward alone (a generation of one token), for the decode steps' share.
    s.profiler.phases_ns.clear()
    before = s.counters.snapshot()
    generate(model, prompt, 1)
    prompt_only = s.counters.since(before)
    prompt_ns = dict(s.profiler.phases_ns)
    s.profiler.phases_ns.clear()
    s.counters.max_inflight = 0
    before = s.counters.snapshot()
    r = generate(model, prompt, tokens)
    total = s.counters.since(before)
    n = len(r.tokens) - 1
    per = {k: round((total[k] - prompt_only[k]) / n, 2) for k in
           ("dispatches", "barriers", "stages", "barriers_raw", "barriers_waw", "barriers_war",
            "barriers_transfer", "submits", "waits_blocked", "waits_ready")}
    host = {k: (s.profiler.phases_ns.get(k, 0) - prompt_ns.get(k, 0)) / n / 1e6 for k in PHASES}
    tpot_ms = 1e3 * r.decode_s / max(n, 1)
    busy = sum(v for k, v in host.items() if k != "wait")
    return {"prefill_tok_s": r.prefill_tok_s, "decode_tok_s": r.decode_tok_s,
            "tpot_ms": tpot_ms, "per_decoded_token": per,
            "max_inflight": total["max_inflight"],
            "host_ms_per_token": {k: round(v, 3) for k, v in host.items()},
            "host_busy_fraction": round(busy / tpot_ms, 3) if tpot_ms else None,
            "host_phases_ms": {k: round(v / 1e6, 1) for k, v in s.profiler.phases_ns.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arms", default="tracked,always")
    ap.add_argument("--inflight", default=None,
                    help="comma-separated VKRT_INFLIGHT values to compare, e.g. 1,2 "
                         "(default: VKRT_INFLIGHT)")
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--reference", action="store_true",
                    help="also compare each arm's 32 greedy tokens with transformers fp32 (CPU)")
    args = ap.parse_args()
    from vkrt import config

    inflights = ([int(v) for v in args.inflight.split(",")] if args.inflight
                 else [config.INFLIGHT.value])
    arms = [(b, n) for n in inflights for b in args.arms.split(",")]

    def arm_name(arm) -> str:
        return arm[0] if len(inflights) == 1 else f"{arm[0]}/inflight{arm[1]}"
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
        streams = {n: Stream(device, inflight=n) for n in inflights}
        first = model.stream

        def use(arm) -> None:
            model.stream.synchronize()   # streams do not order work against each other
            model.stream = streams[arm[1]]
            model.stream.tracker.always = arm[0] == "always"

        for n in inflights:
            use(("tracked", n))
            generate(model, prompt[:8], 4)                        # warm pipelines, sets
        runs = {arm: [] for arm in arms}
        for _ in range(args.rounds):
            for arm in arms:
                use(arm)
                runs[arm].append(run_arm(model, prompt, args.tokens))
        for arm, rs in runs.items():
            out[arm_name(arm)] = {
                "decode_tok_s": [round(r["decode_tok_s"], 1) for r in rs],
                "prefill_tok_s": [round(r["prefill_tok_s"], 1) for r in rs],
                "tpot_ms_median": round(statistics.median(r["tpot_ms"] for r in rs), 3),
                "per_decoded_token": rs[-1]["per_decoded_token"],
                "max_inflight": rs[-1]["max_inflight"],
                "host_ms_per_token": rs[-1]["host_ms_per_token"],
                "host_busy_fraction": rs[-1]["host_busy_fraction"],
                "host_phases_ms_last": rs[-1]["host_phases_ms"]}
        if len(arms) == 2:
            a, b = (statistics.median(r["decode_tok_s"] for r in runs[arm]) for arm in arms)
            out[f"decode_ratio_{arm_name(arms[0])}_over_{arm_name(arms[1])}"] = round(a / b, 3)
        if args.reference:
            import sys
            sys.path.insert(0, "tests")
            from reference import TransformersReference

            expected = TransformersReference(path).greedy(prompt[:16], 32)
            for arm in arms:
                use(arm)
                got = generate(model, prompt[:16], 32).tokens
                out[arm_name(arm)]["token_exact_32"] = got == expected
                out[arm_name(arm)]["first_divergence"] = next(
                    (i for i, (x, y) in enumerate(zip(got, expected)) if x != y), None)
        model.stream.synchronize()
        model.stream = first
        model.close()
        for s in streams.values():
            s.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
