"""Where `matmul_coop`'s time goes, without a profiler: builds of its module with one part of
the kernel taken out, timed beside the shipped build in one process per build.

    python bench/coop_ablation.py [--type q4_1] [--tokens 1,8,32] [--tiles 32x32:2x2x8,16x16:1x1x8]
        [--shapes 4096x4096,1024x4096,14336x4096,4096x14336] [--prefill-tokens 512]
        [--prefill-shapes 4096x4096,14336x4096] [--variants base,no-weight-loads,...]
        [--repeat 10] [--build-only DIR | --built DIR]

Each variant (`VARIANTS`) is one text change of vkrt/glsl/matmul_coop.comp, compiled by the
pinned glslang (vkrt/gen/compile.py) into the module `matmul_coop_<type>` of a copy of
vkrt/spirv (the other modules linked, modules.json's sha256 rewritten; the interface is
unchanged, so the runtime's checks hold). Where the compiler is not installed (a lent GPU),
`--build-only DIR` elsewhere and `--built DIR` there. A change that no longer applies exactly
once is an error (tests/test_bench.py builds them all). Most variants compute wrong
products: only their times mean anything. Per variant, bench/batched_products.py times the
decode tiles (`--tiles`, its `--coop-tiles`) at `--tokens` over `--shapes`, and
bench/matmul_coop.py the table's prefill tile at `--prefill-tokens` over `--prefill-shapes`.
The report (JSON on stdout, a line per variant on stderr): per variant and tile, the µs of
the products summed over the shapes (unweighted) at each token count, and the prefill
TFLOP/s per shape. A part's cost is the shipped build's time less the variant's; the parts
overlap, so the costs do not add up to the whole. Absolute figures only from a real GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "matmul_coop.comp"

# name -> (what is taken out, text of matmul_coop.comp, its replacement)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "no-weight-loads": (
        "the W tile's global loads (words of the row and column instead, still decoded)",
        "return raw4(n0 + r, q, pc.n_cols);", "return uvec2(r, q);"),
    "raw-weight-words": (
        "the dequantization (the fetched quant word's bits as floats)",
        "return decode4(v, 4 * q % WEIGHT_BLOCK);", "return vec4(uintBitsToFloat(v.y));"),
    "no-x-loads": (
        "the x tile's global loads (a value of the token and column instead)",
        "x[(pc.token0 + t0 + t) * cols4 + q]", "vec4(float(t + q))"),
    "no-products": (
        "the coopMatMulAdd calls (and with them the tiles' coopMatLoad)",
        "acc[j / CN * CM * CN + i * CN + j % CN] = coopMatMulAdd(\n"
        "                            a, b[j], acc[j / CN * CM * CN + i * CN + j % CN]);", "{}"),
    "no-step-barriers": (
        "the two barriers of each step with one shared buffer (NBUF = 1)",
        "                barrier();                // every subgroup is done with the last step's "
        "tiles\n                store(xr[d], wr[d], 0, ks);\n                barrier();\n",
        "                store(xr[d], wr[d], 0, ks);\n"),
}


def changed_text(text: str, name: str, variants: dict, source: str, script: str) -> str:
    """`text` (the file `source`) with variant `name`'s change from `variants` (name -> (what
    is taken out, old text, new text)); "base": unchanged. `script` names the caller in the
    error.

    Raises:
        ValueError: the variant's text is not in `text` exactly once (the file changed)."""
    if name == "base":
        return text
    _, old, new = variants[name]
    if text.count(old) != 1:
        raise ValueError(f"{script}: variant {name}: its text occurs {text.count(old)} "
                         f"times in {source}, not once: update VARIANTS to it")
    return text.replace(old, new)


def variant_source(text: str, name: str) -> str:
    """matmul_coop.comp's `text` with variant `name`'s change ("base": unchanged).

    Raises:
        ValueError: the variant's text is not in `text` exactly once (the kernel changed)."""
    return changed_text(text, name, VARIANTS, SOURCE, "coop_ablation")


def add_build_args(ap: argparse.ArgumentParser) -> None:
    """The options that build the variants on one machine and time them on another:
    `--build-only DIR` and `--built DIR`."""
    ap.add_argument("--build-only", default="", metavar="DIR",
                    help="compile the variants into DIR/<variant>/ and stop")
    ap.add_argument("--built", default="", metavar="DIR",
                    help="time the variants --build-only compiled into DIR (a machine "
                         "without the pinned glslang, e.g. a lent GPU)")


def compile_changed(files: dict[str, str], modules: list[str]) -> dict[str, bytes]:
    """The SPIR-V of `modules` (vkrt/glsl/variants.json names) compiled by the pinned glslang
    from a copy of vkrt/glsl whose files named in `files` hold the given texts instead.
    Returns module -> bytes.

    Raises:
        KeyError: an unknown module; vkrt.errors.CompileError: no pinned glslang, or it
        refused a text."""
    from vkrt.gen.compile import compile_source, find_compiler
    from vkrt.gen.variants import discover

    glsl = ROOT / "vkrt" / "glsl"
    sources = {s.module: s for s in discover(glsl)}
    compiler = find_compiler()
    with tempfile.TemporaryDirectory(prefix="vkrt-build-") as tmp:
        src = Path(tmp)
        for f in glsl.iterdir():
            shutil.copy(f, src / f.name)
        for name, text in files.items():
            (src / name).write_text(text)
        return {m: compile_source(compiler, dataclasses.replace(
                    sources[m], path=src / sources[m].path.name), src) for m in modules}


def compile_variants(out: Path, dtype: str, names: list[str]) -> dict[str, Path]:
    """`out/<name>/matmul_coop_<dtype>.spv` for each variant, compiled by the pinned glslang.
    Returns name -> directory.

    Raises:
        ValueError: a variant does not apply; KeyError: no module `matmul_coop_<dtype>`;
        vkrt.errors.CompileError: no pinned glslang, or it refused a variant."""
    module = f"matmul_coop_{dtype}"
    text = (ROOT / "vkrt" / "glsl" / SOURCE).read_text()
    dirs = {}
    for name in names:
        spv = compile_changed({SOURCE: variant_source(text, name)}, [module])[module]
        dirs[name] = out / name
        dirs[name].mkdir(parents=True, exist_ok=True)
        (dirs[name] / f"{module}.spv").write_bytes(spv)
    return dirs


def modules_dir(spv: Path | list[Path], dest: Path) -> Path:
    """`dest` made a modules directory the runtime loads (`PipelineCache(device, dest)`):
    vkrt/spirv's files linked, but the modules `spv` names (a variant's build: one file or
    several) copied in and their sha256 in modules.json rewritten. Returns `dest`."""
    from vkrt.gen.metadata import DEFAULT_SPIRV_DIR, FILENAME

    spvs = [spv] if isinstance(spv, Path) else list(spv)
    doc = json.loads((DEFAULT_SPIRV_DIR / FILENAME).read_text())
    dest.mkdir(parents=True)
    for f in DEFAULT_SPIRV_DIR.glob("*.spv"):
        if f.name not in {s.name for s in spvs}:
            (dest / f.name).symlink_to(f)
    for s in spvs:
        data = s.read_bytes()
        (dest / s.name).write_bytes(data)
        doc["modules"][s.stem]["sha256"] = hashlib.sha256(data).hexdigest()
    (dest / FILENAME).write_text(json.dumps(doc))
    return dest


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    import batched_products
    import matmul_coop

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="q4_1", choices=["q4_1"],
                    help="the W tile's variants change Q4_1's two-phase reader (its words "
                    "as uvec2)")
    ap.add_argument("--tokens", default="1,8,32")
    ap.add_argument("--tiles", default="32x32:2x2x8,16x16:1x1x8")
    ap.add_argument("--shapes", default="4096x4096,1024x4096,14336x4096,4096x14336")
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--prefill-shapes", default="4096x4096,14336x4096")
    ap.add_argument("--variants", default=",".join(["base", *VARIANTS]))
    ap.add_argument("--repeat", type=int, default=10)
    add_build_args(ap)
    args = ap.parse_args(argv)
    names = args.variants.split(",")
    if args.build_only:
        for name, d in compile_variants(Path(args.build_only), args.type, names).items():
            print(f"{name}: {d}")
        return 0
    report = {"type": args.type, "variants": {}}
    module = f"matmul_coop_{args.type}.spv"
    with tempfile.TemporaryDirectory(prefix="coop-ablation-") as tmp:
        built = ({n: Path(args.built) / n for n in names} if args.built
                 else compile_variants(Path(tmp) / "spv", args.type, names))
        for name in names:
            d = modules_dir(built[name] / module, Path(tmp) / "modules" / name)
            out = Path(tmp) / f"{name}.json"
            rc = batched_products.main([
                "--shapes", args.shapes, "--types", args.type, "--tokens", args.tokens,
                "--tiles", "", "--coop-tiles", args.tiles, "--repeat", str(args.repeat),
                "--rounds", "1", "--spirv-dir", str(d), "--out", str(out)])
            if rc:
                return rc
            decode: dict = {}
            for r in json.loads(out.read_text())["runs"]:
                key = f"{r['tile'].removeprefix('coop:')} @{r['tokens']}"
                decode[key] = round(decode.get(key, 0.0) + r["us"], 1)
            out = Path(tmp) / f"{name}.prefill.json"
            with contextlib.redirect_stdout(io.StringIO()):   # its per-product lines
                rc = matmul_coop.main([
                    "--tokens", str(args.prefill_tokens), "--shapes", args.prefill_shapes,
                    "--types", args.type, "--repeat", str(args.repeat), "--rounds", "1",
                    "--spirv-dir", str(d), "--out", str(out)])
            if rc:
                return rc
            prefill = {f"{p['rows']}x{p['cols']}": p["arms"]["coop"]["tflops"]
                       for p in json.loads(out.read_text())["products"]}
            report["variants"][name] = {"decode_us": decode, "prefill_tflops": prefill}
            print(f"{name}: " + "  ".join(f"{k} {v}" for k, v in decode.items())
                  + "  | prefill TFLOP/s " + "  ".join(f"{k} {v}" for k, v in prefill.items()),
                  file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
