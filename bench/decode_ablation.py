"""Where a decode product's time goes, without a profiler: builds of weights.glsl's Q4_K
block-level reader with one part taken out, timed beside the shipped build, one process each.

    python bench/decode_ablation.py [--variants base,no-dequant,...] [--glu-shape 14336x4096]
        [--glu-configs 2x4] [--shape 4096x14336] [--configs 4x4] [--rounds 3] [--repeat 30]
        [--build-only DIR | --built DIR]

Each variant (`VARIANTS`) is one text change of vkrt/glsl/weights.glsl, compiled by the pinned
glslang into the modules `matvec_q4_k` and `matvec_glu_q4_k` of a copy of vkrt/spirv
(bench/coop_ablation.py's `compile_changed` and `modules_dir`; the interface is unchanged).
Where the compiler is not installed (a lent GPU), `--build-only DIR` elsewhere and `--built
DIR` there. A change that no longer applies exactly once is an error (tests/test_bench.py
builds them all). The variants compute wrong products: only their times mean anything. Per
variant, bench/matvec_types.py (a process of its own) times matvec_glu at `--glu-shape` under
`--glu-configs` and matvec at `--shape` under `--configs` (its `SxR` decode launches).
The report (JSON on stdout, a line per variant on stderr): per variant, kernel and launch,
the GB/s of the matrices read. A part's cost is the shipped build's time less the variant's;
the parts overlap, so the costs do not add up to the whole. Absolute figures only from a
real GPU.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from coop_ablation import add_build_args, changed_text, compile_changed, modules_dir  # noqa: E402

SOURCE = "weights.glsl"
MODULES = ("matvec_q4_k", "matvec_glu_q4_k")
_PART = ("    return dot(hd.x * W_(bytes_f)(lo, 31u, 0.0) - hd.z, xa) + dot(hd.y * W_(bytes_f)(hi, "
         "31u, 0.0) - hd.w, xb);\n}")

# name -> (what is taken out, text of weights.glsl, its replacement)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "no-dequant": (
        "the dequantization and the products (the quant word's bits as a float, plus one "
        "element of x: the unit's other x loads fall away with them)",
        _PART, "    return uintBitsToFloat(v) * xa.x + hd.x;\n}"),
    "x-only": (
        "the dequantization and the products, the unit's x still loaded and summed",
        _PART, "    return dot(xa, xb) + uintBitsToFloat(v) + hd.x;\n}"),
    "no-header-decode": (
        "the decode of the 6-bit scales and mins (d, dmin and the scale words' bits instead)",
        "    vec2 a = dd.x * vec2(s0.x, s1.x), m = dd.y * vec2(s0.y, s1.y);\n    return vec4(a, m);",
        "    return uintBitsToFloat(h) + vec4(dd, 0.0, 0.0);"),
}


def variant_source(text: str, name: str) -> str:
    """weights.glsl's `text` with variant `name`'s change ("base": unchanged).

    Raises:
        ValueError: the variant's text is not in `text` exactly once (the reader changed)."""
    return changed_text(text, name, VARIANTS, SOURCE, "decode_ablation")


def compile_variants(out: Path, names: list[str]) -> dict[str, Path]:
    """`out/<name>/<module>.spv` of `MODULES` for each variant, compiled by the pinned glslang.
    Returns name -> directory.

    Raises:
        ValueError: a variant does not apply; vkrt.errors.CompileError: no pinned glslang, or
        it refused a variant."""
    text = (ROOT / "vkrt" / "glsl" / SOURCE).read_text()
    dirs = {}
    for name in names:
        built = compile_changed({SOURCE: variant_source(text, name)}, list(MODULES))
        dirs[name] = out / name
        dirs[name].mkdir(parents=True, exist_ok=True)
        for module, spv in built.items():
            (dirs[name] / f"{module}.spv").write_bytes(spv)
    return dirs


def time_variant(modules: Path, args: argparse.Namespace, glu: bool,
                 out: Path) -> dict[str, float]:
    """GB/s of the matrices the Q4_K product reads, per launch ("SxR" -> GB/s): matvec_glu
    (`glu`) at args.glu_shape under args.glu_configs, else matvec at args.shape under
    args.configs, timed by bench/matvec_types.py in a process of its own on the modules
    directory `modules`; its JSON report is written to `out`.

    Raises:
        SystemExit: matvec_types.py failed (its command and the end of its stderr)."""
    shape, configs = (args.glu_shape, args.glu_configs) if glu else (args.shape, args.configs)
    cmd = [sys.executable, str(ROOT / "bench" / "matvec_types.py"), "--types", "q4_k",
           "--shapes", shape, "--configs", configs, "--rounds", str(args.rounds),
           "--repeat", str(args.repeat), "--spirv-dir", str(modules), "--out", str(out),
           *(["--glu"] if glu else [])]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if run.returncode:
        raise SystemExit(f"decode_ablation: {' '.join(cmd)} failed:\n{run.stderr[-2000:]}")
    report = json.loads(out.read_text())[0]
    return {c: r["gb_s"] for c, r in report["configs"]["q4_k"].items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(["base", *VARIANTS]))
    ap.add_argument("--glu-shape", default="14336x4096", help="RxC of matvec_glu's gate and up")
    ap.add_argument("--glu-configs", default="2x4", help="SxR,...: matvec_glu's launches")
    ap.add_argument("--shape", default="4096x14336", help="RxC of matvec's matrix")
    ap.add_argument("--configs", default="4x4", help="SxR,...: matvec's launches")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=30)
    add_build_args(ap)
    args = ap.parse_args(argv)
    names = args.variants.split(",")
    if args.build_only:
        for name, d in compile_variants(Path(args.build_only), names).items():
            print(f"{name}: {d}")
        return 0
    report = {"type": "q4_k", "variants": {}}
    with tempfile.TemporaryDirectory(prefix="decode-ablation-") as tmp:
        built = ({n: Path(args.built) / n for n in names} if args.built
                 else compile_variants(Path(tmp) / "spv", names))
        for name in names:
            d = modules_dir([built[name] / f"{m}.spv" for m in MODULES],
                            Path(tmp) / "modules" / name)
            glu = time_variant(d, args, True, Path(tmp) / f"{name}.glu.json")
            mv = time_variant(d, args, False, Path(tmp) / f"{name}.json")
            report["variants"][name] = {"matvec_glu_gb_s": glu, "matvec_gb_s": mv}
            print(f"{name}: matvec_glu {args.glu_shape} "
                  + " ".join(f"{c} {v}" for c, v in glu.items()) + f" | matvec {args.shape} "
                  + " ".join(f"{c} {v}" for c, v in mv.items()) + " GB/s",
                  file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
