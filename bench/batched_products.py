"""GPU time of the batched runner's products (`Kernels.linear(batched=kernel)`: matmul.comp
for the generated tokens of a serving step) per matrix shape, weight type, token count and
`matmul` tile (rows per workgroup x tokens per tile, vkrt/tuning.py `BatchTile`), side by side
in one process: the measurement behind the GPU table's `batch_tiles`.

    python bench/batched_products.py [--shapes 1536x576,8192x2048,14336x4096]
        [--types q4_1] [--tokens 1,8,32,64] [--tiles 1x8,4x8,4x16,2x32]
        [--coop-tiles 16x64:1x2,64x128:2x4,32x32:1x1x8] [--glu-tiles 32x32:2x2x4x2]
        [--split-rows 4096,8192]
        [--repeat 20] [--rounds 3] [--out FILE.json]

A shape RxC is a weight of R output rows and C input columns (the 7B ffn_gate's 14336x4096);
its bytes are random (they change the values, not what the kernel reads). `--coop-tiles
BMxBN:SG_MxSG_N[xSG_K[xDEPTH[xNBUF]]],...` adds arms on `matmul_coop` (f16 operands, where the
device lists a cooperative-matrix shape; vkrt/tuning.py `BatchCoopTile`), named
`coop:BMxBN:SG_MxSG_N`; `--glu-tiles BMxBN:SG_MxSG_NxSG_K[xDEPTH[xNBUF]],...` adds arms on
`matmul_coop`'s GLU build (`Kernels.glu_coop`: gate and up, both of the shape, and SiLU
times up in one dispatch; its GB/s and GFLOP/s count both weights), named `glu:...`;
`--split-rows N,...` adds each coop tile again with products of fewer than N rows split
across workgroups (`Kernels.k_splits`, named `coop:...+splitN`; the time is the product's
and its `sum_splits` reduction's, and the report gives `k_splits`). Per (shape, type,
tokens, tile), `--repeat` products are recorded back to back in one submission, each writing
the same output (the tracker's WAW barrier orders them), timed by timestamp queries; the
report gives the median product's µs, the weight bytes over it (GB/s: each weight is read at
least once per product) and the multiply-adds over it (GFLOP/s, 2 per weight per token). The
arms alternate round by round (`--rounds`) so drift affects them alike. Prints one JSON
object; absolute figures only from a real GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from vkrt.gen.metadata import DEFAULT_SPIRV_DIR
    from vkrt.kernels import Kernels
    from vkrt.runtime.device import Device
    from vkrt.runtime.memory import Buffer
    from vkrt.runtime.pipeline import PipelineCache
    from vkrt.runtime.stream import Stream
    from vkrt.runtime.tensor import Tensor
    from vkrt.tuning import BatchCoopTile, BatchTile
    from vkrt.weight_types import TYPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1536x576,8192x2048,14336x4096")
    ap.add_argument("--types", default="q4_1")
    ap.add_argument("--tokens", default="1,8,32,64")
    ap.add_argument("--tiles", default="1x8,4x8,4x16,2x32", help="RxT,...: rows per "
                    "workgroup x tokens per tile")
    ap.add_argument("--coop-tiles", default="", help="BMxBN:SG_MxSG_N,...: matmul_coop "
                    "tiles (tokens x rows over subgroups)")
    ap.add_argument("--glu-tiles", default="", help="BMxBN:SG_MxSG_NxSG_K[xDEPTH[xNBUF]],...: "
                    "matmul_coop's GLU build (gate and up of the shape, SiLU times up, one "
                    "dispatch) on these tiles")
    ap.add_argument("--split-rows", default="", help="N,...: each coop tile also with "
                    "products of fewer than N rows split across workgroups")
    ap.add_argument("--spirv-dir", default=str(DEFAULT_SPIRV_DIR),
                    help="the modules' directory (default: vkrt's; "
                         "bench/coop_ablation.py's builds)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    types = {t.dtype: t for t in TYPES}
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    counts = [int(n) for n in args.tokens.split(",")]
    tiles = [tuple(int(v) for v in c.split("x")) for c in args.tiles.split(",") if c]
    parsed = {}                           # option -> {tile text: BatchCoopTile}
    for option, text in (("--coop-tiles", args.coop_tiles), ("--glu-tiles", args.glu_tiles)):
        try:
            parsed[option] = {c: BatchCoopTile.parse(c, "bench") for c in text.split(",") if c}
        except ValueError as e:
            ap.error(f"{option}: {e}")
    coop_tiles = parsed["--coop-tiles"]
    rng = np.random.default_rng(0)
    report = {"repeat": args.repeat, "rounds": args.rounds, "runs": []}
    with Device() as dev:
        stream = Stream(dev, timestamps=True)
        if not stream.timing:
            print("batched_products: this device has no timestamps", file=sys.stderr)
            return 1
        report["device"] = f"{dev.name} ({dev.driver_name} {dev.driver_info})"
        cache = PipelineCache(dev, args.spirv_dir)
        base = Kernels(cache)
        kernels = {f"{tile[0]}x{tile[1]}": Kernels(cache, tuning=dataclasses.replace(
            base.tuning, batch_products={"decode": "matmul", "prompt": "matmul"},
            batch_tiles=(BatchTile(None, *tile, "bench"),))) for tile in tiles}
        if coop_tiles and base.coop is None:
            print("batched_products: this device has no cooperative-matrix shape",
                  file=sys.stderr)
            return 1
        for c in coop_tiles:
            kernels[f"coop:{c}"] = Kernels(cache, tuning=dataclasses.replace(
                base.tuning, batch_products={"decode": "matmul_coop", "prompt": "matmul_coop"},
                batch_coop_tiles=(coop_tiles[c],)))
        glu_tiles = {}                    # arm -> its GLU tile
        for c, tile in parsed["--glu-tiles"].items():
            if base.coop is None:
                print("batched_products: this device has no cooperative-matrix shape",
                      file=sys.stderr)
                return 1
            kernels[f"glu:{c}"] = base
            glu_tiles[f"glu:{c}"] = tile.spec_tile()
        split_rows = {}                   # arm -> its split_rows
        for c in coop_tiles:
            for n in (int(v) for v in args.split_rows.split(",") if v):
                kernels[f"coop:{c}+split{n}"] = kernels[f"coop:{c}"]
                split_rows[f"coop:{c}+split{n}"] = n
        T = max(counts)
        for rows, cols in shapes:
            x = stream.upload(rng.standard_normal((T, cols)).astype(np.float32), "x")
            y = stream.upload(np.zeros((T, rows), np.float32), "y")
            weights, ups = {}, {}             # ups: the GLU arms' second weight
            for name in args.types.split(","):
                t = types[name]
                nbytes = rows * cols // t.block * t.block_bytes
                nbytes += -nbytes % 4
                for into in (weights, ups) if glu_tiles else (weights,):
                    w = Tensor(Buffer(dev, nbytes, name=name), 0, nbytes, name, (rows, cols),
                               name)
                    stream.write(Tensor(w.buffer, 0, nbytes, "uint8", (nbytes,)),
                                 rng.integers(0, 256, nbytes, dtype=np.uint8))
                    into[name] = w
            stream.synchronize()
            splits = {(name, tile): kernels[tile].k_splits(weights[name], split_rows[tile])
                      for name in weights for tile in split_rows}
            most = max(splits.values(), default=1)
            part = stream.upload(np.zeros(most * T * rows, np.float32), "partials")
            arms = [(name, n, tile) for name in weights for n in counts for tile in kernels]
            times: dict = {a: [] for a in arms}
            for _ in range(args.rounds):
                for name, n, tile in arms:
                    label = f"{name}.{n}.{tile}"
                    stream.profiler.gpu_ns.clear()
                    stream.profiler.gpu_count.clear()
                    k, s = kernels[tile], splits.get((name, tile), 1)
                    if tile in glu_tiles:
                        d = [k.glu_coop(x, weights[name], ups[name], y, n, glu_tiles[tile],
                                        name=label)]
                    else:
                        d = [k.linear(x, weights[name], y, n, name=label, k_splits=s,
                                      partials=part if s > 1 else None,
                                      batched=k.batch_products()["decode"])]
                    if s > 1:
                        d.append(k.sum_splits(part, y, n, rows, s, name=label + ".sum"))
                    stream.record(d * args.repeat)
                    stream.synchronize()
                    times[name, n, tile].append(sum(
                        stream.profiler.gpu_ns[a.name] / stream.profiler.gpu_count[a.name]
                        for a in d))
            for (name, n, tile), ts in times.items():
                us = statistics.median(ts) / 1e3
                report["runs"].append({
                    "shape": f"{rows}x{cols}", "type": name, "tokens": n,
                    "tile": tile, "k_splits": splits.get((name, tile), 1), "us": round(us, 2),
                    "weight_gb_s": round((2 if tile in glu_tiles else 1)
                                         * weights[name].nbytes / us / 1e3, 1),
                    "gflop_s": round((2 if tile in glu_tiles else 1)
                                     * 2 * rows * cols * n / us / 1e3, 1)})
            for t in (*weights.values(), *ups.values(), x, y, part):
                t.buffer.close()
        stream.close()
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
