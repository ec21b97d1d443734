"""Tiny random checkpoints converted by llama.cpp's own convert_hf_to_gguf.py (not
tests/family_files.py's imitation of it), each against transformers fp32 reading the
converted file back (tests/test_families.py `check_file`: teacher-forced logits, decode steps,
greedy tokens; the same tolerance).

The converter, its conversion/ package and its gguf-py come from the llama-cpp-python 0.3.36
source distribution on PyPI (scripts/setup.sh test extracts them into .cache/convert); it runs
in a subprocess, where convert_hf_to_gguf.py puts its own gguf-py first on sys.path.

The converter names a BPE vocabulary's pre-tokenizer by hashing the token ids of a fixed text
(conversion/base.py `get_vocab_base_pre`) and refuses a tokenizer it does not know, so the
checkpoints carry a real one: Qwen2.5's, which transformers rebuilds from the suite's real
Qwen2.5-Coder GGUF (scripts/setup.sh test) and saves beside the random weights. The `llama`
checkpoint gets the same tokenizer (a Llama 3 tokenizer is not in the suite's files); the
converter names its pre-tokenizer qwen2. Gemma 3 is not converted: its converter reads a
SentencePiece tokenizer.model, which the suite does not have.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import test_llama_variants as lv
from family_files import hf_model
from test_families import check_file
from vkrt import config

ROOT = Path(__file__).resolve().parent.parent
CONVERT = ROOT / ".cache" / "convert"
QWEN = ROOT / ".cache" / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
# Kept short for lavapipe: the vocabulary is Qwen's 151936 tokens.
LOGIT_LEN, DECODE_LEN, GREEDY = 16, 4, 4

# name: (arch, tied embeddings)
CASES = {"qwen2_tied": ("qwen2", True), "qwen3": ("qwen3", False), "llama": ("llama", False)}


@pytest.fixture(scope="module")
def qwen_tokenizer():
    """Qwen2.5's tokenizer as transformers builds it from the real GGUF."""
    if not (CONVERT / ".complete").exists():
        pytest.skip(f"{CONVERT} is absent: run scripts/setup.sh test")
    if not QWEN.exists():
        pytest.skip(f"{QWEN} is absent: run scripts/setup.sh test")
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(QWEN.parent), gguf_file=QWEN.name)


def convert(tmp_path, model, tokenizer, name):
    """Save `model` (fp32 safetensors) and `tokenizer` into a checkpoint folder, convert it
    with convert_hf_to_gguf.py --outtype f32; returns the GGUF's path."""
    ckpt = tmp_path / name
    model.save_pretrained(ckpt)
    tokenizer.save_pretrained(ckpt)
    out = tmp_path / f"{name}.gguf"
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}   # its own gguf-py
    p = subprocess.run([sys.executable, str(CONVERT / "convert_hf_to_gguf.py"), str(ckpt),
                        "--outtype", "f32", "--outfile", str(out)],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_converted_matches_transformers(case, qwen_tokenizer, device, tmp_path):
    arch, tied = CASES[case]
    n_vocab = len(qwen_tokenizer)
    if arch == "llama":
        model = lv.hf_model(vocab_size=n_vocab, tie_word_embeddings=tied)
    else:
        model = hf_model(arch, tied=tied, vocab_size=n_vocab)
    path = convert(tmp_path, model, qwen_tokenizer, case)
    with config.COOPMAT.override("0"):
        check_file(path, case, arch, tied, device, n_vocab=n_vocab, logit_len=LOGIT_LEN,
                   decode_len=DECODE_LEN, greedy=GREEDY)
