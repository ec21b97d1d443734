"""Does the layout of Q4_1's blocks limit the decode products? Q4_1 read from a grouped layout
(every 8 blocks: their 8 (d, m) words, then their 8 x 16 quant bytes, so that each block's
quants are one 16-byte-aligned uvec4) against the GGUF layout (20-byte blocks, 4-byte aligned:
five word loads per block), side by side in one process.

    python bench/q4_1_layout.py [--build-only DIR | --built DIR] [--verify] [matvec_types args]

Builds of vkrt/glsl/weights.glsl with Q4_1's readers (`raw_at`, under `block4`, and
`unit_ints`, `unit_scales`, `unit_part`) reading the grouped layout, compiled by the pinned
glslang (vkrt/gen/compile.py) into the Q4_1 decode modules (`MODULES`) of a copy of
vkrt/spirv (bench/coop_ablation.py's `modules_dir`): flavor `g` reads each quant word with
its own load, `g4` the block's four words as one uvec4 (a second view of the same binding).
Where the compiler is not installed (a lent GPU), `--build-only DIR` here and `--built DIR`
there. `--verify` runs each build's products on random Q4_1 blocks (tests/weight_blocks.py),
repacked by `repack`, against the shipped build on the GGUF bytes, under several decode
launches, and exits 1 unless every output is bit-identical. Otherwise bench/matvec_types.py
times `--types q4_1` once per build (shipped first) with the remaining arguments (e.g.
`--shapes 4096x14336,14336x4096 --rounds 3`, `--glu`); the bytes are random, as there, so
the layout changes nothing but the loads. Absolute figures only from a real GPU.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MODULES = ["matvec_q4_1", "matvec_xq_q4_1", "matvec_add_q4_1", "matvec_add_xq_q4_1",
           "matvec_glu_q4_1"]
RAW_AT = ("uvec2 W_(raw_at)(uint o, uint e) { return uvec2(W_(w)[o / 4], "
          "W_(w)[o / 4 + 1 + e % 16 / 4]); }")
GROUPED_RAW_AT = """// Grouped: block i = o / 20 of group i / 8; (d, m) word 40 (i / 8) + i % 8, quant words
// 40 (i / 8) + 8 + 4 (i % 8) .. + 3.
uint W_(g_dm)(uint o) { uint i = o / 20u; return (i >> 3) * 40u + (i & 7u); }
uint W_(g_qs)(uint o) { uint i = o / 20u; return (i >> 3) * 40u + 8u + 4u * (i & 7u); }
#ifdef G4
layout(set = 0, binding = WEIGHT_BINDING) readonly buffer W_(Wt4) { uvec4 W_(w4)[]; };
uint W_(g_word)(uint o, uint q) { uvec4 t = W_(w4)[W_(g_qs)(o) / 4u]; return t[q]; }
#else
uint W_(g_word)(uint o, uint q) { return W_(w)[W_(g_qs)(o) + q]; }
#endif
uvec2 W_(raw_at)(uint o, uint e) {
    return uvec2(W_(w)[W_(g_dm)(o)], W_(g_word)(o, e % 16 / 4));
}"""
UNITS = """uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    uint v = W_(w)[o / 4 + 1 + q];
    return uvec2(v & 0x0F0F0F0Fu, (v >> 4) & 0x0F0F0F0Fu);
}
vec4 W_(unit_scales)(uint o, uint u) {
    vec2 dm = unpackHalf2x16(W_(w)[o / 4]);
    return vec4(dm.xx, -dm.yy);
}
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    vec2 dm = unpackHalf2x16(W_(w)[o / 4]);
    uint v = W_(w)[o / 4 + 1 + q];"""
GROUPED_UNITS = """uvec2 W_(unit_ints)(uint o, uint u, uint q) {
    uint v = W_(g_word)(o, q);
    return uvec2(v & 0x0F0F0F0Fu, (v >> 4) & 0x0F0F0F0Fu);
}
vec4 W_(unit_scales)(uint o, uint u) {
    vec2 dm = unpackHalf2x16(W_(w)[W_(g_dm)(o)]);
    return vec4(dm.xx, -dm.yy);
}
float W_(unit_part)(uint o, uint u, uint q, vec4 hd, vec4 xa, vec4 xb) {
    vec2 dm = unpackHalf2x16(W_(w)[W_(g_dm)(o)]);
    uint v = W_(g_word)(o, q);"""
FLAVORS = {"g": "", "g4": "#define G4\n"}


def weights_text(text: str, flavor: str) -> str:
    """weights.glsl's `text` with Q4_1's readers on the grouped layout (`flavor` of `FLAVORS`).
    Raises ValueError when a replaced reader is not in `text` exactly once (it changed)."""
    for old in (RAW_AT, UNITS):
        if text.count(old) != 1:
            raise ValueError(f"q4_1_layout: a Q4_1 reader occurs {text.count(old)} times in "
                             "weights.glsl, not once: update the texts to weights.glsl")
    return text.replace(RAW_AT, FLAVORS[flavor] + GROUPED_RAW_AT).replace(UNITS, GROUPED_UNITS)


def compile_flavors(out: Path) -> dict[str, Path]:
    """`out/<flavor>/<module>.spv` for every flavor and module in `MODULES`, by the pinned
    glslang (bench/coop_ablation.py's `compile_changed`). Returns flavor -> directory.
    Raises vkrt.errors.CompileError without it, ValueError as `weights_text`."""
    from coop_ablation import compile_changed

    text = (ROOT / "vkrt" / "glsl" / "weights.glsl").read_text()
    dirs = {}
    for flavor in FLAVORS:
        dirs[flavor] = d = out / flavor
        d.mkdir(parents=True, exist_ok=True)
        built = compile_changed({"weights.glsl": weights_text(text, flavor)}, MODULES)
        for m, spv in built.items():
            (d / f"{m}.spv").write_bytes(spv)
    return dirs


def modules_dir(built: Path, dest: Path) -> Path:
    """`dest`: vkrt/spirv's modules with those of `built` (one flavor's build) in their place
    (bench/coop_ablation.py's `modules_dir`)."""
    from coop_ablation import modules_dir as with_modules

    return with_modules(sorted(built.glob("*.spv")), dest)


def repack(raw):
    """GGUF Q4_1 bytes (uint8, N blocks of 20 bytes, N % 8 == 0) -> the grouped layout, the
    same bytes moved: per 8 blocks their (d, m) words, then their quant bytes."""
    import numpy as np

    g = raw.reshape(-1, 8, 20)
    return np.concatenate([g[:, :, :4].reshape(-1, 32), g[:, :, 4:].reshape(-1, 128)],
                          axis=1).reshape(-1)


def verify(dirs: dict[str, Path]) -> bool:
    """Each flavor's matvec on repacked random blocks against the shipped build on the GGUF
    bytes, under the device table's launch and four others: True when all bit-identical."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from weight_blocks import random_blocks

    from vkrt.kernels import Kernels
    from vkrt.runtime.device import Device
    from vkrt.runtime.pipeline import PipelineCache
    from vkrt.runtime.stream import Stream
    from vkrt.runtime.tensor import Tensor

    r = np.random.default_rng(1)
    launches = [None, (4, 8, True), (8, 8, True), (1, 4, False), (4, 8, False)]
    ok = True
    with Device() as dev, tempfile.TemporaryDirectory(prefix="q4_1-layout-") as tmp:
        s = Stream(dev)
        caches = {"shipped": PipelineCache(dev)}
        caches.update({f: PipelineCache(dev, modules_dir(d, Path(tmp) / f))
                       for f, d in dirs.items()})
        for rows, cols in [(64, 256), (40, 576), (24, 1024)]:
            raw = random_blocks(r, "Q4_1", rows, cols)[0].reshape(-1)
            x = s.upload(r.standard_normal(cols).astype(np.float32), "x")
            y = s.upload(np.zeros(rows, np.float32), "y")
            outs: dict[str, list] = {}
            for name, cache in caches.items():
                w = s.upload(raw if name == "shipped" else repack(raw), "w")
                wt = Tensor(w.buffer, 0, w.nbytes, "q4_1", (rows, cols), "w")
                for launch in launches:
                    k = Kernels(cache)
                    if launch:
                        k = Kernels(cache, tuning=k.tuning.with_decode(
                            launch[0], launch[1], "matvec", integer_x=launch[2]))
                    s.record([k.linear(x, wt, y, 1, name="p")])
                    outs.setdefault(name, []).append(s.read(y).view(np.uint32).copy())
                w.buffer.close()
            x.buffer.close()
            y.buffer.close()
            for name in dirs:
                same = all(np.array_equal(a, b) for a, b in zip(outs[name], outs["shipped"]))
                ok &= same
                print(f"{name} [{rows}, {cols}]: {'bit-identical' if same else 'DIFFERENT'}",
                      file=sys.stderr)
        s.close()
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-only", default="", metavar="DIR")
    ap.add_argument("--built", default="", metavar="DIR")
    ap.add_argument("--verify", action="store_true")
    args, rest = ap.parse_known_args(argv)
    if args.build_only:
        for f, d in compile_flavors(Path(args.build_only)).items():
            print(f"{f}: {d}")
        return 0
    with tempfile.TemporaryDirectory(prefix="q4_1-layout-") as tmp:
        dirs = ({f: Path(args.built) / f for f in FLAVORS} if args.built
                else compile_flavors(Path(tmp) / "spv"))
        if args.verify:
            return 0 if verify(dirs) else 1
        import matvec_types

        for name in ["shipped", *FLAVORS]:
            extra = [] if name == "shipped" else [
                "--spirv-dir", str(modules_dir(dirs[name], Path(tmp) / "modules" / name))]
            print(f"== {name}", flush=True)
            rc = matvec_types.main(["--types", "q4_1", *extra, *rest])
            if rc:
                return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
