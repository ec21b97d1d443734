"""Property test: generate random compute shaders (seeded), compile them with the pinned
glslang, and check the reflection against what generated them (and against spirv-cross).

Random per shader: 1-6 bindings at random binding numbers, 1-3 aliased declarations each with
random access qualifiers and element types; 0-4 spec constants of random scalar types, ids and
defaults; a workgroup size whose dimensions are literals or spec constants; an optional
push-constant block of random scalars, vectors, column- and
row-major matrices and arrays of them (std430 offsets computed here).

Every shader is checked in both byte orders: the module as glslang writes it (little-endian)
and the same words stored big-endian (magic read as 0x03022307, spec 2.3). This spirv-cross
reads big-endian modules, so both files are compared against it; our two reflections must be
equal except `sha256` (the bytes differ), literal strings (block and member names) included.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

from test_gen_reflect import byte_swapped, differences
from vkrt.gen import compile as glslang
from vkrt.gen.reflect import reflect

SEED, SHADERS = 20261129, 24
QUALIFIERS = ["", "readonly", "writeonly", "readonly writeonly", "restrict", "coherent",
              "volatile", "restrict readonly", "coherent writeonly"]
ELEMENTS = ["float", "uint", "int", "vec4"]
# push-constant member type -> (std430 alignment, size in bytes, GLSL read expression suffix)
PUSH_TYPES = {"uint": (4, 4, ""), "float": (4, 4, ""), "vec2": (8, 8, ".x"),
              "vec4": (16, 16, ".x"), "mat4": (16, 64, "[0][0]"), "mat2x4": (16, 32, "[0][0]"),
              "layout(row_major) mat2x4": (8, 32, "[0][0]")}


@dataclass
class Shader:
    source: str = ""
    bindings: dict[int, list[str]] = field(default_factory=dict)  # binding -> qualifiers
    specs: list[dict] = field(default_factory=list)
    local_size: list[int] = field(default_factory=list)
    local_size_spec_ids: list[int | None] = field(default_factory=list)
    push_size: int = 0


def _spec(rng: random.Random, sid: int, i: int) -> tuple[str, dict]:
    kind = rng.choice(["bool", "int32", "uint32", "float32"])
    if kind == "bool":
        value = rng.random() < 0.5
        glsl = f"const bool S{i} = {'true' if value else 'false'};"
        use = f"(S{i} ? 1.0 : 0.0)"
    elif kind == "int32":
        value = rng.randint(-2**31, 2**31 - 1)
        glsl, use = f"const int S{i} = {value};", f"float(S{i})"
    elif kind == "uint32":
        value = rng.randint(0, 2**32 - 1)
        glsl, use = f"const uint S{i} = {value}u;", f"float(S{i})"
    else:
        value = rng.randint(-4000, 4000) / 8  # exactly representable
        glsl, use = f"const float S{i} = {value!r};", f"S{i}"
    return (f"layout(constant_id = {sid}) {glsl}\n", use), \
        {"id": sid, "name": f"S{i}", "type": kind, "default": value}


def generate(rng: random.Random) -> Shader:
    sh = Shader()
    decls, reads, writes = [], [], []
    for b in sorted(rng.sample(range(10), rng.randint(1, 6))):
        sh.bindings[b] = []
        for j in range(rng.randint(1, 3)):
            q, elem = rng.choice(QUALIFIERS), rng.choice(ELEMENTS)
            sh.bindings[b].append(q)
            name = f"d{b}_{j}"
            decls.append(f"layout(set = 0, binding = {b}) {q} buffer B{b}_{j} "
                         f"{{ {elem} {name}[]; }};\n")
            if "writeonly" not in q:
                reads.append(f"{name}[0].x" if elem == "vec4" else f"float({name}[0])")
            if "readonly" not in q:
                writes.append(f"{name}[1] = {elem}(acc);")
    ids = rng.sample(range(64), 7)
    for i in range(rng.randint(0, 4)):
        (glsl, use), expect = _spec(rng, ids[i], i)
        decls.append(glsl)
        reads.append(use)
        sh.specs.append(expect)
    layout = []
    for dim, axis in enumerate("xyz"):
        size = rng.choice([1, 2, 4, 8]) if dim else rng.choice([1, 16, 32, 64])
        sh.local_size.append(size)
        layout.append(f"local_size_{axis} = {size}")
        if rng.random() < 0.4:
            sid = ids[4 + dim]
            layout.append(f"local_size_{axis}_id = {sid}")
            sh.local_size_spec_ids.append(sid)
            sh.specs.append({"id": sid, "name": "", "type": "uint32", "default": size})
        else:
            sh.local_size_spec_ids.append(None)
    if rng.random() < 0.7:
        members, offset = [], rng.choice([0, 0, 16])
        for k in range(rng.randint(1, 5)):
            t = rng.choice(list(PUSH_TYPES))
            align, size, suffix = PUSH_TYPES[t]
            n = rng.choice([0, 0, 2, 3])
            offset = (offset + align - 1) // align * align
            explicit = f"layout(offset = {offset}) " if k == 0 else ""
            if explicit and t.startswith("layout"):
                explicit, t = "", f"layout(offset = {offset}, row_major) mat2x4"
            members.append(f"{explicit}{t} m{k}{f'[{n}]' if n else ''};")
            reads.append(f"float(pc.m{k}{'[0]' if n else ''}{suffix})")
            offset += size * (n or 1)
        sh.push_size = (offset + 3) // 4 * 4
        decls.append(f"layout(push_constant) uniform Push {{ {' '.join(members)} }} pc;\n")
    sh.source = (f"#version 450\nlayout({', '.join(layout)}) in;\n{''.join(decls)}"
                 f"void main() {{\n    float acc = 0.0{''.join(' + ' + r for r in reads)};\n"
                 f"    {' '.join(writes)}\n}}\n")
    sh.specs.sort(key=lambda s: s["id"])
    return sh


def test_reflection_matches_generator(tmp_path: Path):
    rng = random.Random(SEED)
    shaders = {f"gen{i:02d}": generate(rng) for i in range(SHADERS)}
    sources = []
    for name, sh in shaders.items():
        (tmp_path / f"{name}.comp").write_text(sh.source)
        sources.append(glslang.Source(name, tmp_path / f"{name}.comp"))
    spirv = glslang.compile_all(glslang.find_compiler(), sources, tmp_path)
    seen_aliases = seen_readonly = seen_spec_dims = 0
    for name, sh in shaders.items():
        got = reflect(spirv[name], name)
        want_bindings = [
            {"set": 0, "binding": b, "descriptor_type": "storage_buffer", "count": 1,
             "writable": any("readonly" not in q for q in qs),
             "readable": any("writeonly" not in q for q in qs),
             "names": [f"B{b}_{j}" for j in range(len(qs))]}
            for b, qs in sorted(sh.bindings.items())]
        assert got["bindings"] == want_bindings, (name, sh.source)
        assert got["binding_count"] == len(sh.bindings), name
        assert got["writable_mask"] == sum(1 << b["binding"] for b in want_bindings
                                           if b["writable"]), name
        assert got["spec_ids"] == sh.specs, (name, sh.source)
        assert got["local_size"] == sh.local_size, name
        assert got["local_size_spec_ids"] == sh.local_size_spec_ids, name
        assert got["push_constant_size"] == sh.push_size, (name, sh.source)
        spv = tmp_path / f"{name}.spv"
        spv.write_bytes(spirv[name])
        assert differences(spv, got) == [], name
        # The same module stored big-endian: same reflection (names included) but sha256,
        # and spirv-cross (which reads either byte order) agrees with it too.
        be = tmp_path / f"{name}_be.spv"
        be.write_bytes(byte_swapped(spirv[name]))
        got_be = reflect(be.read_bytes(), name)
        assert got_be.pop("sha256") == hashlib.sha256(be.read_bytes()).hexdigest()
        assert got_be == {k: v for k, v in got.items() if k != "sha256"}, name
        assert differences(be, got_be) == [], name
        seen_aliases += any(len(qs) > 1 for qs in sh.bindings.values())
        seen_readonly += any(not b["writable"] for b in want_bindings)
        seen_spec_dims += any(s is not None for s in sh.local_size_spec_ids)
    # The seed must exercise the interesting cases, or the test proves little.
    assert min(seen_aliases, seen_readonly, seen_spec_dims) >= 3
