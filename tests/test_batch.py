"""The batched runner over a paged KV cache (vkrt/models/batch.py): greedy tokens against
transformers fp32, and BATCH INVARIANCE: a sequence's logits bit-identical (np.array_equal)
whether it runs alone or in batches with other sequences, in prefill chunks or decode steps,
in any batch-size bucket, replayed or recorded.

`Pages` is a minimal block manager (what the scheduler's KV-block manager does): each sequence
gets physical blocks from a shuffled free list as it grows, so sequences' blocks interleave
and a block table row is never contiguous; `step(...)` builds one `BatchInput`.
"""
from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from family_files import GEMMA3_WINDOW, N_VOCAB, hf_model, write_gguf
from reference import TransformersReference
from test_families import ORACLE_CONFIG
from test_llama_types import LIMIT, split_files  # noqa: F401 (a fixture)
from vkrt import config
from vkrt.models import batch as batch_mod
from vkrt.models.batch import BatchInput, StepShape
from vkrt.models.gguf import load_gguf
from vkrt.models.llama import Llama

BLOCK_SIZE = 4
NUM_BLOCKS = 64


class Pages:
    """Block tables of named sequences over `num_blocks` blocks, handed out in a shuffled
    order (seeded)."""

    def __init__(self, num_blocks: int, block_size: int, seed: int = 0):
        self.block_size = block_size
        self.free = list(np.random.default_rng(seed).permutation(num_blocks))
        self.blocks: dict[str, list[int]] = {}

    def slot(self, seq: str, pos: int) -> int:
        blocks = self.blocks.setdefault(seq, [])
        while len(blocks) <= pos // self.block_size:
            blocks.append(int(self.free.pop()))
        return blocks[pos // self.block_size] * self.block_size + pos % self.block_size

    def step(self, parts: list[tuple[str, list[int], int, bool]], all_logits: bool = True,
             prompt_len: dict[str, int] | None = None,
             ) -> tuple[BatchInput, list[tuple[str, int]]]:
        """One step of `parts` (sequence, its new token ids, the first one's position, whether
        it samples) and the (sequence, position) of each logit row: every token's with
        `all_logits`, else the last token of each sampling part. `prompt_len` (sequence ->
        its prompt's length): each token's role, `BatchInput.prompt` (None: every token a
        prompt token)."""
        ids, pos, seq, slots, logit, rows = [], [], [], [], [], []
        names = list(dict.fromkeys(p[0] for p in parts))
        for name, tokens, start, sample in parts:
            for j, tok in enumerate(tokens):
                if all_logits or (sample and j == len(tokens) - 1):
                    logit.append(len(ids))
                    rows.append((name, start + j))
                ids.append(tok)
                pos.append(start + j)
                seq.append(names.index(name))
                slots.append(self.slot(name, start + j))
        width = max(len(self.blocks[n]) for n in names) + 1
        tables = np.full((len(names), width), 999999, np.uint32)   # unused: any value
        for r, n in enumerate(names):
            tables[r, :len(self.blocks[n])] = self.blocks[n]
        u32 = lambda v: np.asarray(v, np.uint32)  # noqa: E731
        prompt = None if prompt_len is None else np.array(
            [p < prompt_len[names[s]] for p, s in zip(pos, seq)], bool)
        return BatchInput(u32(ids), u32(pos), u32(seq), u32(slots), tables, u32(logit),
                          prompt), rows


def run_schedule(model, schedule, prompts: dict[str, list[int]], n_new: int, seed: int = 0,
                 all_logits: bool = True, kv_dtype: str = "float32", max_batch=None):
    """Run sequences through steps as `schedule(state)` groups them, greedy, the logits of
    every token kept (`all_logits`; else those of the sampled tokens only): returns
    ({(seq, pos): logits row}, {seq: generated tokens}). `schedule(done, tokens, generated,
    n_new)` gets, per sequence, how many of its tokens are in the KV cache, its tokens so far
    and its generated ones, and returns the parts of the next step ((seq, count) pairs: the
    next `count` tokens of seq). `kv_dtype`, `max_batch`: the paged cache's."""
    pages = Pages(NUM_BLOCKS, BLOCK_SIZE, seed)
    model.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE, kv_dtype, max_batch)
    tokens = {s: list(p) for s, p in prompts.items()}
    done = {s: 0 for s in prompts}        # tokens of s whose K/V are in the cache
    logits, generated = {}, {s: [] for s in prompts}
    while any(len(generated[s]) < n_new for s in prompts):
        parts = []
        for s, count in schedule(done, tokens, generated, n_new):
            new = tokens[s][done[s]:done[s] + count]
            samples = done[s] + count == len(tokens[s])
            parts.append((s, new, done[s], samples))
        b, rows = pages.step(parts, all_logits, {s: len(p) for s, p in prompts.items()})
        out = model.execute_batch(b, want_logits=True)
        for r, (s, pos) in enumerate(rows):
            logits[(s, pos)] = out.logits[r]
        for s, new, start, samples in parts:
            done[s] += len(new)
            if samples:
                r = rows.index((s, start + len(new) - 1))
                generated[s].append(int(out.argmax[r]))
                tokens[s].append(int(out.argmax[r]))
                assert out.argmax[r] == np.argmax(out.logits[r])
    return logits, {s: g[:n_new] for s, g in generated.items()}


def alone(seq: str):
    """Schedule: only `seq`, its whole prompt in one step, then one token per step."""
    def schedule(done, tokens, generated, n_new):
        if len(generated[seq]) >= n_new:
            return []
        return [(seq, len(tokens[seq]) - done[seq])]
    return schedule


def mixed(chunk: int):
    """Schedule: every unfinished sequence each step, prefills in chunks of `chunk` tokens
    (so prefill chunks and decode tokens share steps, in varying bucket sizes)."""
    def schedule(done, tokens, generated, n_new):
        return [(s, min(chunk, len(tokens[s]) - done[s])) for s in tokens
                if len(generated[s]) < n_new]
    return schedule


def check_prefill_logits(model, ids: list[int], ref, label: str,
                         kv_dtype: str = "float32") -> None:
    """The batched step's teacher-forced logits of one sequence's prefill (`ids` alone, in
    chunks of 1) against the oracle's `ref.logits(ids)`: within 1e-4, the small configs'
    fp32 tolerance of tests/test_opt.py (logits within +-12.4, measured ~4e-6 there). An f16
    KV cache: within F16_KV_LOGIT_REL of the largest |logit|."""
    lg, _ = run_schedule(model, alone("a"), {"a": ids}, 1, kv_dtype=kv_dtype)
    got = np.array([lg[("a", p)] for p in range(len(ids))])
    want = ref.logits(ids)
    err = np.abs(got - want).max()
    bound = 1e-4 if kv_dtype == "float32" else F16_KV_LOGIT_REL * np.abs(want).max()
    assert err < bound, f"{label}: max |logit diff| {err:.2e} (bound {bound:.2e})"


# An f16 paged KV cache (setup_paged_cache(..., "float16")): K and V rounded to f16 as they
# are stored, a relative error of at most 2^-11 each, all arithmetic f32 (the kernels'
# tests hold them to that rounding exactly). The logits' error scales with their magnitude,
# so the bound is relative, the one tests/test_families.py states for f16 operands
# (COOP_LOGIT_REL: 1e-3 of the largest |logit|); `python bench/kv_cache.py` (f16_vs_f32)
# measured against the f32 cache on lavapipe, 2026-12-03: 2.6e-4 (qwen2) and 7.7e-5 (gemma3)
# of it.
F16_KV_LOGIT_REL = 1e-3


def check_invariance(model, prompts, n_new, chunks=(3, 5), kv_dtype="float32",
                     max_batch=None):
    """Each sequence alone (the logits of its sampled tokens: R < T in its prefill step),
    then all mixed with prefill chunks of each size (every token's logits with the first,
    the sampled ones with the others), and last all recorded (no replay): every logits row
    the alone runs have bit-identical, the same greedy tokens. Returns the alone runs'
    tokens. `kv_dtype`, `max_batch`: the paged cache's, in every run."""
    ref_logits, ref_tokens = {}, {}
    for s in prompts:
        lg, toks = run_schedule(model, alone(s), {s: prompts[s]}, n_new, seed=len(s),
                                all_logits=False, kv_dtype=kv_dtype, max_batch=max_batch)
        ref_logits.update(lg)
        ref_tokens.update(toks)
    runs = [(f"chunks of {c}", lambda c=c: run_schedule(model, mixed(c), prompts, n_new,
                                                        all_logits=c == chunks[0],
                                                        kv_dtype=kv_dtype,
                                                        max_batch=max_batch))
            for c in chunks]

    def recorded():
        with config.REPLAY.override("0"):
            return run_schedule(model, mixed(chunks[0]), prompts, n_new, seed=7,
                                kv_dtype=kv_dtype, max_batch=max_batch)
    runs.append(("recorded", recorded))
    for what, run in runs:
        lg, toks = run()
        assert toks == ref_tokens, what
        assert lg.keys() >= ref_logits.keys(), what
        differ = [key for key in ref_logits if not np.array_equal(lg[key], ref_logits[key])]
        assert not differ, f"{what}: logits not bit-identical at (seq, position) {differ[:4]}"
    return ref_tokens


PROMPTS = {"count": "1, 2, 3, 4, 5,", "alphabet": "a b c d e f g",
           "days": "Monday, Tuesday, Wednesday,"}


def test_batch_smollm2_matches_transformers_and_is_batch_invariant(llama, tok, reference):
    # The random families run longer (6 tokens) and in chunks of 3 and 5; SmolLM2 on
    # lavapipe is slow here, so 4 tokens in chunks of 3 (and recorded).
    n_new = 4
    prompts = {s: tok.encode(p) for s, p in PROMPTS.items()}
    tokens = check_invariance(llama, prompts, n_new, chunks=(3,))
    for s, ids in prompts.items():
        assert tokens[s] == reference.greedy(ids, n_new), s


@pytest.fixture(scope="module")
def tok(default_gguf):
    from vkrt.models.tokenizer import Tokenizer

    return Tokenizer.from_metadata(default_gguf.metadata)


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_batch_family_matches_transformers_and_is_batch_invariant(arch, kv_dtype, device,
                                                                  tmp_path):
    """Greedy tokens equal transformers' and every sequence's logits are bit-identical alone
    and in any batch, with an f32 or an f16 paged KV cache; teacher-forced logits within
    check_prefill_logits' bound for the cache's dtype."""
    path = write_gguf(tmp_path / f"{arch}.gguf", hf_model(arch), arch, "F32")
    ref = TransformersReference(str(path), **ORACLE_CONFIG.get(arch, {}))
    rng = np.random.default_rng(3)
    lengths = {"a": 11, "b": 3, "c": 6}   # "a" + generated crosses gemma3's window of 8
    prompts = {s: [int(i) for i in rng.integers(0, N_VOCAB, n)] for s, n in lengths.items()}
    n_new = 6
    assert lengths["a"] > GEMMA3_WINDOW
    model = Llama.from_gguf(device, load_gguf(path))
    try:
        tokens = check_invariance(model, prompts, n_new, kv_dtype=kv_dtype)
        assert model.paged_kv_dtype == kv_dtype
        for s, ids in prompts.items():
            assert tokens[s] == ref.greedy(ids, n_new), s
        check_prefill_logits(model, prompts["a"], ref, arch, kv_dtype)
    finally:
        model.close()


def qwen2_with_prompts(device, tmp_path, seed: int):
    """A random qwen2 file's model, its transformers reference, and three prompts of 9, 3
    and 6 random ids (PCG64 seeded with `seed`)."""
    path = write_gguf(tmp_path / "qwen2.gguf", hf_model("qwen2"), "qwen2", "F32")
    ref = TransformersReference(str(path), **ORACLE_CONFIG.get("qwen2", {}))
    rng = np.random.default_rng(seed)
    prompts = {s: [int(i) for i in rng.integers(0, N_VOCAB, n)]
               for s, n in {"a": 9, "b": 3, "c": 6}.items()}
    return Llama.from_gguf(device, load_gguf(path)), ref, prompts


def test_wide_engine_decodes_on_its_kernel_batch_invariant(device, tmp_path):
    """An engine of many sequences (max_batch at or past a `WideBatchDecode` rule) runs its
    generated tokens' products on the rule's kernel (here matmul_tiled, which lavapipe has;
    the GPU table's is matmul_coop) for the paged cache's life: its steps record that
    kernel, every sequence's logits are bit-identical alone and in any batch, the greedy
    tokens equal transformers'; a cache set up for fewer sequences keeps the table's."""
    from vkrt.tuning import BatchCoopTile, WideBatchDecode

    model, ref, prompts = qwen2_with_prompts(device, tmp_path, seed=5)
    try:
        own = (BatchCoopTile(None, 16, 16, 1, 1, "test", 2),)     # a rule's own tiles
        model.k.tuning = dataclasses.replace(
            model.k.tuning, batch_products={"decode": "matmul", "prompt": "matmul"},
            wide_batch_decode=(WideBatchDecode(4, "matmul_tiled", "test", coop_tiles=own),))
        tokens = check_invariance(model, prompts, 5, max_batch=4)
        assert model.paged_products == {"decode": "matmul_tiled", "prompt": "matmul"}
        assert model.paged_coop_tiles == own
        assert model._role_products("decode") == {"batched": "matmul_tiled", "coop_tiles": own}
        for s, ids in prompts.items():
            assert tokens[s] == ref.greedy(ids, 5), s
        ds = model.batch_step(model._inputs(3, True)[1], StepShape(decode=2, prompt=1, logits=2))
        kernels = {d.pipeline.name for d in ds if d.name in ("blk.0.attn_q", "output")}
        assert kernels == {"matmul_tiled_f32", "matmul_f32"}, kernels
        assert [d.pipeline.name for d in ds if d.name == "output"] == ["matmul_tiled_f32"]
        model.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE, max_batch=3)
        assert model.paged_products == {"decode": "matmul", "prompt": "matmul"}
        assert model.paged_coop_tiles == model.k.tuning.batch_coop_tiles
    finally:
        model.close()


def test_wide_engine_splits_products_across_workgroups_batch_invariant(device, tmp_path):
    """An engine whose wide rule has `split_rows` runs each generated-token product of fewer
    rows on matmul_coop split across workgroups (Kernels.k_splits: here every layer product,
    2-4 splits) and its `sum_splits` reduction, the prompt tokens' products unsplit; every
    sequence's logits bit-identical alone and in any batch, greedy tokens equal
    transformers'. Runs where the device has cooperative matrices (the H200)."""
    from vkrt.tuning import BatchCoopTile, WideBatchDecode

    model, ref, prompts = qwen2_with_prompts(device, tmp_path, seed=7)
    try:
        if model.k.coop is None:
            pytest.skip(f"{device.name} lists no cooperative-matrix shape")
        own = (BatchCoopTile(None, 16, 16, 1, 1, "test", 1),)     # steps of 32 columns
        model.k.tuning = dataclasses.replace(
            model.k.tuning, batch_products={"decode": "matmul", "prompt": "matmul"},
            wide_batch_decode=(WideBatchDecode(4, "matmul_coop", "test", coop_tiles=own,
                                               split_rows=4096),))
        tokens = check_invariance(model, prompts, 5, max_batch=4)
        for s, ids in prompts.items():
            assert tokens[s] == ref.greedy(ids, 5), s
        ds = model.batch_step(model._inputs(3, True)[1], StepShape(decode=2, prompt=1, logits=2))
        names = [d.name for d in ds if d.name.startswith("blk.0.")]
        for name, splits in (("attn_q", 2), ("attn_k", 2), ("ffn_up", 2), ("ffn_down", 4)):
            i = names.index(f"blk.0.{name}")
            # the decode rows' split product, its reduction, then the prompt row's product
            assert names[i:i + 3] == [f"blk.0.{name}", f"blk.0.{name}.sum", f"blk.0.{name}"]
            d = next(d for d in ds if d.name == f"blk.0.{name}.sum")
            # sum_splits' push constants: n, n_rows, y_row0, n_splits
            assert np.frombuffer(d.push, np.uint32)[3] == splits, name
    finally:
        model.close()


def test_wide_engine_fuses_gate_and_up_batch_invariant(device, tmp_path):
    """An engine whose wide rule has a `glu_tile` runs its generated tokens' gate and up
    products and their SiLU as one `glu_coop` dispatch (`ffn_glu`), the prompt tokens' as
    two products and `silu_mul` over their rows; every sequence's logits bit-identical
    alone and in any batch, greedy tokens equal transformers'; `glu_rows` that leave out
    the FFN's rows (its bounds included) leave them unfused. Runs where the device has
    cooperative matrices."""
    from vkrt.tuning import BatchCoopTile, WideBatchDecode

    model, ref, prompts = qwen2_with_prompts(device, tmp_path, seed=8)
    try:
        if model.k.coop is None:
            pytest.skip(f"{device.name} lists no cooperative-matrix shape")
        own = (BatchCoopTile(None, 16, 16, 1, 1, "test", 2),)
        rule = WideBatchDecode(4, "matmul_coop", "test", coop_tiles=own,
                               glu_tile=BatchCoopTile(None, 16, 16, 1, 1, "test", 2, 2),
                               glu_rows=(0, 1 << 20))
        model.k.tuning = dataclasses.replace(
            model.k.tuning, batch_products={"decode": "matmul", "prompt": "matmul"},
            wide_batch_decode=(rule,))
        tokens = check_invariance(model, prompts, 5, max_batch=4)
        for s, ids in prompts.items():
            assert tokens[s] == ref.greedy(ids, 5), s
        ds = model.batch_step(model._inputs(3, True)[1], StepShape(decode=2, prompt=1, logits=2))
        names = [d.name for d in ds if d.name.startswith("blk.0.ffn")]
        assert names[:4] == ["blk.0.ffn_glu", "blk.0.ffn_gate", "blk.0.ffn_up",
                             "blk.0.ffn_silu_mul"], names
        n_ff = model.w["blk.0.ffn_gate.weight"].shape[0]
        for rows, fused in (((n_ff, n_ff), True), ((0, n_ff - 1), False),
                            ((n_ff + 1, 1 << 20), False)):
            model.k.tuning = dataclasses.replace(model.k.tuning, wide_batch_decode=(
                dataclasses.replace(rule, glu_rows=rows),))
            model.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE, max_batch=4)
            ds = model.batch_step(model._inputs(3, True)[1],
                                  StepShape(decode=2, prompt=1, logits=2))
            assert ("blk.0.ffn_glu" in {d.name for d in ds}) == fused, rows
    finally:
        model.close()


def test_batch_buckets_capture_once_each(llama):
    """A step is captured once per (T bucket, R bucket) and replayed after; T past the largest
    bucket is recorded."""
    pages = Pages(NUM_BLOCKS, BLOCK_SIZE)
    llama.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE)
    c = llama.stream.counters
    outs = {}
    for n, captures in ((3, 1), (4, 0), (3, 0), (2, 1), (4, 0)):   # buckets 4, 4, 4, 2, 4
        b, _ = pages.step([(f"s{n}", list(range(1, n + 1)), 0, True)], all_logits=False)
        pages.blocks.clear()      # the next step gets other blocks
        before = (c.captures, c.replays)
        out = llama.execute_batch(b, want_logits=True)
        # The same tokens in other blocks: the same bits.
        assert np.array_equal(outs.setdefault(n, out.logits), out.logits)
        assert (c.captures - before[0], c.replays - before[1]) == (captures, 1), n
    big = batch_mod.MAX_REPLAY_TOKENS + 1
    b, _ = pages.step([("big", [1] * big, 0, True)], all_logits=False)
    before = c.replays
    llama.execute_batch(b)
    assert c.replays == before


def test_batch_products_take_their_roles_kernels(llama, monkeypatch):
    """A step's products run the generated tokens' rows (first) on the table's "decode"
    kernel and the prompt tokens' rows (after the decode bucket) on its "prompt" kernel, each
    from its first row (token0); the logit rows' product on the "decode" kernel. Either way
    round the table is read, when the paged cache is set up."""
    for decode, prompt in (("matmul", "matmul_tiled"), ("matmul_tiled", "matmul")):
        monkeypatch.setattr(llama.k, "tuning", dataclasses.replace(
            llama.k.tuning, batch_products={"decode": decode, "prompt": prompt}))
        llama.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE)    # the cache fixes the kernels
        assert llama.paged_products == {"decode": decode, "prompt": prompt}
        ds = llama.batch_step(llama._inputs(6, True)[1], StepShape(decode=2, prompt=4, logits=3))

        def products(name):
            return [(d.pipeline.name.removesuffix("_" + d.tensors[0].dtype),
                     *struct.unpack("<4I", d.push)[2:]) for d in ds if d.name == name]
        assert products("blk.0.attn_q") == [(decode, 2, 0), (prompt, 4, 2)]
        assert products("blk.3.ffn_down") == [(decode, 2, 0), (prompt, 4, 2)]
        assert products("output") == [(decode, 3, 0)]


def test_batch_places_tokens_in_their_roles_rows(llama):
    """execute_batch puts the generated tokens in device rows 0 .. D-1 and the prompt tokens
    from the decode bucket's end (row D_b) on, so each runs on its role's kernel
    (test_batch_products_take_their_roles_kernels) however few generated tokens there are;
    the padded rows between are scratch tokens writing the scratch slot. A mixed step of 3
    generated tokens (bucket 4) and 2 prompt tokens, read back from the step's inputs."""
    pages = Pages(NUM_BLOCKS, BLOCK_SIZE)
    llama.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE)
    for s, n in (("a", 5), ("b", 6), ("c", 7)):      # their prompts: K/V in the cache
        llama.execute_batch(pages.step([(s, [7] * n, 0, True)], all_logits=False)[0])
    parts = [("a", [11], 5, True), ("p", [21, 22], 0, True), ("b", [12], 6, True),
             ("c", [13], 7, True)]
    b, _ = pages.step(parts, all_logits=False, prompt_len={"a": 5, "b": 6, "c": 7, "p": 9})
    assert b.prompt.tolist() == [False, True, True, False, False]
    with config.REPLAY.override("1"):          # padded to buckets: replayed
        llama.execute_batch(b)
    inputs = llama._step_inputs[batch_mod.bucket(3) + batch_mod.bucket(2), 0]   # replayed: 4 + 2
    ids, positions = llama.stream.read(inputs.ids), llama.stream.read(inputs.positions)
    slots = llama.stream.read(inputs.slots)
    assert ids.tolist() == [11, 12, 13, 0, 21, 22]
    assert positions.tolist() == [5, 6, 7, 0, 0, 1]
    assert slots[3] == llama._paged.scratch_slot
    assert slots[[0, 1, 2, 4, 5]].tolist() == b.slot_mapping[[0, 3, 4, 1, 2]].tolist()


def test_paged_cache_fits_the_device(llama, monkeypatch):
    """max_paged_blocks is the most blocks whose K/V buffer (paged_cache_bytes, the bytes
    setup_paged_cache allocates) fits KV_MEMORY_FRACTION of the device-local heap less what
    vkrt holds (a paged cache of before not counted), and whose one layer's K fits
    maxStorageBufferRange; a cache refused leaves the one before as it was, and one whose
    allocation fails half-way leaves no paged cache and no bytes behind."""
    from vkrt.errors import DeviceMemoryError

    d = llama.device
    llama.setup_paged_cache(8, BLOCK_SIZE)
    held = d.bytes_in_use - llama._paged.nbytes - d.staging_bytes_in_use   # no step inputs yet
    monkeypatch.setattr(d, "device_local_bytes", int((held + (100 << 20)) / 0.9) + 1)
    budget = int(batch_mod.KV_MEMORY_FRACTION * d.device_local_bytes) - held
    n = llama.max_paged_blocks(BLOCK_SIZE)
    assert llama.paged_cache_bytes(n, BLOCK_SIZE) <= budget
    assert llama.paged_cache_bytes(n + 1, BLOCK_SIZE) > budget
    n16 = llama.max_paged_blocks(BLOCK_SIZE, "float16")          # f16: half the bytes a block
    assert llama.paged_cache_bytes(n16, BLOCK_SIZE, "float16") <= budget
    assert llama.paged_cache_bytes(n16 + 1, BLOCK_SIZE, "float16") > budget
    assert 2 * n <= n16 <= 2 * n + 2
    for bad in (lambda: llama.setup_paged_cache(8, BLOCK_SIZE, "bfloat16"),
                lambda: llama.max_paged_blocks(BLOCK_SIZE, "bfloat16"),
                lambda: llama.paged_cache_bytes(8, BLOCK_SIZE, "bfloat16")):
        with pytest.raises(ValueError, match="kv_dtype 'bfloat16': the kernels read float32 "
                                             "or float16"):
            bad()
    llama.setup_paged_cache(n, BLOCK_SIZE)
    assert d.bytes_in_use - held >= llama.paged_cache_bytes(n, BLOCK_SIZE)
    assert llama.max_paged_blocks(BLOCK_SIZE) == n     # its own cache not counted as held
    monkeypatch.setattr(d, "device_local_bytes", 1 << 50)
    monkeypatch.setattr(d, "max_memory_allocation_size", 1 << 50)
    n = llama.max_paged_blocks(BLOCK_SIZE)
    row = llama._paged_kv_width() * 4
    assert (n * BLOCK_SIZE + 1) * row <= d.max_storage_buffer_range
    assert ((n + 1) * BLOCK_SIZE + 1) * row > d.max_storage_buffer_range
    llama.setup_paged_cache(8, BLOCK_SIZE)
    before = d.bytes_in_use
    with pytest.raises(ValueError, match="maxStorageBufferRange"):
        llama.setup_paged_cache(n + 1, BLOCK_SIZE)
    assert llama.paged_cache_info == (8, BLOCK_SIZE) and d.bytes_in_use == before

    def no_memory(max_positions):
        raise DeviceMemoryError("allocating the tables: out of memory")
    monkeypatch.setattr(llama, "_paged_tables", no_memory)
    with pytest.raises(DeviceMemoryError):
        llama.setup_paged_cache(16, BLOCK_SIZE)
    assert llama.paged_cache_info is None
    assert d.bytes_in_use - d.staging_bytes_in_use == held


@pytest.fixture
def qwen2(device, tmp_path):
    """A random qwen2 file's model (F32, tests/family_files.py)."""
    model = Llama.from_gguf(device, load_gguf(write_gguf(tmp_path / "qwen2.gguf",
                                                         hf_model("qwen2"), "qwen2", "F32")))
    yield model
    model.close()


def test_paged_cache_spread_over_buffers_gives_the_same_bits(qwen2, monkeypatch):
    """A K/V cache larger than maxMemoryAllocationSize lives in several buffers (consecutive
    views per buffer, vkrt/models/scratch.py kv_cache): a step's logits are the bits of the
    cache in one buffer; the budget does not stop at one allocation's size."""
    llama = qwen2
    pages = Pages(NUM_BLOCKS, BLOCK_SIZE)
    b, _ = pages.step([("a", [1, 2, 3, 4, 5], 0, True), ("b", [6, 7], 0, True)])
    llama.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE)
    assert len(llama._paged.buffer.buffers) == 1
    want = llama.execute_batch(b, want_logits=True).logits
    view = llama._paged.k[0].nbytes
    monkeypatch.setattr(llama.device, "max_memory_allocation_size", 3 * view)
    llama.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE)
    n_views = 2 * llama.hp.n_layer
    assert n_views > 3 and len(llama._paged.buffer.buffers) == -(-n_views // 3)
    assert {t.buffer for t in llama._paged.k + llama._paged.v} == set(
        llama._paged.buffer.buffers)
    assert np.array_equal(llama.execute_batch(b, want_logits=True).logits, want)
    monkeypatch.setattr(llama.device, "device_local_bytes", 1 << 40)
    assert llama.paged_cache_bytes(llama.max_paged_blocks(BLOCK_SIZE), BLOCK_SIZE) > 3 * view


def test_batch_input_errors_name_the_field(llama):
    llama.setup_paged_cache(8, BLOCK_SIZE)
    assert llama.paged_cache_info == (8, BLOCK_SIZE)
    u32 = lambda v: np.asarray(v, np.uint32)  # noqa: E731

    def batch(**change):
        fields = dict(token_ids=u32([1, 2]), positions=u32([0, 1]), seq_of_token=u32([0, 0]),
                      slot_mapping=u32([12, 13]), block_tables=u32([[3, 5]]),
                      logit_tokens=u32([1]))
        fields.update(change)
        return BatchInput(**fields)

    llama.execute_batch(batch())
    for change, match in [
            (dict(positions=np.array([0, 1], np.int64)), r"positions: int64 \[2\]"),
            (dict(positions=u32([0])), "positions: 1 entries for 2 tokens"),
            (dict(token_ids=u32([1, 10 ** 6])), "token_ids: token 1 is id 1000000"),
            (dict(seq_of_token=u32([0, 1])), "seq_of_token: token 1 is in row 1, past the 1"),
            (dict(slot_mapping=u32([12, 14])), "slot_mapping: token 1 .* writes slot 14, its "
                                               "block table says 13"),
            (dict(block_tables=u32([[3, 8]]), positions=u32([0, 4]),
                  slot_mapping=u32([12, 32])), "block_tables: row 0 block 1 is 8, past the 8"),
            (dict(positions=u32([0, 8]), slot_mapping=u32([12, 0])),
             "positions: token 1 is at position 8, past its block-table row of 2 blocks"),
            (dict(positions=u32([0, 40])), "positions: token 1 is at position 40, past the 32"),
            (dict(positions=u32([1, 1]), slot_mapping=u32([13, 13])),
             "slot_mapping: slot 13 is written by tokens 0 and 1"),
            (dict(logit_tokens=u32([2])), "logit_tokens: row 0 is token 2, past the 2 tokens"),
            (dict(prompt=u32([1, 0])), r"prompt: uint32 \[2\], expected a bool array of the 2"),
            (dict(prompt=np.array([True])), r"prompt: bool \[1\], expected a bool array"),
            (dict(prompt=[True, False]), "prompt: list, expected a bool array"),
            (dict(token_ids=u32([]), positions=u32([]), seq_of_token=u32([]),
                  slot_mapping=u32([])), "token_ids: 0 tokens")]:
        with pytest.raises(ValueError, match=match):
            llama.execute_batch(batch(**change))


def test_batch_output_split_over_rows(split_files, device, monkeypatch):  # noqa: F811
    """token_embd and output past maxStorageBufferRange (lowered as tests/test_llama_types.py
    does) are read in slices of rows by the batched step too (`embed_range`; the logit rows'
    product per slice into `head`, copied into its columns): the same bits as bound whole."""
    g = load_gguf(split_files["Q4_K"])
    prompts = {"a": [2998, 1000, 2000, 3, 1, 1153, 2305], "b": [5, 895, 896, 2999]}
    runs = []
    try:
        for split in (False, True):
            if split:
                monkeypatch.setattr(device, "max_storage_buffer_range", LIMIT)
                monkeypatch.setattr(device, "min_storage_buffer_offset_alignment", 256)
            model = Llama.from_gguf(device, g)
            try:
                assert bool(model.slices) == split
                runs.append(run_schedule(model, mixed(3), prompts, 3))
            finally:
                model.close()
    finally:
        g.close()
    (whole, tokens), (sliced, split_tokens) = runs
    assert split_tokens == tokens and whole.keys() == sliced.keys()
    assert all(np.array_equal(whole[key], sliced[key]) for key in whole)


def test_batch_through_staging(tmp_path):
    """A device whose memory the host does not map (a discrete GPU's path): the step inputs
    go through their own staging buffer, copied in by the step's first record (replayed
    with it), the argmax comes back through the
    recording's own staging copy, the logits through a copy recorded after it. The same
    greedy tokens as transformers, alone and mixed bit-identical."""
    from vkrt.runtime.device import Device

    path = write_gguf(tmp_path / "qwen2.gguf", hf_model("qwen2"), "qwen2", "F32")
    ref = TransformersReference(str(path))
    rng = np.random.default_rng(4)
    prompts = {s: [int(i) for i in rng.integers(0, N_VOCAB, n)] for s, n in (("a", 7),
                                                                              ("b", 2))}
    with Device(direct_host_access=False) as device:
        model = Llama.from_gguf(device, load_gguf(path))
        try:
            assert model.acts is None or model.acts.arena.mapped is None
            tokens = check_invariance(model, prompts, 4, chunks=(3,))
            assert all(i.buffer.mapped is None for i in model._step_inputs.values())
        finally:
            model.close()
    for s, ids in prompts.items():
        assert tokens[s] == ref.greedy(ids, 4), s


def test_batch_steps_in_flight_take_the_greedy_tokens_on_the_gpu(checked_device, tmp_path):
    """Asynchronous scheduling's device half, host-mapped and through staging, under the
    validation layer where installed: each decode step is submitted while the step before
    it is still held back from the GPU (`Stream.hold`: a host wait for it would time out),
    its tokens' ids unknown to the host (0) and named by that step's logit rows
    (`BatchInput.prev_rows`): `feed_sampled` takes the greedy tokens on the GPU, and the
    tokens equal a synchronous run's. The bucket's second `StepInputs` (phase 1) holds the
    step written while phase 0's is in flight."""
    path = write_gguf(tmp_path / "qwen2.gguf", hf_model("qwen2"), "qwen2", "F32")
    rng = np.random.default_rng(6)
    prompts = {s: [int(i) for i in rng.integers(0, N_VOCAB, n)]
               for s, n in (("a", 7), ("b", 2), ("c", 12))}
    n_new = 5
    llama = Llama.from_gguf(checked_device, load_gguf(path))
    try:
        _, want = run_schedule(llama, mixed(64), prompts, n_new, all_logits=False)
        assert len({tuple(w) for w in want.values()}) == 3
        got = steps_in_flight(llama, prompts, n_new)
        assert got == want
        assert {key[1] for key in llama._step_inputs} == {0, 1}
        # Three steps of one bucket uncollected: the third waits for the first's.
        pages = Pages(NUM_BLOCKS, BLOCK_SIZE, 2)
        llama.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE)
        steps = []
        for seq in "def":
            steps.append(llama.submit_batch(pages.step([(seq, [5, 6], 0, True)],
                                                       all_logits=False)[0]))
        assert [p.done for p in steps] == [True, False, False]
        assert len({tuple(p.result().argmax.tolist()) for p in steps}) == 1
    finally:
        llama.close()


def steps_in_flight(llama, prompts, n_new):
    """The greedy tokens of `prompts` prefilled in one step, then decoded n_new - 1 steps,
    each submitted with the step before held and uncollected; a row past the last step's
    rows refused by name at the end."""
    names = list(prompts)
    pages = Pages(NUM_BLOCKS, BLOCK_SIZE, 1)
    llama.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE)
    plen = {s: len(p) for s, p in prompts.items()}
    got = {s: [] for s in names}
    s = llama.stream
    s.synchronize()   # the cache's tables uploaded (staging): only steps are in flight below
    s.hold()
    b, _ = pages.step([(n, prompts[n], 0, True) for n in names], all_logits=False,
                      prompt_len=plen)
    pending = llama.submit_batch(b)
    try:
        for i in range(n_new):
            following = None
            if i < n_new - 1:
                b, _ = pages.step([(n, [0], plen[n] + i, True) for n in names],
                                  all_logits=False, prompt_len=plen)
                b.prev_rows = np.arange(len(names), dtype=np.uint32)
                with config.FENCE_TIMEOUT_S.override("5"):
                    following = llama.submit_batch(b)   # the step before is held
            s.release()
            out = pending.result()
            for r, n in enumerate(names):
                got[n].append(int(out.argmax[r]))
            s.hold()
            pending = following
    finally:
        s.release()
    with pytest.raises(ValueError, match=r"prev_rows: token 2 takes row 3 of the step "
                                         r"before, which returned 3 rows"):
        b, _ = pages.step([(n, [0], plen[n] + n_new, True) for n in names],
                          all_logits=False, prompt_len=plen)
        b.prev_rows = np.array([0, 1, 3], np.uint32)
        llama.submit_batch(b)
    return got


def prefix_shared(model, prompts: dict[str, list[int]], shared: int, n_new: int):
    """Prefix caching at the model's level (vkrt/serve/kv_cache.py): "a" is prefilled, then
    "b"'s table starts with a's first `shared` blocks (its first shared * BLOCK_SIZE prompt
    tokens are a's) and b computes only the rest, then decodes. Returns b's (logits of its
    sampled rows, tokens)."""
    pages = Pages(NUM_BLOCKS, BLOCK_SIZE, seed=3)
    model.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE)
    a, b = prompts["a"], list(prompts["b"])
    lens = {s: len(p) for s, p in prompts.items()}
    step, _ = pages.step([("a", a, 0, True)], all_logits=False, prompt_len=lens)
    model.execute_batch(step)
    pages.blocks["b"] = pages.blocks["a"][:shared]
    start, logits, tokens = shared * BLOCK_SIZE, {}, []
    while len(tokens) < n_new:
        step, rows = pages.step([("b", b[start:], start, True)], all_logits=False,
                                prompt_len=lens)
        out = model.execute_batch(step, want_logits=True)
        logits[rows[0]] = out.logits[0]
        tokens.append(int(out.argmax[0]))
        start = len(b)
        b.append(tokens[-1])
    return logits, tokens


@pytest.mark.parametrize("which", ["smollm2", "qwen2"])
def test_a_cached_prefix_gives_the_bits_of_computing_it(which, request):
    """A sequence whose first prompt blocks were computed by another sequence's prefill (the
    serving engine's prefix cache hands them over) gets the logits, bit for bit, of
    computing its whole prompt alone: a prompt token's K and V do not depend on the
    sequence or step that computed them."""
    model = request.getfixturevalue("llama" if which == "smollm2" else "qwen2")
    rng = np.random.default_rng(5)
    head = [int(t) for t in rng.integers(1, 200, 2 * BLOCK_SIZE + 1)]
    prompts = {"a": head + [7, 8, 9, 10, 11], "b": head + [12, 13]}
    n_new = 2 if which == "smollm2" else 4
    want_logits, want = run_schedule(model, alone("b"), {"b": prompts["b"]}, n_new,
                                     all_logits=False)
    for shared in (1, 2):
        logits, tokens = prefix_shared(model, prompts, shared, n_new)
        assert tokens == want["b"], shared
        assert logits.keys() == want_logits.keys()
        for key in logits:
            assert np.array_equal(logits[key], want_logits[key]), (shared, key)


def test_paged_cache_partials_cover_a_tiles_own_split():
    """PagedCache.most_split_rows, which sizes the split products' partial sums: the engine's
    split_rows, or a tile's own where larger (a Q4_1 tile splitting up to 8192 rows in an
    engine of 4096), so that `Kernels.k_splits` never asks for more partials than there are."""
    from types import SimpleNamespace

    from vkrt.models.batch import PagedCache
    from vkrt.tuning import BatchCoopTile

    plain = BatchCoopTile(None, 32, 32, 2, 2, "test", 8)
    own = BatchCoopTile(None, 32, 32, 2, 2, "test", 4, dtypes=("q4_1",), split_rows=8192)
    for split_rows, tiles, want in ((4096, (plain,), 4096), (4096, (plain, own), 8192),
                                    (16384, (plain, own), 16384), (0, (own,), 8192),
                                    (0, (), 0)):
        p = SimpleNamespace(split_rows=split_rows, coop_tiles=tiles)
        assert PagedCache.most_split_rows(p) == want, (split_rows, tiles)


def test_paged_cache_fuses_glu():
    """PagedCache.fuses_glu: a gate of `RAW4_DTYPES` (Q4_1, Q4_K) fuses within glu_raw_rows,
    any other type within glu_rows, bounds included; none without a tile."""
    from types import SimpleNamespace

    from vkrt.models.batch import PagedCache

    p = SimpleNamespace(glu_tile=(32, 32, 2, 2, 2, 1, 2), glu_rows=(4096, 8192),
                        glu_raw_rows=(4096, 14336))

    def fuses(dtype: str, rows: int) -> bool:
        return PagedCache.fuses_glu(p, SimpleNamespace(dtype=dtype, shape=(rows, 4096)))

    for raw in ("q4_1", "q4_k"):
        assert fuses(raw, 4096) and fuses(raw, 14336)
        assert not fuses(raw, 4095) and not fuses(raw, 14337)
    assert fuses("q6_k", 4096) and fuses("q6_k", 8192)
    assert not fuses("q6_k", 4095) and not fuses("q6_k", 14336) and not fuses("float32", 14336)
    p.glu_tile = None
    assert not fuses("q4_1", 8192) and not fuses("q4_k", 8192)
