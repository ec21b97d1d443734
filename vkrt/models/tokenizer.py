"""The tokenizer a GGUF file describes, rebuilt as a `tokenizers.Tokenizer` from its metadata.

Supported `tokenizer.ggml.model` values (any other is refused, naming the key and value):

- "gpt2" (byte-level BPE). The pre-tokenizer follows `tokenizer.ggml.pre` the way llama.cpp's
  `llama-vocab.cpp` does (`PRE_TOKENIZERS`: gpt-2, smollm, qwen2, llama-bpe; any other is
  refused).
- "llama" (a SentencePiece BPE vocabulary: Llama 2, Mistral v0.1, Phi-3, Gemma 3), as
  llama.cpp's `llm_tokenizer_spm` tokenizes it: spaces as U+2581, a space prefixed to the text
  and after every special token when `tokenizer.ggml.add_space_prefix` (default: the family's
  `SentencePiece.add_space_prefix`), the adjacent pair whose joined piece scores highest
  merged first (a `tokenizers` BPE whose merges are ranked by `tokenizer.ggml.scores`, as
  transformers' `generate_merges` derives them; the file's `tokenizer.ggml.merges` when it
  has them), characters outside the vocabulary as their UTF-8 bytes' `<0xXX>` tokens
  (byte fallback), BOS added once by default (`tokenizer.ggml.add_bos_token`). Per-family
  details are data: `SPM_FAMILIES`.

Control tokens (token_type 3, and the unknown token, type 2) become special tokens, so
`<|im_start|>` in text encodes to its one id unless `encode(..., special=False)` (how
`vkrt.models.chat` encodes message contents); user-defined tokens (type 4) are always matched
whole, as llama.cpp's `tokenizer_st_partition` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from vkrt.errors import ModelFormatError, VkrtError

_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4  # llama.cpp's llama_token_type values
SPACE = "\u2581"  # SentencePiece's whitespace symbol (llama-vocab.cpp llama_escape_whitespace)
# The end-of-generation ids a GGUF can declare (llama.cpp's llama_vocab::is_eog covers these).
EOG_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id")


# Pre-tokenizer regexes, as each model's tokenizer.json writes them (llama.cpp's
# llama-vocab.cpp `llm_tokenizer_bpe` quotes these as the "original regex from
# tokenizer.json" and runs an adapted form; transformers' models/qwen2/tokenization_qwen2.py
# PRETOKENIZE_REGEX is the Qwen2 one).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    """How one `tokenizer.ggml.pre` value splits text and what it implies (llama-vocab.cpp,
    `llama_vocab::impl::load`): `split` a regex whose matches are the pre-tokens (None: the
    GPT-2 regex of `pre_tokenizers.ByteLevel`), `digits` split every digit first (SmolLM2),
    `ignore_merges` a pre-token that is a whole vocabulary entry is that token (Llama 3's
    tokenizer.json `"ignore_merges": true`), `add_bos` the default of
    `tokenizer.ggml.add_bos_token`, `eog_texts` the control tokens that end generation beside
    the declared ids (llama.cpp finds these by text: `special_eog_ids`)."""
    split: str | None = None
    digits: bool = False
    ignore_merges: bool = False
    add_bos: bool = False
    eog_texts: tuple[str, ...] = ()

    def build(self):
        if self.split is not None:
            return pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(self.split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if self.digits:
            return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                            byte_level])
        return byte_level


_QWEN2 = PreTokenizer(split=QWEN2_SPLIT, eog_texts=("<|im_end|>", "<|endoftext|>"))
_LLAMA3 = PreTokenizer(split=LLAMA3_SPLIT, ignore_merges=True, add_bos=True,
                       eog_texts=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"))
# tokenizer.ggml.pre -> its PreTokenizer; any other value (or none) is refused: llama.cpp
# would fall back to its default (GPT-2) rules with a warning and tokenize differently from
# the model's own tokenizer.
PRE_TOKENIZERS = {
    "gpt-2": PreTokenizer(),
    # llama.cpp: "\p{N}" then the GPT-2 regex; HF SmolLM2's tokenizer.json: the same.
    "smollm": PreTokenizer(digits=True),
    "qwen2": _QWEN2,
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3,
}


@dataclass(frozen=True)
class SentencePiece:
    """What a `tokenizer.ggml.model` "llama" (SentencePiece) vocabulary means in one
    `general.architecture`: `add_space_prefix` the default of `tokenizer.ggml.add_space_prefix`
    (llama.cpp's llama-vocab.cpp: true for every SPM vocabulary; Gemma's converter writes
    false, and transformers' GemmaTokenizer never prefixes), `add_bos` the default of
    `tokenizer.ggml.add_bos_token` (llama.cpp and transformers' gguf_tokenizer_mapping: true),
    `eog_texts` the control tokens that end generation beside the declared ids (llama.cpp's
    `special_eog_ids`, found by text)."""
    add_space_prefix: bool = True
    add_bos: bool = True
    eog_texts: tuple[str, ...] = ()


# general.architecture -> how its SentencePiece vocabulary is read; an SPM vocabulary in any
# other architecture is refused.
SPM_FAMILIES = {
    # Llama 2, Mistral v0.1 (LlamaForCausalLM files): <s> and </s> as BOS/EOS ids 1 and 2.
    "llama": SentencePiece(),
    # Gemma 3: <bos> once, turns end with <end_of_turn> (and <eos>, its EOS id).
    "gemma3": SentencePiece(add_space_prefix=False, eog_texts=("<end_of_turn>", "<eos>")),
    # Phi-3 (its vocabulary is Llama 2's plus chat tokens; vkrt reads the tokenizer only).
    "phi3": SentencePiece(eog_texts=("<|end|>", "<|endoftext|>")),
}
# llama.cpp's defaults for an SPM vocabulary whose file names no special ids (llama-vocab.cpp).
SPM_DEFAULT_IDS = {"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                   "tokenizer.ggml.unknown_token_id": 0}


def declared_eog_ids(token_id) -> frozenset[int]:
    """The end-of-generation ids a file declares under `EOG_KEYS`; token_id(key) -> the
    checked id or None."""
    return frozenset(i for i in map(token_id, EOG_KEYS) if i is not None)


def merges_from_scores(tokens: list[str], scores) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's score-ordered merging: every split of a token
    into two vocabulary entries, ranked by the joined token's score (highest first; ties: the
    longer left part, then the longer right part, then vocabulary order). The same merges as
    transformers' tokenization_utils_base.generate_merges(vocab, scores); llama.cpp's
    llm_tokenizer_spm merges the adjacent pair whose joined piece has the highest score,
    which a BPE with these ranks reproduces (transformers is a test dependency only, so the
    few lines are here). tokens: n pieces; scores: n floats."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for token, score in zip(tokens, scores):
        local = [(token[:k], token[k:], float(score)) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def check_text(text: str, what: str = "the text") -> None:
    """Raise VkrtError unless `text` encodes as UTF-8: one line naming the offending
    character position and what it is (bytes that were not UTF-8, kept as surrogate escapes by
    Python's argv/stdin decoding, or a lone UTF-16 surrogate such as JSON's "\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        part = text[e.start:e.end]
        try:
            what_is = f"bytes {part.encode('utf-8', 'surrogateescape')!r}"
        except UnicodeEncodeError:
            what_is = "a lone surrogate " + ", ".join(f"U+{ord(c):04X}" for c in part)
        raise VkrtError(f"{what} is not valid UTF-8 ({what_is} at character {e.start})") \
            from None


class Tokenizer:
    """Text <-> token ids for one model.

    bos_id, eos_id: ids or None. add_bos: whether `encode` prepends BOS by default
    (`tokenizer.ggml.add_bos_token`; when absent the pre-tokenizer's default, True for
    llama-bpe, else False). eog_ids: every end-of-generation id the model declares (EOS,
    `eot_token_id`, `eom_token_id`) and the control tokens its pre-tokenizer's family ends
    turns with (`PreTokenizer.eog_texts`, `SentencePiece.eog_texts`): generation stops at
    any of them. space_prefix: the encoder prefixes a space to the text and after each special
    token (SentencePiece's dummy prefix); `decode` removes it again.
    """

    def __init__(self, hf: HFTokenizer, bos_id: int | None, eos_id: int | None, add_bos: bool,
                 eog_ids: frozenset[int] | None = None, space_prefix: bool = False):
        self.hf, self.bos_id, self.eos_id, self.add_bos = hf, bos_id, eos_id, add_bos
        self.eog_ids = frozenset(eog_ids if eog_ids is not None else
                                 ([] if eos_id is None else [eos_id]))
        self.space_prefix = space_prefix
        self._added = frozenset(hf.get_added_tokens_decoder()) if space_prefix else frozenset()

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], path: str = "<gguf>") -> "Tokenizer":
        """Build from `GGUFFile.metadata`. ModelFormatError (one line naming the file and the
        key) if the tokenizer is unsupported or its metadata is missing or inconsistent;
        `path` only names the file in messages."""
        kind = metadata.get("tokenizer.ggml.model")
        pre = metadata.get("tokenizer.ggml.pre")
        if kind == "llama":
            return cls._from_sentencepiece(metadata, path)
        if kind != "gpt2":
            raise ModelFormatError(f"{path}: unsupported tokenizer.ggml.model {kind!r} "
                                   "(supported: 'gpt2', 'llama')")
        supported = ", ".join(map(repr, PRE_TOKENIZERS))
        if pre is None:
            raise ModelFormatError(f"{path}: missing metadata key 'tokenizer.ggml.pre' (the "
                                   f"pre-tokenizer; supported: {supported})")
        if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
            raise ModelFormatError(f"{path}: unsupported tokenizer.ggml.pre {pre!r} "
                                   f"(supported: {supported})")
        rules = PRE_TOKENIZERS[pre]
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
            hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                                        ignore_merges=rules.ignore_merges))
        except Exception as e:  # e.g. a merge naming a token that is not in the vocabulary
            raise ModelFormatError(f"{path}: cannot build the BPE tokenizer: {e}") from None
        hf.pre_tokenizer = rules.build()
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

        eog = declared_eog_ids(token_id)
        if token_type is not None:
            eog |= {vocab[t] for t in rules.eog_texts
                    if t in vocab and types[vocab[t]] == _CONTROL}
        return cls(hf, token_id("tokenizer.ggml.bos_token_id"),
                   token_id("tokenizer.ggml.eos_token_id"),
                   bool(metadata.get("tokenizer.ggml.add_bos_token", rules.add_bos)), eog)

    @classmethod
    def _from_sentencepiece(cls, metadata: dict[str, Any], path: str) -> "Tokenizer":
        """A `tokenizer.ggml.model` "llama" vocabulary (see the module docstring): tokens [n]
        str, scores [n] float and token types [n] int (llama_token_type) required, merges
        optional. ModelFormatError naming the file and key for a missing or inconsistent
        one, an architecture `SPM_FAMILIES` does not describe, a pre-tokenizer other than
        "default", add_eos_token, or normalization vkrt does not do
        (remove_extra_whitespaces, a precompiled_charsmap)."""
        arch = metadata.get("general.architecture")
        if arch not in SPM_FAMILIES:
            raise ModelFormatError(
                f"{path}: tokenizer.ggml.model 'llama' (SentencePiece) in general.architecture "
                f"{arch!r} is not supported (supported: {', '.join(map(repr, SPM_FAMILIES))})")
        rules = SPM_FAMILIES[arch]
        pre = metadata.get("tokenizer.ggml.pre")
        if pre not in (None, "default"):
            raise ModelFormatError(f"{path}: unsupported tokenizer.ggml.pre {pre!r} for a "
                                   "SentencePiece vocabulary (supported: 'default' or none)")
        if metadata.get("tokenizer.ggml.add_eos_token"):
            # llama.cpp would append EOS to every prompt; transformers' generate would not.
            raise ModelFormatError(f"{path}: tokenizer.ggml.add_eos_token = True is not "
                                   "implemented (an EOS after every prompt)")
        if metadata.get("tokenizer.ggml.remove_extra_whitespaces"):
            raise ModelFormatError(f"{path}: tokenizer.ggml.remove_extra_whitespaces = True is "
                                   "not implemented")
        charsmap = metadata.get("tokenizer.ggml.precompiled_charsmap")
        if charsmap is not None and len(charsmap):
            raise ModelFormatError(f"{path}: tokenizer.ggml.precompiled_charsmap "
                                   f"({len(charsmap)} bytes) is not implemented")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelFormatError(f"{path}: missing metadata key 'tokenizer.ggml.tokens'")
        n = len(tokens)
        arrays = {}
        for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            value = metadata.get(key)
            if value is None:
                raise ModelFormatError(f"{path}: missing metadata key {key!r} (a SentencePiece "
                                       f"vocabulary needs one per token, {n})")
            if len(value) != n:
                raise ModelFormatError(f"{path}: {key} has {len(value)} entries for {n} tokens")
            arrays[key] = value
        scores = [float(x) for x in arrays["tokenizer.ggml.scores"]]
        if not all(abs(x) < float("inf") for x in scores):
            raise ModelFormatError(f"{path}: tokenizer.ggml.scores holds a value that is not "
                                   "finite")
        types = [int(t) for t in arrays["tokenizer.ggml.token_type"]]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        if len(vocab) != n:
            raise ModelFormatError(f"{path}: tokenizer.ggml.tokens has duplicate tokens")

        def token_id(key: str) -> int | None:
            i = metadata.get(key, SPM_DEFAULT_IDS.get(key))
            if i is not None and not 0 <= int(i) < n:
                raise ModelFormatError(f"{path}: {key} {i} outside the {n}-token vocab")
            return None if i is None else int(i)

        unk = token_id("tokenizer.ggml.unknown_token_id")
        merges = metadata.get("tokenizer.ggml.merges")
        if merges is not None:
            pairs = [tuple(m.split(" ", 1)) for m in merges]
            if any(len(p) != 2 for p in pairs):
                raise ModelFormatError(f"{path}: a merge in tokenizer.ggml.merges has no space")
        else:
            pairs = merges_from_scores(list(tokens), scores)
        try:
            hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, byte_fallback=True,
                                        fuse_unk=True,
                                        unk_token=None if unk is None else tokens[unk]))
        except Exception as e:  # e.g. a merge naming a token that is not in the vocabulary
            raise ModelFormatError(f"{path}: cannot build the SentencePiece tokenizer: "
                                   f"{e}") from None
        prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", rules.add_space_prefix))
        # llama.cpp: ' ' + text (per text fragment after a special token), then every ' ' as
        # U+2581; a normalizer runs per fragment between added tokens, as llama.cpp's does
        # (transformers' phi3_tokenizer builds the same; Metaspace would not double a space).
        steps = [normalizers.Prepend(SPACE)] if prefix else []
        hf.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE)])
        hf.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                        decoders.Fuse()])
        hf.add_special_tokens([AddedToken(tok, special=True, normalized=False)
                               for tok, t in zip(tokens, types) if t in (_CONTROL, _UNKNOWN)])
        hf.add_tokens([AddedToken(tok, special=False, normalized=False)
                       for tok, t in zip(tokens, types) if t == _USER_DEFINED])
        eog = declared_eog_ids(token_id)
        eog |= {vocab[t] for t in rules.eog_texts
                if t in vocab and types[vocab[t]] in (_CONTROL, _USER_DEFINED)}
        return cls(hf, token_id("tokenizer.ggml.bos_token_id"),
                   token_id("tokenizer.ggml.eos_token_id"),
                   bool(metadata.get("tokenizer.ggml.add_bos_token", rules.add_bos)), eog,
                   space_prefix=prefix)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Text -> id of every special (control) token, the tokens `encode` maps from text."""
        return {t.content: i for i, t in self.hf.get_added_tokens_decoder().items() if t.special}

    @property
    def n_vocab(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """Token ids of `text`.

        special: special-token text such as `<|im_start|>` maps to its one id; when False it
        is tokenized as the plain characters it is made of (for text a user wrote).
        BOS is prepended when `add_bos` (default: `self.add_bos`) and the model has one,
        unless the ids already start with it (text rendered by a chat template that writes
        `bos_token` itself must not get a second one).
        Raises VkrtError when `text` is not valid Unicode (lone surrogates, e.g. from a
        command-line argument that was not UTF-8).
        """
        check_text(text)
        old = self.hf.encode_special_tokens
        self.hf.encode_special_tokens = not special
        try:
            ids = self.hf.encode(text, add_special_tokens=False).ids
        finally:
            self.hf.encode_special_tokens = old
        if ((self.add_bos if add_bos is None else add_bos) and self.bos_id is not None
                and ids[:1] != [self.bos_id]):
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = False,
               continuation: bool = False) -> str:
        """The text of `ids`. Special tokens are spelled out unless `skip_special`.

        With a SentencePiece space prefix (`space_prefix`), the one space the encoder put
        before the text and after each special or added token is removed again, so
        `decode(encode(s)) == s`, unless `continuation`: ids that continue earlier text
        (generated tokens) keep every space, as llama.cpp's `token_to_piece` gives them.
        Byte tokens (`<0xXX>`) are joined into UTF-8; an incomplete or invalid sequence
        decodes to U+FFFD."""
        ids = [int(i) for i in ids]
        if not self.space_prefix or continuation:
            return self.hf.decode(ids, skip_special_tokens=skip_special)
        out, run = [], []   # text runs between added tokens, each had one space prefixed

        def flush():
            if run:
                text = self.hf.decode(run)
                out.append(text[1:] if text.startswith(" ") else text)
                run.clear()

        for i in ids:
            if i in self._added:
                flush()
                out.append(self.hf.decode([i], skip_special_tokens=skip_special))
            else:
                run.append(i)
        flush()
        return "".join(out)

    def stream(self, skip_special: bool = False) -> "DecodeStream":
        """A detokenizer fed one id at a time: see DecodeStream."""
        return DecodeStream(self, skip_special)


class DecodeStream:
    """Incremental detokenizer: `step(id) -> str` returns the new text that id completes,
    "" while it holds the start of a multi-byte UTF-8 character split across tokens;
    `finish() -> str` returns what is still held (an incomplete character decodes to U+FFFD,
    as `decode` does). The pieces of every `step` plus `finish` equal
    `decode(all ids, continuation=True)`: generated text continues the prompt, so a
    SentencePiece token's leading space is kept."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        from tokenizers.decoders import DecodeStream as _HFDecodeStream

        self._tok, self._skip = tokenizer, skip_special
        self._stream = _HFDecodeStream(skip_special_tokens=skip_special)
        self._ids: list[int] = []
        self._emitted = 0  # characters returned so far

    def step(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        piece = self._stream.step(self._tok.hf, int(token_id)) or ""
        self._emitted += len(piece)
        return piece

    def finish(self) -> str:
        """The text held back at the end: `decode(all ids)` minus what `step` returned."""
        rest = self._tok.decode(self._ids, skip_special=self._skip,
                                continuation=True)[self._emitted:]
        self._emitted += len(rest)
        return rest


def load_tokenizer(gguf_file) -> Tokenizer:
    """The tokenizer of a `GGUFFile` (see `vkrt.models.gguf.load_gguf`)."""
    return Tokenizer.from_metadata(gguf_file.metadata, gguf_file.path)
