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


def blocks_model(gguf_type: str, seed: int = 0):
    """(model, raw): a random fp32 LlamaForCausalLM whose matrices are gguf-py's values of
    random `gguf_type` blocks, and those blocks by GGUF tensor name (GGUF row order, as
    `write_gguf`'s `raw` takes them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=N_VOCAB, hidden_size=HIDDEN, intermediate_size=N_FF,
                         num_hidden_layers=1, num_attention_heads=N_HEAD,
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
    hf.update({f"model.layers.0.{k}.weight": (f"blk.0.{v}.weight", heads)
               for k, (v, heads) in names.items()})
    raw = {}
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, p in params.items():
            if name in hf:
                gname, heads = hf[name]
                std = 1.0 if "embed" in name else 1 / math.sqrt(p.shape[1])
                blocks, values = random_blocks(r, gguf_type, *p.shape, std)
                raw[gname] = (blocks, gguf_type)
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
