"""The Llama-like families beside `llama` (vkrt/models/arch.py), each against transformers fp32
reading the same GGUF file itself (`from_pretrained(dir, gguf_file=...)`, tests/reference.py):
teacher-forced logits, the same positions one decode step at a time, and greedy tokens on
tiny random checkpoints (tests/family_files.py:
hidden 64, 2 layers (gemma3: 6, five sliding-window layers of 8 positions and a global one),
GQA 4/2 heads, vocabulary 300; prompts longer than the window); and the files vkrt cannot
run faithfully refused before upload, in one line naming the key or tensor.

Tolerance: as tests/test_llama_variants.py, max |logit difference| < 1e-4 (the issue's f32
figure; both sides are fp32 over identical weights and differ in summation order only).
Decode steps run the fused kernels where the family allows them (`Llama.fused_parts`), and
`test_decode_is_fused` checks which run.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from family_files import GEMMA3_WINDOW, HIDDEN, N_HEAD, N_VOCAB, hf_model, write_gguf
from reference import TransformersReference
from vkrt import config, weight_types
from vkrt.errors import ModelFormatError
from vkrt.models.generate import generate
from vkrt.models.gguf import load_gguf
from vkrt.models.llama import Llama

LOGIT_ATOL = 1e-4
# Decode steps whose products quantize x per unit (the `_xq` kernels, glsl/unit_xq.glsl: a
# block-type file on a device with integer dot products): each input is off by up to 2^-15
# of its unit's largest |x| (f32's rounding is 2^-24 of the element), so the error of a
# logit scales with the logits' magnitude, as test_family_coop_matches_transformers' f16
# operands: 1e-4 of the largest |logit| (lavapipe measured 2.7e-4 of 4.3 for qwen2_q8_0:
# 6.3e-5), greedy tokens still exact.
XQ_LOGIT_REL = 1e-4
F16_KV_LOGIT_REL = 1e-3    # tests/test_batch.py's, for an f16 KV cache
PROMPT_LEN, GREEDY, LOGIT_LEN, DECODE_LEN = 12, 8, 48, 20

# name: (arch, tied embeddings, matrix type)
CASES = {
    "qwen2_tied": ("qwen2", True, "F32"),
    "qwen2_q8_0": ("qwen2", False, "Q8_0"),
    "qwen3": ("qwen3", False, "F32"),
    "gemma3": ("gemma3", True, "F32"),
    "gemma3_q8_0": ("gemma3", True, "Q8_0"),
}
# What transformers needs beside the file: Gemma 3's query_pre_attn_scalar is not in a GGUF;
# llama.cpp (src/models/gemma3.cpp) scales by 1 / sqrt(head_dim), which the released 1B-12B
# configs agree with (query_pre_attn_scalar = head_dim = 256): the oracle gets head_dim.
ORACLE_CONFIG = {"gemma3": {"query_pre_attn_scalar": HIDDEN // N_HEAD}}


def run_case(case, device, tmp_path, atol=LOGIT_ATOL, rel=None, xq=False, kv_f16=False):
    """`rel`: the teacher-forced logits' tolerance is rel * max |logit| instead of atol;
    `xq`: decode products with x as integers; `kv_f16`: an f16 KV cache (check_file)."""
    arch, tied, qtype = CASES[case]
    path = write_gguf(tmp_path / f"{case}.gguf", hf_model(arch, tied=tied), arch, qtype)
    check_file(path, case, arch, tied, device, atol, rel, xq=xq, kv_f16=kv_f16)


def check_file(path, case, arch, tied, device, atol=LOGIT_ATOL, rel=None, n_vocab=N_VOCAB,
               logit_len=LOGIT_LEN, decode_len=DECODE_LEN, greedy=GREEDY, xq=False,
               kv_f16=False):
    """vkrt on the GGUF at `path` against transformers fp32 reading it: teacher-forced logits
    over `logit_len` random ids below `n_vocab`, the first `decode_len` of them one decode
    step at a time, and `greedy` greedy tokens after the first PROMPT_LEN ids. `xq`: the
    decode products of the file's block weights take their `_xq` variants (the caller's
    table says so; checked here), and the decode steps' logits are held to XQ_LOGIT_REL.
    `kv_f16`: the model's KV cache in f16 (`Decoder.kv_dtype`), the decode steps' logits
    held to F16_KV_LOGIT_REL too."""
    ref = TransformersReference(str(path), **ORACLE_CONFIG.get(arch, {}))
    ids = [int(i) for i in np.random.default_rng(1).integers(0, n_vocab, logit_len)]
    want = ref.logits(ids)
    vk = Llama.from_gguf(device, load_gguf(path))
    if kv_f16:
        vk.kv_dtype = "float16"
    try:
        assert vk.hp.arch == arch and vk.hp.tied_embeddings == tied
        if arch == "gemma3":
            assert logit_len > 2 * GEMMA3_WINDOW and PROMPT_LEN + greedy > GEMMA3_WINDOW
        got = vk.logits(ids)
        err = np.abs(got - want).max()
        limit = atol if rel is None else rel * float(np.abs(want).max())
        print(f"{case}: max |dlogit| {err:.2e} over {logit_len} positions, logits in "
              f"[{want.min():.1f}, {want.max():.1f}] (limit {limit:.2e})")
        assert err < limit, f"{case}: max |logit diff| {err:.2e}"
        # The decode path (one token per step, the fused layer where `fusable`) on the same
        # positions: each step's logits against the teacher-forced ones.
        steps = []
        for t, token in enumerate(ids[:decode_len]):
            a = vk.activations(1)
            vk.stream.write(a.ids, np.array([token], np.uint32))
            vk.forward(a.ids, 1, t)
            steps.append(vk.stream.read(a.logits.rows(0, 1))[0])
        err = np.abs(np.array(steps) - want[:decode_len]).max()
        limit = LOGIT_ATOL
        if kv_f16:
            assert vk.k_cache[0].dtype == vk.v_cache[0].dtype == "float16"
            limit = F16_KV_LOGIT_REL * float(np.abs(want[:decode_len]).max())
        if xq:
            assert any(vk.k.decode_integer_x("matvec", weight_types.BY_GGUF[t.tensor_type.name]
                                             .dtype, 1) for t in gguf.GGUFReader(path).tensors)
            limit = XQ_LOGIT_REL * float(np.abs(want[:decode_len]).max())
        print(f"{case}: decode steps max |dlogit| {err:.2e} over {decode_len} positions "
              f"(limit {limit:.2e})")
        assert err < limit, f"{case}: decode max |logit diff| {err:.2e}"
        prompt = ids[:PROMPT_LEN]
        assert generate(vk, prompt, greedy).tokens == ref.greedy(prompt, greedy)
    finally:
        vk.close()


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, device, tmp_path):
    with config.COOPMAT.override("0"):
        run_case(case, device, tmp_path)


# An f16 KV cache (vkrt.load(kv_cache_dtype="f16")): K and V rounded to f16 as they are
# stored, the bound tests/test_batch.py states for the paged f16 cache (F16_KV_LOGIT_REL: 1e-3
# of the largest |logit|), greedy tokens exact. qwen2 writes the cache from the fused decode
# product (qkv_rope_kvf16, biases inside); qwen3 and gemma3 norm Q and K per head, so their
# f16 cache is written by the unfused path (rope_kvf16, copy_rows_kvf16); gemma3 adds
# sliding-window layers.
@pytest.mark.parametrize("case", ["qwen2_q8_0", "qwen3", "gemma3"])
def test_family_f16_kv_cache_matches_transformers(case, device, tmp_path):
    if not device.features.get("storageBuffer16BitAccess"):
        pytest.skip(f"{device.name} has no storageBuffer16BitAccess (f16 KV cache)")
    with config.COOPMAT.override("0"):
        run_case(case, device, tmp_path, rel=F16_KV_LOGIT_REL, kv_f16=True)


@pytest.mark.parametrize("case", ["qwen2_q8_0", "gemma3_q8_0"])
def test_family_integer_x_matches_transformers(case, device, tmp_path, monkeypatch):
    """The decode steps on the `_xq` products (x quantized per unit to 16-bit integers,
    glsl/unit_xq.glsl) wherever the type allows: every decode rule of the device's table
    with integer_x (lavapipe's table keeps f32 x for speed; the H200's uses integer x only
    at 7B-like sizes, which have no oracle here)."""
    import dataclasses

    from vkrt import tuning

    table = tuning.for_kind(device.info.kind)
    forced = dataclasses.replace(table, decode={
        k: tuple(dataclasses.replace(r, integer_x=True) for r in rules)
        for k, rules in table.decode.items()})
    monkeypatch.setattr(tuning, "for_kind", lambda kind: forced)
    with config.COOPMAT.override("0"):
        run_case(case, device, tmp_path, xq=True)


# Prefill products on cooperative matrices (VKRT_COOPMAT=1: every product of 2 tokens or
# more, so the 48-token forward runs matmul_coop; decode steps stay f32): f16 operands are
# off by up to 2^-10 of sum |x w| per product (tests/test_kernels.py); the error of a logit
# scales with the logits' magnitude (these random checkpoints' reach 4 to 70), so the bound
# is relative: 1e-3 of the largest |logit| (on the H200 the first kernel measured 2.1e-2 of
# 53.4, 2.3e-3 of 4.3, 1.2e-2 of 69.8: 1.6e-4 to 5.3e-4), greedy tokens still exact. Runs
# where the device lists a shape (skipped on lavapipe).
COOP_LOGIT_REL = 1e-3


@pytest.mark.parametrize("case", ["qwen2_tied", "qwen2_q8_0", "gemma3"])
def test_family_coop_matches_transformers(case, device, tmp_path):
    if device.coop_shape() is None:
        pytest.skip(f"{device.name} lists no f16 cooperative-matrix shape")
    with config.COOPMAT.override("1"):
        run_case(case, device, tmp_path, rel=COOP_LOGIT_REL)


@pytest.mark.parametrize("case", ["qwen2_q8_0", "gemma3"])
def test_family_coop_split_matches_transformers(case, device, tmp_path, monkeypatch):
    """The same with every prompt product's columns split across 3 workgroups (each
    rule of the device's table with splits=3; `Kernels.prefill_splits` caps it at one
    workgroup per step): the partial sums written by matmul_coop and added by sum_splits
    (`Llama._linear`) agree with transformers as the unsplit products do."""
    import dataclasses

    from vkrt import tuning
    from vkrt.kernels import Kernels

    if device.coop_shape() is None:
        pytest.skip(f"{device.name} lists no f16 cooperative-matrix shape")
    table = tuning.for_kind(device.info.kind)
    forced = dataclasses.replace(table, prefill_coop_tiles=tuple(
        dataclasses.replace(r, splits=3) for r in table.prefill_coop_tiles))
    monkeypatch.setattr(tuning, "for_kind", lambda kind: forced)
    summed, sum_splits = [], Kernels.sum_splits
    monkeypatch.setattr(Kernels, "sum_splits",
                        lambda self, *a, **kw: summed.append(kw.get("name")) or sum_splits(
                            self, *a, **kw))
    with config.COOPMAT.override("1"):
        run_case(case, device, tmp_path, rel=COOP_LOGIT_REL)
    assert any(n.endswith("attn_k.sum") for n in summed), summed   # the split path ran


FUSED = ["blk.0.attn_qkv", "blk.0.attn", "blk.0.attn_output", "blk.0.ffn_glu", "blk.0.ffn_down"]
# qwen3's and gemma3's per-head Q/K norms and RoPE: head_norm_rope after qkv_rope
QK_NORMED = ["blk.0.attn_qkv", "blk.0.attn_qkv_norm", *FUSED[1:]]
# gemma3's post-norms keep the projections apart from the residual add (rmsnorm_add)
GEMMA3_DECODE = ["blk.0.attn_qkv", "blk.0.attn_qkv_norm", "blk.0.attn", "blk.0.attn_output",
                 "blk.0.post_attention_norm", "blk.0.ffn_glu", "blk.0.ffn_down",
                 "blk.0.post_ffw_norm"]


@pytest.mark.parametrize("arch, layer", [("qwen2", FUSED), ("qwen3", QK_NORMED),
                                         ("gemma3", GEMMA3_DECODE)])
def test_decode_is_fused(arch, layer, device, tmp_path):
    """qwen2's Q/K/V biases, qwen3's and gemma3's per-head Q/K norms, RoPE on halves and
    GELU-tanh run inside the fused kernels (`Llama.fused_parts`): a qwen2 or qwen3 decode
    layer is the 5-dispatch fused one (qwen3 6: `head_norm_rope` norms and rotates Q and K
    after `qkv_rope`), gemma3's 8 dispatches, not the unfused chain."""
    path = write_gguf(tmp_path / "q.gguf", hf_model(arch), arch)
    vk = Llama.from_gguf(device, load_gguf(path))
    try:
        vk.setup_caches(8)
        a = vk.activations(1)
        names = [d.name for d in vk.step(a.ids, 1, 0)]
        layer0 = [n for n in names if n.startswith("blk.0.")]
        assert layer0 == layer, layer0
    finally:
        vk.close()


# -- refusals: one line naming the key or tensor, before anything is uploaded ----------------
REFUSED = {
    # qwen3 has no biases: a qwen3 file with them disagrees with its architecture
    "qwen3_bias": ("qwen3", {}, {"blk.0.attn_q.bias": np.ones(N_HEAD * 16, np.float32)}, (),
                   "tensor 'blk.0.attn_q.bias' [64] is not read by vkrt's qwen3 forward"),
    "qwen3_no_k_norm": ("qwen3", {}, {}, ("blk.1.attn_k_norm.weight",),
                        "missing tensor 'blk.1.attn_k_norm.weight'"),
    # Q/K norms belong to qwen3: in a qwen2 file they would be ignored
    "qwen2_q_norm": ("qwen2", {}, {"blk.0.attn_q_norm.weight": np.ones(16, np.float32)}, (),
                     "tensor 'blk.0.attn_q_norm.weight' [16] is not read by vkrt's qwen2"),
    "qwen2_output_bias": ("qwen2", {}, {"blk.0.attn_output.bias": np.ones(64, np.float32)}, (),
                          "tensor 'blk.0.attn_output.bias' [64] is not read by vkrt's qwen2"),
    "qwen2_sliding_window": ("qwen2", {"qwen2.attention.sliding_window": 32}, {}, (),
                             "metadata key 'qwen2.attention.sliding_window' = 32 is not "
                             "implemented"),
    "qwen2_theta_zero": ("qwen2", {"qwen2.rope.freq_base": 0.0}, {}, (),
                         "metadata key 'qwen2.rope.freq_base' is 0.0, expected a positive "
                         "finite number"),
    "qwen2_yarn": ("qwen2", {"qwen2.rope.scaling.type": "yarn"}, {}, (),
                   "qwen2.rope.scaling.type = 'yarn' is not implemented"),
    "qwen2_rope_freqs": ("qwen2", {}, {"rope_freqs.weight": np.ones(8, np.float32)}, (),
                         "tensor 'rope_freqs.weight' [8] is not read by vkrt's qwen2"),
    "qwen2_bias_shape": ("qwen2", {}, {"blk.0.attn_k.bias": np.ones(64, np.float32)}, (),
                         "tensor 'blk.0.attn_k.bias' has shape (64,), expected (32,)"),
    "gemma3_window_zero": ("gemma3", {"gemma3.attention.sliding_window": 0}, {}, (),
                           "metadata key 'gemma3.attention.sliding_window' is 0, expected a "
                           "positive integer"),
    "gemma3_swa_base_negative": ("gemma3", {"gemma3.rope.freq_base_swa": -1.0}, {}, (),
                                 "metadata key 'gemma3.rope.freq_base_swa' is -1.0, expected "
                                 "a positive finite number"),
    "gemma3_pattern_string": ("gemma3", {"gemma3.attention.sliding_window_pattern": "six"}, {},
                              (), "metadata key 'gemma3.attention.sliding_window_pattern' is "
                              "'six', expected a period"),
    "gemma3_swa_base_without_window": ("gemma3", {"gemma3.attention.sliding_window": None},
                                       {}, (), "metadata key 'gemma3.rope.freq_base_swa' "
                                       "without gemma3.attention.sliding_window"),
    "gemma3_softcap": ("gemma3", {"gemma3.final_logit_softcapping": 30.0}, {}, (),
                       "metadata key 'gemma3.final_logit_softcapping' = 30.0 is not "
                       "implemented"),
    "gemma3_no_post_norm": ("gemma3", {}, {}, ("blk.2.post_ffw_norm.weight",),
                            "missing tensor 'blk.2.post_ffw_norm.weight'"),
    # post-norms belong to gemma3: in a qwen3 file they would be ignored
    "qwen3_post_norm": ("qwen3", {}, {"blk.0.post_attention_norm.weight":
                                      np.ones(64, np.float32)}, (),
                        "tensor 'blk.0.post_attention_norm.weight' [64] is not read by "
                        "vkrt's qwen3"),
    # a sliding window is gemma3's: a qwen3 file with one is refused, not run global
    "qwen3_sliding_window": ("qwen3", {"qwen3.attention.sliding_window": 8}, {}, (),
                             "metadata key 'qwen3.attention.sliding_window' = 8 is not "
                             "implemented"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_before_upload(case, device, tmp_path):
    arch, keys, tensors, drop, message = REFUSED[case]
    path = write_gguf(tmp_path / f"{case}.gguf", hf_model(arch), arch, keys=keys,
                      tensors=tensors, drop=drop)
    before = device.bytes_in_use
    with pytest.raises(ModelFormatError) as info:
        Llama.from_gguf(device, load_gguf(path))
    text = str(info.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text, text
    assert device.bytes_in_use == before


def test_qwen2_file_generates_text_end_to_end(device, tmp_path):
    """`vkrt.load` on a qwen2 file: the registry picks the Llama-like forward, the file's
    qwen2 tokenizer encodes the prompt as transformers' tokenizer of the same file does, and
    the greedy continuation is transformers' (stopping at the file's stop tokens or after
    max_tokens)."""
    import transformers

    import vkrt

    path = write_gguf(tmp_path / "q.gguf", hf_model("qwen2", tied=True), "qwen2")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="q.gguf")
    prompt = "Hello world, 3333+777 is"
    with vkrt.load(path, device=device) as model:
        assert model.family == "qwen2"
        ids = model.encode(prompt)
        assert ids == hf_tok.encode(prompt, add_special_tokens=False)
        stream = model.generate(prompt, max_tokens=6)
        text = "".join(stream)
        got = stream.result.tokens
        eog = model.tokenizer.eog_ids
    want = TransformersReference(str(path)).greedy(ids, 6)
    cut = next((i for i, t in enumerate(want) if t in eog), len(want))
    assert got == want[:cut]
    assert text == hf_tok.decode(want[:cut], skip_special_tokens=True)


@pytest.mark.parametrize("n_layer, key_length, want", [(6, 32, 32), (62, 32, 16)])
def test_gemma3_attention_scale(tmp_path, n_layer, key_length, want):
    """The attention scale a gemma3 file implies (llama.cpp src/models/gemma3.cpp): 1 /
    sqrt(head_dim), but 1 / sqrt(n_embd / n_head) for the 62-layer 27B (its
    query_pre_attn_scalar); here head_dim 32 against n_embd / n_head = 64 / 4 = 16."""
    import gguf

    from vkrt.models.arch import Arch

    path = tmp_path / "scale.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in {"block_count": n_layer, "context_length": 64, "embedding_length": 64,
                       "feed_forward_length": 128, "attention.head_count": 4,
                       "attention.key_length": key_length,
                       "attention.value_length": key_length}.items():
        w.add_uint32("gemma3." + key, value)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    hp = Arch.from_gguf(load_gguf(path))
    assert hp.head_dim == key_length and hp.attn_scale == 1.0 / np.sqrt(want)
    assert hp.window == 0 and not any(hp.swa_layers)   # no sliding_window key: all global


LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}"
                   "<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}"
                   "{% if add_generation_prompt %}<|start_header_id|>assistant"
                   "<|end_header_id|>\n\n{% endif %}")


def test_llama3_file_end_to_end(device, tmp_path):
    """A Llama 3.2-style `llama` file (tied embeddings, the llama-bpe pre-tokenizer, its
    special tokens) through `vkrt.load`: <|begin_of_text|> once, raw or through the chat
    template that writes it itself; generation stops at <|eot_id|> / <|eom_id|>; greedy
    tokens equal transformers reading the same file (Q/K as the converter permutes them)."""
    import test_llama_variants as lv
    from family_files import DIGIT_MERGES, VOCAB_SPECIALS, byte_bpe_vocab

    import vkrt

    tokens, merges, types = byte_bpe_vocab(VOCAB_SPECIALS["llama-bpe"], lv.N_VOCAB,
                                           DIGIT_MERGES)
    keys = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": tokens.index("<|begin_of_text|>"),
            "tokenizer.ggml.eos_token_id": tokens.index("<|eot_id|>"),
            "tokenizer.chat_template": LLAMA3_TEMPLATE}
    model = lv.hf_model(tie_word_embeddings=True)
    path = lv.write_gguf(tmp_path / "llama3.gguf", model, keys=keys, drop=("output.weight",))
    bos = tokens.index("<|begin_of_text|>")
    with vkrt.load(path, device=device) as m:
        assert m.family == "llama" and m.hparams.tied_embeddings
        assert m.tokenizer.eog_ids == {tokens.index(t) for t in
                                       ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")}
        ids = m.encode("Hello world 3333")
        assert ids[0] == bos and ids.count(bos) == 1
        chat = m.encode("Hi", chat=True)
        assert chat[0] == bos and chat.count(bos) == 1
        stream = m.generate(ids, max_tokens=6)
        "".join(stream)
        got = stream.result.tokens
    want = TransformersReference(str(path)).greedy(ids, 6)
    eog = {tokens.index(t) for t in ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")}
    cut = next((i for i, t in enumerate(want) if t in eog), len(want))
    assert got == want[:cut]


def test_gemma3_file_end_to_end(device, tmp_path):
    """A Gemma 3 file with a SentencePiece vocabulary (tests/family_files.py `spm_vocab`: its
    special tokens, byte tokens, scored pieces; no space prefix) and Gemma 3's chat template,
    through `vkrt.load`: the prompt's ids equal transformers' GemmaTokenizer of the same file
    (<bos> once), the chat prompt equals transformers' `apply_chat_template` on it, and the
    greedy tokens equal transformers fp32 reading the file, stopping at <end_of_turn> or
    <eos>; `vkrt generate --chat` renders the same template."""
    import transformers
    from test_cli import run_cli

    import vkrt

    path = write_gguf(tmp_path / "gemma3.gguf", hf_model("gemma3", tied=True), "gemma3")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    prompt = "Hello world, 3333+777 is"
    messages = [{"role": "user", "content": "Hi there"}]
    want_chat = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
    with vkrt.load(path, device=device) as m:
        tok = m.tokenizer
        bos, sp = tok.bos_id, tok.special_tokens
        assert m.family == "gemma3" and bos == sp["<bos>"]
        assert tok.eog_ids == {sp["<eos>"], sp["<end_of_turn>"]}
        ids = m.encode(prompt)
        assert ids == hf_tok.encode(prompt) and ids.count(bos) == 1 and ids[0] == bos
        chat = m.encode("Hi there", chat=True)
        assert chat == list(want_chat) and chat.count(bos) == 1
        assert tok.decode(chat) == ("<bos><start_of_turn>user\nHi there<end_of_turn>\n"
                                    "<start_of_turn>model\n")
        stream = m.generate(ids, max_tokens=6)
        text = "".join(stream)
        got = stream.result.tokens
    want = TransformersReference(str(path), **ORACLE_CONFIG["gemma3"]).greedy(ids, 6)
    cut = next((i for i, t in enumerate(want) if t in tok.eog_ids), len(want))
    print(f"gemma3: prompt {ids}, greedy {want}, vkrt {got} {text!r}")
    assert got == want[:cut] and cut > 0
    assert text == tok.decode(want[:cut], skip_special=True, continuation=True)
    p = run_cli("generate", "Hi there", "--chat", "--max-tokens", "2", "--model", str(path))
    assert p.returncode == 0, p.stderr
    assert f"prompt {len(want_chat)} tokens" in p.stderr.strip().splitlines()[-1], p.stderr


@pytest.mark.parametrize("keys, words", [
    ({"tokenizer.ggml.scores": None}, "missing metadata key 'tokenizer.ggml.scores'"),
    ({"tokenizer.ggml.token_type": [1] * 299}, "tokenizer.ggml.token_type has 299 entries for "
     "300 tokens"),
    ({"tokenizer.ggml.model": "gemma4"}, "unsupported tokenizer.ggml.model 'gemma4'"),
])
def test_gemma3_bad_vocabulary_refused_before_upload(device, tmp_path, keys, words):
    """A gemma3 file whose SentencePiece vocabulary is incomplete or of an unknown model:
    `vkrt.load` refuses it in one line naming the file and key, before any upload."""
    import vkrt

    path = write_gguf(tmp_path / "bad.gguf", hf_model("gemma3", tied=True), "gemma3", keys=keys)
    before = device.bytes_in_use
    with pytest.raises(ModelFormatError) as info:
        vkrt.load(path, device=device)
    text = str(info.value)
    assert text.startswith(str(path)) and words in text and "\n" not in text, text
    assert device.bytes_in_use == before


LLAMA2_TEMPLATE = ("{% for m in messages %}{% if m.role == 'user' %}{{ bos_token + '[INST] ' + "
                   "m.content + ' [/INST]' }}{% else %}{{ ' ' + m.content + eos_token }}"
                   "{% endif %}{% endfor %}")


def test_llama2_file_end_to_end(device, tmp_path):
    """A Llama 2-style `llama` file with the real Llama 2 SentencePiece vocabulary (llama.cpp's
    ggml-vocab-llama-spm.gguf: its tokens, scores and token types) through `vkrt.load`: <s>
    once, the prompt's ids as llama.cpp's tokenizer test expects them, a chat prompt tokenized
    as the whole rendered text is (a space prefixed after <s>), greedy tokens equal
    transformers reading the file."""
    import test_llama_variants as lv
    from test_tokenizer import vocab_file

    import vkrt

    md = load_gguf(vocab_file("llama-spm")).metadata
    keys = {k: (list(map(int, v)) if k == "tokenizer.ggml.token_type" else
                [float(x) for x in v] if k == "tokenizer.ggml.scores" else v)
            for k, v in md.items() if k.startswith("tokenizer.")}
    keys["tokenizer.chat_template"] = LLAMA2_TEMPLATE
    model = lv.hf_model(vocab_size=len(keys["tokenizer.ggml.tokens"]), tie_word_embeddings=True)
    path = lv.write_gguf(tmp_path / "llama2.gguf", model, keys=keys, drop=("output.weight",))
    with vkrt.load(path, device=device) as m:
        tok = m.tokenizer
        assert m.family == "llama" and tok.space_prefix and tok.eog_ids == {2}
        ids = m.encode("Hello world")
        assert ids == [1, 15043, 3186]     # llama.cpp's expected ids, after BOS
        chat = m.encode("Hi", chat=True)
        assert chat == tok.encode("<s>[INST] Hi [/INST]", add_bos=False) and chat.count(1) == 1
        stream = m.generate(ids, max_tokens=4)
        "".join(stream)
        got = stream.result.tokens
    want = TransformersReference(str(path)).greedy(ids, 4)
    cut = next((i for i, t in enumerate(want) if t in {2}), len(want))
    assert got == want[:cut] and cut > 0
