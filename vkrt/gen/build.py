"""Build, check and write the `vkrt/spirv` tree from `vkrt/glsl`.

`build` compiles and reflects every module in memory; `write` puts the result in place only
after everything succeeded; `check` compares a fresh build with what is on disk, byte for byte.
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vkrt.errors import CompileError, MetadataError, ReflectionError
from vkrt.gen import compile as glslang
from vkrt.gen import metadata, variants
from vkrt.gen.cache import Cache
from vkrt.gen.reflect import reflect

DEFAULT_GLSL_DIR: Path = Path(__file__).resolve().parent.parent / "glsl"

# What the runtime builds pipelines from: one descriptor set of single storage buffers.
# reflect() describes more; the package's own modules are held to this.
RUNTIME_DESCRIPTOR_TYPES = ("storage_buffer",)


@dataclass(frozen=True)
class Tree:
    """A built tree: module name -> SPIR-V bytes, and the bytes of `modules.json`."""

    spirv: dict[str, bytes]
    modules_json: bytes


def check_runtime_shape(module: str, meta: dict) -> None:
    """Refuse descriptors the runtime cannot bind (anything but single set-0 storage buffers).

    Raises:
        ReflectionError: naming the module and the offending binding.
    """
    for b in meta["bindings"]:
        if b["descriptor_type"] not in RUNTIME_DESCRIPTOR_TYPES or b["set"] != 0 or b["count"] != 1:
            raise ReflectionError(
                f"{module}: set {b['set']} binding {b['binding']} is {b['descriptor_type']} "
                f"x{b['count']}; the runtime binds only single storage buffers in set 0")


def compiler_info(compiler: glslang.Compiler) -> dict:
    return {"name": "glslangValidator", "package": glslang.PACKAGE,
            "version": compiler.version, "flags": list(glslang.FLAGS)}


def build(glsl_dir: Path = DEFAULT_GLSL_DIR, jobs: int | None = None,
          cache_dir: Path | None = None, only: list[str] | None = None,
          spirv_dir: Path = metadata.DEFAULT_SPIRV_DIR) -> Tree:
    """Compile and reflect every module of `glsl_dir` (see variants.py), in memory.

    `cache_dir`: compile cache (see cache.py); None compiles everything. `only`: module-name
    patterns (fnmatch, e.g. `matvec_q4_k`, `*_q6_k`): only the modules they match are
    compiled; every other module's SPIR-V and metadata are taken as `spirv_dir` has them.

    Raises:
        CompileError: compiler missing or of another version, bad variants manifest, a
            shader failed (every failing module is listed), or a pattern of `only` names no
            module.
        MetadataError: `only` is given and `spirv_dir` lacks a module it does not name.
        ReflectionError: a module has a shape reflect() or the runtime refuses.
    """
    glsl_dir = Path(glsl_dir).resolve()
    sources = variants.discover(glsl_dir)
    chosen = sources if only is None else _select(sources, only)
    compiler = glslang.find_compiler()
    spirv = glslang.compile_all(compiler, chosen, glsl_dir, jobs, Cache(cache_dir).compile)
    kept = {} if len(chosen) == len(sources) else metadata.read_document(spirv_dir)["modules"]
    modules = {}
    for s in sources:
        if s.module not in spirv:
            if s.module not in kept:
                raise MetadataError(f"{s.module}: not in {Path(spirv_dir) / metadata.FILENAME}"
                                    f"; run gen-spirv without module names")
            spirv[s.module] = metadata.read_spirv(s.module, spirv_dir)
            modules[s.module] = kept[s.module]
            continue
        meta = reflect(spirv[s.module], s.module)
        check_runtime_shape(s.module, meta)
        modules[s.module] = {"source": s.path.name, "defines": dict(s.defines), **meta}
    return Tree(spirv, metadata.render(compiler_info(compiler), modules))


def _select(sources: list[glslang.Source], patterns: list[str]) -> list[glslang.Source]:
    """The sources whose module name matches one of `patterns` (fnmatch).

    Raises:
        CompileError: a pattern matches no module (naming it).
    """
    names = [s.module for s in sources]
    for pattern in patterns:
        if not fnmatch.filter(names, pattern):
            raise CompileError(f"{pattern}: names no module (of {len(names)}, each named as its "
                               f".spv file)")
    return [s for s in sources if any(fnmatch.fnmatchcase(s.module, p) for p in patterns)]


def write(tree: Tree, spirv_dir: Path = metadata.DEFAULT_SPIRV_DIR) -> None:
    """Put `tree` in `spirv_dir` and delete `.spv` files of modules no longer built.

    Everything is first written to a temporary directory beside `spirv_dir`, then moved in
    with os.replace, `.spv` files first and `modules.json` last: an interrupted move leaves a
    sha256 mismatch that load_modules reports, never a silently inconsistent tree.
    """
    spirv_dir = Path(spirv_dir)
    spirv_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gen-spirv-", dir=spirv_dir.parent))
    try:
        for name, data in tree.spirv.items():
            (tmp / f"{name}.spv").write_bytes(data)
        (tmp / metadata.FILENAME).write_bytes(tree.modules_json)
        for name, data in tree.spirv.items():
            dest = spirv_dir / f"{name}.spv"
            if not dest.is_file() or dest.read_bytes() != data:
                os.replace(tmp / f"{name}.spv", dest)
        os.replace(tmp / metadata.FILENAME, spirv_dir / metadata.FILENAME)
        for old in spirv_dir.glob("*.spv"):
            if old.stem not in tree.spirv:
                old.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _field_diffs(old: dict, new: dict) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def check(tree: Tree, spirv_dir: Path = metadata.DEFAULT_SPIRV_DIR) -> list[str]:
    """Differences between a fresh `tree` and `spirv_dir`, one line each; [] when current.

    Each line names a module and what differs: missing, extra, SPIR-V bytes, or which
    metadata fields; or the compiler/schema/formatting of `modules.json`.
    """
    spirv_dir = Path(spirv_dir)
    new = json.loads(tree.modules_json)
    problems = []
    try:
        old = metadata.read_document(spirv_dir)
    except MetadataError as e:  # missing or unknown schema: nothing to compare
        return [str(e)]
    if old.get("compiler") != new["compiler"]:
        problems.append(f"modules.json: compiler differs ({old.get('compiler')} vs "
                        f"{new['compiler']})")
    on_disk = {p.stem for p in spirv_dir.glob("*.spv")}
    for name in sorted(set(new["modules"]) | set(old["modules"]) | on_disk):
        if name not in new["modules"]:
            places = [p for p, there in (("modules.json", name in old["modules"]),
                                         (f"{name}.spv", name in on_disk)) if there]
            problems.append(f"{name}: extra module (in {' and '.join(places)}, no source)")
            continue
        if name not in old["modules"] or name not in on_disk:
            where = "modules.json" if name not in old["modules"] else f"{name}.spv"
            problems.append(f"{name}: missing module (not in {where})")
            continue
        what = []
        if (spirv_dir / f"{name}.spv").read_bytes() != tree.spirv[name]:
            what.append("SPIR-V bytes differ")
        fields = _field_diffs(old["modules"][name], new["modules"][name])
        if fields:
            what.append(f"metadata fields differ: {', '.join(fields)}")
        if what:
            problems.append(f"{name}: stale ({'; '.join(what)})")
    if not problems and (spirv_dir / metadata.FILENAME).read_bytes() != tree.modules_json:
        problems.append("modules.json: same content, different bytes (edited by hand?)")
    return problems
