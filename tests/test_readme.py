"""README.md as a user reads it: its Python blocks run verbatim from another directory, and
its commands name options and files that exist."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, re.S | re.M)


def test_readme_has_python_and_shell_blocks():
    assert blocks("python") and blocks("sh")


@pytest.mark.parametrize("code", blocks("python"))
def test_python_block_runs(tmp_path, code):
    # From an empty temporary directory, with this tree's vkrt first on the path.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-"], input=code, cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip(), "the example prints nothing"


def _commands() -> list[list[str]]:
    cmds = []
    for block in blocks("sh"):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line:
                cmds.append(line)
    # Commands quoted inline in the text, e.g. `.venv/bin/python bench/side_by_side.py ...`.
    cmds += re.findall(r"`((?:\.venv/bin/|scripts/)[^`]+)`", README)
    return cmds


@pytest.mark.parametrize("line", _commands())
def test_command_as_written(line):
    from vkrt.cli import _parser

    for part in line.split("|"):
        argv = shlex.split(part)
        if argv[0] == "echo":
            continue
        if argv[0] == ".venv/bin/vkrt":
            if "--help" in argv:
                continue
            _parser().parse_args(argv[1:])        # SystemExit on an unknown option
        elif argv[0] == ".venv/bin/python":
            assert (ROOT / argv[1]).is_file(), argv[1]
            if argv[1].startswith("bench/"):
                text = (ROOT / argv[1]).read_text()
                for opt in argv[2:]:
                    assert not opt.startswith("--") or f'"{opt}"' in text, opt
        else:
            assert (ROOT / argv[0]).is_file(), argv[0]


def test_files_named_exist():
    # Paths in backquotes that look like repository files.
    for path in re.findall(r"`((?:vkrt|tests|scripts|bench)/[\w./-]+)`", README):
        if "*" not in path and "<" not in path:
            assert (ROOT / path).exists(), path
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        assert link.startswith("http") or (ROOT / link).exists(), link
