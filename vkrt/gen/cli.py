"""`gen-spirv`: compile `vkrt/glsl/*.comp` into `vkrt/spirv/` (`<module>.spv` + `modules.json`).

    gen-spirv                 rebuild and write; deletes .spv files of removed modules
    gen-spirv MODULE ...      compile only these modules (fnmatch patterns, e.g. '*_q4_k');
                              the others stay as --spirv-dir has them
    gen-spirv --check         rebuild in memory; exit 1 listing stale/missing/extra modules
    gen-spirv --reflect F.spv print one module's metadata as JSON
    --glsl-dir D, --spirv-dir O, -j N, --cache-dir D, --no-cache

Errors print one line per problem on stderr (no traceback) and exit 1; nothing is written.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vkrt.errors import VkrtError
from vkrt.gen import build, cache, metadata
from vkrt.gen.reflect import reflect


def _reflect_file(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise VkrtError(f"{path}: {e.strerror}") from None
    meta = {"source": None, "defines": {}, **reflect(data, path.stem)}
    return json.dumps(meta, sort_keys=True, indent=1)


def run(argv: list[str] | None = None) -> int:
    """Run gen-spirv with `argv`; returns the exit status. Raises VkrtError on failure."""
    p = argparse.ArgumentParser(prog="gen-spirv", description=__doc__.splitlines()[0])
    p.add_argument("modules", nargs="*", metavar="MODULE",
                   help="compile only the modules these fnmatch patterns name (e.g. "
                        "'matvec_q4_k', '*_q6_k'); the others are kept as --spirv-dir has them")
    p.add_argument("--glsl-dir", type=Path, default=build.DEFAULT_GLSL_DIR,
                   help="shader sources (default: %(default)s)")
    p.add_argument("--spirv-dir", type=Path, default=metadata.DEFAULT_SPIRV_DIR,
                   help="output directory (default: %(default)s)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless the output directory is byte-for-byte current")
    p.add_argument("--reflect", type=Path, metavar="FILE.spv",
                   help="print the metadata of one SPIR-V module and exit")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel compiles")
    p.add_argument("--cache-dir", type=Path, default=cache.default_dir(),
                   help="compile cache (default: %(default)s)")
    p.add_argument("--no-cache", action="store_true", help="recompile every module")
    args = p.parse_args(argv)
    if args.reflect:
        print(_reflect_file(args.reflect))
        return 0
    if args.check and args.modules:
        p.error("--check compares every module: give no MODULE names with it")
    tree = build.build(args.glsl_dir, args.jobs, None if args.no_cache else args.cache_dir,
                       args.modules or None, args.spirv_dir)
    if args.check:
        problems = build.check(tree, args.spirv_dir)
        for line in problems:
            print(f"gen-spirv --check: {line}", file=sys.stderr)
        if problems:
            print("gen-spirv --check: run gen-spirv and commit the result", file=sys.stderr)
        return 1 if problems else 0
    build.write(tree, args.spirv_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point: exit status 0 on success, 1 on any vkrt error (message on stderr)."""
    try:
        return run(argv)
    except VkrtError as e:
        for line in str(e).splitlines() or [type(e).__name__]:
            print(f"gen-spirv: {line}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
