"""gen-spirv's reflection on real-style kernels, field by field against spirv-cross.

The corpus: vkrt's own shaders (vkrt/glsl) and tests/gen_corpus, kernels written for this test
in the shapes that contributors port (llama.cpp's Vulkan backend and the like):
- soft_max.comp, argmax.comp, sum_rows.comp: `layout(constant_id = 0) const uint BLOCK_SIZE =
  32;` with `layout(local_size_x_id = 0) in;` (SpecId 0 on two constants, defaults 32 and 1),
  shared memory sized by BLOCK_SIZE, long push-constant heads;
- bda_copy.comp: GL_EXT_buffer_reference pointers in push constants (direct, in a struct, in
  an array) next to a uint64_t and a vec4;
- subgroup_sum.comp: subgroup arithmetic and ballot, local_size_x_id / y_id, bool spec constant;
- small_types.comp: 16- and 8-bit storage buffers and push-constant members, 16- and 64-bit
  spec constants.
Each is compiled with the pinned glslang for SPIR-V 1.5 (vulkan1.2, the project's target) and
1.6 (vulkan1.3, LocalSizeId), and compared by `test_gen_reflect.differences` (its docstring
lists spirv-cross's known deviations). The corpus must keep exercising each shape: the last
test counts them.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from test_gen_reflect import CROSS_UNREADABLE, coop_differences, coop_sibling, differences
from vkrt.gen import compile as glslang
from vkrt.gen.build import DEFAULT_GLSL_DIR
from vkrt.gen.reflect import reflect
from vkrt.gen.variants import discover

CORPUS = Path(__file__).parent / "gen_corpus"
# (name, .comp, -D flags): the corpus, then every module vkrt builds (variants.json included).
SOURCES = ([(p.stem, p, []) for p in sorted(CORPUS.glob("*.comp"))]
           + [(f"vkrt_{s.module}", s.path, [f"-D{k}={v}" for k, v in s.defines])
              for s in discover(DEFAULT_GLSL_DIR)])
TARGETS = ("vulkan1.2", "vulkan1.3")


def _compile_all(tmp_path: Path, target: str) -> dict[str, bytes]:
    flags = list(glslang.FLAGS)
    flags[flags.index("--target-env") + 1] = target
    compiler = glslang.find_compiler()
    out = {}
    for name, src, defines in SOURCES:
        spv = tmp_path / f"{name}.{target}.spv"
        proc = subprocess.run(
            [compiler.path, *flags, *defines, f"-I{src.parent}", "-o", str(spv), str(src)],
            capture_output=True, text=True, env={**os.environ, **compiler.env})
        assert proc.returncode == 0, proc.stdout
        out[name] = spv.read_bytes()
    return out


@pytest.fixture(scope="module", params=TARGETS)
def corpus(request, tmp_path_factory) -> tuple[str, dict[str, tuple[Path, dict]]]:
    """target -> {module: (.spv path, our reflection)}."""
    tmp = tmp_path_factory.mktemp(request.param)
    reflected = {}
    for name, data in _compile_all(tmp, request.param).items():
        path = tmp / f"{name}.spv"
        path.write_bytes(data)
        reflected[name] = (path, reflect(data, name))
    return request.param, reflected


def test_corpus_matches_spirv_cross(corpus):
    """Every module against spirv-cross, but those the Debian spirv-cross cannot parse
    (CooperativeMatrixKHR: matmul_coop_*), which are held against their matmul_tiled_*
    siblings as test_gen_reflect does."""
    target, reflected = corpus
    diffs = {}
    for name, (spv, ours) in reflected.items():
        if CROSS_UNREADABLE in ours.get("capabilities", []):
            sibling = coop_sibling(name)
            d = coop_differences(name.removeprefix("vkrt_"), ours, reflected[sibling][1])
        else:
            d = differences(spv, ours)
        if d:
            diffs[name] = d
    assert diffs == {}, target
    assert any(CROSS_UNREADABLE in o.get("capabilities", []) for _, o in reflected.values())


def test_corpus_idiom_and_pointers(corpus):
    """What the three issue-14 shapes reflect to, in both SPIR-V versions."""
    _, reflected = corpus
    for name in ("soft_max", "argmax", "sum_rows"):
        ours = reflected[name][1]
        block = next(s for s in ours["spec_ids"] if s["id"] == 0)
        assert block == {"id": 0, "name": "BLOCK_SIZE", "type": "uint32", "default": 32,
                         "defaults": [32, 1]}, name
        assert ours["local_size"] == [1, 1, 1] and ours["local_size_spec_ids"][0] == 0, name
    weight = reflected["sum_rows"][1]["spec_ids"][1]
    assert weight == {"id": 1, "name": "WEIGHT", "type": "float32", "default": 1.0}
    pushes = {p["name"]: p for p in reflected["bda_copy"][1]["push_constants"]}
    assert pushes["dst"] == {"name": "dst", "offset": 0, "size": 8, "type": "pointer"}
    assert (pushes["seg"]["type"], pushes["seg"]["size"]) == ("struct", 16)
    assert (pushes["extra"]["offset"], pushes["extra"]["size"]) == (24, 16)


def test_corpus_covers_the_shapes(corpus):
    _, reflected = corpus
    metas = [ours for _, ours in reflected.values()]
    idiom = sum(any("defaults" in s for s in m["spec_ids"]) for m in metas)
    pointers = sum(any(p["type"] == "pointer" for p in m["push_constants"]) for m in metas)
    small = {p["type"] for m in metas for p in m["push_constants"]} | \
        {s["type"] for m in metas for s in m["spec_ids"]}
    assert idiom >= 3 and pointers >= 1
    assert {"float16", "uint8", "uint16", "int64", "bool"} <= small
    assert len(reflected) == len(SOURCES)
