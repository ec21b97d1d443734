"""Which modules a shader directory builds: every `.comp`, plus variants from `variants.json`.

Without a manifest every `<glsl-dir>/*.comp` is one module named after its stem, compiled
with no defines. `<glsl-dir>/variants.json` declares modules compiled from one source with
different `#define`s:

    {"matvec_q4_1": {"source": "matvec.comp", "defines": {"WEIGHT_Q4_1": 1}},
     "matvec_f32":  {"source": "matvec.comp", "defines": {"WEIGHT_F32": 1, "TILE": 4}}}

A `.comp` named as the source of any variant builds only its variants (declare one with
`"defines": {}` to keep the plain build); every other `.comp` is still one module named after
its stem. Define values are strings, integers or booleans (true -> 1, false -> 0) and are passed
as `-DNAME=VALUE`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from vkrt.errors import CompileError
from vkrt.gen.compile import Source

MANIFEST = "variants.json"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # define names
_MODULE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")  # module (= .spv file) names


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"key(s) {', '.join(dupes)} declared twice")
    return dict(pairs)


def _define_value(where: str, value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, str)) and "\n" not in str(value):
        return str(value)
    raise CompileError(f"{where}: define value {value!r} is not a string, integer or boolean")


def _variant(path: Path, glsl_dir: Path, module: str, spec: object) -> Source:
    where = f"{path}: variant {module!r}"
    if not _MODULE.match(module):
        raise CompileError(f"{where}: module names use only [A-Za-z0-9_.-]")
    if not isinstance(spec, dict) or set(spec) - {"source", "defines"} or "source" not in spec:
        raise CompileError(f"{where}: expected {{\"source\": \"x.comp\", \"defines\": {{...}}}}")
    source = glsl_dir / str(spec["source"])
    if source.suffix != ".comp" or source.parent != glsl_dir or not source.is_file():
        raise CompileError(f"{where}: source {spec['source']!r} is not a .comp file in {glsl_dir}")
    defines = spec.get("defines", {})
    if not isinstance(defines, dict):
        raise CompileError(f"{where}: 'defines' must be an object")
    for key in defines:
        if not _NAME.match(key):
            raise CompileError(f"{where}: define name {key!r} is not an identifier")
    items = tuple(sorted((k, _define_value(where, v)) for k, v in defines.items()))
    return Source(module, source.resolve(), items)


def discover(glsl_dir: Path) -> list[Source]:
    """The modules of `glsl_dir`, sorted by name.

    Raises:
        CompileError: `glsl_dir` is not a directory, or the manifest is malformed (bad JSON,
            unknown keys, missing source, bad define, or a module name used twice).
    """
    glsl_dir = Path(glsl_dir).resolve()
    if not glsl_dir.is_dir():
        raise CompileError(f"{glsl_dir}: no such shader directory")
    path = glsl_dir / MANIFEST
    variants: list[Source] = []
    if path.exists():
        try:
            doc = json.loads(path.read_text(), object_pairs_hook=_unique_keys)
        except (OSError, ValueError) as e:
            raise CompileError(f"{path}: unreadable manifest: {e}") from None
        if not isinstance(doc, dict):
            raise CompileError(f"{path}: expected an object of module name -> variant")
        variants = [_variant(path, glsl_dir, m, spec) for m, spec in doc.items()]
    with_variants = {v.path for v in variants}
    plain = [Source(p.stem, p) for p in sorted(glsl_dir.glob("*.comp"))
             if p.resolve() not in with_variants]
    names = [s.module for s in variants + plain]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise CompileError(f"{path}: module name(s) {', '.join(clash)} used twice (a variant "
                           f"named like another .comp's stem?)")
    for s in plain:
        if not _MODULE.match(s.module):
            raise CompileError(f"{s.path}: module name {s.module!r} has characters outside "
                               f"[A-Za-z0-9_.-]; rename the file")
    return sorted(variants + plain, key=lambda s: s.module)
