"""Bytes per second each weight type's decode product reads: `matvec` over one matrix of
every type in `vkrt.weight_types.TYPES`, side by side in one process.

    python bench/matvec_types.py [--rows 4096] [--cols 14336] [--repeat 50] [--json]
        [--shapes 4096x14336,1536x576] [--configs 4x1,1x4] [--out FILE.json]

Each type's matrix ([rows, cols], the shape of a 7B model's ffn_down by default) holds random
bytes: the values do not change what the kernel reads, only the product (a NaN in it costs the
same). Per type, `--repeat` products are recorded back to back in one submission, each
writing the same output (so every one waits for the one before: the tracker's WAW barrier)
and each timed by timestamp queries (`VKRT_TIMESTAMPS`' mechanism, vkrt/runtime/stream.py);
the report gives the median product's GPU time, the matrix's bytes over it (GB/s) and the
ratio to Q4_1's. The types alternate round by round (`--rounds`), so drift affects them
alike. `--configs SxR,...` times every type under each decode launch (S subgroups per
workgroup, R rows per workgroup, `s` after R: x staged through shared memory, `qN` after
R: N invocations per unit of 32 weights, `i` last: x as 16-bit integers per unit, the `_xq`
variants;
vkrt/tuning.py's `Decode`, for every row count) instead
of the device's table, and reports each config's figures and the best per type; `--glu` times
matvec_glu (gate and up), `--qkv` qkv_rope (Q of the shape, K and V a quarter of it); `--shapes
RxC,...` repeats the whole run per matrix shape; `--pipeline-stats` adds what the driver
compiled for each product's pipelines (`vkrt.runtime.pipeline.Pipeline.statistics`: NVIDIA's
register count and others; not on lavapipe); `--spirv-dir DIR` loads the modules from DIR (a
build of another kernel text: bench/coop_ablation.py's `modules_dir`). A copy of a buffer of the largest matrix's size (vkCmdCopyBuffer: reads and writes
it) is timed beside them. Absolute figures only from a real GPU; compare within one run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from vkrt.errors import VkrtError
    from vkrt.kernels import Kernels
    from vkrt.runtime.device import Device
    from vkrt.runtime.dispatch import Copy
    from vkrt.runtime.memory import Buffer
    from vkrt.runtime.pipeline import PipelineCache
    from vkrt.runtime.stream import Stream
    from vkrt.runtime.tensor import Tensor
    from vkrt.weight_types import TYPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=14336)
    ap.add_argument("--shapes", default="", help="RxC,... (default: --rows x --cols)")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--types", default="", help="comma-separated dtypes (default: all)")
    ap.add_argument("--configs", default="", help="SxR,...: decode launches to time "
                    "(default: the device's table)")
    ap.add_argument("--glu", action="store_true", help="time matvec_glu (RMSNorm, gate and "
                    "up: two matrices of the shape) instead of matvec")
    ap.add_argument("--qkv", action="store_true", help="time qkv_rope (RMSNorm, Q, K, V, RoPE "
                    "and the cache rows: Q of the shape, K and V of a quarter of its rows, "
                    "heads of 128) instead of matvec; R of a config is pairs of rows")
    ap.add_argument("--pipeline-stats", action="store_true", help="also report what the "
                    "driver compiled for each product's pipelines (VK_KHR_pipeline_"
                    "executable_properties statistics, e.g. NVIDIA's register count); a "
                    "device without them stops the run with its error")
    ap.add_argument("--spirv-dir", default="", help="the modules to load (default: vkrt/spirv; "
                    "a build of bench/coop_ablation.py's modules_dir shape)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default="", help="also write the JSON report here")
    args = ap.parse_args(argv)
    chosen = [t for t in TYPES if not args.types or t.dtype in args.types.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] \
        or [(args.rows, args.cols)]
    configs = [c for c in args.configs.split(",") if c]
    rng = np.random.default_rng(0)
    reports = []
    try:
        dev = Device(pipeline_statistics=args.pipeline_stats)
    except VkrtError as e:     # one line: the device lacks what --pipeline-stats needs
        print(f"matvec_types: {e}", file=sys.stderr)
        return 1
    with dev:
        stream = Stream(dev, timestamps=True)
        if not stream.timing:
            print("matvec_types: this device has no timestamps", file=sys.stderr)
            return 1
        cache = PipelineCache(dev, args.spirv_dir) if args.spirv_dir else PipelineCache(dev)
        kernels = {"table": Kernels(cache)}
        if configs:
            table = kernels["table"].tuning
            kernels = {}
            for c in configs:     # SxR, SxRs: x staged through shared memory; SxRqN: N per
                # unit; a trailing i: x as integers (the `_xq` variants)
                base = c.removesuffix("i")
                s, r = base.rstrip("s").split("q")[0].split("x")
                kernels[c] = Kernels(cache, tuning=table.with_decode(
                    int(s), int(r), "matvec_glu" if args.glu else "qkv_rope" if args.qkv
                    else "matvec", stage_x=base.endswith("s"),
                    split=int(base.split("q")[1]) if "q" in base else 1,
                    integer_x=c.endswith("i")))
        for rows, cols in shapes:
            x = stream.upload(rng.standard_normal(cols).astype(np.float32), "x")
            norm = stream.upload(rng.standard_normal(cols).astype(np.float32), "norm")
            y = stream.upload(np.zeros(rows, np.float32), "y")
            weights, ups, kvs = {}, {}, {}
            if args.qkv:
                from vkrt.models.llama import rope_table
                cos_sin = stream.upload(rope_table(128, 10000.0, 1), "cos_sin")
                q_out = stream.upload(np.zeros(rows, np.float32), "q_out")
                caches = [stream.upload(np.zeros((1, rows // 4), np.float32), n)
                          for n in ("k_cache", "v_cache")]
                pos = stream.upload(np.zeros(1, np.uint32), "pos")
            for t in chosen:
                if cols % t.block:
                    continue
                nbytes = rows * cols // t.block * t.block_bytes
                nbytes += -nbytes % 4
                w = Tensor(Buffer(dev, nbytes, name=t.dtype), 0, nbytes, t.dtype,
                           (rows, cols), t.dtype)
                raw = rng.integers(0, 256, nbytes, dtype=np.uint8)
                stream.write(Tensor(w.buffer, 0, nbytes, "uint8", (nbytes,)), raw)
                weights[t.dtype] = w
                if args.glu:      # a second matrix (up): not the first one's bytes from L2
                    ups[t.dtype] = u = Tensor(Buffer(dev, nbytes, name=t.dtype + "_up"), 0,
                                              nbytes, t.dtype, (rows, cols), t.dtype)
                    stream.write(Tensor(u.buffer, 0, nbytes, "uint8", (nbytes,)), raw[::-1])
                if args.qkv:      # K and V: a quarter of Q's rows each (grouped-query heads)
                    kv = []
                    for i in range(2):
                        kb = nbytes // 4 - nbytes // 4 % 4
                        kt = Tensor(Buffer(dev, kb, name=f"{t.dtype}_kv{i}"), 0, kb, t.dtype,
                                    (rows // 4, cols), t.dtype)
                        stream.write(Tensor(kt.buffer, 0, kb, "uint8", (kb,)), raw[i:kb + i])
                        kv.append(kt)
                    kvs[t.dtype] = kv
            big = max(w.nbytes for w in weights.values())
            src, dst = (Tensor(Buffer(dev, big, name=n), 0, big, "uint8", (big,)) for n in "ab")
            stream.synchronize()
            arms = [(name, c) for name in weights for c in kernels] + [("copy", "")]
            times: dict[tuple[str, str], list[float]] = {a: [] for a in arms}
            stats: dict[tuple[str, str], dict] = {}
            for _ in range(args.rounds):
                for name, c in arms:
                    stream.profiler.gpu_ns.clear()
                    stream.profiler.gpu_count.clear()
                    if name == "copy":
                        records = [Copy(src, dst, "copy")] * args.repeat
                    elif args.qkv:
                        records = kernels[c].qkv_rope(
                            x, norm, weights[name], *kvs[name], cos_sin, q_out, *caches, 128,
                            0, 1e-5, pos, False, name=name) * args.repeat
                    elif args.glu:
                        records = [kernels[c].glu(x, norm, weights[name], ups[name], y, 1e-5,
                                                  name=name)] * args.repeat
                    else:
                        records = [kernels[c].linear(x, weights[name], y, 1, name=name)] \
                            * args.repeat
                    stream.record(records)
                    stream.synchronize()
                    if args.pipeline_stats and name != "copy" and (name, c) not in stats:
                        stats[name, c] = {d.pipeline.name: d.pipeline.statistics()
                                          for d in records}
                    times[name, c].append(stream.profiler.gpu_ns[name]
                                          / stream.profiler.gpu_count[name])
            report = {"device": dev.name, "driver": f"{dev.driver_name} {dev.driver_info}",
                      "rows": rows, "cols": cols, "repeat": args.repeat, "types": {},
                      "configs": {}}
            for (name, c), ts in times.items():
                nbytes = big if name == "copy" else (
                    weights[name].nbytes * (2 if args.glu else 1)
                    + sum(k.nbytes for k in kvs.get(name, ())))
                us = statistics.median(ts) / 1e3
                # A copy reads and writes its bytes; a product reads the matrix (x, y small).
                moved = 2 * nbytes if name == "copy" else nbytes
                r = {"bytes": nbytes, "us": round(us, 2), "gb_s": round(moved / us / 1e3, 1),
                     **({"pipelines": stats[name, c]} if (name, c) in stats else {})}
                report["configs"].setdefault(name, {})[c] = r
            for name, by_c in report["configs"].items():
                best = max(by_c, key=lambda c: by_c[c]["gb_s"])
                report["types"][name] = {**by_c[best], "config": best}
            reports.append(report)
            extra = [cos_sin, q_out, *caches, pos] if args.qkv else []
            for t in (*weights.values(), *ups.values(), *(k for kv in kvs.values() for k in kv),
                      src, dst, x, norm, y, *extra):
                t.buffer.close()
        stream.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(reports, f, indent=1)
    if args.json:
        print(json.dumps(reports, indent=1))
        return 0
    for report in reports:
        print(f"{report['device']} ({report['driver']}): [{report['rows']}, {report['cols']}] "
              f"per type, median of {args.rounds} rounds x {args.repeat} products")
        base = report["types"].get("q4_1", report["types"]["copy"])["gb_s"]
        for name, r in report["types"].items():
            each = " ".join(f"{c}:{v['gb_s']:.0f}" for c, v in report["configs"][name].items()
                            if len(report["configs"][name]) > 1)
            print(f"  {name:<8} {r['bytes'] / 2**20:8.1f} MiB  {r['us']:9.2f} us  "
                  f"{r['gb_s']:8.1f} GB/s  ({r['gb_s'] / base:.2f}x q4_1) {r['config']} {each}")
            for c, v in report["configs"][name].items():
                for module, st in v.get("pipelines", {}).items():
                    print(f"    {c or 'table'} {module}: "
                          + ", ".join(f"{k} {val}" for k, val in st.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
