"""`modules.json`: the committed metadata of every SPIR-V module, and its loader.

The runtime imports only this file of `vkrt.gen` (no glslang needed). `load_modules` reads
`<spirv_dir>/modules.json`, checks the schema version and the sha256 of every `.spv` it names,
and returns frozen `ModuleMeta` records. `render` produces the file's bytes: sorted keys,
indent 1, trailing newline, so equal metadata gives equal bytes.

Schema 2 (1 lacked `push_constants`):
    {"schema": 2,
     "compiler": {"name", "package", "version", "flags"},
     "modules": {"<module>": {"source", "defines", "sha256", "binding_count", "writable_mask",
                              "bindings", "spec_ids", "local_size", "local_size_spec_ids",
                              "push_constant_size", "push_constants"}}}
The per-module fields are documented in `reflect.py`. A `spec_ids` entry may carry an optional
`defaults` list (a SpecId whose constants disagree on their default), and a module optional
`signed_zero_inf_nan_preserve` and `capabilities` lists; a file without them loads as before,
so the schema stays 2.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from vkrt.errors import MetadataError

SCHEMA = 2
FILENAME = "modules.json"
DEFAULT_SPIRV_DIR: Path = Path(__file__).resolve().parent.parent / "spirv"


@dataclass(frozen=True)
class SpecConstant:
    """A specialization constant: SpecId `id`, GLSL `name` ("" if unnamed), scalar `type`
    (`bool`, `int32`, `uint32`, `float32`, 8/16/64-bit variants) and `default` value.

    `defaults`: () unless several constants carry this SpecId with different defaults (e.g.
    `const uint BLOCK_SIZE = 32` and `local_size_x_id` on one id: (32, 1)); then the runtime
    refuses to leave it unspecialized."""

    id: int
    name: str
    type: str
    default: int | float | bool
    defaults: tuple[int | float | bool, ...] = ()


@dataclass(frozen=True)
class Binding:
    """One descriptor binding; `count` is the array length (1 single, 0 runtime array);
    `writable` (`readable`) when any declaration aliased on it may be written (read): from the
    NonWritable / NonReadable decorations."""

    set: int
    binding: int
    descriptor_type: str
    count: int
    writable: bool
    readable: bool
    name: str


@dataclass(frozen=True)
class PushConstant:
    """One top-level member of the push-constant block: `name`, byte `offset` and `size`,
    `type` (a scalar type such as `uint32`/`float32`, or `vector`/`matrix`/`array`/`struct`)."""

    name: str
    offset: int
    size: int
    type: str


@dataclass(frozen=True)
class ModuleMeta:
    """What the runtime needs to build a pipeline for one module.

    `binding_count`: distinct set-0 storage-buffer bindings; `writable_mask`: bit b = binding b
    written; `local_size`: workgroup size defaults; `local_size_spec_ids`: SpecId overriding each
    dimension, or None; `push_constant_size`: bytes of push constants from offset 0;
    `push_constants`: the block's members by declaration order; `signed_zero_inf_nan_preserve`:
    float widths whose infinities and NaNs the module keeps (execution mode
    SignedZeroInfNanPreserve; the device must support each); `capabilities`: the SPIR-V
    capabilities it declares but Shader, by name (the device must support each that
    `Pipeline._check_device` knows).
    """

    name: str
    sha256: str
    binding_count: int
    writable_mask: int
    bindings: tuple[Binding, ...]
    spec_constants: tuple[SpecConstant, ...]
    local_size: tuple[int, int, int]
    local_size_spec_ids: tuple[int | None, int | None, int | None]
    push_constant_size: int
    push_constants: tuple[PushConstant, ...]
    signed_zero_inf_nan_preserve: tuple[int, ...] = ()
    capabilities: tuple[str, ...] = ()


def render(compiler: dict, modules: dict[str, dict]) -> bytes:
    """The bytes of `modules.json` for `compiler` info and per-module metadata dicts."""
    doc = {"schema": SCHEMA, "compiler": compiler, "modules": modules}
    return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()


def read_document(spirv_dir: Path = DEFAULT_SPIRV_DIR) -> dict:
    """Parse `modules.json` and check its schema version.

    Raises:
        MetadataError: the file is missing, not JSON, or of another schema.
    """
    path = Path(spirv_dir) / FILENAME
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise MetadataError(f"{path} is missing: run gen-spirv") from None
    except (OSError, ValueError) as e:
        raise MetadataError(f"{path} is unreadable: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise MetadataError(f"{path}: schema {found!r}, expected {SCHEMA}")
    if not isinstance(doc.get("modules"), dict):
        raise MetadataError(f"{path}: no 'modules' table")
    return doc


def _module(name: str, d: dict) -> ModuleMeta:
    return ModuleMeta(
        name=name, sha256=d["sha256"], binding_count=int(d["binding_count"]),
        writable_mask=int(d["writable_mask"]),
        bindings=tuple(Binding(b["set"], b["binding"], b["descriptor_type"], b["count"],
                               b["writable"], b["readable"], "/".join(b["names"]))
                       for b in d["bindings"]),
        spec_constants=tuple(SpecConstant(s["id"], s["name"], s["type"], s["default"],
                                          tuple(s.get("defaults", ())))
                             for s in d["spec_ids"]),
        local_size=tuple(d["local_size"]), local_size_spec_ids=tuple(d["local_size_spec_ids"]),
        push_constant_size=int(d["push_constant_size"]),
        push_constants=tuple(PushConstant(p["name"], p["offset"], p["size"], p["type"])
                             for p in d["push_constants"]),
        signed_zero_inf_nan_preserve=tuple(d.get("signed_zero_inf_nan_preserve", ())),
        capabilities=tuple(d.get("capabilities", ())))


def read_spirv(name: str, spirv_dir: Path = DEFAULT_SPIRV_DIR) -> bytes:
    """The bytes of `<spirv_dir>/<name>.spv`.

    Raises:
        MetadataError: the file is missing or unreadable.
    """
    path = Path(spirv_dir) / f"{name}.spv"
    try:
        return path.read_bytes()
    except OSError as e:
        raise MetadataError(f"{path}: cannot read SPIR-V module {name!r}: {e.strerror}") from None


def load_modules(spirv_dir: Path = DEFAULT_SPIRV_DIR) -> dict[str, ModuleMeta]:
    """Load every module's metadata from `<spirv_dir>/modules.json`, module name -> ModuleMeta.

    Reads each `.spv` once to check its sha256 (a few hundred KiB in all).

    Raises:
        MetadataError: missing or unreadable file, unknown schema, a malformed entry, or a
            `.spv` whose sha256 differs from the metadata (stale or edited by hand).
    """
    path = Path(spirv_dir) / FILENAME
    doc = read_document(spirv_dir)
    out = {}
    for name in sorted(doc["modules"]):
        try:
            meta = _module(name, doc["modules"][name])
        except (KeyError, TypeError, ValueError) as e:
            raise MetadataError(f"{path}: module {name!r} is malformed ({e!r})") from None
        digest = hashlib.sha256(read_spirv(name, spirv_dir)).hexdigest()
        if digest != meta.sha256:
            raise MetadataError(f"{Path(spirv_dir) / name}.spv: sha256 {digest[:12]}... does not "
                                f"match {FILENAME} ({meta.sha256[:12]}...): run gen-spirv")
        out[name] = meta
    return out
