"""vkrt against llama.cpp's Vulkan backend and transformers, side by side in one run on one
machine: the same GGUF, the same prompt and generation lengths, the systems alternating round
by round (their speeds drift between runs and machines, so only ratios taken this way count).

    python bench/side_by_side.py --model M.gguf --llama-bench PATH [--rounds 3]
        [--prompt-tokens 512] [--tokens 128] [--vkrt-args "--inflight 2"] [--no-transformers]
        [--decode-after-prompt]

Per round:
- vkrt: `python -m vkrt bench --json --repeat 1` (its method: vkrt/bench.py); decode and
  prefill tok/s of its first arm.
- llama.cpp: `llama-bench -m M -p P -n N -r 1 -ngl 99 -o json` (pp = prefill of P tokens in
  one batch, tg = N tokens generated; its avg_ts). One unrecorded warm-up run first: a fresh
  build compiles its pipelines on first use. llama-bench generates from an empty context
  unless `--decode-after-prompt`: then `-d 0,P` and its tg at depth P (N tokens after P
  positions of context, as vkrt's decode after its P-token prompt); the prefill stays pp at
  depth 0. Long contexts compare this way (vkrt's decode always follows its prompt).
- transformers (when torch sees CUDA): the model from the GGUF (dequantized, fp32, eager),
  prefill = one forward of the P-token prompt, TPOT = (time of an (8 + N)-token greedy
  generation - time of an 8-token one) / N, CUDA synchronized around each.
Prints one JSON object: every round's numbers, the medians, and the ratios of medians
vkrt / llama.cpp and vkrt / transformers. llama-bench is not part of vkrt: build it with
llama.cpp's own instructions (GGML_VULKAN=ON); bench/README.md says how the README's numbers
were taken.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_vkrt(model: str, p: int, n: int, extra: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "vkrt", "bench", "--model", model,
                          "--prompt-tokens", str(p), "--tokens", str(n), "--repeat", "1",
                          "--json", *extra], capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"vkrt bench failed: {out.stderr.strip()}")
    return bench_figures(json.loads(out.stdout))


def bench_figures(report: dict) -> dict:
    """The figures of one `vkrt bench --json` report (vkrt/bench.py) kept per round: its first
    arm's medians (decode and prefill tok/s, TPOT ms), stages per token, host busy fraction,
    weight bytes per second, GPU ms per token and per prompt and by kernel (None where the
    device has no timestamps), and the device, driver and commit."""
    label, arm = next(iter(report["arms"].items()))
    gpu = report.get("gpu", {})
    return {"arm": label, "decode_tok_s": arm["decode_tok_s"]["median"],
            "prefill_tok_s": arm["prefill_tok_s"]["median"], "tpot_ms": arm["tpot_ms"]["median"],
            "stages_per_token": arm["per_decoded_token"]["stages"],
            "host_busy_fraction": arm["host_busy_fraction"],
            "same_tokens_as_first_arm": arm.get("same_tokens_as_first_arm"),
            "gpu_ms_per_token": gpu.get("gpu_ms_per_token"),
            "gpu_us_per_token_by_kernel": gpu.get("gpu_us_per_token_by_kernel"),
            "prefill_gpu_ms": gpu.get("prefill_gpu_ms"),
            "prefill_gpu_ms_by_kernel": gpu.get("prefill_gpu_ms_by_kernel"),
            "weight_bytes_per_s": arm["weight_bytes_per_s"],
            "device": report["device"], "driver_version": report["driver_version"],
            "commit": report["commit"], "weight_bytes": report["weight_bytes"]}


def run_llama_bench(path: str, model: str, p: int, n: int, depth: int = 0) -> dict:
    """llama-bench's pp of p tokens (from an empty context) and tg of n tokens after `depth`
    positions of context (its -d)."""
    extra = ["-d", f"0,{depth}"] if depth else []
    out = subprocess.run([path, "-m", model, "-p", str(p), "-n", str(n), "-r", "1", "-ngl",
                          "99", "-o", "json", *extra], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"llama-bench failed: {out.stderr.strip()[-2000:]}")
    rows = json.loads(out.stdout)
    pp = next(r for r in rows if r["n_prompt"] == p and r["n_gen"] == 0
              and r.get("n_depth", 0) == 0)
    tg = next(r for r in rows if r["n_gen"] == n and r["n_prompt"] == 0
              and r.get("n_depth", 0) == depth)
    return {"prefill_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"], "tg_depth": depth,
            "build_commit": pp.get("build_commit"), "backend": pp.get("backends")}


def transformers_only(model: str, p: int, n: int) -> dict:
    """Runs in its own process (`--transformers-only`): the model stays off vkrt's device."""
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, ROOT)
    from vkrt.bench import bench_prompt

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(model)),
                                             gguf_file=os.path.basename(model),
                                             dtype=torch.float32).to(dev).eval()
    ids = torch.tensor([bench_prompt(m.config.vocab_size, p)], device=dev)

    def timed(fn) -> float:
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if dev == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def gen(k: int):
        return m.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False,
                          pad_token_id=0)

    with torch.no_grad():
        timed(lambda: m(ids))
        gen(8)                                                        # warm-up
        prefill = min(timed(lambda: m(ids)) for _ in range(3))
        tpot = (timed(lambda: gen(8 + n)) - timed(lambda: gen(8))) / n
    return {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
            "dtype": "float32", "prefill_tok_s": p / prefill, "decode_tok_s": 1 / tpot}


def run_transformers(model: str, p: int, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--transformers-only", "--model", model,
                          "--prompt-tokens", str(p), "--tokens", str(n)],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"transformers failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-bench", default=None, help="path of llama.cpp's llama-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--vkrt-args", default="", help="extra `vkrt bench` options, quoted")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--decode-after-prompt", action="store_true",
                    help="llama.cpp's decode at depth P (llama-bench -d), as vkrt's")
    ap.add_argument("--transformers-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    p, n = args.prompt_tokens, args.tokens
    if args.transformers_only:
        print(json.dumps(transformers_only(args.model, p, n)))
        return
    systems = {"vkrt": lambda: run_vkrt(args.model, p, n, shlex.split(args.vkrt_args))}
    if args.llama_bench:
        depth = p if args.decode_after_prompt else 0
        run_llama_bench(args.llama_bench, args.model, p, n)          # warm-up: pipelines
        systems["llama.cpp"] = lambda: run_llama_bench(args.llama_bench, args.model, p, n, depth)
    if not args.no_transformers:
        systems["transformers"] = lambda: run_transformers(args.model, p, n)
    rounds = {name: [] for name in systems}
    for r in range(args.rounds):
        for name, fn in systems.items():
            rounds[name].append(fn())
            print(f"round {r + 1} {name}: decode {rounds[name][-1]['decode_tok_s']:.1f} tok/s, "
                  f"prefill {rounds[name][-1]['prefill_tok_s']:.1f} tok/s", file=sys.stderr)
    medians = {name: {k: statistics.median(x[k] for x in rs)
                      for k in ("decode_tok_s", "prefill_tok_s")} for name, rs in rounds.items()}
    ratios = {f"vkrt/{other}": {k: round(medians["vkrt"][k] / medians[other][k], 3)
                                for k in ("decode_tok_s", "prefill_tok_s")}
              for other in medians if other != "vkrt"}
    print(json.dumps({"model": args.model, "prompt_tokens": p, "tokens": n,
                      "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "rounds": rounds, "medians": medians, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
