"""Prefill attention kernels side by side in one process: `attention.comp` (one workgroup per
head and token) against `attention_tile.comp` on the tiles the table names and any `--tiles`,
for one layer of a model's attention shape.

    python bench/attention_prefill.py [--tokens 4096] [--heads 32] [--kv-heads 8]
        [--head-dim 128] [--tiles 32x4x32,16x4x32] [--kv f32|f16] [--repeat 5] [--rounds 2]
        [--json]

q [tokens, heads, head_dim] and the caches [tokens, kv heads, head_dim] hold standard
normals; the prompt starts at position 0, so token t attends to positions 0 ..= t (T (T + 1)
/ 2 scores per head). A tile is QTxLQxKT (queries per workgroup, lanes per query at most,
positions per staged tile at most; `kernels.attention_tile_shape` fits the last two to the
device). Per arm, `--repeat` dispatches are recorded back to back in one submission and
timed by timestamp queries; the median gives TFLOP/s = 4 T (T + 1) / 2 head_dim heads / time
(two products of head_dim multiply-adds per score). The report gives each arm's largest
|difference| from the one-pass arm. Absolute figures only from a real GPU; compare within
one run.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from vkrt import tuning
    from vkrt.kernels import Kernels
    from vkrt.runtime.device import Device
    from vkrt.runtime.pipeline import PipelineCache
    from vkrt.runtime.stream import Stream

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tiles", default="", help="QTxLQxKT tiles beside the table's")
    ap.add_argument("--kv", choices=("f32", "f16"), default="f32")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    T, H, KV, D = args.tokens, args.heads, args.kv_heads, args.head_dim
    rng = np.random.default_rng(0)
    kv_dtype = np.float16 if args.kv == "f16" else np.float32
    with Device() as dev:
        stream = Stream(dev, timestamps=True)
        if not stream.timing:
            print("attention_prefill bench: this device has no timestamps", file=sys.stderr)
            return 1
        cache = PipelineCache(dev)
        table = tuning.for_kind(dev.info.kind)
        tiles = [tuple(int(v) for v in s.split("x")) for s in args.tiles.split(",") if s]
        arms_tables = {"one-pass": dataclasses.replace(table, prefill_attention=None)}
        if table.prefill_attention is not None:
            arms_tables["table " + "x".join(map(str, table.prefill_attention))] = table
        for tile in tiles:
            arms_tables["x".join(map(str, tile))] = dataclasses.replace(
                table, prefill_attention=tile)
        q = stream.upload(rng.standard_normal((T, H, D), np.float32), "q")
        k = stream.upload(rng.standard_normal((T, KV, D), np.float32).astype(kv_dtype), "k")
        v = stream.upload(rng.standard_normal((T, KV, D), np.float32).astype(kv_dtype), "v")
        part = stream.upload(np.zeros(16, np.float32), "part")
        scale = float(np.float32(1 / np.sqrt(D)))
        arms = {}
        for name, t in arms_tables.items():
            kern = Kernels(cache, head_dim=D, tuning=t)
            out = stream.upload(np.zeros((T, H, D), np.float32), "out_" + name)
            d = kern.attention(q, k, v, out, T, H, KV, D, 0, scale, part, name=name)
            arms[name] = (d, out, kern.attention_tile)
        times = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, (d, _, _) in arms.items():
                stream.profiler.gpu_ns.clear()
                stream.profiler.gpu_count.clear()
                stream.record(d * args.repeat)
                stream.synchronize()
                times[name].append(stream.profiler.gpu_ns[name] / stream.profiler.gpu_count[name])
        ref = stream.read(arms["one-pass"][1])
        flop = 4.0 * T * (T + 1) / 2 * D * H
        report = {"device": dev.name, "driver": f"{dev.driver_name} {dev.driver_info}",
                  "tokens": T, "heads": H, "kv_heads": KV, "head_dim": D, "kv": args.kv,
                  "repeat": args.repeat, "rounds": args.rounds, "arms": {}}
        for name, (_, out, shape) in arms.items():
            ms = statistics.median(times[name]) / 1e6
            diff = float(np.abs(stream.read(out) - ref).max())
            report["arms"][name] = {"ms": round(ms, 3), "tflops": round(flop / ms / 1e9, 2),
                                    "tile": shape, "max_abs_diff": float(f"{diff:.2e}")}
            print(f"T={T} H={H}/{KV} D={D} kv {args.kv} {name:14}: {ms:9.3f} ms "
                  f"{flop / ms / 1e9:7.2f} TFLOP/s (tile {shape}, d {diff:.1e})", flush=True)
        stream.close()
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
