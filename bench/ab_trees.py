"""Builds of vkrt side by side: `vkrt bench --json` of each tree in turn, round by round, on one
machine in one command (the A/B behind bench/README.md's "before / after" figures).

    python bench/ab_trees.py --model M.gguf --tree before=DIR --tree after=. [--rounds 2]
        [--bench-args "--repeat 2"] [--out FILE.json]

A tree is a directory holding a `vkrt` package, e.g. the commit before a change as `git archive
REV vkrt | tar -x -C DIR`. Each run is `python -m vkrt bench --model M --json ARGS` in a process
of its own whose working directory is the tree (`python -m` puts it first on sys.path, before
PYTHONPATH and any installed vkrt; the model's path is made absolute); the trees alternate within
each round (before, after, before, after, ...), because a GPU's speed drifts between commands
and machines and only figures taken this way compare. Prints one JSON object: per tree, every
round's decode and prefill tok/s (the first arm's medians, vkrt/bench.py), TPOT, weight bytes
per second, GPU ms per token and per prompt and µs (ms) by kernel where the device has
timestamps; the medians over rounds, and each tree's ratios of medians against the first
tree's. Absolute figures only from a real GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from side_by_side import bench_figures  # noqa: E402  (a sibling script, not a package)

FIELDS = ("decode_tok_s", "prefill_tok_s", "tpot_ms")


def run_tree(tree: str, model: str, bench_args: list[str]) -> dict:
    """One `vkrt bench --json` of the package in `tree`, as `side_by_side.bench_figures` keeps
    it. Raises SystemExit naming the tree when the run fails."""
    out = subprocess.run([sys.executable, "-m", "vkrt", "bench", "--model",
                          os.path.abspath(model), "--json", *bench_args],
                         capture_output=True, text=True, cwd=tree)
    if out.returncode:
        raise SystemExit(f"vkrt bench in {tree} failed: {out.stderr.strip()[-2000:]}")
    return bench_figures(json.loads(out.stdout))


def summarize(rounds: dict[str, list[dict]]) -> dict:
    """Medians over rounds per tree (`FIELDS`), and each tree's ratios of medians against the
    first tree's (dict order: the order the trees were given)."""
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in FIELDS}
               for name, runs in rounds.items()}
    first = next(iter(medians.values()))
    ratios = {name: {k: round(m[k] / first[k], 4) for k in FIELDS}
              for name, m in medians.items()}
    return {"medians": medians, "ratios": ratios}


def parse_tree(text: str) -> tuple[str, str]:
    """NAME=DIR -> (NAME, DIR); DIR must hold a vkrt package."""
    name, sep, path = text.partition("=")
    if not sep or not name or not os.path.isfile(os.path.join(path, "vkrt", "__init__.py")):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=DIR with DIR/vkrt/__init__.py")
    return name, path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tree", type=parse_tree, action="append", required=True,
                    metavar="NAME=DIR", help="a tree to run (two or more, the first the base)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bench-args", default="--repeat 2",
                    help="arguments of each `vkrt bench` run (default: --repeat 2)")
    ap.add_argument("--out", default="", help="also write the JSON report to this file")
    args = ap.parse_args(argv)
    names = [n for n, _ in args.tree]
    if len(args.tree) < 2 or len(set(names)) != len(names) or args.rounds < 1:
        ap.error("give two or more trees of distinct names and --rounds of 1 or more")
    rounds: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name, tree in args.tree:
            rounds[name].append(run_tree(tree, args.model, shlex.split(args.bench_args)))
            got = rounds[name][-1]
            print(f"round {r + 1} {name}: decode {got['decode_tok_s']:.1f} tok/s, prefill "
                  f"{got['prefill_tok_s']:.1f} tok/s", file=sys.stderr)
    report = {"model": args.model, "trees": dict(args.tree), "bench_args": args.bench_args,
              "rounds": rounds, **summarize(rounds)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
