"""The GGUF tokenizer against transformers' tokenizer built from the same file, and the
SentencePiece ones against llama.cpp's expected ids of its real vocabulary files as well
(`scripts/setup.sh test` fetches them into .cache/vocab: `VOCAB_DIR`)."""

import os

import numpy as np
import pytest

from vkrt.errors import ModelFormatError, VkrtError
from vkrt.models.gguf import load_gguf
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


def test_a_lone_surrogate_is_one_line_error(tok):
    """JSON's "\\ud800" decodes to a lone UTF-16 surrogate, which no surrogate escape covers."""
    with pytest.raises(VkrtError, match=r"not valid UTF-8 \(a lone surrogate U\+D800 at "
                                        r"character 2\)"):
        tok.encode("ab\ud800c")


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
    ({"tokenizer.ggml.model": "gemma4"}, "unsupported tokenizer.ggml.model 'gemma4' "
     "(supported: 'gpt2', 'llama')"),
    ({"tokenizer.ggml.pre": "qwen35"}, "unsupported tokenizer.ggml.pre 'qwen35'"),
    ({"tokenizer.ggml.merges": ["a c"]}, "cannot build"),
    ({"tokenizer.ggml.token_type": np.array([3, 1])}, "2 token types for 4 tokens"),
    ({"tokenizer.ggml.bos_token_id": 99}, "outside"),
])
def test_bad_tokenizer_metadata(over, words):
    with pytest.raises(ModelFormatError) as info:
        Tokenizer.from_metadata(_tiny_metadata(**over), "m.gguf")
    assert words in str(info.value) and "\n" not in str(info.value)


# -- each family's pre-tokenizer against transformers reading the same file -----------------
HARD = ["3333+777", "x 3333+777=4110", "emoji 🤖🎉👩‍👩‍👧 done", "東京 naïve, 中文字符",
        "  leading   spaces\n\n\ttabs\r\n", " Hello world", "It's don't I'M", "a" * 20, " ",
        "<|im_start|>user\nHi<|im_end|>\n", "<|endoftext|>x",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"]
FAMILY_PRE = {"qwen2": "qwen2", "llama-bpe": "llama", "gpt-2": "llama"}   # pre -> arch


@pytest.fixture(scope="module")
def family_vocabs(tmp_path_factory):
    """pre -> (vkrt's Tokenizer, transformers' tokenizer) of one tokenizer-only GGUF."""
    import transformers
    from family_files import write_vocab_gguf

    out = {}
    for pre, arch in FAMILY_PRE.items():
        path = write_vocab_gguf(tmp_path_factory.mktemp(pre) / "vocab.gguf", pre, arch)
        hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        if pre == "llama-bpe":
            # Llama 3's tokenizer.json says "ignore_merges": true (a pre-token that is a
            # vocabulary entry is that token; llama.cpp's llama-vocab.cpp sets ignore_merges
            # for llama-bpe too); transformers' GGUF reader builds its BPE without it.
            hf.backend_tokenizer.model.ignore_merges = True
        out[pre] = (load_tokenizer(load_gguf(path)), hf)
    return out


@pytest.mark.parametrize("pre", list(FAMILY_PRE))
def test_family_pre_tokenizer_matches_transformers(family_vocabs, pre):
    ours, theirs = family_vocabs[pre]
    # transformers' GPT2Tokenizer adds its default <|endoftext|> when the vocabulary has none
    # (Llama 3's): an id past the file's vocabulary, so texts spelling it are not compared.
    invented = {t for t, i in theirs.get_vocab().items() if i >= ours.n_vocab}
    assert invented <= {"<|endoftext|>"}, invented
    for text in HARD:
        if any(t in text for t in invented):
            continue
        ids = ours.encode(text, add_bos=False)
        assert ids == theirs.encode(text, add_special_tokens=False), (pre, text)
        assert ours.decode(ids) == text, (pre, text)


def test_pre_tokenizers_split_digits_differently(family_vocabs):
    """qwen2 splits every digit, llama-bpe runs of up to 3, gpt-2 whole runs: on "3333+777"
    the three give three different id lists (a pre-tokenizer silently swapped shows)."""
    ids = {pre: tok.encode("3333+777", add_bos=False) for pre, (tok, _) in family_vocabs.items()}
    spelled = {pre: [tok.decode([i]) for i in ids[pre]] for pre, (tok, _) in family_vocabs.items()}
    assert spelled == {"qwen2": ["3", "3", "3", "3", "+", "7", "7", "7"],
                       "llama-bpe": ["333", "3", "+", "777"],
                       "gpt-2": ["3333", "+", "777"]}, spelled


def test_llama3_ignores_merges_for_whole_tokens(family_vocabs):
    """" done" is one entry of the test vocabulary that its merges do not reach ("o n"
    merges first): llama-bpe takes the entry whole, qwen2 runs the merges."""
    assert family_vocabs["llama-bpe"][0].encode(" done", add_bos=False) == [
        family_vocabs["llama-bpe"][0].hf.token_to_id("Ġdone")]
    assert len(family_vocabs["qwen2"][0].encode(" done")) == 3


def test_family_special_tokens_and_stops(family_vocabs):
    """qwen2 stops at <|im_end|> and <|endoftext|>, Llama 3 at <|eot_id|>, <|eom_id|> and
    <|end_of_text|> (llama.cpp's llama-vocab.cpp finds these by text); Llama 3 adds
    <|begin_of_text|> once when the file does not say (llama.cpp's default for llama-bpe),
    qwen2 adds none."""
    qwen, _ = family_vocabs["qwen2"]
    sp = qwen.special_tokens
    assert qwen.eog_ids == {sp["<|im_end|>"], sp["<|endoftext|>"]}
    assert not qwen.add_bos and qwen.encode("Hi")[:1] != [sp["<|endoftext|>"]]
    llama, _ = family_vocabs["llama-bpe"]
    sp = llama.special_tokens
    assert llama.eog_ids == {sp["<|eot_id|>"], sp["<|eom_id|>"], sp["<|end_of_text|>"]}
    bos = sp["<|begin_of_text|>"]
    assert llama.add_bos and llama.encode("Hi")[0] == bos
    assert llama.encode("<|begin_of_text|>Hi").count(bos) == 1
    gpt2, _ = family_vocabs["gpt-2"]
    assert gpt2.eog_ids == {gpt2.eos_id}


@pytest.mark.parametrize("pre, words", [
    (None, "missing metadata key 'tokenizer.ggml.pre' (the pre-tokenizer; supported: "),
    ("qwen-2", "unsupported tokenizer.ggml.pre 'qwen-2' (supported: "),
    ("default", "unsupported tokenizer.ggml.pre 'default'"),
])
def test_missing_or_misnamed_pre_tokenizer_refused(pre, words, tmp_path):
    from family_files import write_vocab_gguf

    path = write_vocab_gguf(tmp_path / "v.gguf", "qwen2", keys={"tokenizer.ggml.pre": pre})
    with pytest.raises(ModelFormatError) as info:
        load_tokenizer(load_gguf(path))
    assert words in str(info.value) and "\n" not in str(info.value)



# -- SentencePiece vocabularies (tokenizer.ggml.model "llama") -------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# llama.cpp's vocabulary-only GGUF files with the ids its test-tokenizer-0 expects
# (ggml-vocab-NAME.gguf.inp: texts between "\n__ggml_vocab_test__\n"; .out: one line of ids
# per text, encoded without BOS). tests/mutations.py points its copies here too.
VOCAB_DIR = os.environ.get("VKRT_VOCAB_DIR", os.path.join(ROOT, ".cache", "vocab"))
SPM_REAL = ["llama-spm", "phi-3"]   # Llama 2's vocabulary (32000), Phi-3's (32064)
SPM_HARD = HARD + ["3333+777", "  two leading", "   three", "\n\nnew\nlines\n", "\ttab\t\t",
                   "ends with space ", "東京タワー 中文", "Ωmega ǅ ﬁ", "🦙🦙 llama", "\u00a0\u2028",
                   "<s>hi</s> x", "a<unk>b", "<0x41> <0xE6>", "x" * 40, "\r\n\r\n"]


def vocab_file(name: str) -> str:
    path = os.path.join(VOCAB_DIR, f"ggml-vocab-{name}.gguf")
    if not os.path.isfile(path):
        pytest.fail(f"{path} is missing: run scripts/setup.sh test (it fetches llama.cpp's "
                    "vocabulary files from PyPI's llama-cpp-python sdist)", pytrace=False)
    return path


def llama_cpp_cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, llama.cpp's ids) of ggml-vocab-NAME.gguf.inp/.out."""
    path = vocab_file(name)
    with open(path + ".inp", encoding="utf-8", newline="") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")
    with open(path + ".out", encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    assert len(lines) >= len(texts) > 40, (len(texts), len(lines))
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


@pytest.fixture(scope="module")
def spm_real():
    """name -> (vkrt's Tokenizer, transformers' tokenizer) of llama.cpp's real SPM files."""
    import transformers

    out = {}
    for name in SPM_REAL:
        path = vocab_file(name)
        hf = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                        gguf_file=os.path.basename(path))
        out[name] = (load_tokenizer(load_gguf(path)), hf)
    return out


@pytest.mark.parametrize("name", SPM_REAL)
def test_spm_real_vocab_matches_llama_cpp(spm_real, name):
    """Every text of llama.cpp's tokenizer test gives its expected ids (leading and repeated
    spaces, newlines, tabs, digits, emoji through byte fallback, CJK), and decodes back."""
    tok, _ = spm_real[name]
    assert tok.space_prefix and tok.add_bos and tok.bos_id == 1
    for text, want in llama_cpp_cases(name):
        ids = tok.encode(text, add_bos=False)
        assert ids == want, (name, text)
        assert tok.decode(ids) == text, (name, text)


@pytest.mark.parametrize("name", SPM_REAL)
def test_spm_real_vocab_matches_transformers(spm_real, name):
    """Against transformers' tokenizer of the same file. Phi-3's (transformers prefixes the
    space with a normalizer, as llama.cpp does) agrees on every text. For `llama` files
    transformers builds a Metaspace pre-tokenizer that prefixes a space only when the text does
    not start with one and only before the first fragment: there it differs from llama.cpp
    (whose ids vkrt gives: llama.cpp's test expects [29871, 15043] for " Hello") on text that
    starts with whitespace or follows a special token, and those are checked against llama.cpp
    only."""
    ours, theirs = spm_real[name]
    texts = SPM_HARD + [t for t, _ in llama_cpp_cases(name)]
    compared = 0
    for text in texts:
        ids = ours.encode(text, add_bos=False)
        assert ours.decode(ids) == text, (name, text)
        if name == "llama-spm" and (text[:1].isspace() or any(
                t in text for t in ours.special_tokens)):
            continue
        assert ids == theirs.encode(text, add_special_tokens=False), (name, text)
        compared += 1
    assert compared > (40 if name == "llama-spm" else len(texts) - 1), compared
    if name == "llama-spm":
        assert ours.encode(" Hello", add_bos=False) == [29871, 15043]
        assert theirs.encode(" Hello", add_special_tokens=False) == [15043]


def test_merges_from_scores_equal_transformers():
    """On the real Llama 2 vocabulary (no merges in the file), the merges rebuilt from the
    scores are transformers' generate_merges, in the same order."""
    from transformers.tokenization_utils_base import generate_merges

    from vkrt.models.tokenizer import merges_from_scores

    md = load_gguf(vocab_file("llama-spm")).metadata
    tokens, scores = list(md["tokenizer.ggml.tokens"]), [float(x) for x in
                                                         md["tokenizer.ggml.scores"]]
    ours = merges_from_scores(tokens, scores)
    assert len(ours) > 60000
    assert ours == generate_merges({t: i for i, t in enumerate(tokens)}, dict(zip(tokens, scores)))


def test_spm_special_tokens_follow_llama_cpp(spm_real):
    """Special-token text becomes its id, and the text after it gets the space prefix again
    (llama.cpp's `is_prev_special`); BOS is added once."""
    tok, _ = spm_real["llama-spm"]
    hi = tok.encode("hi", add_bos=False)
    assert tok.encode("<s>hi") == [1] + hi and tok.encode("<s>hi").count(1) == 1
    assert tok.encode("hi</s>hi", add_bos=False) == hi + [2] + hi
    assert tok.encode("hi") == [1] + hi
    plain = tok.encode("<s>hi", add_bos=False, special=False)
    assert 1 not in plain and tok.decode(plain) == "<s>hi"
    assert tok.eog_ids == {2} and tok.decode([1, 2], skip_special=True) == ""


def test_spm_byte_fallback(spm_real):
    """A character outside the vocabulary is its UTF-8 bytes' <0xXX> tokens (never <unk>),
    and the bytes join back into the character."""
    tok, _ = spm_real["llama-spm"]
    ids = tok.encode("🦙", add_bos=False)
    assert ids == [29871, 243, 162, 169, 156] and 0 not in ids   # ▁ <0xF0> <0x9F> <0xA6> <0x99>
    assert [tok.hf.id_to_token(i) for i in ids[1:]] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]
    assert tok.decode(ids) == "🦙"


@pytest.mark.parametrize("name", SPM_REAL)
def test_spm_stream_keeps_spaces_and_utf8(spm_real, name):
    """Generated ids continue a prompt: every piece keeps its leading space (llama.cpp's
    token_to_piece), a character split over byte tokens waits until whole, and the pieces equal
    `decode(ids, continuation=True)`; `decode` alone drops the one space the encoder put
    first."""
    tok, _ = spm_real[name]
    text = "Hello 🦙 world 東京 done"
    ids = tok.encode(text, add_bos=False)
    stream = tok.stream()
    pieces = [stream.step(i) for i in ids] + [stream.finish()]
    assert "".join(pieces) == " " + text == tok.decode(ids, continuation=True)
    assert pieces[0] == " Hello" and "" in pieces and all("\ufffd" not in p for p in pieces)
    assert tok.decode(ids) == text
    # Cut inside the llama's four byte tokens: the held bytes come out at finish, as
    # decode(continuation=True) shows them (one U+FFFD per byte, as ByteFallback decodes).
    cut = ids[:ids.index(tok.hf.token_to_id("<0x9F>")) + 1]
    stream = tok.stream()
    pieces = [stream.step(i) for i in cut] + [stream.finish()]
    assert "".join(pieces) == tok.decode(cut, continuation=True) == " Hello \ufffd\ufffd", pieces


def spm_vocab_tokenizers(tmp_path, **kw):
    import transformers
    from family_files import write_spm_vocab_gguf

    path = write_spm_vocab_gguf(tmp_path / "spm.gguf", **kw)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    return load_tokenizer(load_gguf(path)), hf


def test_gemma3_spm_matches_transformers(tmp_path):
    """A Gemma-style SentencePiece vocabulary (no space prefix, `<bos>` added, its special
    tokens, byte tokens, scored pieces) against transformers' GemmaTokenizer of the same file:
    equal ids on every hard text, decode round trips."""
    ours, theirs = spm_vocab_tokenizers(tmp_path)
    assert not ours.space_prefix and ours.add_bos
    for text in SPM_HARD + ["<start_of_turn>user\nHi<end_of_turn>\n", "<bos>x<eos>", "<mask> y"]:
        ids = ours.encode(text, add_bos=False)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text, text


def test_gemma3_spm_bos_once_and_stops(tmp_path):
    """Gemma 3: <bos> once (the file's add_bos_token; a prompt or template that writes it
    gets no second one), generation stops at <end_of_turn> and <eos>."""
    tok, _ = spm_vocab_tokenizers(tmp_path)
    sp = tok.special_tokens
    assert tok.bos_id == sp["<bos>"] and tok.eog_ids == {sp["<eos>"], sp["<end_of_turn>"]}
    assert tok.encode("Hi")[0] == sp["<bos>"]
    assert tok.encode("<bos>Hi").count(sp["<bos>"]) == 1
    assert tok.decode(tok.encode("<bos>Hi"), skip_special=True) == "Hi"


def test_spm_merges_follow_scores_not_ids(tmp_path):
    """SentencePiece merges the pair whose joined piece scores highest: "bc" scores above "ab"
    though its id is larger, so "abc" is a + bc (merging in id order would give ab + c)."""
    from family_files import SCORE_ORDER_PIECES

    ours, theirs = spm_vocab_tokenizers(tmp_path, arch="llama", n_vocab=300,
                                        specials=[("<unk>", 2), ("<s>", 3), ("</s>", 3)],
                                        pieces=[("\u2581", 0.0)] + SCORE_ORDER_PIECES)
    pieces = [ours.hf.id_to_token(i) for i in ours.encode("abc", add_bos=False)]
    assert pieces == ["\u2581", "a", "bc"], pieces
    assert ours.encode("abc", add_bos=False) == theirs.encode("abc", add_special_tokens=False)
    assert ours.encode("abab", add_bos=False) == theirs.encode("abab", add_special_tokens=False)


def test_unknown_tokenizer_model_refused_real_file():
    """llama.cpp's Gemma 4 vocabulary says tokenizer.ggml.model 'gemma4': refused in one line
    naming the key and value, never read as another model."""
    path = vocab_file("gemma-4")
    with pytest.raises(ModelFormatError) as info:
        load_tokenizer(load_gguf(path))
    text = str(info.value)
    assert text.startswith(path) and "\n" not in text
    assert "unsupported tokenizer.ggml.model 'gemma4' (supported: 'gpt2', 'llama')" in text


@pytest.mark.parametrize("keys, words", [
    ({"tokenizer.ggml.scores": None},
     "missing metadata key 'tokenizer.ggml.scores' (a SentencePiece vocabulary needs one per "
     "token, 400)"),
    ({"tokenizer.ggml.token_type": [1, 1, 3]}, "tokenizer.ggml.token_type has 3 entries for 400 "
     "tokens"),
    ({"tokenizer.ggml.scores": [0.0] * 399}, "tokenizer.ggml.scores has 399 entries for 400"),
    ({"tokenizer.ggml.model": "bert"}, "unsupported tokenizer.ggml.model 'bert'"),
    ({"tokenizer.ggml.pre": "qwen2"}, "unsupported tokenizer.ggml.pre 'qwen2' for a "
     "SentencePiece vocabulary"),
    ({"tokenizer.ggml.add_eos_token": True}, "tokenizer.ggml.add_eos_token = True is not "
     "implemented"),
    ({"tokenizer.ggml.remove_extra_whitespaces": True},
     "tokenizer.ggml.remove_extra_whitespaces = True is not implemented"),
    ({"tokenizer.ggml.bos_token_id": 400}, "tokenizer.ggml.bos_token_id 400 outside the "
     "400-token vocab"),
])
def test_bad_spm_metadata(tmp_path, keys, words):
    from family_files import write_spm_vocab_gguf

    path = write_spm_vocab_gguf(tmp_path / "bad.gguf", keys=keys)
    with pytest.raises(ModelFormatError) as info:
        load_tokenizer(load_gguf(path))
    text = str(info.value)
    assert text.startswith(str(path)) and words in text and "\n" not in text, text


def test_spm_in_another_architecture_refused(tmp_path):
    from family_files import write_spm_vocab_gguf

    path = write_spm_vocab_gguf(tmp_path / "q.gguf", arch="qwen2")
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.model 'llama' \\(SentencePiece\\) "
                       "in general.architecture 'qwen2' is not supported"):
        load_tokenizer(load_gguf(path))
