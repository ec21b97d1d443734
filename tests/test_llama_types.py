"""The model-level gate of each GGUF block type (vkrt/weight_types.py): a small Llama file
whose matrices and embedding are all stored in that type, against transformers fp32 on the
weights gguf-py dequantizes from the same bytes.

Each case is a random `LlamaForCausalLM` (hidden 256, the smallest row of whole K-quant
blocks; feed-forward 256; 1 layer; GQA 4/2 heads of 64; vocabulary 300) whose 2-D tensors
are random blocks (tests/weight_blocks.py: gguf-py cannot quantize K-quants, and any block
with finite f16 scales is a valid weight), written as llama.cpp's converter writes a Llama
(tests/test_llama_variants.py `write_gguf`, Q/K rows permuted). The oracle is transformers
fp32 reading that file (`from_pretrained(gguf_file=...)`, which dequantizes it through
gguf-py and un-permutes Q/K). Teacher-forced logits over LOGIT_LEN
positions (the prefill products, `matmul`) within test_llama_variants' LOGIT_ATOL with the
same argmax at every position, and greedy tokens (decode: the fused `qkv_rope`,
`matvec_glu`, `matvec_add` and `matvec` kernels). Measured on lavapipe: max |dlogit| 1.7e-6
to 1.6e-5 (Q4_1 and Q5_1, whose random mins give rows a large common offset, so products
cancel more), logits within +-6; about 1 s per type.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from reference import TransformersReference
from test_llama_variants import LOGIT_ATOL, write_gguf
from vkrt import weight_types
from vkrt.models.generate import generate
from vkrt.models.gguf import load_gguf
from vkrt.models.llama import Llama
from weight_blocks import random_blocks

N_VOCAB, HIDDEN, N_FF, N_HEAD, N_HEAD_KV = 300, 256, 256, 4, 2
LOGIT_LEN, PROMPT_LEN, GREEDY = 48, 8, 4
BLOCK_TYPES = [t.gguf for t in weight_types.TYPES if t.quantized]


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of convert_hf_to_gguf.py `LlamaModel.permute` (llama.cpp's adjacent RoPE
    pairs back to transformers' rotate-half rows)."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def blocks_model(gguf_type, seed: int = 0, n_vocab: int = N_VOCAB, n_layer: int = 1):
    """(model, raw): a random fp32 LlamaForCausalLM whose matrices are gguf-py's values of
    random blocks of `gguf_type` (a GGUF type name, or a function of the GGUF tensor name
    giving its type), and those blocks by GGUF tensor name (GGUF row order, as
    `write_gguf`'s `raw` takes them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=n_vocab, hidden_size=HIDDEN, intermediate_size=N_FF,
                         num_hidden_layers=n_layer, num_attention_heads=N_HEAD,
                         num_key_value_heads=N_HEAD_KV, max_position_embeddings=512,
                         rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    r = np.random.default_rng(seed + 1)
    head_dim = HIDDEN // N_HEAD
    hf = {"model.embed_tokens.weight": ("token_embd.weight", None),
          "lm_head.weight": ("output.weight", None)}
    names = {"self_attn.q_proj": ("attn_q", N_HEAD), "self_attn.k_proj": ("attn_k", N_HEAD_KV),
             "self_attn.v_proj": ("attn_v", None), "self_attn.o_proj": ("attn_output", None),
             "mlp.gate_proj": ("ffn_gate", None), "mlp.up_proj": ("ffn_up", None),
             "mlp.down_proj": ("ffn_down", None)}
    hf.update({f"model.layers.{i}.{k}.weight": (f"blk.{i}.{v}.weight", heads)
               for k, (v, heads) in names.items() for i in range(n_layer)})
    type_of = gguf_type if callable(gguf_type) else lambda name: gguf_type
    raw = {}
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, p in params.items():
            if name in hf:
                gname, heads = hf[name]
                std = 1.0 if "embed" in name else 1 / math.sqrt(p.shape[1])
                blocks, values = random_blocks(r, type_of(gname), *p.shape, std)
                raw[gname] = (blocks, type_of(gname))
                values = values if heads is None else unpermute(values, heads)
                p.copy_(torch.from_numpy(values.astype(np.float32)))
            else:
                assert name.endswith("norm.weight"), name
                p.copy_(torch.from_numpy(1 + 0.1 * r.standard_normal(p.shape)
                                         .astype(np.float32)))
    assert model.config.head_dim == head_dim
    return model, raw


@pytest.mark.parametrize("gguf_type", BLOCK_TYPES)
def test_type_matches_transformers(gguf_type, device, tmp_path):
    model, raw = blocks_model(gguf_type)
    path = write_gguf(tmp_path / f"{gguf_type}.gguf", model, raw=raw)
    g = load_gguf(path)
    assert {g.tensor_info(n).ggml_type for n in raw} == {gguf_type}
    ref = TransformersReference(str(path))
    ids = [int(i) for i in np.random.default_rng(2).integers(0, N_VOCAB, LOGIT_LEN)]
    want = ref.logits(ids)
    vk = Llama.from_gguf(device, g)
    try:
        assert {vk.w[n].dtype for n in raw} == {weight_types.BY_GGUF[gguf_type].dtype}
        got = vk.logits(ids)
        err = np.abs(got - want).max()
        print(f"{gguf_type}: max |dlogit| {err:.2e} over {LOGIT_LEN} positions, logits in "
              f"[{want.min():.1f}, {want.max():.1f}]")
        assert err < LOGIT_ATOL, f"{gguf_type}: max |logit diff| {err:.2e}"
        np.testing.assert_array_equal(got.argmax(1), want.argmax(1))
        prompt = ids[:PROMPT_LEN]
        assert generate(vk, prompt, GREEDY).tokens == ref.greedy(prompt, GREEDY)
    finally:
        vk.close()
        g.close()


# llama.cpp's Q4_K_M mix (llama-quant.cpp: Q6_K for output and for attn_v / ffn_down in some
# layers, Q4_K elsewhere; Q5_0 or Q8_0 where a row is not a multiple of 256, here given to
# two matrices whose rows are): layer 0's V is Q6_K beside Q4_K Q and K, which qkv_rope's
# mixed variant reads in one dispatch (weight_types.MIXED_QKV); layer 1's K is Q5_K beside
# a Q4_K Q, no such pair, so its Q/K/V run unfused while its projections' residual adds
# (matvec_add) run fused, reading Q5_0 and Q8_0.
Q4_K_M = {"output.weight": "Q6_K", "blk.0.attn_v.weight": "Q6_K",
          "blk.0.ffn_down.weight": "Q6_K", "blk.1.attn_k.weight": "Q5_K",
          "blk.1.attn_output.weight": "Q5_0", "blk.1.ffn_down.weight": "Q8_0"}


def test_q4_k_m_mix_matches_transformers(device, tmp_path):
    """A file of several block types, as llama.cpp's presets write them: the same gate."""
    model, raw = blocks_model(lambda name: Q4_K_M.get(name, "Q4_K"), seed=7, n_layer=2)
    path = write_gguf(tmp_path / "q4_k_m.gguf", model, raw=raw)
    ref = TransformersReference(str(path))
    ids = [int(i) for i in np.random.default_rng(8).integers(0, N_VOCAB, LOGIT_LEN)]
    want = ref.logits(ids)
    g = load_gguf(path)
    vk = Llama.from_gguf(device, g)
    try:
        assert {t.dtype for t in vk.w.values()} == {"float32", "q4_k", "q5_k", "q6_k", "q5_0",
                                                    "q8_0"}
        assert [vk.fused_parts(i) for i in range(2)] == [(True,) * 4, (False, True, True, True)]
        got = vk.logits(ids)
        print(f"Q4_K_M: max |dlogit| {np.abs(got - want).max():.2e}")
        assert np.abs(got - want).max() < LOGIT_ATOL
        np.testing.assert_array_equal(got.argmax(1), want.argmax(1))
        prompt = ids[:PROMPT_LEN]
        assert generate(vk, prompt, GREEDY).tokens == ref.greedy(prompt, GREEDY)
        step = {d.name: d.pipeline.name for d in vk.step(vk.activations(1).token, 1, 3)}
        assert step["blk.0.attn_qkv"] == "qkv_rope_q4_k_v_q6_k" and "blk.1.attn_qkv" not in step
    finally:
        vk.close()
        g.close()


# -- tables larger than one binding: split over rows ----------------------------------------
SPLIT_VOCAB = 3000


# The binding limit of the split tests (128 KiB + 20 rows of 144 bytes) and, by type, (row
# bytes, rows per slice at alignment 256). Q3_K's 110-byte rows (2 mod 4) start aligned
# every 128 rows, which also aligns the logits' columns; Q4_K's 144-byte rows every 16 rows
# (930 would fit), but the logits' f32 columns only every 64.
LIMIT = (1 << 17) + 20 * 144
SPLITS = {"Q3_K": (110, 1152), "Q4_K": (144, 896)}


@pytest.fixture(scope="module")
def split_files(tmp_path_factory):
    """Models with a vocabulary of 3000 (token_embd and output: 330,000 bytes each as Q3_K,
    432,000 as Q4_K), by type."""
    out = {}
    for gguf_type in SPLITS:
        model, raw = blocks_model(gguf_type, seed=5, n_vocab=SPLIT_VOCAB)
        out[gguf_type] = write_gguf(tmp_path_factory.mktemp("split") / f"{gguf_type}.gguf",
                                    model, raw=raw)
    return out


@pytest.mark.parametrize("gguf_type", SPLITS)
def test_tables_past_one_binding_split_over_rows(split_files, gguf_type, device, monkeypatch):
    """token_embd and output larger than maxStorageBufferRange (lowered to LIMIT, which the
    other matrices, the RoPE table and the KV cache views fit) are bound in slices of rows
    whose starts are aligned for the weights' and the logits' views (alignment raised to
    256; SPLITS): the embedding read slice by slice (`embed_range`), the logits slice by
    slice (one-row views at decode, `head` and copy_block teacher-forced). Logits and greedy
    tokens equal the model bound whole, bit for bit (each row's product is the same
    arithmetic), and transformers' within LOGIT_ATOL."""
    path, (row, rows) = split_files[gguf_type], SPLITS[gguf_type]
    starts = list(range(0, SPLIT_VOCAB, rows))
    edges = [0, SPLIT_VOCAB - 1] + [i for r in starts[1:] for i in (r - 1, r)]
    # Every slice edge; 7 positions per forward (11 rows of 3000 logits fit LIMIT).
    prompts = [edges[i:i + 7] + [5] * (7 - len(edges[i:i + 7]))
               for i in range(0, len(edges), 7)]
    prompts.append([2998, 1000, 2000, 3, 1, 1153, 2305])
    g = load_gguf(path)
    whole = Llama.from_gguf(device, g)
    try:
        assert not whole.slices
        want = [whole.logits(ids) for ids in prompts]
        want_tokens = [generate(whole, ids, GREEDY).tokens for ids in prompts]
    finally:
        whole.close()
    monkeypatch.setattr(device, "max_storage_buffer_range", LIMIT)
    monkeypatch.setattr(device, "min_storage_buffer_offset_alignment", 256)
    model = Llama.from_gguf(device, g)
    try:
        for name in ("token_embd.weight", "output.weight"):
            slices = model.slices[name]
            assert [(r, t.shape[0]) for r, t in slices] == [
                (r, min(rows, SPLIT_VOCAB - r)) for r in starts], name
            assert all(t.offset % 256 == 0 and t.nbytes <= LIMIT for _, t in slices)
        oracle = TransformersReference(str(path))
        for ids, logits, tokens in zip(prompts, want, want_tokens):
            got = model.logits(ids)
            np.testing.assert_array_equal(got, logits)
            assert generate(model, ids, GREEDY).tokens == tokens
            ref = oracle.logits(ids)
            assert np.abs(got - ref).max() < LOGIT_ATOL
            np.testing.assert_array_equal(got.argmax(1), ref.argmax(1))
    finally:
        model.close()
        g.close()


def test_table_that_cannot_be_split_refused(split_files, device, monkeypatch):
    """A table whose smallest aligned slice (128 rows of 110 bytes at alignment 256) is
    past the binding limit cannot be split: refused with the numbers before any upload."""
    monkeypatch.setattr(device, "max_storage_buffer_range", 14000)
    monkeypatch.setattr(device, "min_storage_buffer_offset_alignment", 256)
    refused(device, split_files["Q3_K"],
            f"tensor 'token_embd.weight' [{SPLIT_VOCAB}, {HIDDEN}] Q3_K is 330000 bytes, more "
            "than the device's maxStorageBufferRange of 14000 bytes, and it cannot be split: "
            "its slices start at multiples of 128 rows (minStorageBufferOffsetAlignment 256), "
            "and 128 rows are 14080 bytes")


# -- bad input: one line naming the tensor, its type and the numbers, before any upload -------
def retype(path, name: str, gguf_type: str) -> None:
    """Overwrite the type of tensor `name` in the GGUF header at `path` (its tensor info: name,
    n_dims u32, dims u64 each, type u32, offset u64), leaving its bytes as they are."""
    import gguf

    data = bytearray(path.read_bytes())
    key = len(name).to_bytes(8, "little") + name.encode()
    at = data.index(key) + len(key)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    at += 4 + 8 * n_dims
    data[at:at + 4] = int(gguf.GGMLQuantizationType[gguf_type]).to_bytes(4, "little")
    path.write_bytes(bytes(data))


def refused(device, path, message: str, load_fails: bool = False) -> None:
    """Loading `path` raises ModelFormatError: one line starting with the path and holding
    `message`; no device memory is left in use."""
    from vkrt.errors import ModelFormatError

    before = device.bytes_in_use
    with pytest.raises(ModelFormatError) as info:
        g = load_gguf(path)
        assert not load_fails, "load_gguf accepted the file"
        try:
            Llama.from_gguf(device, g)
        finally:
            g.close()
    text = str(info.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text, text
    assert device.bytes_in_use == before


@pytest.mark.parametrize("gguf_type", ["IQ2_XXS", "MXFP4", "TQ2_0", "Q8_K"])
def test_type_the_kernels_do_not_read_refused_by_name(gguf_type, device, tmp_path):
    """A matrix in a type without a weights.glsl reader (IQ1/IQ2/IQ3, TQ, MXFP4, ...) is
    refused naming the tensor and its type, whatever its bytes."""
    import gguf

    model, raw = blocks_model("Q4_K")
    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[gguf_type]]
    rows, n_cols = N_FF, HIDDEN
    raw["blk.0.ffn_up.weight"] = (np.random.default_rng(3).integers(
        0, 256, (rows, n_cols // block * nbytes), dtype=np.uint8), gguf_type)
    path = write_gguf(tmp_path / f"{gguf_type}.gguf", model, raw=raw)
    supported = ", ".join(t.gguf for t in weight_types.TYPES)
    refused(device, path, f"tensor 'blk.0.ffn_up.weight' [{rows}, {n_cols}] has type "
                          f"{gguf_type}, which vkrt's kernels do not read (supported: "
                          f"{supported})")


def test_rows_not_whole_blocks_refused(device, tmp_path):
    """Rows of 96 elements read as Q4_K (blocks of 256): the file is refused naming the
    tensor, its type and both numbers (the file written as Q8_0, its header retyped)."""
    from test_llama_variants import hf_model

    path = write_gguf(tmp_path / "rows.gguf", hf_model(head_dim=24), qtype="Q8_0")
    retype(path, "blk.0.attn_q.weight", "Q4_K")
    refused(device, path, "tensor 'blk.0.attn_q.weight' [96, 64] Q4_K: row length 64 is not "
                          "a multiple of the Q4_K block size 256", load_fails=True)


def test_size_that_does_not_match_type_and_shape_refused(device, tmp_path):
    """blk.0.attn_q's bytes are Q4_K's (36,864), its header says Q6_K (53,760 for its shape):
    it would overlap the next tensor, and the file is refused with the numbers."""
    model, raw = blocks_model("Q4_K")
    path = write_gguf(tmp_path / "size.gguf", model, raw=raw)
    retype(path, "blk.0.attn_q.weight", "Q6_K")
    refused(device, path, f"tensor 'blk.0.attn_q.weight' [{HIDDEN}, {HIDDEN}] Q6_K is 53760 "
                          "bytes, but tensor 'blk.0.attn_k.weight' starts 36864 bytes after "
                          "it", load_fails=True)


def test_truncated_last_block_refused(device, tmp_path):
    """A file cut inside the last block of its last tensor (output.weight, Q6_K) is refused
    naming the tensor, its type, its size and the file's."""
    model, raw = blocks_model("Q6_K")
    path = write_gguf(tmp_path / "cut.gguf", model, raw=raw)
    g = load_gguf(path)
    info = g.tensor_info("output.weight")
    g.close()
    assert info.offset + info.nbytes == max(
        g.tensor_info(n).offset + g.tensor_info(n).nbytes for n in g.tensor_names)
    cut = info.offset + info.nbytes - 100           # 100 bytes short: inside the last block
    path.write_bytes(path.read_bytes()[:cut])
    refused(device, path, f"tensor 'output.weight' [{N_VOCAB}, {HIDDEN}] Q6_K is 63000 bytes "
                          f"({N_VOCAB} blocks of 210) and ends at byte {cut + 100}, past the "
                          f"end of the {cut}-byte file", load_fails=True)


def test_table_row_that_disagrees_with_the_file_refused(device, tmp_path, monkeypatch):
    """Should the type table give a type other sizes than the file's (gguf-py's), the loader
    refuses the tensor with both sizes rather than read it wrongly."""
    import dataclasses

    model, raw = blocks_model("Q6_K")
    path = write_gguf(tmp_path / "table.gguf", model, raw=raw)
    wrong = dataclasses.replace(weight_types.BY_DTYPE["q6_k"], block_bytes=208)
    monkeypatch.setitem(weight_types.BY_DTYPE, "q6_k", wrong)
    refused(device, path, f"tensor 'token_embd.weight' [{N_VOCAB}, {HIDDEN}] Q6_K holds 63000 "
                          "bytes in the file, 62400 by vkrt's type table")
