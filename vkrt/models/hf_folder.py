"""A Hugging Face checkpoint folder: `config.json` and the weights in safetensors files
(`model.safetensors`, or shards listed by `model.safetensors.index.json`'s `weight_map`).

A checkpoint is untrusted input. Each file is first opened with the `safetensors` library
(`safe_open`, which checks the header: its JSON, dtypes, shapes, and that the data offsets are
contiguous and lie inside the file, so a truncated shard is refused there); then tensors are
read one at a time from a read-only mapping of the file by the header's offsets (the format:
an 8-byte little-endian header length, the JSON header, the data;
https://github.com/huggingface/safetensors README "Format"). Reading the bytes ourselves
keeps bf16 (which numpy has no dtype for) without torch: a bf16 value is the upper half of
the f32 with the same bits. `tensor_f32` makes the one host copy of a tensor, as f32.

Every failure is a one-line `ModelFormatError` naming the file and the key or tensor.
"""
from __future__ import annotations

import json
import mmap
import os
import struct

import numpy as np

from vkrt.errors import ModelFormatError

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
# safetensors dtype -> numpy dtype of the stored bytes (BF16 is read as uint16 bits).
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_json(path: str) -> dict:
    """The JSON object in `path`. Raises ModelFormatError when missing, unreadable or not an
    object."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFormatError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise ModelFormatError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


class HFFolder:
    """config.json and the tensors of a checkpoint folder.

    Attributes: path (the folder), config (config.json's object), tensors (name -> (file,
    safetensors dtype, shape, byte offset in the file, nbytes)), in file order.
    Raises (construction): ModelFormatError for a missing config.json or weights, an index
    naming a missing file or a tensor its shard does not hold, a file safetensors refuses
    (truncated, corrupt header), a tensor stored in two files.
    """

    def __init__(self, path: str):
        self.path = str(path)
        if not os.path.isdir(self.path):
            raise ModelFormatError(f"{self.path}: not a folder (a Hugging Face checkpoint "
                                   f"folder holds {CONFIG} and *.safetensors)")
        self.config = read_json(os.path.join(self.path, CONFIG))
        index = os.path.join(self.path, INDEX)
        if os.path.exists(index):
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ModelFormatError(f"{index}: no 'weight_map' object")
            files = sorted(set(weight_map.values()), key=str)
        elif os.path.exists(os.path.join(self.path, WEIGHTS)):
            weight_map, files = None, [WEIGHTS]
        else:
            raise ModelFormatError(f"{self.path}: no {WEIGHTS} and no {INDEX}")
        self.tensors: dict[str, tuple] = {}
        self._maps: dict[str, mmap.mmap] = {}
        for name in files:
            for key, info in self._header(os.path.join(self.path, str(name))).items():
                if key in self.tensors:
                    raise ModelFormatError(f"{info[0]}: tensor {key!r} also in "
                                           f"{self.tensors[key][0]}")
                self.tensors[key] = info
        for key, name in (weight_map or {}).items():
            where = os.path.join(self.path, str(name))
            if key not in self.tensors or self.tensors[key][0] != where:
                raise ModelFormatError(f"{index}: tensor {key!r} mapped to {name!r}, which "
                                       "does not hold it")

    def _header(self, file: str) -> dict[str, tuple]:
        """The tensors of one safetensors file, checked by safe_open first."""
        from safetensors import safe_open

        if not os.path.exists(file):
            raise ModelFormatError(f"{file}: missing (named by {INDEX})")
        try:
            with safe_open(file, framework="numpy") as f:
                keys = set(f.keys())
        except Exception as e:  # safetensors raises SafetensorError and others, one line each
            raise ModelFormatError(f"{file}: not a valid safetensors file "
                                   f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                                   ) from None
        with open(file, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        out = {}
        for key, h in header.items():
            if key == "__metadata__":
                continue
            assert key in keys, key
            start, end = h["data_offsets"]
            out[key] = (file, h["dtype"], tuple(int(d) for d in h["shape"]), 8 + n + start,
                        end - start)
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name][2]

    def dtype(self, name: str) -> str:
        """The safetensors dtype name ("F32", "F16", "BF16", ...)."""
        return self.tensors[name][1]

    def tensor_f32(self, name: str) -> np.ndarray:
        """Tensor `name` as a new f32 array of its shape (f32, f16 and bf16 stored).
        Raises ModelFormatError for another dtype."""
        file, dtype, shape, offset, nbytes = self.tensors[name]
        if dtype not in DTYPES:
            raise ModelFormatError(f"{file}: tensor {name!r} is {dtype}; supported: "
                                   f"{', '.join(DTYPES)}")
        m = self._maps.get(file)
        if m is None:
            with open(file, "rb") as fh:
                m = self._maps[file] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        raw = np.frombuffer(m, DTYPES[dtype], nbytes // np.dtype(DTYPES[dtype]).itemsize,
                            offset).reshape(shape)
        if dtype == "BF16":  # the f32 whose upper 16 bits these are: one copy, no torch
            out = np.empty(shape, np.uint32)
            np.left_shift(raw, 16, out=out, dtype=np.uint32)
            return out.view(np.float32)
        return raw.astype(np.float32)

    def close(self) -> None:
        """Unmap the files (arrays returned by `tensor_f32` are copies and stay valid)."""
        for m in self._maps.values():
            m.close()
        self._maps.clear()


# The special tokens of OPT's GPT-2 vocabulary (facebook/opt-* vocab.json ids 0..3), used
# when a folder with vocab.json + merges.txt names none in its tokenizer files.
OPT_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json / special_tokens_map.json write it: a string
    or an AddedToken object {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_tokenizer(path: str):
    """The tokenizer of a checkpoint folder as a `vkrt.models.tokenizer.Tokenizer`.

    From `tokenizer.json` when present (`tokenizers.Tokenizer.from_file`), else from
    `vocab.json` + `merges.txt` (GPT-2 byte-level BPE, as transformers' GPT2Tokenizer reads
    them: ByteLevel pre-tokenizer without a prefix space, ByteLevel decoder), special tokens
    being those tokenizer_config.json / special_tokens_map.json name (bos, eos, unk, pad),
    else OPT's four. BOS and EOS ids are config.json's `bos_token_id` / `eos_token_id` (a
    list of EOS ids: every one ends generation); BOS is prepended (OPT's tokenizer prepends
    `</s>`, id 2) unless tokenizer_config.json says `"add_bos_token": false`.
    Raises ModelFormatError (one line naming the file) when there is no tokenizer, a file
    does not parse, or a BOS/EOS id lies outside the tokenizer's vocabulary.
    """
    from tokenizers import AddedToken, Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    from vkrt.models.tokenizer import Tokenizer

    folder = str(path)
    join = lambda name: os.path.join(folder, name)   # noqa: E731
    config = read_json(join(CONFIG))
    tok_config = read_json(join("tokenizer_config.json")) \
        if os.path.exists(join("tokenizer_config.json")) else {}
    if os.path.exists(join("tokenizer.json")):
        try:
            hf = HFTokenizer.from_file(join("tokenizer.json"))
        except Exception as e:
            raise ModelFormatError(f"{join('tokenizer.json')}: not a tokenizers file "
                                   f"({str(e).splitlines()[0] if str(e) else e!r})") from None
    elif os.path.exists(join("vocab.json")) and os.path.exists(join("merges.txt")):
        try:
            hf = HFTokenizer(models.BPE.from_file(join("vocab.json"), join("merges.txt"),
                                                  fuse_unk=False))
        except Exception as e:
            raise ModelFormatError(f"{join('vocab.json')}, {join('merges.txt')}: cannot build "
                                   f"the BPE tokenizer ({str(e).splitlines()[0]})") from None
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.decoder = decoders.ByteLevel()
        named = dict(tok_config)
        if os.path.exists(join("special_tokens_map.json")):
            named.update(read_json(join("special_tokens_map.json")))
        specials = {_token_text(named.get(k)) for k in ("bos_token", "eos_token", "unk_token",
                                                         "pad_token")} - {None}
        vocab = hf.get_vocab()
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t in (specials or OPT_SPECIALS) if t in vocab])
    else:
        raise ModelFormatError(f"{folder}: no tokenizer (tokenizer.json, or vocab.json and "
                               "merges.txt)")
    n = hf.get_vocab_size(with_added_tokens=True)

    def ids(key: str) -> list[int]:
        v = config.get(key)
        out = v if isinstance(v, list) else [] if v is None else [v]
        for i in out:
            if not (isinstance(i, int) and 0 <= i < n):
                raise ModelFormatError(f"{join(CONFIG)}: {key} {i!r} outside the tokenizer's "
                                       f"{n} tokens")
        return out

    bos, eos = ids("bos_token_id"), ids("eos_token_id")
    return Tokenizer(hf, bos[0] if bos else None, eos[0] if eos else None,
                     bool(tok_config.get("add_bos_token", True)), frozenset(eos))
