"""Our SPIR-V reflection against Debian's `spirv-cross FILE.spv --reflect` (2021.01.15).

Every fixture in tests/gen_fixtures (compiled here, or assembled from .spvasm) and every
module of vkrt/glsl and of the committed vkrt/spirv is compared field by field: descriptor
sets/bindings/types/counts, read-only and write-only flags, spec ids/types/defaults,
workgroup size and which dimensions are spec constants, the push-constant size and each
push-constant member's name, offset, size and type (`physical_pointer` members: `pointer`,
8 bytes).

Known deviations of that spirv-cross, asserted rather than papered over:
- it gives no push-constant block size: the size is recomputed here from its member offsets,
  types, array/matrix strides;
- for LocalSizeId (SPIR-V 1.6) it reports literal workgroup dimensions as 0;
- it lists a SpecId shared by two constants twice (we list it once, and their distinct
  defaults, named constants first, as `defaults` when they differ: compared with its list);
- for a workgroup dimension that is a spec constant, `workgroup_size` holds the spec id, not
  the default value; when several constants share that SpecId (llama.cpp's BLOCK_SIZE idiom)
  it does not say which one sizes the workgroup: the one glslang leaves unnamed does;
- it prints no default value for 16- and 64-bit spec constants (only their type is compared);
- it names texel buffers by type (`imageBuffer`, `samplerBuffer`) inside images/textures.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from vkrt.gen import compile as glslang
from vkrt.gen import metadata
from vkrt.gen.build import DEFAULT_GLSL_DIR
from vkrt.gen.reflect import reflect
from vkrt.gen.variants import discover

FIXTURES = Path(__file__).parent / "gen_fixtures"
SPIRV_CROSS = shutil.which("spirv-cross") or "/usr/bin/spirv-cross"

# spirv-cross scalar names -> (our type name, bytes)
_SCALARS = {"bool": ("bool", 4), "int": ("int32", 4), "uint": ("uint32", 4),
            "float": ("float32", 4), "double": ("float64", 8), "half": ("float16", 2),
            "int64_t": ("int64", 8), "uint64_t": ("uint64", 8), "short": ("int16", 2),
            "ushort": ("uint16", 2), "int8_t": ("int8", 1), "uint8_t": ("uint8", 1),
            "int16_t": ("int16", 2), "uint16_t": ("uint16", 2), "float16_t": ("float16", 2)}
_VEC_BASE = {"": "float", "i": "int", "u": "uint", "b": "bool", "d": "double", "f16": "half",
             "i64": "int64_t", "u64": "uint64_t", "i16": "short", "u16": "ushort",
             "i8": "int8_t", "u8": "uint8_t"}
_DESCRIPTOR_KEYS = {"ssbos": "storage_buffer", "ubos": "uniform_buffer",
                    "images": "storage_image", "textures": "combined_image_sampler",
                    "separate_images": "sampled_image", "separate_samplers": "sampler"}


def _assemble(src: Path, out: Path) -> None:
    compiler = glslang.find_compiler()
    spirv_as = Path(compiler.path).parent / "spirv-as"
    env = {**os.environ, **compiler.env}
    target = re.search(r"; target-env: (\S+)", src.read_text())
    argv = [str(spirv_as), "--target-env", target.group(1) if target else "vulkan1.2",
            "-o", str(out), str(src)]
    subprocess.run(argv, check=True, env=env, capture_output=True)


def _fixture_flags(src: Path) -> tuple[str, ...]:
    """A fixture may ask for another target with a `// target-env: vulkan1.3` line."""
    target = re.search(r"// target-env: (\S+)", src.read_text())
    flags = list(glslang.FLAGS)
    if target:
        flags[flags.index("--target-env") + 1] = target.group(1)
    return tuple(flags)


def compile_fixture(src: Path, out_dir: Path, defines: tuple = ()) -> Path:
    """Compile (.comp, with `defines` as (name, value) pairs) or assemble (.spvasm) one
    fixture into out_dir; returns the .spv."""
    out = out_dir / f"{src.stem}.spv"
    if src.suffix == ".spvasm":
        _assemble(src, out)
        return out
    compiler = glslang.find_compiler()
    argv = [compiler.path, *_fixture_flags(src), *[f"-D{k}={v}" for k, v in defines],
            f"-I{src.parent}", "-o", str(out), str(src)]
    proc = subprocess.run(argv, capture_output=True, text=True,
                          env={**os.environ, **compiler.env})
    assert proc.returncode == 0, proc.stdout
    return out


def _scalar_or_vec(t: str) -> tuple[str, int]:
    """(scalar name, component count) of a spirv-cross scalar/vector type name."""
    if t in _SCALARS:
        return t, 1
    m = re.fullmatch(r"(|i|u|b|d|f16|i64|u64|i16|u16|i8|u8)vec([234])", t)
    assert m, f"unknown spirv-cross type {t}"
    return _VEC_BASE[m.group(1)], int(m.group(2))


def _member_size(types: dict, mem: dict) -> int:
    if mem.get("array"):
        assert all(mem["array_size_is_literal"]), mem
        return mem["array"][-1] * mem["array_stride"]  # outermost dimension is last
    t = mem["type"]
    if mem.get("physical_pointer"):
        return 8  # a buffer_reference pointer; `type` names its pointee block
    if t.startswith("_"):
        return _struct_size(types, t)
    m = re.fullmatch(r"(|d|f16)mat(\d)(?:x(\d))?", t)
    if m:
        cols, rows = int(m.group(2)), int(m.group(3) or m.group(2))
        return mem["matrix_stride"] * (rows if mem.get("row_major") else cols)
    scalar, n = _scalar_or_vec(t)
    return n * _SCALARS[scalar][1]


def _member_type(mem: dict) -> str:
    """Our push-constant `type` for a spirv-cross member."""
    if mem.get("array"):
        return "array"
    if mem.get("physical_pointer"):
        return "pointer"
    t = mem["type"]
    if t.startswith("_"):
        return "struct"
    if re.fullmatch(r"(|d|f16)mat\d(x\d)?", t):
        return "matrix"
    scalar, n = _scalar_or_vec(t)
    return _SCALARS[scalar][0] if n == 1 else "vector"


def _struct_size(types: dict, type_key: str) -> int:
    return max((m["offset"] + _member_size(types, m) for m in types[type_key]["members"]),
               default=0)


def _same_value(theirs, mine, type_: str) -> bool:
    """A spirv-cross default value equals ours (bools stay bools, floats to 1e-6)."""
    if type_ == "bool":
        return bool(theirs) == mine and isinstance(mine, bool)
    if type_.startswith("float"):
        return math.isclose(theirs, mine, rel_tol=1e-6, abs_tol=0)
    return theirs == mine


def spirv_cross(spv: Path) -> dict:
    out = subprocess.run([SPIRV_CROSS, str(spv), "--reflect"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def words_of(spv_bytes: bytes) -> list[int]:
    """The module's words in either byte order (spec 2.3: the magic number tells which)."""
    order = "<" if spv_bytes[:4] == bytes.fromhex("03022307") else ">"
    return list(struct.unpack(f"{order}{len(spv_bytes) // 4}I", spv_bytes))


def byte_swapped(spv_bytes: bytes) -> bytes:
    """The same module with every 32-bit word stored in the other byte order."""
    n = len(spv_bytes) // 4
    return struct.pack(f">{n}I", *struct.unpack(f"<{n}I", spv_bytes))


def _is_local_size_id(meta_spv: bytes) -> bool:
    # OpExecutionModeId (opcode 331) with LocalSizeId (38)
    words = words_of(meta_spv)
    return any(words[i] & 0xFFFF == 331 and words[i + 2] == 38 for i in range(5, len(words) - 2))


def differences(spv: Path, ours: dict) -> list[str]:
    """Where `ours` (reflect() output) disagrees with spirv-cross on `spv`; [] if nowhere."""
    sc = spirv_cross(spv)
    diffs = []
    # Descriptors: group spirv-cross's per-declaration entries by (set, binding).
    theirs: dict[tuple[int, int], list[tuple[str, dict]]] = {}
    for key, kind in _DESCRIPTOR_KEYS.items():
        for r in sc.get(key, []):
            texel = "storage_texel_buffer" if key == "images" else "uniform_texel_buffer"
            kind_r = texel if r["type"].endswith("Buffer") else kind  # imageBuffer, ...
            theirs.setdefault((r["set"], r["binding"]), []).append((kind_r, r))
    mine = {(b["set"], b["binding"]): b for b in ours["bindings"]}
    if set(theirs) != set(mine):
        diffs.append(f"bindings: spirv-cross {sorted(theirs)} ours {sorted(mine)}")
    for key in set(theirs) & set(mine):
        b, decls = mine[key], theirs[key]
        kinds = {k for k, _ in decls}
        if kinds != {b["descriptor_type"]}:
            diffs.append(f"{key}: descriptor type {kinds} vs {b['descriptor_type']}")
        counts = {(r.get("array") or [1])[0] for _, r in decls}
        if counts != {b["count"]}:
            diffs.append(f"{key}: count {counts} vs {b['count']}")
        if b["descriptor_type"] in ("storage_buffer", "storage_image"):
            writable = any(not r.get("readonly", False) for _, r in decls)
            readable = any(not r.get("writeonly", False) for _, r in decls)
            if (writable, readable) != (b["writable"], b["readable"]):
                diffs.append(f"{key}: writable/readable {(writable, readable)} vs "
                             f"{(b['writable'], b['readable'])}")
    ssbo0 = {bn for (s, bn), d in theirs.items() if s == 0 and d[0][0] == "storage_buffer"}
    if len(ssbo0) != ours["binding_count"]:
        diffs.append(f"binding_count {len(ssbo0)} vs {ours['binding_count']}")
    mask = sum(1 << bn for bn in ssbo0
               if any(not r.get("readonly", False) for _, r in theirs[(0, bn)]))
    if mask != ours["writable_mask"]:
        diffs.append(f"writable_mask {mask} vs {ours['writable_mask']}")
    # Spec constants (deviation: a SpecId on several constants is listed once per constant;
    # we list it once, with `defaults` when their defaults differ).
    all_specs: dict[int, list[dict]] = {}
    for s in sc.get("specialization_constants", []):
        all_specs.setdefault(s["id"], []).append(s)
    specs = {sid: same_id[0] for sid, same_id in all_specs.items()}
    mine_specs = {s["id"]: s for s in ours["spec_ids"]}
    if set(specs) != set(mine_specs):
        diffs.append(f"spec ids {sorted(specs)} vs {sorted(mine_specs)}")
    for sid in set(specs) & set(mine_specs):
        d = mine_specs[sid]
        types = {_SCALARS[t["type"]][0] for t in all_specs[sid]}
        if types != {d["type"]}:
            diffs.append(f"spec {sid}: type {sorted(types)} vs {d['type']}")
        if "default_value" not in specs[sid]:
            # deviation: this spirv-cross prints no default for 16- and 64-bit constants
            assert d["type"][-2:] in ("16", "64"), specs[sid]
            if "defaults" in d:
                diffs.append(f"spec {sid}: defaults {d['defaults']} not checkable")
            continue
        theirs_defaults = []  # distinct, named constants first, then in module order
        for t in sorted(all_specs[sid], key=lambda t: not t["name"]):
            if not any(_same_value(t["default_value"], v, d["type"]) for v in theirs_defaults):
                theirs_defaults.append(t["default_value"])
        mine_defaults = d.get("defaults", [d["default"]])
        if "defaults" in d and len(d["defaults"]) < 2:
            diffs.append(f"spec {sid}: `defaults` {d['defaults']} without a conflict")
        if len(theirs_defaults) != len(mine_defaults) or not all(
                _same_value(t, v, d["type"]) for t, v in zip(theirs_defaults, mine_defaults)):
            diffs.append(f"spec {sid}: defaults {theirs_defaults} vs {mine_defaults}")
        if not _same_value(theirs_defaults[0], d["default"], d["type"]):
            diffs.append(f"spec {sid}: default {theirs_defaults[0]} vs {d['default']}")
    # Workgroup size.
    ep = sc["entryPoints"][0]
    local_size_id = _is_local_size_id(spv.read_bytes())
    for dim in range(3):
        value, is_spec = ep["workgroup_size"][dim], ep["workgroup_size_is_spec_constant_id"][dim]
        sid = ours["local_size_spec_ids"][dim]
        if is_spec:
            # deviation: spirv-cross does not say which constant of a shared SpecId builds the
            # workgroup size; glslang leaves that one (local_size_x_id) unnamed.
            same_id = all_specs.get(value, [])
            wg = {t["default_value"] for t in same_id if not t["name"]} if len(same_id) > 1 \
                else {t["default_value"] for t in same_id}
            if sid != value:
                diffs.append(f"local_size dim {dim}: spec id {value} vs {sid}")
            elif len(wg) != 1:
                diffs.append(f"local_size dim {dim}: SpecId {value}'s unnamed constants have "
                             f"defaults {sorted(wg)}; which one sizes the workgroup is unknown")
            elif wg != {ours["local_size"][dim]}:
                diffs.append(f"local_size dim {dim}: default {wg.pop()} "
                             f"vs {ours['local_size'][dim]}")
        elif sid is not None:
            diffs.append(f"local_size dim {dim}: not a spec constant for spirv-cross, ours {sid}")
        elif local_size_id and value == 0:
            pass  # deviation: spirv-cross reports LocalSizeId literal dimensions as 0
        elif value != ours["local_size"][dim]:
            diffs.append(f"local_size dim {dim}: {value} vs {ours['local_size'][dim]}")
    # Push constants: spirv-cross gives members only; size = max(offset + size), rounded to 4.
    pcs = sc.get("push_constants", [])
    size = (_struct_size(sc["types"], pcs[0]["type"]) + 3) // 4 * 4 if pcs else 0
    if size != ours["push_constant_size"]:
        diffs.append(f"push_constant_size {size} vs {ours['push_constant_size']}")
    # Members: name, offset and size of each, in declaration order.
    members = sc["types"][pcs[0]["type"]]["members"] if pcs else []
    theirs = [(m["name"], m["offset"], _member_size(sc["types"], m), _member_type(m))
              for m in members]
    mine = [(p["name"], p["offset"], p["size"], p["type"]) for p in ours["push_constants"]]
    if theirs != mine:
        diffs.append(f"push_constants: spirv-cross {theirs} ours {mine}")
    return diffs


def _fixture_sources() -> list[Path]:
    return sorted(p for p in FIXTURES.glob("*") if p.suffix in (".comp", ".spvasm")
                  and not p.name.startswith("refused_"))


@pytest.mark.parametrize("src", _fixture_sources(), ids=lambda p: p.name)
def test_fixture_matches_spirv_cross(src: Path, tmp_path: Path):
    spv = compile_fixture(src, tmp_path)
    assert differences(spv, reflect(spv.read_bytes(), src.stem)) == []


# Debian bookworm's spirv-cross (2021.01.15) predates SPV_KHR_cooperative_matrix (2023) and
# throws on its instructions ("Currently no block to insert opcode"). A module declaring
# CooperativeMatrixKHR (matmul_coop_*) is compared instead with the sibling that has its
# interface by construction (matmul_tiled_* of the same weight type: the same bindings and
# push constants, which spirv-cross checks there), and its capabilities and spec constants
# with what the shader declares.
CROSS_UNREADABLE = "CooperativeMatrixKHR"
COOP_SPEC = ["", "TM", "TN", "TK", "BM", "BN", "SG_M", "SG_N", "SG_K", "NBUF", "DEPTH"]


def coop_differences(module: str, ours: dict, sibling: dict) -> list[str]:
    """What differs between matmul_coop_<type>'s reflection `ours` and its sibling
    matmul_tiled_<type>'s (`sibling`), plus the capabilities and SpecIds it must declare."""
    assert module.startswith("matmul_coop_"), module
    # matmul_coop's push constants are the sibling's, then y_row0 and n_splits (the split
    # across workgroups, matmul_coop.comp); its GLU build (matmul_coop_glu_<type>) also
    # reads up's weights at binding 3, as the sibling's W at 0, and has spec id 11, GELU
    size = sibling["push_constant_size"]
    want = {**sibling, "push_constant_size": size + 8, "push_constants": [
        *sibling["push_constants"],
        {"name": "y_row0", "offset": size, "size": 4, "type": "uint32"},
        {"name": "n_splits", "offset": size + 4, "size": 4, "type": "uint32"}]}
    spec = COOP_SPEC
    if module.startswith("matmul_coop_glu_"):
        w = sibling["bindings"][0]
        up = {**w, "binding": 3, "names": sorted(f"{n}_up" for n in w["names"])}
        want.update(bindings=[*sibling["bindings"], up],
                    binding_count=sibling["binding_count"] + 1)
        spec = [*COOP_SPEC, "GELU"]
    diffs = [f"{k}: ours {ours[k]} sibling (+ y_row0, n_splits) {want[k]}"
             for k in ("bindings", "push_constants", "push_constant_size", "binding_count",
                       "writable_mask") if ours[k] != want[k]]
    if not {"CooperativeMatrixKHR", "Float16", "VulkanMemoryModel"} <= set(ours["capabilities"]):
        diffs.append(f"capabilities {ours['capabilities']}")
    if ([sc["name"] for sc in ours["spec_ids"]] != spec
            or ours["local_size_spec_ids"] != [0, None, None]):
        diffs.append(f"spec_ids {ours['spec_ids']}")
    return diffs


def coop_sibling(module: str) -> str:
    """matmul_coop_<type>'s and matmul_coop_glu_<type>'s sibling: matmul_tiled_<type>."""
    return re.sub(r"matmul_coop_(glu_)?", "matmul_tiled_", module, count=1)


@pytest.mark.parametrize("src", discover(DEFAULT_GLSL_DIR), ids=lambda s: s.module)
def test_package_shader_matches_spirv_cross(src, tmp_path: Path):
    spv = compile_fixture(src.path, tmp_path, src.defines)
    ours = reflect(spv.read_bytes(), src.module)
    if CROSS_UNREADABLE in ours.get("capabilities", ()):
        sibling = coop_sibling(src.module)
        sib = next(s for s in discover(DEFAULT_GLSL_DIR) if s.module == sibling)
        sib_spv = compile_fixture(sib.path, tmp_path, sib.defines)
        assert coop_differences(src.module, ours, reflect(sib_spv.read_bytes(), sibling)) == []
        return
    assert differences(spv, ours) == []


def test_coop_comparison_can_fail():
    """coop_differences notices a GLU build's up weights missing or renamed, its GELU spec
    id missing, and a plain build given the GLU build's interface."""
    doc = metadata.read_document()["modules"]
    glu, sib = doc["matmul_coop_glu_q4_1"], doc["matmul_tiled_q4_1"]
    assert coop_differences("matmul_coop_glu_q4_1", glu, sib) == []
    no_up = {**glu, "bindings": glu["bindings"][:3], "binding_count": 3}
    renamed = {**glu, "bindings": [*glu["bindings"][:3], {**glu["bindings"][3], "names": ["Wt"]}]}
    no_gelu = {**glu, "spec_ids": glu["spec_ids"][:-1]}
    for wrong in (no_up, renamed, no_gelu):
        assert coop_differences("matmul_coop_glu_q4_1", wrong, sib) != []
    assert coop_differences("matmul_coop_q4_1", glu, sib) != []


def test_committed_modules_match_spirv_cross():
    """Every module of the committed vkrt/spirv: its metadata equals a fresh reflection of
    its .spv, and that reflection agrees with spirv-cross. Fails if the tree is missing."""
    doc = metadata.read_document()
    assert doc["modules"], "vkrt/spirv/modules.json lists no module"
    for name, committed in sorted(doc["modules"].items()):
        spv = metadata.DEFAULT_SPIRV_DIR / f"{name}.spv"
        ours = reflect(spv.read_bytes(), name)
        assert {k: committed[k] for k in ours} == ours, name
        if CROSS_UNREADABLE in ours.get("capabilities", ()):
            sibling = coop_sibling(name)
            assert coop_differences(name, ours, doc["modules"][sibling]) == [], name
            continue
        assert differences(spv, ours) == [], name


def test_comparison_can_fail(tmp_path: Path):
    """The comparator itself notices a wrong answer in each field it checks."""
    spv = compile_fixture(FIXTURES / "aliased.comp", tmp_path)
    good = reflect(spv.read_bytes(), "aliased")
    mutations = {
        "writable": lambda m: m["bindings"][0].update(writable=True),
        "binding": lambda m: m["bindings"][0].update(binding=7),
        "count": lambda m: m["bindings"][0].update(count=2),
        "binding_count": lambda m: m.update(binding_count=3),
        "writable_mask": lambda m: m.update(writable_mask=3),
        "spec default": lambda m: m["spec_ids"][1].update(default=3),
        "spec type": lambda m: m["spec_ids"][1].update(type="uint32"),
        "spec id": lambda m: m["spec_ids"][1].update(id=9),
        "local_size spec id": lambda m: m.update(local_size_spec_ids=[None, None, None]),
        "push size": lambda m: m.update(push_constant_size=12),
        "push member offset": lambda m: m["push_constants"][0].update(offset=4),
        "push member name": lambda m: m["push_constants"][0].update(name="other"),
    }
    for what, mutate in mutations.items():
        bad = json.loads(json.dumps(good))
        mutate(bad)
        assert differences(spv, bad), what


@pytest.mark.parametrize("fixture, what, mutate", [
    ("spec_idiom", "defaults dropped", lambda m: m["spec_ids"][0].pop("defaults")),
    ("spec_idiom", "defaults reordered", lambda m: m["spec_ids"][0].update(defaults=[1, 32])),
    ("spec_idiom", "default not the named one", lambda m: m["spec_ids"][0].update(default=1)),
    ("spec_idiom", "workgroup default of BLOCK_SIZE", lambda m: m.update(local_size=[32, 1, 1])),
    ("wg_default", "defaults without conflict", lambda m: m["spec_ids"][0].update(defaults=[64])),
    ("push_pointer", "pointer type", lambda m: m["push_constants"][0].update(type="uint64")),
    ("push_pointer", "pointer size", lambda m: m["push_constants"][0].update(size=4)),
])
def test_comparison_can_fail_on_new_fields(fixture, what, mutate, tmp_path: Path):
    """The comparator notices wrong `defaults`, workgroup defaults and pointer members."""
    src = FIXTURES / f"{fixture}.comp"
    spv = compile_fixture(src, tmp_path)
    good = reflect(spv.read_bytes(), fixture)
    assert differences(spv, good) == []
    bad = json.loads(json.dumps(good))
    mutate(bad)
    assert differences(spv, bad), what
