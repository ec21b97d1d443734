"""Variants manifest (`variants.json`) and the incremental compile cache."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vkrt.errors import CompileError
from vkrt.gen import build, compile as glslang, variants
from vkrt.gen.cache import parse_depfile
from vkrt.gen.cli import main

KERNEL = """#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#ifndef WIDTH
#define WIDTH 32
#endif
layout(local_size_x = WIDTH) in;
layout(set = 0, binding = 0) buffer O { float o[]; };
void main() { o[gl_GlobalInvocationID.x] = sq(2.0); }
"""
PLAIN = """#version 450
layout(local_size_x = 16) in;
layout(set = 0, binding = 0) buffer O { float o[]; };
void main() { o[gl_GlobalInvocationID.x] = 1.0; }
"""


@pytest.fixture
def glsl(tmp_path: Path) -> Path:
    d = tmp_path / "glsl"
    d.mkdir()
    (d / "kernel.comp").write_text(KERNEL)
    (d / "plain.comp").write_text(PLAIN)
    (d / "common.glsl").write_text("float sq(float x) { return x * x; }\n")
    return d


@pytest.fixture
def compiles(monkeypatch) -> list[str]:
    """Names of the modules glslang actually compiled (cache misses)."""
    seen: list[str] = []
    real = glslang.compile_source

    def counting(compiler, source, include_dir, depfile=None):
        seen.append(source.module)
        return real(compiler, source, include_dir, depfile)
    monkeypatch.setattr(glslang, "compile_source", counting)
    return seen


def test_without_manifest_every_comp_is_a_module(glsl):
    assert [(s.module, s.path.name, s.defines) for s in variants.discover(glsl)] == [
        ("kernel", "kernel.comp", ()), ("plain", "plain.comp", ())]


def test_variants_are_modules_with_their_defines(glsl, tmp_path):
    (glsl / "variants.json").write_text(json.dumps({
        "kernel_w64": {"source": "kernel.comp", "defines": {"WIDTH": 64}},
        "kernel": {"source": "kernel.comp", "defines": {}},
        "kernel_flag": {"source": "kernel.comp", "defines": {"FLAG": True, "NAME": "x"}}}))
    out = tmp_path / "spirv"
    assert main(["--glsl-dir", str(glsl), "--spirv-dir", str(out), "--no-cache"]) == 0
    mods = json.loads((out / "modules.json").read_text())["modules"]
    assert sorted(mods) == ["kernel", "kernel_flag", "kernel_w64", "plain"]
    assert mods["kernel_w64"]["defines"] == {"WIDTH": "64"}
    assert mods["kernel_flag"]["defines"] == {"FLAG": "1", "NAME": "x"}
    assert mods["kernel_w64"]["source"] == "kernel.comp"
    assert mods["kernel_w64"]["local_size"] == [64, 1, 1]
    assert mods["kernel"]["local_size"] == [32, 1, 1]
    assert mods["kernel_w64"]["sha256"] != mods["kernel"]["sha256"]
    assert sorted(p.name for p in out.glob("*.spv")) == [
        "kernel.spv", "kernel_flag.spv", "kernel_w64.spv", "plain.spv"]


def test_source_with_variants_builds_only_its_variants(glsl):
    (glsl / "variants.json").write_text('{"k64": {"source": "kernel.comp", '
                                        '"defines": {"WIDTH": 64}}}')
    assert [s.module for s in variants.discover(glsl)] == ["k64", "plain"]


@pytest.mark.parametrize("manifest, message", [
    ("{not json", "unreadable manifest"),
    ('{"a": {"source": "nope.comp"}}', "source 'nope.comp' is not a .comp file"),
    ('{"a": {"source": "kernel.comp", "optimize": true}}', "expected {\"source\""),
    ('{"plain": {"source": "kernel.comp"}}', "module name(s) plain used twice"),
    ('{"a": {"source": "kernel.comp"}, "a": {"source": "plain.comp"}}', "a declared twice"),
    ('{"a": {"source": "kernel.comp", "defines": {"1X": 1}}}', "define name '1X'"),
    ('{"a": {"source": "kernel.comp", "defines": {"X": [1]}}}', "define value [1]"),
    ('{"a/b": {"source": "kernel.comp"}}', "module names use only"),
])
def test_bad_manifest_is_one_line_error(glsl, tmp_path, capsys, manifest, message):
    (glsl / "variants.json").write_text(manifest)
    with pytest.raises(CompileError, match=None) as err:
        variants.discover(glsl)
    assert message in str(err.value) and "\n" not in str(err.value)
    out = tmp_path / "spirv"
    assert main(["--glsl-dir", str(glsl), "--spirv-dir", str(out), "--no-cache"]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not out.exists()


def test_cache_recompiles_only_what_changed(glsl, tmp_path, compiles):
    cache = tmp_path / "cache"
    (glsl / "variants.json").write_text(json.dumps({
        "kernel": {"source": "kernel.comp"},
        "kernel_w64": {"source": "kernel.comp", "defines": {"WIDTH": 64}}}))
    uncached = build.build(glsl, cache_dir=None)
    compiles.clear()
    cold = build.build(glsl, cache_dir=cache)
    assert sorted(compiles) == ["kernel", "kernel_w64", "plain"] and cold == uncached
    compiles.clear()
    assert build.build(glsl, cache_dir=cache) == cold and compiles == []
    # Editing a source recompiles its modules only.
    (glsl / "plain.comp").write_text(PLAIN.replace("16", "8"))
    build.build(glsl, cache_dir=cache)
    assert compiles == ["plain"]
    # Editing an included file recompiles its includers only; undoing the edit, nothing.
    compiles.clear()
    common = (glsl / "common.glsl").read_text()
    (glsl / "common.glsl").write_text("float sq(float x) { return x * x * 1.0; }\n")
    edited = build.build(glsl, cache_dir=cache)
    assert sorted(compiles) == ["kernel", "kernel_w64"]
    compiles.clear()
    (glsl / "common.glsl").write_text(common)
    build.build(glsl, cache_dir=cache)
    assert compiles == []
    (glsl / "common.glsl").write_text("float sq(float x) { return x * x * 1.0; }\n")
    assert build.build(glsl, cache_dir=cache) == edited and compiles == []
    # Changing a variant's defines recompiles that variant only.
    compiles.clear()
    (glsl / "variants.json").write_text(json.dumps({
        "kernel": {"source": "kernel.comp"},
        "kernel_w64": {"source": "kernel.comp", "defines": {"WIDTH": 128}}}))
    warm = build.build(glsl, cache_dir=cache)
    assert compiles == ["kernel_w64"]
    assert warm == build.build(glsl, cache_dir=None)


def test_corrupt_cache_entry_is_a_miss(glsl, tmp_path, compiles):
    cache = tmp_path / "cache"
    good = build.build(glsl, cache_dir=cache)
    for entry in cache.glob("*/*.json"):
        if entry.name == "deps.json":       # the paths an entry's name is computed from
            continue
        doc = json.loads(entry.read_text())
        doc["spirv"] = doc["spirv"][:-8] + "AAAAAAAA"
        entry.write_text(json.dumps(doc))
    (cache / "junk.json").write_text("{")
    compiles.clear()
    assert build.build(glsl, cache_dir=cache) == good
    assert sorted(compiles) == ["kernel", "plain"]


def test_compiler_version_change_misses(glsl, tmp_path, compiles, monkeypatch):
    cache = tmp_path / "cache"
    build.build(glsl, cache_dir=cache)
    real = glslang.find_compiler()
    # Same binary reporting another version: keys differ, nothing is reused. (Running it
    # for real is refused before any compile: see test_unknown_compiler_version_refused.)
    monkeypatch.setattr(glslang, "find_compiler",
                        lambda: glslang.Compiler(real.path, real.env, "13.1.1-other"))
    compiles.clear()
    build.build(glsl, cache_dir=cache)
    assert sorted(compiles) == ["kernel", "plain"]


def test_parse_depfile():
    assert parse_depfile("/o/x.spv: /a b/k.comp /a\\ b/c.glsl \\\n /d/e.glsl\n") == [
        "/a", "b/k.comp", "/a b/c.glsl", "/d/e.glsl"]
