"""The GGUF tokenizer against transformers' tokenizer built from the same file."""

import numpy as np
import pytest

from vkrt.errors import ModelFormatError
from vkrt.models.tokenizer import Tokenizer, load_tokenizer

TEXTS = [
    "Hello, world!",
    "1234567890 and 3.14159",
    "12 345 6789",
    "$100,000.00 (approx.)",
    "  leading   spaces\n\n\ttabs\r\n",
    "naïve café, Straße, 東京, Привет",
    "emoji 🤖🎉👩‍👩‍👧 done",
    "def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>x",
    "It's don't we'll I'M",
    "\u00a0nbsp\u2028line sep",
    "a" * 50,
    " ",
    "",
]


@pytest.fixture(scope="module")
def tok(default_gguf):
    return load_tokenizer(default_gguf)



@pytest.mark.parametrize("text", TEXTS)
def test_matches_transformers_and_round_trips(tok, hf_tokenizer, text):
    ids = tok.encode(text)
    assert ids == hf_tokenizer.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


def test_special_tokens(tok):
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.n_vocab) == (1, 2, False, 49152)
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("hi", add_bos=True)[0] == 1
    assert tok.decode([1, 2], skip_special=True) == ""


def test_digits_split_one_by_one(tok):
    # SmolLM2 (tokenizer.ggml.pre "smollm") splits every digit, as llama.cpp does.
    ids = tok.encode("2024")
    assert len(ids) == 4 and tok.decode(ids[:1]) == "2"


@pytest.mark.parametrize("text", ["emoji 🤖🎉👩‍👩‍👧 done", "東京 naïve", "plain ascii"])
def test_stream_keeps_utf8_whole(tok, text):
    ids = tok.encode(text)
    stream = tok.stream()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    if not text.isascii():  # some token holds a partial character: its piece waits
        assert "" in pieces


def _tiny_metadata(**over):
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": ["<s>", "a", "b", "ab"],
        "tokenizer.ggml.token_type": np.array([3, 1, 1, 1]),
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 0,
    }
    md.update(over)
    return md


def test_tiny_vocab():
    t = Tokenizer.from_metadata(_tiny_metadata())
    assert t.encode("abab<s>a") == [3, 3, 0, 1]


@pytest.mark.parametrize("over, words", [
    ({"tokenizer.ggml.model": "llama"}, "unsupported tokenizer.ggml.model 'llama'"),
    ({"tokenizer.ggml.pre": "qwen2"}, "unsupported tokenizer.ggml.pre 'qwen2'"),
    ({"tokenizer.ggml.merges": ["a c"]}, "cannot build"),
    ({"tokenizer.ggml.token_type": np.array([3, 1])}, "2 token types for 4 tokens"),
    ({"tokenizer.ggml.bos_token_id": 99}, "outside"),
])
def test_bad_tokenizer_metadata(over, words):
    with pytest.raises(ModelFormatError) as info:
        Tokenizer.from_metadata(_tiny_metadata(**over), "m.gguf")
    assert words in str(info.value) and "\n" not in str(info.value)
