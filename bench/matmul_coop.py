"""Prefill products on the f32 tiled kernel against cooperative matrices, side by side in one
process: `matmul_tiled` and `matmul_coop` (the tiling `Kernels.linear` picks, `coop`, and any
`--tiles`) over 7B shapes.

    python bench/matmul_coop.py [--tokens 512] [--shapes 4096x4096,14336x4096,4096x14336]
        [--types q4_1,q4_k,float16] [--tiles 64x64:2x2,128x64:2x2] [--repeat 20] [--json]
        [--out FILE.json]

A shape is [rows, cols] of W (N, K); x is [tokens, cols] f32 of standard normals, y [tokens,
rows]. Each type's matrix holds random bytes with its f16 scale fields set to finite values
(tests/weight_blocks.py F16_FIELDS) and F16 weights are random normals / 64, so every product
is finite and the arms can be compared: the report gives each coop arm's relative difference
from the tiled one, ||y_coop - y_tiled|| / ||y_tiled|| (Frobenius). Per arm, `--repeat`
products are recorded back to back in one submission (each waits for the one before: the
tracker's WAW barrier on y) and timed by timestamp queries; the median product's GPU time
gives TFLOP/s = 2 T N K / time. A tiling is BMxBN:SG_MxSG_N[xSG_K[xNBUF]] (tokens x rows
per workgroup, subgroups along each, groups of them splitting the columns, shared buffers;
`Kernels.coop_spec` refuses a tiling past the device's shared memory, which NVIDIA's driver
hung on rather than refused); the arms alternate round by round (`--rounds`). Absolute
figures only from a real GPU; compare within one run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np


def _weight(stream, dev, dtype: str, rows: int, cols: int, rng):
    from vkrt.runtime.memory import Buffer
    from vkrt.runtime.tensor import Tensor, nbytes_of
    from vkrt.weight_types import BY_DTYPE

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    t = BY_DTYPE[dtype]
    nbytes = nbytes_of(dtype, (rows, cols))
    if t.quantized:
        from weight_blocks import F16_FIELDS

        raw = rng.integers(0, 256, (rows * cols // t.block, t.block_bytes), dtype=np.uint8)
        for off in F16_FIELDS[t.gguf]:
            scale = rng.uniform(0.5, 1.0, raw.shape[0]) * 2.0 ** -8
            raw[:, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw = raw.reshape(-1)
    elif dtype == "float16":
        raw = (rng.standard_normal(rows * cols, np.float32) / 64).astype(np.float16).view(np.uint8)
    else:
        raise SystemExit(f"matmul_coop bench: type {dtype} not set up (q*, iq*, float16)")
    w = Tensor(Buffer(dev, nbytes, name=dtype), 0, nbytes, dtype, (rows, cols), dtype)
    pad = np.zeros(nbytes, np.uint8)
    pad[:raw.size] = raw
    stream.write(Tensor(w.buffer, 0, nbytes, "uint8", (nbytes,)), pad)
    return w


def main(argv: list[str] | None = None) -> int:
    from vkrt import config
    from vkrt.gen.metadata import DEFAULT_SPIRV_DIR
    from vkrt.kernels import Kernels, _groups, spread
    from vkrt.runtime.device import Device
    from vkrt.runtime.pipeline import PipelineCache
    from vkrt.runtime.stream import Stream

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--shapes", default="4096x4096,14336x4096,4096x14336")
    ap.add_argument("--types", default="q4_1,q4_k,float16")
    ap.add_argument("--tiles", default="", help="tilings beside the one linear picks")
    ap.add_argument("--spirv-dir", default=str(DEFAULT_SPIRV_DIR),
                    help="the modules' directory (default: vkrt's; "
                         "bench/coop_ablation.py's builds)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default="", help="also write the JSON report to this file")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    T = args.tokens
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    tiles = [tuple(int(v) for p in s.split(":") for v in p.split("x"))
             for s in args.tiles.split(",") if s]
    with Device() as dev:
        stream = Stream(dev, timestamps=True)
        if not stream.timing:
            print("matmul_coop bench: this device has no timestamps", file=sys.stderr)
            return 1
        k = Kernels(PipelineCache(dev, args.spirv_dir))
        if k.coop is None:
            print(f"matmul_coop bench: {dev.name} lists no f16 cooperative-matrix shape",
                  file=sys.stderr)
            return 1
        report = {"device": dev.name, "driver": f"{dev.driver_name} {dev.driver_info}",
                  "coop_shape": [k.coop.m, k.coop.n, k.coop.k], "tokens": T,
                  "repeat": args.repeat, "rounds": args.rounds, "products": []}
        for rows, cols in shapes:
            for dtype in args.types.split(","):
                w = _weight(stream, dev, dtype, rows, cols, rng)
                xin = stream.upload(rng.standard_normal((T, cols), np.float32), "x")
                arms = {}
                with config.COOPMAT.override("0"):     # matmul_tiled on a GPU
                    y = stream.upload(np.zeros((T, rows), np.float32), "y_tiled")
                    arms["tiled"] = (k.linear(xin, w, y, T, name="tiled"), y)
                    row_kernel = k.prefill_kernel(T)
                with config.COOPMAT.override("1"):     # the tile linear picks
                    y = stream.upload(np.zeros((T, rows), np.float32), "y_coop")
                    arms["coop"] = (k.linear(xin, w, y, T, name="coop"), y)
                for tile in tiles:
                    spec = k.coop_spec(rows, T, tile)
                    bm, bn = spec[4], spec[5]
                    name = (f"coop_{bm}x{bn}_{spec[6]}x{spec[7]}"
                            + (f"x{spec[8]}" if spec[8] > 1 else "")
                            + (f"_b{spec[9]}" if spec[9] > 1 else "")
                            + (f"_d{spec[10]}" if spec[10] > 1 else ""))
                    y = stream.upload(np.zeros((T, rows), np.float32), name)
                    gx, gz = spread(_groups(rows, bn), k.limit)
                    op = k.weight_op("matmul_coop", w, spec=spec)
                    arms[name] = (op(w, xin, y, grid=(gx, _groups(T, bm), gz), name=name,
                                     need=(None, T * cols, T * rows), n_cols=cols,
                                     n_rows=rows, n_tokens=T, token0=0, y_row0=0,
                                     n_splits=1), y)
                times = {name: [] for name in arms}
                for _ in range(args.rounds):
                    for name, (d, _) in arms.items():
                        stream.profiler.gpu_ns.clear()
                        stream.profiler.gpu_count.clear()
                        stream.record([d] * args.repeat)
                        stream.synchronize()
                        times[name].append(stream.profiler.gpu_ns[name]
                                           / stream.profiler.gpu_count[name])
                ref = stream.read(arms["tiled"][1]).astype(np.float64)
                flop = 2.0 * T * rows * cols
                row = {"rows": rows, "cols": cols, "type": dtype, "tiled": row_kernel,
                       "arms": {}}
                for name, (_, y) in arms.items():
                    us = statistics.median(times[name]) / 1e3
                    got = stream.read(y).astype(np.float64)
                    diff = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                    row["arms"][name] = {"us": round(us, 1), "tflops": round(flop / us / 1e6, 1),
                                         "rel_diff": float(f"{diff:.2e}")}
                report["products"].append(row)
                print(f"T={T} [{rows}, {cols}] {dtype:8}: " + "  ".join(
                    f"{n} {a['us']:8.1f} us {a['tflops']:6.1f} TFLOP/s (d {a['rel_diff']:.1e})"
                    for n, a in row["arms"].items()), flush=True)
                for _, y in arms.values():
                    y.buffer.close()
                xin.buffer.close()
                w.buffer.close()
        stream.close()
    if args.json:
        print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
