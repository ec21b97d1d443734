"""GGUF loading: the default model's layout and weights, and refusal of bad files."""

import struct

import gguf
import numpy as np
import pytest

from reference import numpy_forward
from vkrt.errors import ModelFormatError
from vkrt.models.arch import Arch
from vkrt.models.gguf import load_gguf
from vkrt.models.tokenizer import load_tokenizer

# The first bytes of the default GGUF hold the 24-byte header, 33 KVs (tokenizer included) and
# 272 tensor infos; its data section starts at byte 1,785,664.
HEADER_END = 1_785_664


def test_default_model_hparams(default_gguf):
    hp = Arch.from_gguf(default_gguf)
    assert default_gguf.architecture == "llama"
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim) == (30, 576, 9, 3, 64)
    assert (hp.n_ff, hp.n_vocab, hp.n_ctx) == (1536, 49152, 8192)
    assert hp.rope_theta == 100000.0 and abs(hp.rms_eps - 1e-5) < 1e-9
    assert hp.tied_embeddings and (hp.bos_id, hp.eos_id) == (1, 2)


def test_default_model_tensors(default_gguf):
    g = default_gguf
    assert len(g.tensor_names) == 272
    q = g.tensor_info("blk.0.attn_q.weight")
    assert (q.shape, q.ggml_type) == ((576, 576), "Q4_1")
    assert g.tensor_info("blk.0.attn_k.weight").shape == (192, 576)
    assert g.tensor_info("blk.0.ffn_down.weight").shape == (576, 1536)
    assert g.tensor_info("token_embd.weight").ggml_type == "Q8_0"
    types = [g.tensor_info(n).ggml_type for n in g.tensor_names]
    assert (types.count("Q4_1"), types.count("Q8_0"), types.count("F32")) == (210, 1, 61)
    assert g.metadata["tokenizer.ggml.model"] == "gpt2"
    assert len(g.metadata["tokenizer.ggml.tokens"]) == 49152


def test_tensor_f32_dequantizes_by_hand(default_gguf):
    # Q4_1 block: fp16 d, fp16 m, 16 bytes; element j<16 is the low nibble of byte j, j>=16
    # the high nibble of byte j-16; value = d*q + m.
    g = default_gguf
    w = g.tensor_f32("blk.0.attn_q.weight")
    assert w.dtype == np.float32 and w.shape == (576, 576) and w.flags.c_contiguous
    block = g.tensor_raw("blk.0.attn_q.weight")[:20]
    d, m = np.frombuffer(block[:4].tobytes(), np.float16).astype(np.float32)
    qs = np.concatenate([block[4:] & 0xF, block[4:] >> 4]).astype(np.float32)
    np.testing.assert_array_equal(w[0, :32], d * qs + m)
    # Q8_0 block: fp16 d + 32 int8.
    e = g.tensor_f32("token_embd.weight")
    assert e.shape == (49152, 576)
    block = g.tensor_raw("token_embd.weight")[:34]
    d = np.frombuffer(block[:2].tobytes(), np.float16).astype(np.float32)[0]
    np.testing.assert_array_equal(e[0, :32], d * np.frombuffer(block[2:].tobytes(), np.int8))
    norm = g.tensor_f32("output_norm.weight")
    assert norm.shape == (576,) and norm.dtype == np.float32


# --- bad files ---------------------------------------------------------------------------

def _expect_error(path, *words):
    with pytest.raises(ModelFormatError) as info:
        load_gguf(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    for word in words:
        assert word in msg, msg
    return msg


@pytest.fixture(scope="module")
def header_bytes(default_model_path):
    with open(default_model_path, "rb") as f:
        return f.read(HEADER_END + 4096)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.gguf"
    with pytest.raises(ModelFormatError, match="model file not found: .*nope.gguf"):
        load_gguf(path)


@pytest.mark.parametrize("cut", [0, 3, 10, 23, 24, 100, 5000, 900_000, HEADER_END - 100,
                                 HEADER_END + 1000])
def test_truncated(tmp_path, header_bytes, cut):
    # Inside the header, the KVs (tokens array at ~5000, merges at ~900,000), the tensor infos,
    # and inside the data (the first tensor is 30 MB).
    path = tmp_path / "cut.gguf"
    path.write_bytes(header_bytes[:cut])
    _expect_error(path, "truncated" if cut < HEADER_END else "past the end")


def test_bad_magic(tmp_path, header_bytes):
    path = tmp_path / "magic.gguf"
    path.write_bytes(b"GGML" + header_bytes[4:])
    _expect_error(path, "not a GGUF file")


def test_bad_version(tmp_path, header_bytes):
    path = tmp_path / "version.gguf"
    path.write_bytes(header_bytes[:4] + struct.pack("<I", 99) + header_bytes[8:])
    _expect_error(path, "version 99")


@pytest.mark.parametrize("field_offset", [8, 16])  # tensor count, KV count
def test_corrupt_counts(tmp_path, header_bytes, field_offset):
    data = bytearray(header_bytes)
    data[field_offset:field_offset + 8] = struct.pack("<Q", 2**60)
    path = tmp_path / "count.gguf"
    path.write_bytes(bytes(data))
    _expect_error(path, "impossible")


def _write_tiny(path, arch="llama", tensors=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for name, array in (tensors or {"token_embd.weight": np.ones((8, 32), np.float32)}).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_tiny_file_loads(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write_tiny(path, tensors={"a": np.arange(64, dtype=np.float32).reshape(2, 32),
                               "b": np.ones((3, 32), np.float16)})
    g = load_gguf(path)
    assert g.tensor_info("a").shape == (2, 32) and g.tensor_info("b").ggml_type == "F16"
    np.testing.assert_array_equal(g.tensor_f32("a"), np.arange(64).reshape(2, 32))
    assert g.tensor_f32("b").dtype == np.float32


def _tensor_info_offset_pos(data: bytes, name: bytes) -> int:
    """Byte position of the u64 offset field in the tensor info of `name` (1-D or 2-D)."""
    pos = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", data, pos)
    return pos + 4 + 8 * n_dims + 4


def test_tensor_offset_past_eof(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write_tiny(path, tensors={"a": np.ones((2, 32), np.float32)})
    data = bytearray(path.read_bytes())
    pos = _tensor_info_offset_pos(bytes(data), b"a")
    data[pos:pos + 8] = struct.pack("<Q", 1 << 20)
    path.write_bytes(bytes(data))
    _expect_error(path, "'a'", "past the end")


@pytest.mark.parametrize("dim, words", [(0, "a dim is 0"), (2**62, "too many elements")])
def test_bad_dims(tmp_path, dim, words):
    path = tmp_path / "tiny.gguf"
    _write_tiny(path, tensors={"a": np.ones((2, 32), np.float32)})
    data = bytearray(path.read_bytes())
    outer_dim_pos = _tensor_info_offset_pos(bytes(data), b"a") - 4 - 8  # dims[1], before type
    data[outer_dim_pos:outer_dim_pos + 8] = struct.pack("<Q", dim)
    path.write_bytes(bytes(data))
    _expect_error(path, words)


def test_unknown_tensor_type(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write_tiny(path, tensors={"a": np.ones((2, 32), np.float32)})
    data = bytearray(path.read_bytes())
    pos = _tensor_info_offset_pos(bytes(data), b"a") - 4
    data[pos:pos + 4] = struct.pack("<I", 9999)
    path.write_bytes(bytes(data))
    _expect_error(path, "unknown ggml type 9999")


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt9.gguf"
    _write_tiny(path, arch="gpt9")
    g = load_gguf(path)
    assert g.architecture == "gpt9"
    with pytest.raises(ModelFormatError, match="unsupported architecture 'gpt9'"):
        Arch.from_gguf(g)


def test_missing_hparam_key(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write_tiny(path)
    with pytest.raises(ModelFormatError, match="missing metadata key 'llama.embedding_length'"):
        Arch.from_gguf(load_gguf(path))


def test_numpy_forward_matches_transformers(default_gguf, reference):
    # The GGUF read in llama.cpp's Q/K order with RoPE on adjacent pairs must give what
    # transformers gives with its un-permuted weights and rotate-half RoPE.
    hp = Arch.from_gguf(default_gguf)
    ids = [1, 4093, 198, 31530, 429, 216, 33, 288, 216, 33, 32, 30, 2, 198]
    ours = numpy_forward(default_gguf, hp, ids)
    theirs = reference.logits(ids)
    assert ours.shape == theirs.shape == (len(ids), hp.n_vocab)
    assert np.abs(ours - theirs).max() < 1e-3
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_reference_greedy_counts(default_gguf, reference):
    # "1, 2, 3, 4, 5," has a top-1/top-2 gap of 1.9 over 32 steps (FACTS.md): robust.
    tok = load_tokenizer(default_gguf)
    out = reference.greedy(tok.encode("1, 2, 3, 4, 5,"), 8)
    assert tok.decode(out).startswith(" 6, 7, 8")


def test_random_header_corruption_gives_only_model_format_error(tmp_path):
    # Flip bytes of a small but complete GGUF (strings, arrays, two tensors): every load must
    # either succeed or raise ModelFormatError, never anything else, and never hang.
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_token_list(["<s>", "a", "b", "ab", "é"])
    w.add_token_types([3, 1, 1, 1, 1])
    w.add_token_merges(["a b"])
    w.add_tensor("token_embd.weight", np.ones((5, 32), np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    clean = path.read_bytes()
    data_start = clean.index(b"blk.0.attn_norm.weight") + 64
    rng = np.random.default_rng(0)
    for trial in range(300):
        data = bytearray(clean)
        for pos in rng.integers(0, data_start, size=int(rng.integers(1, 4))):
            data[pos] = int(rng.integers(0, 256)) if trial % 2 else 0xFF
        path.write_bytes(bytes(data))
        try:
            load_gguf(path)
        except ModelFormatError as e:
            assert "\n" not in str(e)


# --- metadata the spec allows, vocabulary against the weights ------------------------------

def test_arrays_of_arrays_are_read(tmp_path):
    # The GGUF spec lets an array hold arrays; gguf-py writes and parses them.
    path = tmp_path / "nested.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("x.ints", [[1, 2], [3, 4, 5]])
    w.add_array("x.strs", [["a", "b"], ["é"]])
    w.add_array("x.deep", [[[1.5], [2.5, 3.5]], [[4.5]]])
    w.add_tensor("a", np.ones((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    md = load_gguf(path).metadata
    assert md["x.ints"] == [[1, 2], [3, 4, 5]]
    assert md["x.strs"] == [["a", "b"], ["é"]]
    assert md["x.deep"] == [[[1.5], [2.5, 3.5]], [[4.5]]]


N_EMBD = 32


def _write_llama(path, n_rows=8, tokens=None, output_rows=None, **ids):
    """A tiny llama GGUF with hparams, a tokenizer of `tokens` and an embedding of `n_rows`."""
    tokens = tokens if tokens is not None else ["<s>", "</s>", "a", "b", "ab", "c", "d", "e"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(N_EMBD)
    w.add_head_count(4)
    w.add_feed_forward_length(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_context_length(64)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    w.add_token_merges(["a b"])
    for key, value in ids.items():
        w.add_uint32(f"tokenizer.ggml.{key}", value)
    w.add_tensor("token_embd.weight", np.ones((n_rows, N_EMBD), np.float32))
    if output_rows is not None:
        w.add_tensor("output.weight", np.ones((output_rows, N_EMBD), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_llama_hparams(tmp_path):
    hp = Arch.from_gguf(load_gguf(_write_llama(tmp_path / "ok.gguf", eos_token_id=1,
                                                       output_rows=8)))
    assert (hp.n_vocab, hp.n_embd, hp.eos_id, hp.tied_embeddings) == (8, N_EMBD, 1, False)


def test_tokens_appended_without_embedding_rows(tmp_path):
    # 8 user-defined tokens appended to the tokenizer but not to token_embd: ids 8..15 would
    # read past the embedding table on the GPU.
    tokens = ["<s>", "</s>", "a", "b", "ab", "c", "d", "e"] + [f"<extra_{i}>" for i in range(8)]
    g = load_gguf(_write_llama(tmp_path / "extra.gguf", tokens=tokens))
    with pytest.raises(ModelFormatError) as info:
        Arch.from_gguf(g)
    assert "16 tokens but token_embd.weight has 8 rows" in str(info.value)
    assert "\n" not in str(info.value)


def test_fewer_tokens_than_embedding_rows(tmp_path):
    g = load_gguf(_write_llama(tmp_path / "short.gguf", n_rows=9))
    with pytest.raises(ModelFormatError, match="8 tokens but token_embd.weight has 9 rows"):
        Arch.from_gguf(g)


def test_output_matrix_rows_against_vocabulary(tmp_path):
    g = load_gguf(_write_llama(tmp_path / "out.gguf", output_rows=7))
    with pytest.raises(ModelFormatError, match=r"output.weight has shape \(7, 32\), expected "
                                               r"\(8, 32\)"):
        Arch.from_gguf(g)


@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id", "eot_token_id",
                                 "eom_token_id", "padding_token_id", "unknown_token_id"])
def test_special_token_id_outside_vocabulary(tmp_path, key):
    g = load_gguf(_write_llama(tmp_path / "ids.gguf", **{key: 8}))
    with pytest.raises(ModelFormatError) as info:
        Arch.from_gguf(g)
    assert f"tokenizer.ggml.{key} is 8, outside the 8-token vocabulary" in str(info.value)
    Arch.from_gguf(load_gguf(_write_llama(tmp_path / "ok.gguf", **{key: 7})))
