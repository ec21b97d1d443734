"""`vkrt.load`, the family registry and the `Model` handle: one entry point for a GGUF file or
a Hugging Face checkpoint folder, text streamed piece by piece, errors in one line, nothing
left allocated."""
from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest

import vkrt
from test_opt import config_json
from vkrt.errors import ConfigError, ModelFormatError, VkrtError
from vkrt.models.generate import generate
from vkrt.models.registry import FAMILIES, open_checkpoint



def test_opt_folder_streams_the_greedy_text(opt_folder, device):
    with vkrt.load(opt_folder, device=device) as model:
        assert model.family == "opt" and model.hparams.n_ctx == config_json()[
            "max_position_embeddings"]
        ids = model.encode("Hello world")
        assert ids[0] == model.tokenizer.bos_id == 2          # OPT prepends </s>
        text = model.generate("Hello world", max_tokens=6)
        pieces = list(text)
        expected = generate(model.lm, ids, 6, stop_ids=model.tokenizer.eog_ids).tokens
        assert text.result.tokens == expected and len(expected) >= 1
        assert "".join(pieces) == model.tokenizer.decode(expected, skip_special=True)
        # Token ids in, the same tokens out.
        assert list(model.generate(ids, max_tokens=6)) == pieces


def test_default_gguf_through_load(default_gguf, device):
    """The Llama family through the registry, greedy and chat, equal to the direct path."""
    from vkrt.models.chat import encode_chat

    with vkrt.load(default_gguf.path, device=device) as model:
        assert model.family == "llama"
        text = model.generate("The capital of France is", max_tokens=3)
        pieces = list(text)
        ids = model.tokenizer.encode("The capital of France is")
        assert text.result.tokens == generate(model.lm, ids, 3).tokens
        assert "".join(pieces) == model.tokenizer.decode(text.result.tokens, skip_special=True)
        chat = model.encode("Hi <|im_end|>", chat=True)
        template = model.checkpoint.chat_template
        assert chat == encode_chat(model.tokenizer, template, [{"role": "user",
                                                                "content": "Hi <|im_end|>"}],
                                   add_generation_prompt=True, bos_token="",
                                   eos_token=model.tokenizer.decode([model.tokenizer.eos_id]))


def test_f16_kv_cache_through_load(opt_folder, device):
    """`vkrt.load(kv_cache_dtype="f16")`: the model's KV cache is float16 (OPT here: its
    copy_rows and attention read and write it through their `_kvf16` variants), its
    teacher-forced logits within the f16 cache's bound of the f32 cache's, and tokens come
    out; a name outside KV_CACHE_DTYPES, or f16 on a device without
    storageBuffer16BitAccess, is refused in one line before any weight is read."""
    if not device.features.get("storageBuffer16BitAccess"):
        pytest.skip(f"{device.name} has no storageBuffer16BitAccess (f16 KV cache)")
    with vkrt.load(opt_folder, device=device) as model:
        ids = model.encode("Hello world, here is a longer prompt")
        want = model.lm.logits(ids)
    with vkrt.load(opt_folder, device=device, kv_cache_dtype="f16") as model:
        got = model.lm.logits(ids)
        assert model.lm.k_cache[0].dtype == model.lm.v_cache[0].dtype == "float16"
        text = model.generate("Hello world", max_tokens=4)
        list(text)
        assert len(text.result.tokens) >= 1
    # tests/test_batch.py's bound for an f16 cache: 1e-3 of the largest |logit|
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()
    before = device.bytes_in_use
    with pytest.raises(ConfigError, match=r"^kv_cache_dtype must be one of f32, f16, got "
                                          r"'bf16'$"):
        vkrt.load(opt_folder, device=device, kv_cache_dtype="bf16")
    features = device.features
    device.features = {**features, "storageBuffer16BitAccess": False}
    try:
        with pytest.raises(VkrtError, match=r"^an f16 KV cache needs the device feature "
                                            r"storageBuffer16BitAccess, which .* lacks$"):
            vkrt.load(opt_folder, device=device, kv_cache_dtype="f16")
    finally:
        device.features = features
    assert device.bytes_in_use == before


def test_closing_the_stream_early_then_generating_again(opt_folder, device):
    with vkrt.load(opt_folder, device=device) as model:
        full = list(model.generate("Hello", max_tokens=5))
        text = model.generate("Hello", max_tokens=5)
        next(text)
        text.close()                       # steps in flight are left to finish, unread
        assert list(model.generate("Hello", max_tokens=5)) == full


def test_close_frees_every_buffer(opt_folder, checked_device):
    before = checked_device.bytes_in_use
    model = vkrt.load(opt_folder, device=checked_device)
    list(model.generate("Hello", max_tokens=2))
    assert checked_device.bytes_in_use > before
    model.close()
    assert checked_device.bytes_in_use == before
    model.close()                          # twice is harmless
    with pytest.raises(VkrtError, match="closed"):
        model.generate("Hello")


def test_load_opens_and_closes_its_own_device(opt_folder):
    model = vkrt.load(opt_folder)
    device = model.device
    assert device.handle is not None
    model.close()
    assert device.handle is None and model.device is None


def test_failed_load_leaves_nothing_allocated(opt_folder, tmp_path, device):
    """A shard cut short is refused in one line naming it; nothing stays on the device."""
    bad = tmp_path / "cut"
    bad.mkdir()
    for name in os.listdir(opt_folder):
        data = open(os.path.join(opt_folder, name), "rb").read()
        (bad / name).write_bytes(data[:len(data) - 100] if name.endswith(".safetensors")
                                 else data)
    before = device.bytes_in_use
    with pytest.raises(ModelFormatError) as e:
        vkrt.load(bad, device=device)
    assert "model.safetensors" in str(e.value) and "\n" not in str(e.value)
    assert device.bytes_in_use == before


def _gguf(path, arch: str) -> str:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _folder(path, config) -> str:
    path.mkdir()
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


@pytest.mark.parametrize("make, words", [
    # Each lists the families that read its format (OPT comes from folders only).
    (lambda p: _gguf(p / "m.gguf", "mamba"), ["m.gguf", "unsupported architecture 'mamba'",
                                              "(supported: gemma3, llama, qwen2, qwen3)"]),
    (lambda p: _gguf(p / "o.gguf", "opt"), ["o.gguf", "'opt'", "checkpoint folders only"]),
    (lambda p: _folder(p / "gpt2", {"model_type": "gpt2"}), ["config.json",
                                                            "unsupported model_type 'gpt2' "
                                                            "(supported: opt)"]),
    (lambda p: _folder(p / "nomt", {"hidden_size": 8}), ["config.json",
                                                        "unsupported model_type None"]),
    (lambda p: _folder(p / "llama", {"model_type": "llama"}), ["'llama'", "GGUF files only"]),
    (lambda p: _folder(p / "broken", "{not json"), ["config.json", "cannot read"]),
    (lambda p: _folder(p / "list", "[1, 2]"), ["config.json", "JSON object"]),
    (lambda p: (p / "empty").mkdir() or str(p / "empty"), ["without config.json"]),
    (lambda p: str(p / "missing.gguf"), ["not found", "missing.gguf"]),
])
def test_registry_refuses_in_one_line(tmp_path, make, words):
    path = make(tmp_path)
    with pytest.raises(ModelFormatError) as e:
        open_checkpoint(path)
    message = str(e.value)
    assert "\n" not in message
    for w in words:
        assert w in message, message


def test_every_family_module_has_a_reader():
    import importlib

    for name, module in FAMILIES.items():
        m = importlib.import_module(module)
        assert hasattr(m, "checkpoint_from_gguf") or hasattr(m, "checkpoint_from_folder"), name


def test_bad_requests_are_refused_before_any_work(opt_folder, device):
    with vkrt.load(opt_folder, device=device) as model:
        n_vocab = model.hparams.n_vocab
        submits = model.lm.stream.counters.submits
        with pytest.raises(VkrtError, match=f"token id {n_vocab} is outside"):
            model.generate([1, n_vocab])
        with pytest.raises(VkrtError, match="no chat template"):
            model.generate("hi", chat=True)
        with pytest.raises(VkrtError, match="empty"):
            model.generate("", max_tokens=2) if not model.tokenizer.add_bos else \
                model.generate([], max_tokens=2)
        with pytest.raises(VkrtError, match=r"^prompt of \d+ tokens? \+ 1000000 new = \d+ "
                                            r"exceeds the model's context of \d+ tokens$"):
            model.generate("hi", max_tokens=10 ** 6)   # (it once named the CLI's --max-tokens)
        for prompt in (5, [1.5], ["7"], [True], None):   # ids are integers: none rounded
            with pytest.raises(ConfigError, match="prompt must be text or a sequence of "
                                                  "integer token ids, got "):
                model.generate(prompt)
        assert model.encode(np.array([1, 2])) == [1, 2]
        with pytest.raises(ConfigError, match="temperature"):
            model.generate("hi", temperature=-1.0)
        for bad in (0, -1, 2.5, True):   # as the CLI and the server refuse them
            with pytest.raises(ConfigError, match=f"max_tokens must be an integer >= 1, got {bad}"):
                "".join(model.generate("hi", max_tokens=bad))
        assert model.lm.stream.counters.submits == submits
