"""Each shape the reflection supports or refuses, as a fixture in tests/gen_fixtures with its
expected metadata written out in `<name>.expected.json` (sha256 left out: it is checked
against the bytes instead). `refused_*` fixtures expect `{"refused": "<message>"}`, a message
in words: it may show no opcode and no type id.

The expected files are `gen-spirv --reflect` output (less `sha256`, `source`, `defines`); what
justifies them is test_gen_reflect.py, which compares every accepted fixture with spirv-cross.

Fixtures and what they pin down:
- access.comp: readonly, writeonly, readonly writeonly, plain, restrict, coherent, volatile,
  per-member readonly (some members: writable; all members: read-only).
- var_decorations.spvasm: NonWritable/NonReadable on the variable; an alias pair where one
  declaration is NonWritable and the other is not (writable).
- aliased.comp: two blocks on one binding (counted once, writable if any alias is), includes.
- buffer_shapes.comp: array of 4 buffers (count 4), runtime array of buffers (count 0),
  structs in blocks.
- descriptors.comp: set 1, uniform buffer, storage images (readonly/writeonly/array), sampler,
  sampled image, combined image sampler, storage/uniform texel buffers.
- unused.comp: a declared-but-unused buffer is reported like a used one (writable, counted).
- spec_types.comp: bool/int/uint/float of 16/32/64 bits, negative and extreme defaults, ids out
  of order, composites and expressions (not listed).
- workgroup_spec_v12.comp / _v13.comp: local_size_x_id/z_id through the WorkgroupSize builtin
  (SPIR-V 1.5) and through LocalSizeId (1.6), with a SpecId emitted twice.
- wg_default.comp: local_size_x = 64 with local_size_x_id: default 64.
- push_layout.comp: push constants starting at offset 16 with an array, a column-major and a
  row-major matrix and a nested struct: 116 bytes; push_row_major.comp (48: a row-major
  matrix last is rows x MatrixStride) and push_array_tail.comp (80: arrays of mat2 and vec4
  sized by ArrayStride).
- spec_idiom.comp / spec_idiom_v13.comp: llama.cpp's `layout(constant_id = 0) const uint
  BLOCK_SIZE = 32` with `local_size_x_id = 0` (SPIR-V 1.5 and 1.6): one entry with
  `defaults` [32, 1], `default` 32, and `local_size` [1, 1, 1], the real unspecialized width.
- push_pointer.comp: GL_EXT_buffer_reference pointers in push constants: one (`pointer`,
  8 bytes), one inside a struct, an array of two.
- refused_*: two entry points, no compute entry point, a buffer without Binding; a SpecId on
  an int32 and a uint32 constant; an acceleration structure descriptor; a 2 x 3 array of
  buffers ("array of arrays of descriptors"); a push-constant pointer to Workgroup storage.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from test_gen_reflect import FIXTURES, compile_fixture
from vkrt.errors import ReflectionError, ShaderInterfaceError
from vkrt.gen.cli import main
from vkrt.gen.metadata import SpecConstant
from vkrt.gen.reflect import reflect

SOURCES = sorted(p for p in FIXTURES.iterdir() if p.suffix in (".comp", ".spvasm"))


def test_every_fixture_has_expectations():
    missing = [p.name for p in SOURCES if not (FIXTURES / f"{p.stem}.expected.json").exists()]
    assert missing == []


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_fixture_metadata(src: Path, tmp_path: Path):
    expected = json.loads((FIXTURES / f"{src.stem}.expected.json").read_text())
    data = compile_fixture(src, tmp_path).read_bytes()
    if "refused" in expected:
        with pytest.raises(ReflectionError) as err:
            reflect(data, src.stem)
        assert str(err.value) == expected["refused"]
        assert "\n" not in str(err.value)
        assert not re.search(r"opcode|type id|\bid \d", str(err.value)), "not in words"
        return
    got = reflect(data, src.stem)
    assert got.pop("sha256") == hashlib.sha256(data).hexdigest()
    assert sorted(got) == sorted(expected)
    for key in expected:  # key by key, so a failure names the field
        assert got[key] == expected[key], key
    # Defaults keep their JSON type: bools stay bools, floats stay floats.
    for spec, want in zip(got["spec_ids"], expected["spec_ids"]):
        assert type(spec["default"]) is type(want["default"]), spec


@pytest.mark.parametrize("name, binding", [
    ("descriptors", "descriptors: set 0 binding 1 is uniform_buffer x1"),
    ("buffer_shapes", "buffer_shapes: set 0 binding 1 is storage_buffer x4"),
])
def test_gen_spirv_refuses_what_the_runtime_cannot_bind(name, binding, tmp_path, capsys):
    glsl = tmp_path / "glsl"
    glsl.mkdir()
    shutil.copy(FIXTURES / f"{name}.comp", glsl)
    out = tmp_path / "spirv"
    assert main(["--glsl-dir", str(glsl), "--spirv-dir", str(out), "--no-cache"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gen-spirv: {binding}; the runtime binds only single storage buffers "
                   f"in set 0"]
    assert not out.exists()


def _fake_device():
    """Enough of a Device for Pipeline to fail before it creates any Vulkan object."""
    return SimpleNamespace(handle=None, max_push_constants_size=128,
                           adopt=lambda p: None, release=lambda p: None)


def test_spec_idiom_must_be_specialized(tmp_path):
    """gen-spirv accepts the SpecId idiom; get_pipeline refuses to leave that SpecId
    unspecialized (one line: module, SpecId, both defaults) and sizes the workgroup from the
    value given, or from the workgroup's own default for an ordinary SpecId."""
    try:
        from vkrt.runtime import pipeline
    except OSError as e:  # `import vulkan` dlopens the Vulkan loader
        pytest.skip(f"no Vulkan loader: {e}")
    glsl = tmp_path / "glsl"
    glsl.mkdir()
    for name in ("spec_idiom.comp", "wg_default.comp"):
        shutil.copy(FIXTURES / name, glsl)
    out = tmp_path / "spirv"
    assert main(["--glsl-dir", str(glsl), "--spirv-dir", str(out), "--no-cache"]) == 0
    cache = pipeline.PipelineCache(_fake_device(), out)
    meta = cache.modules["spec_idiom"]
    assert meta.spec_constants == (SpecConstant(0, "BLOCK_SIZE", "uint32", 32, (32, 1)),)
    assert meta.local_size == (1, 1, 1) and meta.local_size_spec_ids == (0, None, None)
    assert cache.modules["wg_default"].spec_constants[0].defaults == ()
    with pytest.raises(ShaderInterfaceError) as err:
        cache.get_pipeline("spec_idiom")
    assert str(err.value) == (
        "spec_idiom: SpecId 0 (BLOCK_SIZE, workgroup size x) has defaults 32 and 1; "
        "specialize it explicitly, e.g. get_pipeline('spec_idiom', {0: 32})")
    for spec, width in (({"BLOCK_SIZE": 64}, 64), ({0: 16}, 16)):
        stub = SimpleNamespace(meta=meta, name=meta.name)
        assert [v for _, v in pipeline.Pipeline._specialize(stub, spec)] == [width]
        assert stub.local_size == (width, 1, 1)
    stub = SimpleNamespace(meta=cache.modules["wg_default"], name="wg_default")
    assert pipeline.Pipeline._specialize(stub, {}) == []
    assert stub.local_size == (64, 1, 1)
