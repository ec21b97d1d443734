"""The tokenizer a GGUF file describes, rebuilt as a `tokenizers.Tokenizer` from its metadata.

Supported: `tokenizer.ggml.model` "gpt2" (byte-level BPE). The pre-tokenizer follows
`tokenizer.ggml.pre` the way llama.cpp's `llama-vocab.cpp` does; control tokens (token_type 3)
become special tokens, so `<|im_start|>` in text encodes to its one id.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from vkrt.errors import ModelFormatError

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's llama_token_type values


def _pre_tokenizer(pre: str | None):
    """The pre-tokenizer for a `tokenizer.ggml.pre` value, or None when unsupported."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "gpt-2":
        return byte_level
    if pre == "smollm":
        # llama.cpp: "\p{N}" then the GPT-2 regex; HF SmolLM2's tokenizer.json: the same.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return None


class Tokenizer:
    """Text <-> token ids for one model.

    bos_id, eos_id: ids or None. add_bos: whether `encode` prepends BOS by default
    (`tokenizer.ggml.add_bos_token`, False when absent).
    """

    def __init__(self, hf: HFTokenizer, bos_id: int | None, eos_id: int | None, add_bos: bool):
        self.hf, self.bos_id, self.eos_id, self.add_bos = hf, bos_id, eos_id, add_bos

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], path: str = "<gguf>") -> "Tokenizer":
        """Build from `GGUFFile.metadata`. ModelFormatError if the tokenizer is unsupported or
        its metadata is missing or inconsistent; `path` only names the file in messages."""
        kind = metadata.get("tokenizer.ggml.model")
        pre = metadata.get("tokenizer.ggml.pre")
        if kind != "gpt2":
            raise ModelFormatError(f"{path}: unsupported tokenizer.ggml.model {kind!r} "
                                   "(supported: 'gpt2')")
        pre_tok = _pre_tokenizer(pre)
        if pre_tok is None:
            raise ModelFormatError(f"{path}: unsupported tokenizer.ggml.pre {pre!r} "
                                   "(supported: 'smollm', 'gpt-2')")
        tokens = metadata.get("tokenizer.ggml.tokens")
        merges = metadata.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise ModelFormatError(f"{path}: tokenizer.ggml.tokens or tokenizer.ggml.merges "
                                   "missing")
        token_type = metadata.get("tokenizer.ggml.token_type")
        if token_type is not None and len(token_type) != len(tokens):
            raise ModelFormatError(f"{path}: {len(token_type)} token types for "
                                   f"{len(tokens)} tokens")
        vocab = {tok: i for i, tok in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise ModelFormatError(f"{path}: tokenizer.ggml.tokens has duplicate tokens")
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        if any(len(p) != 2 for p in pairs):
            raise ModelFormatError(f"{path}: a merge in tokenizer.ggml.merges has no space")
        try:
            hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        except Exception as e:  # e.g. a merge naming a token that is not in the vocabulary
            raise ModelFormatError(f"{path}: cannot build the BPE tokenizer: {e}") from None
        hf.pre_tokenizer = pre_tok
        hf.decoder = decoders.ByteLevel()
        if token_type is not None:
            types = [int(t) for t in token_type]
            hf.add_special_tokens([AddedToken(tok, special=True, normalized=False)
                                   for tok, t in zip(tokens, types) if t == _CONTROL])
            hf.add_tokens([AddedToken(tok, special=False, normalized=False)
                           for tok, t in zip(tokens, types) if t == _USER_DEFINED])
        if hf.get_vocab_size(with_added_tokens=True) != len(tokens):
            raise ModelFormatError(f"{path}: tokenizer has {hf.get_vocab_size()} tokens after "
                                   f"adding special tokens, expected {len(tokens)}")

        def token_id(key: str) -> int | None:
            i = metadata.get(key)
            if i is not None and not 0 <= int(i) < len(tokens):
                raise ModelFormatError(f"{path}: {key} {i} outside the {len(tokens)}-token vocab")
            return None if i is None else int(i)

        return cls(hf, token_id("tokenizer.ggml.bos_token_id"),
                   token_id("tokenizer.ggml.eos_token_id"),
                   bool(metadata.get("tokenizer.ggml.add_bos_token", False)))

    @property
    def n_vocab(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; special-token text such as `<|im_start|>` maps to its one id.
        BOS is prepended when `add_bos` (default: `self.add_bos`) and the model has one."""
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """The text of `ids`. Special tokens are spelled out unless `skip_special`."""
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    def stream(self, skip_special: bool = False) -> "DecodeStream":
        """A detokenizer fed one id at a time: see DecodeStream."""
        return DecodeStream(self, skip_special)


class DecodeStream:
    """Incremental detokenizer: `step(id) -> str` returns the new text that id completes,
    "" while it holds the start of a multi-byte UTF-8 character split across tokens.
    The concatenated pieces equal `decode(all ids)`."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        from tokenizers.decoders import DecodeStream as _HFDecodeStream

        self._hf = tokenizer.hf
        self._stream = _HFDecodeStream(skip_special_tokens=skip_special)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._hf, int(token_id)) or ""


def load_tokenizer(gguf_file) -> Tokenizer:
    """The tokenizer of a `GGUFFile` (see `vkrt.models.gguf.load_gguf`)."""
    return Tokenizer.from_metadata(gguf_file.metadata, gguf_file.path)
