"""`vkrt bench`: prefill and decode speed of one model on one device, with the counters and
host phases that explain it.

Method (the same for every arm, arms alternating repeat by repeat on one loaded model so that
ratios are side by side):
- The prompt is `prompt_tokens` ids drawn from the vocabulary by numpy's PCG64 seeded with 0
  (ids 100 .. min(n_vocab, 40000)), prefilled in chunks of `batch_size` tokens.
- Warm-up: one generation per arm of the timed shape (pipelines built, activations, KV
  cache and descriptor sets allocated and written, decode steps captured), as llama-bench's
  warm-up run; a user's first generation of a new shape pays those once.
- Each repeat: one greedy generation of `tokens` tokens (no stop token). Prefill tok/s =
  prompt tokens / time to the first token; decode tok/s = (tokens - 1) / time from the first
  token to the last; TPOT = its inverse. Reported as median, min and max over repeats.
- Per decoded token (last repeat): dispatches, barriers, dependent stages and submits: what
  the stream counted from the first token to the last, over the decode steps submitted in
  that window (tokens - N with N slots in flight: steps 2 .. N went out before the first
  token); host ms by phase (build, record, submit, transfer; `wait` is blocked on the GPU):
  the window's host time over its tokens - 1 decoded tokens, as TPOT.
- GPU time per decoded token, by kernel (timestamp queries around every dispatch, on the
  device's timestamp clock; each span includes any barrier stall before it): one extra
  generation with timestamps on, outside the timed repeats, the same window. Timestamps time
  recorded commands, so that generation records its decode steps (no replay), and a timestamp
  after every dispatch serializes them: an upper bound on the replayed step's GPU time. Then
  the prompt's forward alone, by kernel (one more generation of one token with timestamps:
  the prefill and the first token's argmax), in ms for the whole prompt. Absent where the
  queue has no timestamps.
- Per-token `dispatches`, `barriers` and `stages` count what the GPU ran: recorded, plus what
  each replayed recording holds (VKRT_REPLAY, the default: a replayed step runs its stages
  all the same). `recorded_dispatches` is what the host recorded (0 once the step is
  captured) and `replays` the recordings submitted (1 per token).
- Weight bytes on the device (the buffers holding the model's weights), the weight bytes one
  decode step reads (every matrix once, one row of an input embedding that is not the
  output: `Decoder.decode_weight_bytes`) and, per arm, those times the median decode tok/s
  (`weight_bytes_per_s`), and the process's peak RSS (getrusage ru_maxrss).
Times are wall clock on the host (perf_counter).
"""
from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from vkrt import config
from vkrt.models.generate import GenerationResult, generate, stream_tokens

PHASES = ("build", "record", "submit", "transfer", "wait")
PER_TOKEN = ("barriers_raw", "barriers_waw", "barriers_war", "barriers_transfer", "submits",
             "replays", "captures", "waits_blocked", "waits_ready")
RUN = ("dispatches", "barriers", "stages")   # recorded + replayed (Counters.replayed_*)


def bench_prompt(n_vocab: int, n: int, seed: int = 0) -> list[int]:
    """The benchmark's prompt: n ids from numpy's PCG64 seeded with `seed` (0 for `vkrt
    bench`; bench/batched.py gives sequence i seed i), in [100, min(n_vocab, 40000))."""
    return [int(i) for i in
            np.random.default_rng(seed).integers(100, min(n_vocab, 40000), n)]


def _stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def peak_rss_bytes() -> int:
    """The process's peak resident set size (Linux getrusage reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def git_commit() -> str | None:
    """The commit of the source tree vkrt runs from, with `-dirty` when it has changes; None
    outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty",
                              "--abbrev=12"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _kernel(name: str) -> str:
    """`blk.3.ffn_down` -> `ffn_down`: GPU time grouped by what the dispatch does."""
    return re.sub(r"^blk\.\d+\.|^(model\.)?decoder\.layers\.\d+\.", "", name)


class _Arm:
    """One configuration: a barrier policy and an in-flight depth, each with its own stream."""

    def __init__(self, barriers: str, inflight: int, stream, label: str):
        self.barriers, self.inflight, self.stream, self.label = barriers, inflight, stream, label
        self.runs: list[dict] = []


def _use(lm, arm: _Arm) -> None:
    lm.stream.synchronize()      # streams do not order work against each other
    lm.stream = arm.stream
    arm.stream.tracker.always = arm.barriers == "always"


def _decode_window(lm, prompt: list[int], tokens: int, batch_size: int):
    """Generate `tokens` tokens; yields once the first token (the prefill) is out, so the caller
    can snapshot its counters, then returns the GenerationResult when the rest is done. The
    window from the first token to the last is the tokens - 1 decode steps (with N slots
    in flight, the steps already submitted at the first token belong to it too)."""
    result = GenerationResult(len(prompt))
    it = stream_tokens(lm, prompt, tokens, batch_size=batch_size, result=result)
    next(it)
    yield
    for _ in it:
        pass
    lm.stream.synchronize()
    return result


def _repeat(lm, prompt: list[int], tokens: int, batch_size: int) -> dict:
    s = lm.stream
    window = _decode_window(lm, prompt, tokens, batch_size)
    next(window)
    before, phases = s.counters.snapshot(), dict(s.profiler.phases_ns)
    s.counters.max_inflight = 0
    r = _finish(window)
    total = s.counters.since(before)
    # Steps recorded in the window: with N slots, steps 2 .. N were submitted before the first
    # token was read, so the window holds tokens - N submissions (one per decode step).
    steps = max(total["submits"], 1)
    # Host time per decoded token, as TPOT: the window's host phases over its tokens - 1
    # tokens (a wait per token read; only tokens - N steps were submitted in the window).
    decoded = max(len(r.tokens) - 1, 1)
    host = {k: (s.profiler.phases_ns.get(k, 0) - phases.get(k, 0)) / decoded / 1e6
            for k in PHASES}
    tpot_ms = 1e3 * r.decode_s / decoded
    return {"prefill_tok_s": r.prefill_tok_s, "decode_tok_s": r.decode_tok_s,
            "tpot_ms": tpot_ms, "tokens": r.tokens, "max_inflight": total["max_inflight"],
            "steps": total["submits"],
            "per_token": {**{k: round((total[k] + total["replayed_" + k]) / steps, 2)
                             for k in RUN},
                          "recorded_dispatches": round(total["dispatches"] / steps, 2),
                          **{k: round(total[k] / steps, 2) for k in PER_TOKEN}},
            "host_ms": {k: round(v, 3) for k, v in host.items()},
            "host_busy_fraction": round(sum(v for k, v in host.items() if k != "wait")
                                        / tpot_ms, 3) if tpot_ms else None}


def _finish(window):
    try:
        next(window)
    except StopIteration as done:
        return done.value
    raise AssertionError("the decode window yields once")


def _gpu_per_token(lm, prompt: list[int], tokens: int, batch_size: int) -> dict | None:
    """GPU µs per decoded token by kernel, from timestamps (None without them)."""
    s = lm.stream
    timing = s.timing
    if not s.enable_timestamps():
        return None
    try:
        s.profiler.gpu_ns.clear()
        window = _decode_window(lm, prompt, tokens, batch_size)
        next(window)
        before = dict(s.profiler.gpu_ns)  # batches collected by the first token
        count = s.profiler.gpu_count.get("argmax", 0)
        stages = s.counters.stages
        _finish(window)
        stages = s.counters.stages - stages
    finally:
        s.timing = timing
    # Steps timed in the window: each step has one argmax dispatch.
    n = max(s.profiler.gpu_count.get("argmax", 0) - count, 1)
    by_kernel = _by_kernel(s.profiler.gpu_ns, before, n * 1e3)
    total_us = sum(by_kernel.values())
    return {"gpu_ms_per_token": round(total_us / 1e3, 4),
            "gpu_us_per_stage": round(total_us / (stages / n), 2) if stages else None,
            # not the prompt's kernels alone
            "gpu_us_per_token_by_kernel": {k: round(v, 2) for k, v in by_kernel.items()}}


def _by_kernel(gpu_ns: dict[str, float], before: dict[str, float], per: float
               ) -> dict[str, float]:
    """GPU time since `before` grouped by kernel (`_kernel`), each ns sum divided by `per`,
    largest first, the kernels that took none left out."""
    out: dict[str, float] = {}
    for name, ns in gpu_ns.items():
        k = _kernel(name)
        out[k] = out.get(k, 0.0) + (ns - before.get(name, 0.0)) / per
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def _gpu_prefill(lm, prompt: list[int], batch_size: int) -> dict | None:
    """GPU ms of the prompt's forward (and its first token's argmax), by kernel, from
    timestamps (None without them)."""
    s = lm.stream
    timing = s.timing
    if not s.enable_timestamps():
        return None
    try:
        s.synchronize()
        s.profiler.gpu_ns.clear()
        generate(lm, prompt, 1, batch_size=batch_size)
        s.synchronize()
    finally:
        s.timing = timing
    by_kernel = _by_kernel(s.profiler.gpu_ns, {}, 1e6)
    return {"prefill_gpu_ms": round(sum(by_kernel.values()), 3),
            "prefill_gpu_ms_by_kernel": {k: round(v, 3) for k, v in by_kernel.items()}}


def run(model, prompt_tokens: int, tokens: int, repeat: int, batch_size: int,
        barriers: list[str], inflights: list[int]) -> dict:
    """Benchmark a loaded `vkrt.models.model.Model` in every arm (barrier policy x in-flight
    depth). Returns the report as a JSON-ready dict (see the module docstring)."""
    from vkrt.runtime.stream import Stream

    lm, device = model.lm, model.device
    if tokens < 2 or prompt_tokens < 1 or repeat < 1:
        raise ValueError("need --tokens >= 2, --prompt-tokens >= 1 and --repeat >= 1")
    prompt = bench_prompt(model.hparams.n_vocab, prompt_tokens)
    home = lm.stream
    # A stream per arm: a replayed step is captured per stream and barrier policy once.
    arms = [_Arm(b, n, Stream(device, inflight=n), b if len(inflights) == 1
                 else f"{b}/inflight{n}") for n in inflights for b in barriers]
    streams = {id(arm): arm.stream for arm in arms}
    if len(barriers) == 1 and len(inflights) == 1:
        arms[0].label = f"{barriers[0]}/inflight{inflights[0]}"
    try:
        for arm in arms:
            _use(lm, arm)
            generate(lm, prompt, tokens, batch_size=batch_size)        # warm-up
        for _ in range(repeat):
            for arm in arms:
                _use(lm, arm)
                arm.runs.append(_repeat(lm, prompt, tokens, batch_size))
        _use(lm, arms[0])
        gpu = _gpu_per_token(lm, prompt, tokens, batch_size)
        if gpu is not None:
            gpu.update(_gpu_prefill(lm, prompt, batch_size) or {})
    finally:
        lm.stream.synchronize()
        lm.stream = home
        for s in streams.values():
            s.close()
    report = {"model": model.path, "family": model.family, "device": device.name,
              "prompt_tokens": prompt_tokens, "tokens": tokens, "repeat": repeat,
              "batch_size": batch_size, "replay": bool(config.REPLAY.value
                                                         and getattr(lm, "replayable", False)),
              # The kernel of the prefill products (VKRT_COOPMAT; Kernels.prefill_kernel).
              "prefill_kernel": lm.k.prefill_kernel(max(2, min(batch_size, prompt_tokens))),
              "weight_bytes": lm.weight_bytes(),
              "weight_bytes_per_token": lm.decode_weight_bytes(),
              "peak_rss_bytes": peak_rss_bytes(), "arms": {}}
    for arm in arms:
        last = arm.runs[-1]
        report["arms"][arm.label] = {
            "prefill_tok_s": _stats([r["prefill_tok_s"] for r in arm.runs]),
            "decode_tok_s": _stats([r["decode_tok_s"] for r in arm.runs]),
            # Weight bytes a decode step reads times decode tok/s (median): the bandwidth
            # the weights stream at.
            "weight_bytes_per_s": round(lm.decode_weight_bytes() * _stats(
                [r["decode_tok_s"] for r in arm.runs])["median"]),
            "tpot_ms": _stats([r["tpot_ms"] for r in arm.runs]),
            "per_decoded_token": last["per_token"], "max_inflight": last["max_inflight"],
            "steps_counted": last["steps"],
            "host_ms_per_token": last["host_ms"], "host_busy_fraction": last["host_busy_fraction"],
            "same_tokens_as_first_arm": all(r["tokens"] == arms[0].runs[0]["tokens"]
                                            for r in arm.runs)}
    if gpu is not None:
        gpu["measured_in_arm"] = arms[0].label + " (recorded steps)"
        report["gpu"] = gpu
    return report


def describe(report: dict) -> str:
    """The report as a few lines of text for a terminal."""
    lines = [f"{report['model']} ({report['family']}) on {report['device']}: prompt "
             f"{report['prompt_tokens']} tokens, {report['tokens']} generated, "
             f"{report['repeat']} repeat{'' if report['repeat'] == 1 else 's'} "
             "(median [min, max])"
             + (f", prefill products on {report['prefill_kernel']}"
                if "prefill_kernel" in report else "")]
    for label, a in report["arms"].items():
        p, d, t = a["prefill_tok_s"], a["decode_tok_s"], a["tpot_ms"]
        per, host = a["per_decoded_token"], a["host_ms_per_token"]
        lines.append(
            f"  {label:<18} prefill {p['median']:>9.1f} tok/s [{p['min']:.1f}, {p['max']:.1f}]"
            f"  decode {d['median']:>8.1f} tok/s [{d['min']:.1f}, {d['max']:.1f}]"
            f"  TPOT {t['median']:.3f} ms  weights {a['weight_bytes_per_s'] / 1e9:.1f} GB/s")
        lines.append(f"  {'':<18} per token: {per['dispatches']:g} dispatches "
                     f"({per['recorded_dispatches']:g} recorded), {per['stages']:g} stages, "
                     f"{per['barriers']:g} barriers, {per['replays']:g} replays; host ms "
                     + ", ".join(f"{k} {v:.3f}" for k, v in host.items())
                     + ("" if a["same_tokens_as_first_arm"] else "  TOKENS DIFFER"))
    if "gpu" in report:
        g = report["gpu"]
        top = ", ".join(f"{k} {v:.1f}" for k, v in
                        list(g["gpu_us_per_token_by_kernel"].items())[:6])
        lines.append(f"  GPU {g['gpu_ms_per_token']:.3f} ms per token "
                     f"({g['gpu_us_per_stage']} µs per stage); µs by kernel: {top}")
        if "prefill_gpu_ms" in g:
            top = ", ".join(f"{k} {v:.2f}" for k, v in
                            list(g["prefill_gpu_ms_by_kernel"].items())[:6])
            lines.append(f"  GPU {g['prefill_gpu_ms']:.2f} ms for the prompt's forward; "
                         f"ms by kernel: {top}")
    lines.append(f"  weights on device {report['weight_bytes'] / 2**20:.1f} MiB, "
                 f"peak RSS {report['peak_rss_bytes'] / 2**20:.1f} MiB")
    return "\n".join(lines)


def environment(device) -> dict:
    """What `--json` adds: device, driver and API version, commit, Python and time."""
    info = device.info
    return {"device": info.name, "device_kind": info.kind, "vulkan_api": info.api_version,
            "driver": device.driver_name, "driver_version": device.driver_info, "commit": git_commit(),
            "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def dumps(report: dict) -> str:
    return json.dumps(report, indent=1)
