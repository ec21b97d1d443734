"""`vkrt bench`: the report's numbers come from the stream's counters in the decode window and
agree with what the arms mean (always: a barrier per record; tracked: fewer; N slots: depth
N). Speeds are reported, never asserted (benchmarks are not timed tests)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

import vkrt
from vkrt import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def test_report_counts_match_the_arms(opt_folder, device):
    with vkrt.load(opt_folder, device=device) as model:
        n_layer = model.hparams.n_layer
        r = bench.run(model, prompt_tokens=6, tokens=4, repeat=2, batch_size=4,
                      barriers=["tracked", "always"], inflights=[1, 2])
        weights = model.lm.weight_bytes()
        model_positions_bytes = model.lm.w["decoder.embed_positions.weight"].nbytes
    assert set(r["arms"]) == {"tracked/inflight1", "always/inflight1", "tracked/inflight2",
                              "always/inflight2"}
    step = None
    for label, arm in r["arms"].items():
        per = arm["per_decoded_token"]
        assert arm["same_tokens_as_first_arm"], label
        assert arm["max_inflight"] == int(label[-1]), label
        assert arm["steps_counted"] == 4 - int(label[-1]), label   # tokens - inflight
        assert per["submits"] == 1, label                  # one submission per decode step
        assert per["dispatches"] > 4 * n_layer
        step = step or per["dispatches"]
        assert per["dispatches"] == step                   # the same forward in every arm
        if label.startswith("always"):
            assert per["barriers"] >= per["dispatches"] and per["stages"] == per["barriers"]
        else:
            assert per["stages"] < r["arms"]["always" + label[7:]]["per_decoded_token"]["stages"]
        assert all(v >= 0 for v in arm["host_ms_per_token"].values()), label
        for key in ("prefill_tok_s", "decode_tok_s", "tpot_ms"):
            s = arm[key]
            assert 0 < s["min"] <= s["median"] <= s["max"], (label, key)
    assert r["weight_bytes"] == weights > 0
    # The prefill products' kernel (4-token batches: below COOP_MIN_TOKENS, the f32 one).
    assert r["prefill_kernel"] == ("matmul" if device.info.kind == "cpu" else "matmul_tiled")
    # A decode step reads every weight but one row of the position table (the test model's
    # embedding is also its output matrix, tied): all of the weights, less that table.
    positions = model_positions_bytes
    assert r["weight_bytes_per_token"] == weights - positions
    for arm in r["arms"].values():
        assert arm["weight_bytes_per_s"] == round(
            r["weight_bytes_per_token"] * arm["decode_tok_s"]["median"])
    assert r["peak_rss_bytes"] > 0
    if device.timestamp_valid_bits:
        g = r["gpu"]
        assert g["gpu_ms_per_token"] > 0 and g["gpu_us_per_stage"] > 0
        assert any(k.startswith("self_attn") for k in g["gpu_us_per_token_by_kernel"])
        # The prompt's forward alone, by kernel: its products and attention among them.
        assert g["prefill_gpu_ms"] == pytest.approx(sum(g["prefill_gpu_ms_by_kernel"].values()),
                                                    abs=0.01 * len(g["prefill_gpu_ms_by_kernel"]))
        assert {"fc1", "self_attn.attn", "argmax"} <= set(g["prefill_gpu_ms_by_kernel"])


def test_host_ms_are_per_decoded_token(monkeypatch):
    """Host ms per token are the window's host time over its tokens - 1 decoded tokens, as
    TPOT, while the counters are per step submitted in it (tokens - N with N slots): a
    scripted window of 4 tokens, 2 submits and 3 ms of waiting gives 1 ms of wait per token."""
    from types import SimpleNamespace

    from vkrt.models.generate import GenerationResult
    from vkrt.runtime.profiler import Counters, Profiler

    stream = SimpleNamespace(counters=Counters(), profiler=Profiler())

    def window(lm, prompt, tokens, batch_size):
        yield
        stream.counters.submits += 2
        stream.profiler.phases_ns["wait"] = 3_000_000
        return GenerationResult(len(prompt), tokens=[1, 2, 3, 4], prefill_s=1.0, decode_s=0.003)

    monkeypatch.setattr(bench, "_decode_window", window)
    r = bench._repeat(SimpleNamespace(stream=stream), [5, 6], 4, 8)
    assert r["host_ms"]["wait"] == pytest.approx(1.0) and r["tpot_ms"] == pytest.approx(1.0)
    assert r["per_token"]["submits"] == 1 and r["steps"] == 2
    assert r["host_busy_fraction"] == 0.0


def test_a_replayed_arm_counts_the_work_its_replays_run(default_model_path, device):
    """With decode replay (the default for Llama) the host records nothing per token, yet the
    GPU runs the captured step every token: the report's per-token dispatches, barriers and
    stages are the recording's, not 0."""
    with vkrt.load(default_model_path, device=device) as model:
        r = bench.run(model, prompt_tokens=6, tokens=5, repeat=1, batch_size=8,
                      barriers=["tracked"], inflights=[2])
        recordings = list(model.lm._replays.values())   # the arm's, one per ring phase
    (arm,) = r["arms"].values()
    per = arm["per_decoded_token"]
    assert per["replays"] == 1 and per["recorded_dispatches"] == 0, per
    rec = recordings[0]
    assert rec.dispatches > 100, rec.dispatches            # SmolLM2: 30 layers, fused
    assert (per["dispatches"], per["barriers"], per["stages"]) == (
        rec.dispatches, rec.barriers, rec.stages), per


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vkrt", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_cli_json(opt_folder, kv):
    """--json: the device, driver, commit and memory beside the arms; the KV cache's element
    dtype as the runs held it (--kv-cache-dtype)."""
    p = run_cli("bench", "--model", opt_folder, "--prompt-tokens", "5", "--tokens", "3",
                "--repeat", "1", "--json", "--kv-cache-dtype", kv)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    for key in ("device", "driver", "driver_version", "commit", "vulkan_api", "weight_bytes",
                "peak_rss_bytes", "arms"):
        assert key in r, key
    assert r["kv_cache_dtype"] == kv   # as the flag spells it
    (arm,) = r["arms"].values()
    assert arm["per_decoded_token"]["dispatches"] > 0


@pytest.mark.parametrize("flags, code, words", [
    (["--tokens", "1"], 2, "--tokens must be at least 2"),
    (["--repeat", "0"], 2, "--repeat must be at least 1"),
    (["--prompt-tokens", "0"], 2, "--prompt-tokens must be at least 1"),
    (["--batch-size", "0"], 2, "--batch-size must be at least 1"),
    (["--prompt-tokens", "100000"], 1, "exceeds the model's context"),
    (["--barriers", "sometimes"], 2, "'sometimes' is not one of tracked, always"),
    (["--inflight", "0"], 2, "expected integers >= 1"),
])
def test_cli_refuses_bad_options(opt_folder, flags, code, words):
    p = run_cli("bench", "--model", opt_folder, *flags)
    assert p.returncode == code, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], p.stderr


def _bench_script(name: str):
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench", name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_shape_model_q4_k_m_has_the_real_qwen_files_type_counts():
    """bench/shape_model.py's Q4_K_M mix on the Qwen2.5-0.5B shape: the tensor count and the
    count of each type of the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M file (gguf-py's
    GGUFReader on the file scripts/setup.sh fetches: 133 Q5_0, 13 Q8_0, 12 Q6_K, 12 Q4_K, 121 F32), rows of 896 falling back
    from the K types as llama.cpp's quantizer does."""
    sm = _bench_script("shape_model")
    ts = sm.tensors(sm.PRESETS["qwen2.5-0.5b"], "q4_k_m")
    counts = {}
    for _, _, t, _ in ts:
        counts[t] = counts.get(t, 0) + 1
    assert len(ts) == 291
    assert counts == {"Q5_0": 133, "Q8_0": 13, "Q6_K": 12, "Q4_K": 12, "F32": 121}
    # One type everywhere: matrices in it, the embedding and output in Q8_0.
    ts = sm.tensors(sm.PRESETS["7b"], "q4_1")
    assert {t for n, s, t, _ in ts if len(s) == 2 and n not in ("token_embd.weight",
                                                                 "output.weight")} == {"Q4_1"}
    assert [t for n, _, t, _ in ts if n in ("token_embd.weight", "output.weight")] == ["Q8_0"] * 2


def _fake_tree(root, decode: float) -> str:
    """A directory whose `vkrt` package is a stand-in `python -m vkrt bench --json`: it appends
    its tree's name to $AB_LOG and prints a report with this decode tok/s."""
    pkg = root / "vkrt"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    arm = {"decode_tok_s": {"median": decode}, "prefill_tok_s": {"median": 10 * decode},
           "tpot_ms": {"median": 1000 / decode}, "weight_bytes_per_s": 1,
           "per_decoded_token": {"stages": 1.0}, "host_busy_fraction": 0.1}
    report = {"arms": {"tracked/inflight2": arm}, "device": "fake", "commit": root.name,
              "driver_version": "0", "weight_bytes": 1}
    (pkg / "__main__.py").write_text(
        "import os, sys\n"
        "assert sys.argv[1:3] == ['bench', '--model'] and '--json' in sys.argv, sys.argv\n"
        f"open(os.environ['AB_LOG'], 'a').write({root.name!r} + ' ')\n"
        f"print({json.dumps(report)!r})\n")
    return f"{root.name}={root}"


def test_ab_trees_alternates_the_trees_and_rates_them_against_the_first(tmp_path, monkeypatch):
    """bench/ab_trees.py: each run imports its own tree's package (run from the tree, even
    with this checkout on PYTHONPATH and as the caller's directory), the trees alternate
    round by round, and the ratios are of medians against the first tree."""
    ab = _bench_script("ab_trees")
    monkeypatch.chdir(os.path.dirname(os.path.dirname(__file__)))
    log = tmp_path / "order"
    monkeypatch.setenv("AB_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.dirname(__file__)))
    trees = [_fake_tree(tmp_path / "before", 200.0), _fake_tree(tmp_path / "after", 250.0)]
    out = tmp_path / "ab.json"
    assert ab.main(["--model", "m.gguf", "--tree", trees[0], "--tree", trees[1],
                    "--rounds", "2", "--out", str(out)]) == 0
    assert log.read_text().split() == ["before", "after", "before", "after"]
    report = json.loads(out.read_text())
    assert [r["commit"] for r in report["rounds"]["after"]] == ["after", "after"]
    assert report["medians"]["after"]["decode_tok_s"] == 250.0
    assert report["ratios"] == {"before": {"decode_tok_s": 1.0, "prefill_tok_s": 1.0,
                                           "tpot_ms": 1.0},
                                "after": {"decode_tok_s": 1.25, "prefill_tok_s": 1.25,
                                          "tpot_ms": 0.8}}
    with pytest.raises(SystemExit):          # one tree, or a directory without vkrt
        ab.main(["--model", "m.gguf", "--tree", trees[0]])
    with pytest.raises(SystemExit):
        ab.main(["--model", "m.gguf", "--tree", trees[0], "--tree", f"x={tmp_path}"])


@pytest.mark.parametrize("depth", [0, 300])
def test_side_by_side_takes_llama_cpp_decode_at_the_asked_depth(tmp_path, depth):
    """bench/side_by_side.py `run_llama_bench`: prefill from pp at depth 0 and decode from tg
    at `depth` (`--decode-after-prompt` asks for the prompt's), passing `-d 0,depth` only then.
    A stand-in llama-bench prints the rows a real one prints for `-d 0,300` (its JSON
    fields n_prompt, n_gen, n_depth, avg_ts) and records its arguments."""
    rows = [{"n_prompt": p, "n_gen": g, "n_depth": d, "avg_ts": 1000.0 * (1 + i)}
            for i, (p, g, d) in enumerate([(300, 0, 0), (0, 16, 0), (300, 0, 300),
                                           (0, 16, 300)])]
    fake = tmp_path / "llama-bench"
    fake.write_text(f"#!{sys.executable}\nimport sys\nopen(sys.argv[0] + '.args', 'w')"
                    f".write(' '.join(sys.argv[1:]))\nprint({json.dumps(rows)!r})\n")
    fake.chmod(0o755)
    got = _bench_script("side_by_side").run_llama_bench(str(fake), "m.gguf", 300, 16, depth)
    assert (got["prefill_tok_s"], got["decode_tok_s"]) == (1000.0, 4000.0 if depth else 2000.0)
    args = (tmp_path / "llama-bench.args").read_text()
    assert ("-d 0,300" in args) == bool(depth), args


def test_batched_takes_llama_batched_bench_second_run(tmp_path):
    """bench/batched.py `llama_batched_bench`: llama-batched-bench runs twice with the same
    arguments and the report is the second run's rows (the first compiles the pipelines a
    fresh process needs: timed alone, one pl measured S_PP 330 tok/s on an H100). A stand-in
    prints a different speed_tg each run (its jsonl rows: pl, speed_pp, speed_tg)."""
    fake = tmp_path / "llama-batched-bench"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\nlog = sys.argv[0] + '.runs'\n"
        "n = len(open(log).read().splitlines()) if os.path.exists(log) else 0\n"
        "open(log, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "for pl in (32, 64):\n"
        "    print(json.dumps({'pl': pl, 'speed_pp': 1.0, 'speed_tg': 100.0 * (n + 1) + pl}))\n")
    fake.chmod(0o755)
    got = _bench_script("batched").llama_batched_bench(str(fake), "m.gguf", [32, 64], 64, 48)
    assert {pl: r["speed_tg"] for pl, r in got.items()} == {32: 232.0, 64: 264.0}
    runs = (tmp_path / "llama-batched-bench.runs").read_text().splitlines()
    assert len(runs) == 2 and runs[0] == runs[1] and "-npl 32,64" in runs[0]


def test_batched_generate_prefix_follows_vkrt_generate(default_model_path):
    """bench/batched.py's `generate_prefix`: the engine's greedy sequences (a batch of 2)
    share their first tokens with `vkrt generate` on the same prompts (the default model on
    this machine: all of them), and `common_prefix` stops at the first difference, so a
    product gone wrong in the batched kernels shows there, which `batch_1_identical` misses."""
    script = _bench_script("batched")
    assert script.common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert script.common_prefix([7], [8]) == 0 and script.common_prefix([], [1]) == 0
    with vkrt.load(default_model_path) as model:
        _, toks = script.run(model, 2, 8, 5, 64, max_batch=2)
        ref = [script.generate_tokens(model, 8, 5, i) for i in range(2)]
    assert len(ref[0]) == 5 and ref[0] != ref[1]
    assert [script.common_prefix(t, r) for t, r in zip(toks, ref)] == [5, 5]


def test_batched_decode_coop_tiles_parse():
    """bench/batched.py --decode-coop-tiles: MAX:BMxBN:SG_MxSG_NxSG_K[xDEPTH[xNBUF]] entries
    become the table's batched matmul_coop tiles, the last one for any count; a malformed
    entry (too few or too many fields, a zero, NBUF other than 1 or 2) or a last one with a
    MAX exits naming it."""
    parse = _bench_script("batched").coop_decode_tiles
    tiles = parse("16:16x32:1x2x4,32:32x32:2x2x4x2,64:32x32:2x2x2x2x2,:32x64:2x2x4")
    assert [(t.max_tokens, t.bm, t.bn, t.sg_m, t.sg_n, t.sg_k, t.depth, t.nbuf)
            for t in tiles] == [
        (16, 16, 32, 1, 2, 4, 1, 1), (32, 32, 32, 2, 2, 4, 2, 1), (64, 32, 32, 2, 2, 2, 2, 2),
        (None, 32, 64, 2, 2, 4, 1, 1)]
    for bad in ("16:16x32:1x2", "16:16x32:1x2x4x2x1x1", "16:16x32:1x2x4x0", "16:16x32:1x0x4",
                "16:16x32:1x2x4x2x3"):
        with pytest.raises(SystemExit, match=f"'{bad}' is not MAX:BMxBN:SG_MxSG_NxSG_K"):
            parse(f"{bad},:32x64:2x2x4")
    with pytest.raises(SystemExit, match="the last tile must cover any count"):
        parse("16:16x32:1x2x4")


def test_batched_table_coop_tiles_keep_the_rules():
    """bench/batched.py --table-coop-tiles: the GPU table's own batched matmul_coop tiles
    (its per-type ones among them) become the given ones; the wide-engine rules, their own
    tiles and splits, and the prefill tiles stay as they were."""
    import dataclasses

    from vkrt import tuning

    gpu = tuning.TABLES["gpu"]
    got = _bench_script("batched").with_table_coop_tiles(gpu, ":32x32:2x2x4x2")
    assert [(t.sg_k, t.depth, t.dtypes) for t in got.batch_coop_tiles] == [(4, 2, ())]
    assert got.wide_batch_decode == gpu.wide_batch_decode and got.wide_batch_decode
    assert dataclasses.replace(got, batch_coop_tiles=gpu.batch_coop_tiles) == gpu


def test_batched_coop_depth_reaches_every_batched_tile():
    """bench/batched.py --coop-depth: every batched matmul_coop tile of the table (its own
    and each wide-engine rule's) fetches that many steps ahead; their other fields, the
    rules' other fields and the prefill tiles stay as they were."""
    from vkrt import tuning

    gpu = tuning.TABLES["gpu"]
    deep = _bench_script("batched").with_coop_depth(gpu, 5)
    tiles = [*deep.batch_coop_tiles, *(t for r in deep.wide_batch_decode for t in r.coop_tiles)]
    assert tiles and all(t.depth == 5 for t in tiles)

    def strip(t):
        return dataclasses.replace(t, depth=1)

    assert [strip(t) for t in deep.batch_coop_tiles] == [strip(t) for t in gpu.batch_coop_tiles]
    for r, was in zip(deep.wide_batch_decode, gpu.wide_batch_decode, strict=True):
        assert dataclasses.replace(r, coop_tiles=()) == dataclasses.replace(was, coop_tiles=())
        assert [strip(t) for t in r.coop_tiles] == [strip(t) for t in was.coop_tiles]
    assert deep.prefill_coop_tiles == gpu.prefill_coop_tiles


def test_batched_glu_options_reach_every_wide_rule():
    """bench/batched.py --glu-tile / --glu-rows: every wide-engine rule gets the tile ("none":
    none) and the rows, a rule keeping its own rows where none are given and it had a tile,
    any rows where it had none; --glu-rows alone keeps the tiles; MIN:MAX parses, a
    malformed or reversed range is refused; the rules' other fields stay."""
    from vkrt import tuning

    script = _bench_script("batched")
    tile = tuning.BatchCoopTile(None, 32, 16, 2, 1, "t", 8, 2)
    gpu = dataclasses.replace(tuning.TABLES["gpu"], wide_batch_decode=(
        tuning.WideBatchDecode(16, "matmul_coop", "a", glu_tile=tile, glu_rows=(4096, 8192)),
        tuning.WideBatchDecode(64, "matmul_coop", "b", split_rows=7)))
    got = script.with_glu(gpu, "32x32:2x2x2x2", None).wide_batch_decode
    assert [(g.bm, g.bn, g.sg_m, g.sg_n, g.sg_k, g.depth) for g in (r.glu_tile for r in got)] \
        == [(32, 32, 2, 2, 2, 2)] * 2
    assert [r.glu_rows for r in got] == [(4096, 8192), (0, 1 << 30)]
    got = script.with_glu(gpu, "none", (1, 2)).wide_batch_decode
    assert [(r.glu_tile, r.glu_rows) for r in got] == [(None, (1, 2))] * 2
    got = script.with_glu(gpu, None, (5, 6)).wide_batch_decode
    assert [(r.glu_tile, r.glu_rows) for r in got] == [(tile, (5, 6)), (None, (5, 6))]
    for r, was in zip(got, gpu.wide_batch_decode, strict=True):
        assert dataclasses.replace(r, glu_tile=None, glu_rows=(0, 0)) == dataclasses.replace(
            was, glu_tile=None, glu_rows=(0, 0))
    # --glu-rows holds every weight type to the rows (a rule's raw-type rows dropped), and
    # without it the raw-type rows stay.
    raw = dataclasses.replace(gpu, wide_batch_decode=(dataclasses.replace(
        gpu.wide_batch_decode[0], glu_raw_rows=(4096, 14336)),))
    assert script.with_glu(raw, None, (5, 6)).wide_batch_decode[0].glu_raw_rows is None
    assert script.with_glu(raw, "none", None).wide_batch_decode[0].glu_raw_rows == (4096, 14336)
    assert script.glu_rows("4096:8192") == (4096, 8192) and script.glu_rows("0:0") == (0, 0)
    for bad in ("8192:4096", "4096", "a:1", "1:", "-1:3"):
        with pytest.raises(Exception, match="MIN:MAX"):
            script.glu_rows(bad)


def test_coop_ablation_variants_apply_and_compile(tmp_path):
    """bench/coop_ablation.py's builds: "base" is the committed matmul_coop_q4_1 byte for
    byte, each variant's change applies (once) and compiles to other bytes, and each
    variant's modules directory is vkrt/spirv's but for that module, its modules.json
    checking out (load_modules)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import coop_ablation
    from vkrt.gen.metadata import DEFAULT_SPIRV_DIR, load_modules

    names = ["base", *coop_ablation.VARIANTS]
    dirs = coop_ablation.compile_variants(tmp_path / "spv", "q4_1", names)
    shipped = (DEFAULT_SPIRV_DIR / "matmul_coop_q4_1.spv").read_bytes()
    built = {n: (d / "matmul_coop_q4_1.spv").read_bytes() for n, d in dirs.items()}
    assert built["base"] == shipped
    assert len(set(built.values())) == len(names)
    for n, d in dirs.items():
        m = coop_ablation.modules_dir(d / "matmul_coop_q4_1.spv", tmp_path / "modules" / n)
        assert set(load_modules(m)) == set(load_modules(DEFAULT_SPIRV_DIR))
        assert (m / "matmul_coop_q4_1.spv").read_bytes() == built[n]
    with pytest.raises(ValueError, match="no-products.*0 times"):
        coop_ablation.variant_source("void main() {}", "no-products")


def test_decode_ablation_variants_apply_and_compile(tmp_path):
    """bench/decode_ablation.py's builds: "base" is the committed matvec_q4_k and
    matvec_glu_q4_k byte for byte, and each variant's change applies (once) and compiles to
    other bytes of both."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import decode_ablation
    from vkrt.gen.metadata import DEFAULT_SPIRV_DIR

    names = ["base", *decode_ablation.VARIANTS]
    dirs = decode_ablation.compile_variants(tmp_path / "spv", names)
    for module in decode_ablation.MODULES:
        built = {n: (d / f"{module}.spv").read_bytes() for n, d in dirs.items()}
        assert built["base"] == (DEFAULT_SPIRV_DIR / f"{module}.spv").read_bytes()
        assert len(set(built.values())) == len(names), module
    with pytest.raises(ValueError, match="no-dequant.*0 times"):
        decode_ablation.variant_source("void main() {}", "no-dequant")


def test_decode_ablation_times_each_build(tmp_path, capsys):
    """bench/decode_ablation.py --built DIR: each build's modules directory timed by
    bench/matvec_types.py in a process of its own, both kernels under each launch, in one
    JSON report."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import decode_ablation

    decode_ablation.compile_variants(tmp_path, ["base", "no-dequant"])
    assert decode_ablation.main(["--built", str(tmp_path), "--variants", "base,no-dequant",
                                 "--glu-shape", "16x256", "--glu-configs", "1x1,1x2",
                                 "--shape", "8x512", "--configs", "1x1", "--rounds", "1",
                                 "--repeat", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["variants"]) == ["base", "no-dequant"]
    for v in report["variants"].values():
        assert list(v["matvec_glu_gb_s"]) == ["1x1", "1x2"] and list(v["matvec_gb_s"]) == ["1x1"]


def test_q4_1_layout_builds_read_the_grouped_blocks(monkeypatch):
    """bench/q4_1_layout.py: each build's Q4_1 readers on the grouped layout give the shipped
    products bit for bit on repacked blocks (--verify), and not on blocks left in the GGUF
    layout (the check can fail)."""
    layout = _bench_script("q4_1_layout")
    assert layout.main(["--verify"]) == 0
    monkeypatch.setattr(layout, "repack", lambda raw: raw)
    assert layout.main(["--verify"]) == 1


def test_matvec_types_pipeline_stats_refusal_is_one_line():
    """--pipeline-stats on a device without VK_KHR_pipeline_executable_properties (lavapipe)
    stops before any product with one line naming the device and the extension."""
    from vkrt.runtime.device import PIPELINE_STATISTICS, Device
    with Device() as d:
        if d._offers(PIPELINE_STATISTICS):
            pytest.skip("this device offers pipeline statistics")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "matvec_types.py"),
                          "--types", "q4_k", "--rows", "8", "--cols", "256", "--rounds", "1",
                          "--repeat", "1", "--pipeline-stats"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 1 and run.stdout == "", run
    assert run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("matvec_types: ") and PIPELINE_STATISTICS in run.stderr, \
        run.stderr
