"""Aggregate decode throughput of the serving engine at several numbers of concurrent
sequences (continuous batching over the paged KV cache), the figure llama.cpp's
`llama-batched-bench` reports as S_TG, and whether each greedy sequence's tokens are those of
its batch-1 run.

    python bench/batched.py [--model M] [--seqs 1,8,32,64] [--prompt-tokens 128]
        [--tokens 128] [--max-batched-tokens 512] [--kv-cache-dtype f32] [--device N]
        [--max-batch B] [--compare-sync]
        [--decode-coop-tiles MAX:BMxBN:SG_MxSG_NxSG_K[xDEPTH[xNBUF]],...]
        [--table-coop-tiles MAX:BMxBN:SG_MxSG_NxSG_K[xDEPTH[xNBUF]],...] [--split-rows N]
        [--split-min-steps S] [--coop-depth D] [--glu-tile T] [--glu-rows MIN:MAX]

For each N: an `Engine(model, max_batch=N)` (vkrt/serve/engine.py; with `--max-batch B`,
max(B, N): a server started with `vkrt serve --max-batch B` serving N), N greedy requests
submitted at once, each of its own `--prompt-tokens` random ids (PCG64 seeded with the
sequence's index), `max_tokens` = `--tokens`, end-of-generation ids ignored (`ignore_eos`), so
every sequence decodes the same count. Timed on the host with `time.perf_counter`:
- `decode_tok_s`: tokens generated after every sequence had its first one, over the time from
  the last first token to the last token (all N decode together in that window);
- `total_tok_s`: (prompt + generated tokens of all N) over the whole run, as llama.cpp's S;
- TTFT and TPOT (p50, p99) of the requests (`RequestOutput.ttft_s` / `tpot_s`);
- `batch_1_identical`: the tokens of sequences 0 .. `--check` - 1 in the batch equal their
  runs alone in an engine of the same max_batch (which fixes the products' kernels,
  vkrt/tuning.py `WideBatchDecode`), which the batched forward's bit-identity gives;
- `generate_prefix`: for each of those sequences, how many of its first tokens are those of
  `vkrt generate` on its prompt (greedy, the single-sequence decode path: other kernels, in
  f32, so a near-tie of two logits may part them late). Wrong products part them within a
  few tokens, which `batch_1_identical` cannot see: its two runs share the products.
With `--llama-batched-bench PATH` (llama.cpp's tool, built as bench/README.md says) the same
command then runs `llama-batched-bench -m M -npp P -ntg N -npl SEQS -ngl 99 --output-format
jsonl` on the same file twice (the first run compiles its pipelines and is not recorded) and
reports the second's S_TG (`speed_tg`: pl * tg over its generation time)
beside each row, and the ratio. With `--kernels`, each row also has `gpu_us_per_step_by_kernel`
and `gpu_ms_per_step`: one batched decode step of N generated tokens (each at position
`--prompt-tokens`, in its own blocks of the engine's paged cache) timed with timestamp queries
(recorded, not replayed: timestamps are recorded per dispatch), GPU µs per kernel name
(`blk.3.ffn_down` -> `ffn_down`). `--decode-coop-tiles` runs the generated tokens' products on
`matmul_coop` with the given tiles (split K included) instead of the GPU table's kernel: the
A/B of bench/README.md, 2026-12-04 second session; `--table-coop-tiles` replaces the GPU
table's own tiles (those of engines whose rule has none) and keeps the rules. `--split-rows
N` sets the GPU table's wide-engine rules' `split_rows` (vkrt/tuning.py `WideBatchDecode`;
0: no product split across workgroups), `--split-min-steps S` their `split_min_steps`,
`--coop-depth D` every `matmul_coop` decode tile's `depth` (steps fetched ahead), `--glu-tile
T` (`none`: off) and `--glu-rows MIN:MAX` the wide-engine rules' fused gate / up / SiLU
(`WideBatchDecode.glu_tile`). The engines schedule asynchronously (vkrt serve's default: a
greedy step stays in flight while the next is scheduled).
Each row is timed after one unrecorded run of its N sequences (4 tokens each), so that
neither scheduling pays for building and capturing the steps' buckets.
`--compare-sync` runs each row a second time with `async_scheduling=False` and reports it
(`sync`: its decode tok/s and TPOT), `async_over_sync` (the decode rates' ratio) and
`sync_identical` (every sequence's tokens the same both ways). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank below."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of token lists a and b."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def generate_tokens(model, p: int, tokens: int, index: int) -> list[int]:
    """`vkrt generate`'s greedy tokens (vkrt/models/generate.py, end-of-generation ids not
    stopping it, as the engine's `ignore_eos`) after the prompt `run` gives sequence `index`."""
    from vkrt.bench import bench_prompt
    from vkrt.models.generate import generate

    return generate(model.lm, bench_prompt(model.hparams.n_vocab, p, index), tokens).tokens


def run(model, n: int, p: int, tokens: int, max_batched_tokens: int,
        first_index: int = 0, kv_cache_dtype: str = "f32",
        max_batch: int | None = None, async_scheduling: bool = True) -> tuple[dict, list]:
    """N = `n` greedy sequences at once, prompts `bench_prompt(n_vocab, p, first_index + i)`,
    `tokens` tokens each, in an engine of `max_batch` (None: n) sequences per step whose KV
    cache holds `kv_cache_dtype`, scheduling asynchronously or not: (the report row: tok/s,
    TTFT and TPOT in ms, the token lists of the n sequences). Raises SystemExit when a
    request fails or the family cannot batch n."""
    from vkrt.bench import bench_prompt
    from vkrt.serve.engine import Engine
    from vkrt.serve.request import SamplingParams
    from vkrt.serve.runner import batched_model

    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    box: queue.SimpleQueue = queue.SimpleQueue()
    out_tokens: dict[int, list[int]] = {i: [] for i in range(n)}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    stats = []
    if batched_model(model) is not None:
        max_batch = max_batch or n
        batching = {"max_batch": max_batch,
                    "max_batched_tokens": max(max_batched_tokens, max_batch),
                    "kv_cache_dtype": kv_cache_dtype}
    elif n == 1 and max_batch in (None, 1):
        batching = {}   # a family without a batched forward runs one sequence at a time
    else:
        raise SystemExit(f"{model.family}: no batched forward (execute_batch); --seqs 1 only")
    with Engine(model, max_queue=n, async_scheduling=async_scheduling, **batching) as engine:
        t0 = time.perf_counter()
        for i in range(n):
            engine.add_request(bench_prompt(model.hparams.n_vocab, p, first_index + i), params,
                               lambda o, i=i: box.put((i, time.perf_counter(), o)),
                               request_id=str(i))
        done = 0
        while done < n:
            i, t, o = box.get()
            if o.token_ids:
                first.setdefault(i, t)
                last[i] = t
                out_tokens[i] += o.token_ids
            if o.request_finished:
                done += 1
                if o.error:
                    raise SystemExit(f"request {i}: {o.error}")
                stats.append((o.ttft_s, o.tpot_s))
        t1 = time.perf_counter()
    t_first = max(first.values())
    after = sum(len(out_tokens[i]) for i in range(n)) - n
    decode = after / (max(last.values()) - t_first) if max(last.values()) > t_first else None
    ttft = [s[0] for s in stats if s[0] is not None]
    tpot = [s[1] for s in stats if s[1] is not None]
    return ({"seqs": n, "decode_tok_s": decode and round(decode, 1),
             "total_tok_s": round(n * (p + tokens) / (t1 - t0), 1),
             "ttft_ms_p50": round(pct(ttft, 0.5) * 1e3, 2), "ttft_ms_p99": round(pct(ttft, 0.99) * 1e3, 2),
             "tpot_ms_p50": round(pct(tpot, 0.5) * 1e3, 3) if tpot else None,
             "tpot_ms_p99": round(pct(tpot, 0.99) * 1e3, 3) if tpot else None},
            [out_tokens[i] for i in range(n)])


def gpu_per_step(model, n: int, pos: int) -> dict | None:
    """GPU time of one batched decode step of `n` generated tokens at position `pos` (or
    lower, where the paged cache holds fewer than n * (pos + 1) slots), by kernel, from
    timestamps: {"gpu_ms_per_step", "gpu_us_per_step_by_kernel"}; None without timestamps
    or a batched forward."""
    import numpy as np

    from vkrt.bench import _kernel
    from vkrt.models.batch import BatchInput
    from vkrt.serve.runner import batched_model

    lm = batched_model(model)
    if lm is None or lm.paged_cache_info is None:
        return None
    num_blocks, bs = lm.paged_cache_info
    pos = min(pos, num_blocks // n * bs - 1)
    if pos < 0:
        return None
    s = lm.stream
    timing = s.timing
    if not s.enable_timestamps():
        return None
    try:
        per_seq = pos // bs + 1
        tables = np.arange(n * per_seq, dtype=np.uint32).reshape(n, per_seq)
        u32 = np.uint32
        batch = BatchInput(token_ids=np.ones(n, u32), positions=np.full(n, pos, u32),
                           seq_of_token=np.arange(n, dtype=u32),
                           slot_mapping=(tables[:, -1] * bs + pos % bs).astype(u32),
                           block_tables=tables, logit_tokens=np.arange(n, dtype=u32),
                           prompt=np.zeros(n, bool))
        lm.execute_batch(batch)          # pipelines built, warm
        s.profiler.gpu_ns.clear()
        lm.execute_batch(batch)
        lm.stream.synchronize()
        ns = dict(s.profiler.gpu_ns)
    finally:
        s.timing = timing
    by_kernel: dict[str, float] = {}
    for name, t in ns.items():
        by_kernel[_kernel(name)] = by_kernel.get(_kernel(name), 0.0) + t / 1e3
    return {"gpu_ms_per_step": round(sum(by_kernel.values()) / 1e3, 4),
            "gpu_us_per_step_by_kernel": {k: round(v, 2) for k, v in
                                          sorted(by_kernel.items(), key=lambda kv: -kv[1])}}


def llama_batched_bench(path: str, model: str, seqs: list[int], p: int, n: int) -> dict:
    """{pl: speed_tg} from llama.cpp's llama-batched-bench on `model` (every pl in one run),
    the second of two runs: the first, not recorded, compiles the pipelines its shapes need (a
    fresh process of llama.cpp's Vulkan backend compiles them on first use, which a single
    run at one pl would time)."""
    cmd = [path, "-m", model, "-c", str(max(seqs) * (p + n) + 64), "-b", "2048", "-ub", "512",
           "-npp", str(p), "-ntg", str(n), "-npl", ",".join(map(str, seqs)), "-ngl", "99",
           "--output-format", "jsonl"]
    for _ in range(2):
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"llama-batched-bench failed: {out.stderr.strip()[-2000:]}")
    rows = [json.loads(line) for line in (out.stdout + "\n" + out.stderr).splitlines()
            if line.startswith("{") and "speed_tg" in line]
    return {r["pl"]: r for r in rows}


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def glu_rows(text: str) -> tuple[int, int]:
    """`--glu-rows`: "MIN:MAX" -> (MIN, MAX), 0 <= MIN <= MAX; argparse's error otherwise."""
    lo, sep, hi = text.partition(":")
    if not (sep and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi)):
        raise argparse.ArgumentTypeError(f"expected MIN:MAX rows, 0 <= MIN <= MAX, got {text!r}")
    return int(lo), int(hi)


def coop_decode_tiles(spec: str) -> tuple:
    """`--decode-coop-tiles`: "MAX:BMxBN:SG_MxSG_NxSG_K[xDEPTH[xNBUF]],..." ->
    `vkrt.tuning.BatchCoopTile`s, each for products of at most MAX tokens (MAX empty: any;
    the last must be), tokens x rows over subgroups, SG_K groups splitting the columns, DEPTH
    steps fetched ahead, NBUF shared buffers (matmul_coop.comp). Raises
    SystemExit naming a malformed entry."""
    from vkrt.tuning import BatchCoopTile

    tiles = []
    for entry in spec.split(","):
        most, _, tile = entry.partition(":")
        try:
            if tile.rpartition(":")[2].count("x") < 2:    # SG_K given
                raise ValueError(tile)
            tiles.append(BatchCoopTile.parse(tile, "bench/batched.py --decode-coop-tiles",
                                             int(most) if most else None))
        except ValueError:
            raise SystemExit(f"--decode-coop-tiles: {entry!r} is not "
                             "MAX:BMxBN:SG_MxSG_NxSG_K[xDEPTH[xNBUF]] (NBUF 1 or 2)")
    if tiles[-1].max_tokens is not None:
        raise SystemExit("--decode-coop-tiles: the last tile must cover any count (MAX empty)")
    return tuple(tiles)


def with_table_coop_tiles(table, spec: str):
    """`--table-coop-tiles`: `table` (a `vkrt.tuning.Table`) with its own `batch_coop_tiles`,
    those of the wide-engine rules without tiles of their own (the 16-63 engines' on the GPU
    table), replaced by `spec`'s (`coop_decode_tiles`); the rules kept, unlike
    `--decode-coop-tiles`."""
    import dataclasses

    return dataclasses.replace(table, batch_coop_tiles=coop_decode_tiles(spec))


def with_coop_depth(table, depth: int):
    """`--coop-depth`: `table` (a `vkrt.tuning.Table`) with every batched `matmul_coop` tile,
    its own `batch_coop_tiles` and each wide-engine rule's `coop_tiles`, fetching `depth`
    steps ahead; nothing else changed."""
    import dataclasses

    def deeper(tiles):
        return tuple(dataclasses.replace(t, depth=depth) for t in tiles)

    return dataclasses.replace(
        table, batch_coop_tiles=deeper(table.batch_coop_tiles),
        wide_batch_decode=tuple(dataclasses.replace(r, coop_tiles=deeper(r.coop_tiles))
                                for r in table.wide_batch_decode))


def with_glu(table, tile: str | None, rows: tuple[int, int] | None):
    """`--glu-tile` / `--glu-rows`: `table` (a `vkrt.tuning.Table`) with every wide-engine
    rule's `glu_tile` the `tile` (BMxBN:SG_MxSG_NxSG_K[xDEPTH[xNBUF]]; "none": no fused gate/up;
    None: the rule's own) and its `glu_rows` `rows` (None: the rule's own where it has a
    tile, else any), for every weight type (`glu_raw_rows` None) where `rows` are given;
    nothing else changed."""
    import dataclasses

    def rule(r):
        glu = r.glu_tile if tile is None else (
            None if tile == "none" else coop_decode_tiles(":" + tile)[0])
        own = r.glu_rows if r.glu_tile is not None else (0, 1 << 30)
        return dataclasses.replace(r, glu_tile=glu, glu_rows=rows or own,
                                   glu_raw_rows=None if rows else r.glu_raw_rows)

    return dataclasses.replace(table, wide_batch_decode=tuple(
        rule(r) for r in table.wide_batch_decode))


def main() -> None:
    import dataclasses

    from vkrt import tuning
    from vkrt.models.scratch import KV_CACHE_DTYPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--seqs", default="1,8,32,64")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--max-batched-tokens", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=None,
                    help="every engine's max_batch (default: each row's --seqs)")
    ap.add_argument("--kv-cache-dtype", choices=list(KV_CACHE_DTYPES), default="f32",
                    help="the engine's paged KV cache (vkrt serve's option)")
    ap.add_argument("--llama-batched-bench", default=None, help="llama.cpp's tool, for S_TG")
    ap.add_argument("--kernels", action="store_true",
                    help="GPU µs per decode step by kernel (timestamps) for each N")
    ap.add_argument("--compare-sync", action="store_true",
                    help="also run each row with synchronous scheduling; report the ratio")
    ap.add_argument("--check", type=int, default=4,
                    help="sequences compared with their runs alone (default 4)")
    ap.add_argument("--decode-coop-tiles", default=None, metavar="MAX:BMxBN:SG_MxSG_NxSG_K,...",
                    help="run the generated tokens' products on matmul_coop with these tiles "
                         "instead of the GPU table's kernel (e.g. 16:16x32:1x2x4,"
                         "32:32x32:2x2x4,:32x64:2x2x4)")
    ap.add_argument("--table-coop-tiles", default=None, metavar="MAX:BMxBN:SG_MxSG_NxSG_K,...",
                    help="the GPU table's own batched matmul_coop tiles (its per-type tiles "
                         "among them) replaced, its wide-engine rules kept")
    ap.add_argument("--split-rows", type=int, default=None, metavar="N",
                    help="the wide-engine rules' split_rows instead of the GPU table's")
    ap.add_argument("--split-min-steps", type=int, default=None, metavar="S",
                    help="the wide-engine rules' split_min_steps instead of the GPU table's")
    ap.add_argument("--glu-tile", default=None, metavar="BMxBN:SG_MxSG_NxSG_K[xDEPTH[xNBUF]]",
                    help="the wide-engine rules' glu_tile: gate, up and SiLU of the "
                         "generated tokens in one matmul_coop dispatch; 'none': never")
    ap.add_argument("--glu-rows", type=glu_rows, default=None, metavar="MIN:MAX",
                    help="the wide-engine rules' glu_rows (default: a rule's own where it "
                         "has a glu_tile, else any)")
    ap.add_argument("--coop-depth", type=_positive, default=None, metavar="D",
                    help="every matmul_coop decode tile of the GPU table (its own and its "
                         "wide-engine rules') with D steps fetched ahead instead of its own")
    args = ap.parse_args()
    import vkrt

    if args.decode_coop_tiles:
        tuning.TABLES["gpu"] = dataclasses.replace(
            tuning.TABLES["gpu"], batch_coop_tiles=coop_decode_tiles(args.decode_coop_tiles),
            batch_products={**tuning.TABLES["gpu"].batch_products, "decode": "matmul_coop"},
            wide_batch_decode=())        # no rule's own tiles: these, at every max_batch
    if args.table_coop_tiles:
        tuning.TABLES["gpu"] = with_table_coop_tiles(tuning.TABLES["gpu"], args.table_coop_tiles)
    if args.coop_depth is not None:
        tuning.TABLES["gpu"] = with_coop_depth(tuning.TABLES["gpu"], args.coop_depth)
    if args.glu_tile is not None or args.glu_rows is not None:
        tuning.TABLES["gpu"] = with_glu(tuning.TABLES["gpu"], args.glu_tile, args.glu_rows)
    for key in ("split_rows", "split_min_steps"):
        if getattr(args, key) is not None:
            gpu = tuning.TABLES["gpu"]
            tuning.TABLES["gpu"] = dataclasses.replace(gpu, wide_batch_decode=tuple(
                dataclasses.replace(r, **{key: getattr(args, key)})
                for r in gpu.wide_batch_decode))

    seqs = [int(s) for s in args.seqs.split(",")]
    report = {"model": args.model, "prompt_tokens": args.prompt_tokens,
              "tokens": args.tokens, "kv_cache_dtype": args.kv_cache_dtype,
              "decode_coop_tiles": args.decode_coop_tiles, "split_rows": args.split_rows,
              "split_min_steps": args.split_min_steps,
              "runs": []}
    reference: list[list[int]] = []   # generate_tokens of sequences 0, 1, ...
    with vkrt.load(args.model, device=args.device) as model:
        report["device"] = model.device.name
        for n in seqs:
            b = max(n, args.max_batch or n)
            alone = [run(model, 1, args.prompt_tokens, args.tokens, args.max_batched_tokens,
                         i, args.kv_cache_dtype, max_batch=b)[1][0]
                     for i in range(min(n, args.check))]
            # not recorded: the step buckets of n sequences built and captured before either
            # scheduling is timed (else the first timed run pays them, TTFT most)
            run(model, n, args.prompt_tokens, min(args.tokens, 4), args.max_batched_tokens,
                kv_cache_dtype=args.kv_cache_dtype, max_batch=b)
            row, toks = run(model, n, args.prompt_tokens, args.tokens, args.max_batched_tokens,
                            kv_cache_dtype=args.kv_cache_dtype, max_batch=b)
            row["max_batch"] = b
            k = min(n, args.check)
            row["batch_1_identical"] = f"{sum(toks[i] == alone[i] for i in range(k))}/{k}"
            while len(reference) < k:
                reference.append(generate_tokens(model, args.prompt_tokens, args.tokens,
                                                 len(reference)))
            row["generate_prefix"] = [common_prefix(toks[i], reference[i]) for i in range(k)]
            if args.compare_sync:
                sync, sync_toks = run(model, n, args.prompt_tokens, args.tokens,
                                      args.max_batched_tokens, kv_cache_dtype=args.kv_cache_dtype,
                                      max_batch=b, async_scheduling=False)
                row["sync"] = {key: sync[key] for key in ("decode_tok_s", "tpot_ms_p50",
                                                          "tpot_ms_p99", "ttft_ms_p50")}
                if row["decode_tok_s"] and sync["decode_tok_s"]:
                    row["async_over_sync"] = round(row["decode_tok_s"] / sync["decode_tok_s"], 3)
                row["sync_identical"] = sync_toks == toks
            if args.kernels:
                row.update(gpu_per_step(model, n, args.prompt_tokens) or {})
            report["runs"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    if args.llama_batched_bench:
        ref = llama_batched_bench(args.llama_batched_bench, args.model, seqs,
                                  args.prompt_tokens, args.tokens)
        for row in report["runs"]:
            r = ref.get(row["seqs"])
            if r is not None:
                row["llama_cpp_s_tg"] = round(r["speed_tg"], 1)
                row["llama_cpp_s_pp"] = round(r["speed_pp"], 1)
                if row["decode_tok_s"]:
                    row["decode_ratio"] = round(row["decode_tok_s"] / r["speed_tg"], 3)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
