"""A compile cache so that `gen-spirv` recompiles only the modules whose inputs changed.

A module's entries are keyed by everything that decides glslang's output except the included
files: compiler version and path, flags, include directory, source path and bytes, and
defines. Each stores the SPIR-V bytes plus the sha256 of every file glslang read (from its
`--depfile`), so editing an included `.glsl` invalidates exactly the modules that include it.
A module keeps one entry per version of its included files (`<key>/<digest>.json`, the
digest of the files' paths and sha256s; `<key>/deps.json` lists the paths): an edit undone
hits again (the mutation gate, tests/mutations.py, edits `weights.glsl` and
undoes it once per mutation). A hit is re-verified (dependency hashes, SPIR-V sha256)
before use; anything unreadable is a miss.

Default location: `$XDG_CACHE_HOME/vkrt/gen-spirv` (else `~/.cache/vkrt/gen-spirv`), outside any
checkout; `gen-spirv --cache-dir D` or `--no-cache` override it. Entries are written
atomically (temp file + os.replace), so concurrent runs and interrupted runs are safe.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from pathlib import Path

from vkrt.gen import compile as glslang


def default_dir() -> Path:
    """`$XDG_CACHE_HOME/vkrt/gen-spirv`, or `~/.cache/vkrt/gen-spirv` (XDG base-dir spec)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vkrt" / "gen-spirv"


def _sha256_file(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _key(compiler: glslang.Compiler, source: glslang.Source, include_dir: Path) -> str:
    text = json.dumps({"version": compiler.version, "compiler": compiler.path,
                       "flags": glslang.FLAGS, "include": str(include_dir),
                       "source": str(source.path), "defines": source.defines,
                       "bytes": _sha256_file(str(source.path))})
    return hashlib.sha256(text.encode()).hexdigest()


def _digest(deps: dict[str, str | None]) -> str:
    """An entry's file name: the sha256 (32 hex digits) of its files' paths and sha256s."""
    return hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()[:32]


def parse_depfile(text: str) -> list[str]:
    """Paths listed after the target in a make-style depfile (`\\ ` escapes a space)."""
    body = text.split(": ", 1)[1] if ": " in text else ""
    body = body.replace("\\\n", " ")
    paths, cur, i = [], "", 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and body[i + 1] == " ":
            cur, i = cur + " ", i + 2
            continue
        if c.isspace():
            if cur:
                paths.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    return paths + ([cur] if cur else [])


class Cache:
    """Compile through the cache in `root` (None: no cache, always compile)."""

    def __init__(self, root: Path | None):
        self.root = Path(root) if root is not None else None
        self.hits = 0

    def _lookup(self, entry: Path) -> bytes | None:
        try:
            doc = json.loads(entry.read_text())
            spirv = base64.b64decode(doc["spirv"])
            if hashlib.sha256(spirv).hexdigest() != doc["sha256"]:
                return None
            if all(_sha256_file(p) == h for p, h in doc["deps"].items()):
                return spirv
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def compile(self, compiler: glslang.Compiler, source: glslang.Source,
                include_dir: Path) -> bytes:
        """SPIR-V of `source`, from the cache when every input is unchanged.

        Raises:
            CompileError: as compile.compile_source (failures are never cached).
        """
        if self.root is None:
            return glslang.compile_source(compiler, source, include_dir)
        folder = self.root / _key(compiler, source, include_dir)
        try:    # the files the module read last time: today's bytes name the entry to try
            last = json.loads((folder / "deps.json").read_text())
            entry = folder / f"{_digest({p: _sha256_file(p) for p in last})}.json"
        except (OSError, ValueError, TypeError):
            entry = None
        hit = self._lookup(entry) if entry is not None else None
        if hit is not None:
            self.hits += 1
            return hit
        # Hash the include directory before compiling: a file edited during the compile then
        # makes the entry miss next time instead of pairing new bytes with old SPIR-V.
        before = {str(p): _sha256_file(str(p)) for p in Path(include_dir).iterdir()
                  if p.is_file()}
        with tempfile.TemporaryDirectory(prefix="gen-spirv-dep-") as tmp:
            depfile = Path(tmp) / "deps.d"
            spirv = glslang.compile_source(compiler, source, include_dir, depfile)
            deps = parse_depfile(depfile.read_text()) if depfile.exists() else []
        paths = [str(source.path), *deps]
        doc = {"deps": {p: before[p] if p in before else _sha256_file(p) for p in paths},
               "sha256": hashlib.sha256(spirv).hexdigest(),
               "spirv": base64.b64encode(spirv).decode()}
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in ((f"{_digest(doc['deps'])}.json", doc), ("deps.json", paths)):
                fd, tmp_name = tempfile.mkstemp(dir=folder, suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f)
                os.replace(tmp_name, folder / name)
        except OSError:
            pass  # an unwritable cache only costs speed
        return spirv
