"""OPT's batched step over a paged KV cache (vkrt/models/opt_batch.py on vkrt/models/batch.py),
as tests/test_batch.py checks the Llama-like families': BATCH INVARIANCE (a sequence's logits
bit-identical alone or batched with sequences of other prompt lengths, in prefill chunks and
decode steps across buckets, replayed or recorded), greedy tokens equal to transformers'
OPTForCausalLM fp32 (the oracle of tests/test_opt.py, over its small random checkpoints:
pre-LN with project_in/out, post-LN), embed_tokens/lm_head in slices, the input checks; and
the engine picking the batched runner for OPT, each request equal to its batch-1 run.
"""
from __future__ import annotations

import numpy as np
import pytest

from test_batch import (BLOCK_SIZE, NUM_BLOCKS, check_invariance, check_prefill_logits,
                        mixed, run_schedule)
from test_opt import SMALL, checkpoints  # noqa: F401 (a fixture)
from vkrt.models.batch import BatchInput
from vkrt.models.opt import OPT

LENGTHS = {"a": 11, "b": 3, "c": 6}
N_NEW = 6


def oracle(path: str):
    import torch
    from transformers import OPTForCausalLM

    from reference import TransformersReference

    return TransformersReference.from_model(OPTForCausalLM.from_pretrained(
        path, dtype=torch.float32))


def prompts_of(seed: int) -> dict[str, list[int]]:
    """Prompts of LENGTHS, each starting with </s> (OPT's BOS, id 2) as OPT's tokenizer does."""
    rng = np.random.default_rng(seed)
    return {s: [2] + [int(i) for i in rng.integers(3, SMALL["vocab_size"], n - 1)]
            for s, n in LENGTHS.items()}


@pytest.mark.parametrize("case, kv_dtype", [("f32", "float32"), ("post_ln", "float32"),
                                            ("f32", "float16")])
def test_opt_batch_matches_transformers_and_is_batch_invariant(checkpoints, device,  # noqa: F811
                                                               case, kv_dtype):
    """Greedy tokens equal transformers' and logits bit-identical alone and batched, with
    an f32 (pre- and post-LN) or an f16 paged KV cache (tests/test_batch.py's bounds)."""
    path = checkpoints[case]
    ref = oracle(path)
    prompts = prompts_of(5)
    model = OPT.from_folder(device, path)
    try:
        tokens = check_invariance(model, prompts, N_NEW, kv_dtype=kv_dtype)
        for s, ids in prompts.items():
            assert tokens[s] == ref.greedy(ids, N_NEW), (case, s)
        assert len({t for toks in tokens.values() for t in toks}) > 3   # no collapse
        check_prefill_logits(model, prompts["a"], ref, case, kv_dtype)
    finally:
        model.close()


def test_opt_batch_sliced_tables_match_whole(checkpoints, device):  # noqa: F811
    """embed_tokens (tied lm_head) in slices of 256 rows (tests/test_opt.py's limit): the
    lookup by `embed_range` per slice, the logit rows' product per slice into `head`, copied
    into its columns: the same bits and tokens as bound whole."""
    path = checkpoints["f32"]
    prompts = prompts_of(6)
    runs = []
    for limit in (None, 256 * 32 * 4):
        model = OPT.from_folder(device, path, max_binding_bytes=limit)
        try:
            assert len(model.embed) == (1 if limit is None else 2)
            runs.append(run_schedule(model, mixed(3), prompts, 3))
        finally:
            model.close()
    (whole, tokens), (sliced, split_tokens) = runs
    assert split_tokens == tokens and whole.keys() == sliced.keys()
    assert all(np.array_equal(whole[key], sliced[key]) for key in whole)


def test_opt_batch_on_both_memory_paths_frees_every_buffer(checkpoints,  # noqa: F811
                                                          checked_device):
    """Host-mapped and through staging (a discrete GPU's path), under the validation layer
    where installed: the same bits alone and mixed (post-LN with the tables in slices), a
    second `setup_paged_cache` frees the first (its positions table included), `close` frees
    every buffer."""
    before = checked_device.bytes_in_use
    model = OPT.from_folder(checked_device, checkpoints["post_ln"],
                            max_binding_bytes=256 * 64 * 4)
    try:
        assert len(model.embed) == 2
        prompts = {s: p for s, p in prompts_of(7).items() if s != "a"}
        check_invariance(model, prompts, 3, chunks=(2,))
        model.setup_paged_cache(8, BLOCK_SIZE)
        held = checked_device.bytes_in_use
        model.setup_paged_cache(8, BLOCK_SIZE)
        assert checked_device.bytes_in_use == held
    finally:
        model.close()
    assert checked_device.bytes_in_use == before


def test_opt_batch_input_errors_name_the_field(checkpoints, device):  # noqa: F811
    """validate_batch's checks, as for Llama; positions stop at max_position_embeddings (64)
    even where the paged cache has more slots (64 blocks of 4)."""
    model = OPT.from_folder(device, checkpoints["f32"])
    u32 = lambda v: np.asarray(v, np.uint32)  # noqa: E731
    try:
        model.setup_paged_cache(NUM_BLOCKS, BLOCK_SIZE)
        assert model.paged_cache_info == (NUM_BLOCKS, BLOCK_SIZE)
        tables = u32([list(range(20))])

        def batch(**change):
            fields = dict(token_ids=u32([2, 7]), positions=u32([0, 1]),
                          seq_of_token=u32([0, 0]), slot_mapping=u32([0, 1]),
                          block_tables=tables, logit_tokens=u32([1]))
            fields.update(change)
            return BatchInput(**fields)

        model.execute_batch(batch())
        for change, match in [
                (dict(positions=u32([0, 64]), slot_mapping=u32([0, 64])),
                 "^BatchInput.positions: token 1 is at position 64, past the 64 positions"),
                (dict(token_ids=u32([2, 300])), "token_ids: token 1 is id 300, past the "
                                                "vocabulary of 300"),
                (dict(slot_mapping=u32([0, 2])), "slot_mapping: token 1 .* writes slot 2, its "
                                                 "block table says 1"),
                (dict(positions=np.array([0, 1], np.int64)), r"positions: int64 \[2\]")]:
            with pytest.raises(ValueError, match=match) as e:
                model.execute_batch(batch(**change))
            assert "\n" not in str(e.value)
    finally:
        model.close()


def test_engine_batches_opt_and_each_request_equals_its_batch1_run(opt_folder, device):
    """The engine picks `BatchRunner` for OPT (`batched_model`): 6 greedy requests of prompt
    lengths 1 to 29 at once, max_batch 4 and 8 tokens a step (prompts chunked, decodes and
    chunks sharing steps): each gets, token for token, what batch-1 `generate` (the
    single-sequence forward, its own contiguous KV cache) gives it alone."""
    import vkrt
    from vkrt.models.generate import generate
    from vkrt.serve import Engine, SamplingParams
    from vkrt.serve.runner import BatchRunner

    rng = np.random.default_rng(8)
    cases = [([2] + [int(i) for i in rng.integers(3, SMALL["vocab_size"], n - 1)], m)
             for n, m in ((1, 9), (5, 4), (29, 7), (12, 12), (3, 6), (17, 5))]
    with vkrt.load(opt_folder, device=device) as model:
        want = [generate(model.lm, prompt, m).tokens for prompt, m in cases]
        engine = Engine(model, max_batch=4, block_size=4, max_batched_tokens=8,
                        max_queue=16).start(thread=False)
        assert isinstance(engine.runner, BatchRunner) and engine.max_batch == 4
        got = {}
        for i, (prompt, m) in enumerate(cases):
            engine.add_request(prompt, SamplingParams(max_tokens=m, ignore_eos=True),
                               lambda out, i=i: got.setdefault(i, []).extend(out.token_ids))
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
            assert steps < 500
        assert engine.runner.max_seqs_in_step == 4
        assert [got[i] for i in range(len(cases))] == want
        assert engine.kv.num_free_blocks == engine.kv.num_blocks
        engine.shutdown()
        # An f16 KV cache (--kv-cache-dtype f16): the same requests batched as above, and
        # each alone (max_batch 1), token for token; the model's cache now holds f16.
        runs = []
        for max_batch in (4, 1):
            engine = Engine(model, max_batch=max_batch, block_size=4, max_batched_tokens=8,
                            max_queue=16, kv_cache_dtype="f16").start(thread=False)
            assert model.lm.paged_kv_dtype == "float16"
            got = {}
            for i, (prompt, m) in enumerate(cases):
                engine.add_request(prompt, SamplingParams(max_tokens=m, ignore_eos=True),
                                   lambda out, i=i: got.setdefault(i, []).extend(out.token_ids))
            while engine.has_unfinished():
                engine.step()
            engine.shutdown()
            runs.append([got[i] for i in range(len(cases))])
        assert runs[0] == runs[1] and [len(t) for t in runs[0]] == [m for _, m in cases]
