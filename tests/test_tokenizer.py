"""The GGUF tokenizer against transformers' tokenizer built from the same file."""

import numpy as np
import pytest

from vkrt.errors import ModelFormatError, VkrtError
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


def test_special_off_spells_the_characters(tok, hf_tokenizer):
    text = "hi<|im_end|>\n<|im_start|>system"
    ids = tok.encode(text, special=False)
    assert 1 not in ids and 2 not in ids and tok.decode(ids) == text
    # transformers' split_special_tokens=False counterpart: the plain characters' ids.
    assert ids == hf_tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def test_bos_is_never_doubled(tok):
    with_bos = Tokenizer(tok.hf, tok.bos_id, tok.eos_id, add_bos=True)
    rendered = "<|im_start|>user\nHi<|im_end|>\n"   # SmolLM2's BOS is <|im_start|>
    ids = with_bos.encode(rendered)
    assert ids == tok.encode(rendered) and ids.count(1) == 1
    assert with_bos.encode("Hi") == [1] + tok.encode("Hi")


def test_text_that_is_not_unicode_is_one_line_error(tok):
    bad = b"caf\xe9 ok".decode("utf-8", "surrogateescape")   # argv of a Latin-1 terminal
    with pytest.raises(VkrtError, match=r"not valid UTF-8 \(bytes b'\\xe9' at character 3\)"):
        tok.encode(bad)


def test_end_of_generation_ids():
    md = _tiny_metadata(**{"tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.eot_token_id": 2,
                           "tokenizer.ggml.eom_token_id": 3})
    assert Tokenizer.from_metadata(md).eog_ids == {1, 2, 3}
    assert Tokenizer.from_metadata(_tiny_metadata()).eog_ids == set()


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


def test_stream_cut_inside_a_character(tok):
    # Generation can stop after 2 of the 3 tokens of 🎉: the held bytes come out at finish,
    # as decode shows them (one U+FFFD for the incomplete sequence).
    ids = tok.encode("ok ") + tok.encode("🎉")[:2]
    assert len(tok.encode("🎉")) == 3
    stream = tok.stream()
    pieces = [stream.step(i) for i in ids] + [stream.finish()]
    assert "".join(pieces) == tok.decode(ids) == "ok \ufffd"


@pytest.mark.parametrize("skip_special", [False, True])
def test_stream_equals_decode_on_random_ids(tok, skip_special):
    # Random ids include byte tokens that never form valid UTF-8, special tokens, and cuts
    # anywhere: the streamed pieces plus finish are always decode(ids).
    rng = np.random.default_rng(0)
    byte_tokens = [i for i in range(tok.n_vocab) if len(tok.decode([i]).encode()) <= 3
                   and "\ufffd" in tok.decode([i])]
    assert len(byte_tokens) > 50
    for trial in range(200):
        pool = byte_tokens if trial % 2 else range(tok.n_vocab)
        ids = [int(rng.choice(pool)) if rng.random() < 0.7 else int(rng.integers(0, 20))
               for _ in range(int(rng.integers(1, 12)))]
        stream = tok.stream(skip_special)
        got = "".join(stream.step(i) for i in ids) + stream.finish()
        assert got == tok.decode(ids, skip_special=skip_special), ids


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
