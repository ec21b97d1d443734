"""Small GGUF files of the Llama-like families as llama.cpp's convert_hf_to_gguf.py writes them
(conversion/base.py `TextModel.set_gguf_parameters`, conversion/qwen.py `Qwen2Model`,
`Qwen3Model`; gguf-py's tensor names), from random transformers models, for tests that let
transformers read the same file back as the fp32 oracle (`from_pretrained(dir,
gguf_file=...)`).

qwen2 and qwen3 files store Q and K as transformers has them (no `LlamaModel.permute`), so
RoPE rotates halves of each head on them. The tokenizer written is a byte-level BPE over the
256 GPT-2 byte symbols, a few merges and the special tokens, `N_VOCAB` tokens in all
(transformers needs a token list to size the vocabulary); gemma3 files get a SentencePiece
vocabulary as Gemma's are (`spm_vocab`: specials, the 256 `<0xXX>` byte tokens, pieces with
scores, `tokenizer.ggml.model` "llama").
"""
from __future__ import annotations

import math

import gguf
import numpy as np

N_VOCAB, HIDDEN, N_FF, N_LAYER, N_HEAD, N_HEAD_KV = 300, 64, 128, 2, 4, 2

# HF module name -> GGUF tensor name, per layer (gguf-py tensor_mapping.py).
LAYER_TENSORS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                 "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
# Gemma 3 names its norms after where they sit (conversion/gemma.py, gguf-py tensor_mapping:
# post_attention_layernorm is ATTN_POST_NORM there, FFN_NORM in Llama-like files).
GEMMA3_TENSORS = {**LAYER_TENSORS, "post_attention_layernorm": "post_attention_norm",
                  "pre_feedforward_layernorm": "ffn_norm",
                  "post_feedforward_layernorm": "post_ffw_norm"}
SPECIALS = {"qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            "qwen3": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}
# Gemma 3's first tokens as its tokenizer.model has them (token_type 3 control, 2 unknown),
# then <start_of_turn> / <end_of_turn> (ids 105 and 106 in the real vocabulary).
GEMMA_SPECIALS = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<mask>", 4),
                  ("<start_of_turn>", 3), ("<end_of_turn>", 3)]
# SentencePiece pieces, best first (score -rank): single characters, then merged pieces
# (each splits into two earlier pieces, so a BPE finds its merge).
SPM_CHARS = ["\u2581", *"etaoinshrdlucmwfgypbvkxjqz", "\n", *"0123456789", *",.!?'+=:()",
             *"HTWIGD", "東", "京"]
SPM_MERGES = ["\u2581t", "he", "\u2581the", "in", "er", "\u2581a", "on", "\u2581w", "or", "ld",
              "\u2581wor", "\u2581world", "ll", "\u2581h", "\u2581he", "\u2581hell", "\u2581hello",
              "He", "Hell", "Hello", "33", "333", "3333", "77", "777", "\u2581\u2581",
              "\u2581\u2581\u2581\u2581", "\u25813", "\n\n", "\u2581s", "en", "\u2581i", "is",
              "\u2581is", "it", "\u2581it", "an", "\u2581an", "and", "\u2581and", "東京",
              "\u2581東京", "us", "user", "\u2581m", "mo", "model", "od", "el", "ode"]
# A vocabulary with a piece whose score disagrees with its id: "bc" (id after "ab") scores
# higher, so "abc" is "a" + "bc" by score but "ab" + "c" in id order.
SCORE_ORDER_PIECES = [("a", -1.0), ("b", -2.0), ("c", -3.0), ("ab", -20.0), ("bc", -10.0)]
# Gemma 3's chat template as google/gemma-3-*-it's tokenizer_config.json has it (text turns).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n")
# Gemma 3 test shape: 6 layers so that the default pattern (5 sliding, 1 global) has both
# kinds, a window of 8 positions that the test prompts cross.
GEMMA3_LAYERS, GEMMA3_WINDOW = 6, 8


def apply_keys(meta: dict, keys: dict | None) -> None:
    """Override `meta` with `keys` (full key name -> value; None removes the key)."""
    for k, v in (keys or {}).items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v


def write_file(path, arch: str, meta: dict, tensors: dict | None = None, qtype: str = "F32",
               raw: dict | None = None):
    """Write a GGUF of `arch` with metadata `meta` (key -> bool, str, float (f32), list (an
    array; `tokenizer.ggml.token_type` as ints) or int (u32)) and `tensors` (name -> f32
    array): 2-D ones quantized by gguf-py to `qtype` unless F32, and those named in `raw`
    (name -> (uint8 blocks [rows, bytes per row], GGUF type name)) stored as given. The
    writer shared by this module and tests/test_llama_variants.py. Returns `path`."""
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in meta.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, list) and k == "tokenizer.ggml.token_type":
            w.add_array(k, [int(t) for t in v])
        elif isinstance(v, list):
            w.add_array(k, v)
        else:
            w.add_uint32(k, v)
    for name, a in (tensors or {}).items():
        if name in (raw or {}):
            blocks, gtype = raw[name]
            w.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType[gtype])
        elif qtype != "F32" and a.ndim == 2:
            t = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(a, t), raw_dtype=t)
        else:
            w.add_tensor(name, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 encoder.py)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_bpe_vocab(specials: list[str], n_vocab: int = N_VOCAB, extra: list[str] = ()):
    """(tokens, merges, token types): the 256 byte symbols, `extra` merges, then merges of
    frequent pairs of English text up to n_vocab - len(specials) tokens, then the specials
    (control, type 3)."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = []
    # Fixed merges (each pair of existing tokens): enough to exercise BPE, deterministic.
    pairs = ["Ġ t", "h e", "i n", "Ġt he", "e r", "a n", "Ġ a", "o n", "r e", "Ġ s", "e n",
             "a t", "o r", "Ġ w", "e s", "Ġ c", "i s", "i t", "Ġ b", "a l", "Ġ o", "Ġ f",
             "e d", "a r", "Ġ m", "i c", "Ġ p", "l e", "Ġ d", "o u", "1 2", "3 3", "Ġ 1",
             "Ġ h", "Ġ in", "i ng", "n g", "Ġ l", "Ġ n", "Ġ e", "Ġ y", "o m", "Ġ th", "Ġ g",
             "Ġ Ġ", "ĠĠ ĠĠ", "Ċ Ċ", "l o", "Ġw or", "o r", "l d", "Ġwor ld", "H e", "He l",
             "Hel lo", "' s", "' t", "Ġ '", "e m", "o j", "oj i", "Ġ em", "Ġem oji", "Ġ 東",
             "æ Ŀ", "Ġ +", "+ 7", "Ġ 3", "x y", "Ġ x", "Ġx y", "d e", "Ġ de", "Ġde f", "Ġd o",
             "n e", "Ġdo ne", "u s", "Ġ us", "Ġus er", "Ġ H", "Ġ i", "Ġi t"]
    for m in [*extra, *pairs]:
        a, b = m.split(" ")
        if a + b in tokens or a not in tokens or b not in tokens:
            continue
        if len(tokens) >= n_vocab - len(specials):
            break
        merges.append(m)
        tokens.append(a + b)
    # Unmerged filler tokens (never produced) pad the vocabulary to its size.
    tokens += [f"<unused{i}>" for i in range(n_vocab - len(specials) - len(tokens))]
    types = [1] * len(tokens) + [3] * len(specials)
    return tokens + specials, merges, types


def spm_vocab(specials: list[tuple[str, int]] = GEMMA_SPECIALS, n_vocab: int = N_VOCAB,
              pieces: list[tuple[str, float]] | None = None):
    """(tokens, scores, token types) of a SentencePiece vocabulary as llama.cpp's converter
    writes one (conversion/base.py `_create_vocab_sentencepiece`): `specials` (text, type)
    with score 0, the 256 byte tokens `<0x00>`..`<0xFF>` (type 6, score 0), then `pieces`
    (text, score; default SPM_CHARS and SPM_MERGES with score -rank, as many as fit) as
    normal tokens (type 1), padded with unused `<unusedN>` tokens (type 5, score -1e9) to
    `n_vocab`."""
    if pieces is None:
        pieces = [(t, -float(i)) for i, t in enumerate(SPM_CHARS + SPM_MERGES)]
    tokens = [t for t, _ in specials] + [f"<0x{b:02X}>" for b in range(256)]
    types = [k for _, k in specials] + [6] * 256
    scores = [0.0] * len(tokens)
    for text, score in pieces[:n_vocab - len(tokens)]:
        tokens.append(text)
        types.append(1)
        scores.append(score)
    pad = n_vocab - len(tokens)
    tokens += [f"<unused{i}>" for i in range(pad)]
    return tokens, scores + [-1e9] * pad, types + [5] * pad


def spm_metadata(tokens, scores, types, **keys) -> dict:
    """The `tokenizer.ggml.*` keys of a SentencePiece vocabulary (Gemma-style ids when the
    vocabulary has <bos>/<eos>, else Llama 2's <s>=1, </s>=2), `keys` replaced on top (with
    dots as "__": add_space_prefix=False)."""
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types}
    for name, key in (("<bos>", "bos"), ("<eos>", "eos"), ("<unk>", "unknown"), ("<pad>", "padding"),
                      ("<s>", "bos"), ("</s>", "eos")):
        if name in tokens:
            meta[f"tokenizer.ggml.{key}_token_id"] = tokens.index(name)
    meta.update({f"tokenizer.ggml.{k}": v for k, v in keys.items()})
    return meta


def hf_model(arch: str, seed: int = 0, tied: bool = False, **overrides):
    """A random fp32 Qwen2ForCausalLM, Qwen3ForCausalLM or Gemma3ForCausalLM of the test
    size; norms near 1 (Gemma's as 1 + w), biases random (zero at init)."""
    import torch
    import transformers

    cls = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
           "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
           "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}[arch]
    shape = dict(vocab_size=N_VOCAB, hidden_size=HIDDEN, intermediate_size=N_FF,
                 num_hidden_layers=N_LAYER, num_attention_heads=N_HEAD,
                 num_key_value_heads=N_HEAD_KV, max_position_embeddings=512, rms_norm_eps=1e-6,
                 tie_word_embeddings=tied)
    if arch == "gemma3":
        shape.update(num_hidden_layers=GEMMA3_LAYERS, head_dim=HIDDEN // N_HEAD,
                     query_pre_attn_scalar=HIDDEN // N_HEAD, sliding_window=GEMMA3_WINDOW,
                     rope_parameters={
                         "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    else:
        shape["rope_theta"] = 1e6
    config = getattr(transformers, cls[0])(**{**shape, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, cls[1])(config).float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_((0 if arch == "gemma3" else 1) + 0.1 * r)
            elif name.endswith(".bias"):
                p.copy_(0.5 * r)
            elif "embed_tokens" in name:
                p.copy_(r)
            else:
                p.copy_(r / math.sqrt(p.shape[1]))
    return model


def write_gguf(path, model, arch: str, qtype: str = "F32", keys: dict | None = None,
               tensors: dict | None = None, drop: tuple[str, ...] = ()):
    """The GGUF convert_hf_to_gguf.py writes for `model` (`arch` "qwen2", "qwen3" or
    "gemma3"), its matrices as `qtype` (F32, F16 or Q8_0; 1-D tensors f32); `keys` adds or
    replaces metadata (None removes), `tensors` adds tensors, `drop` leaves tensors out.
    Returns the path."""
    c = model.config
    p = arch + "."
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    meta: dict = {p + "block_count": c.num_hidden_layers,
                  p + "context_length": c.max_position_embeddings,
                  p + "embedding_length": c.hidden_size,
                  p + "feed_forward_length": c.intermediate_size,
                  p + "attention.head_count": c.num_attention_heads,
                  p + "attention.head_count_kv": c.num_key_value_heads,
                  p + "rope.freq_base": float(rope["rope_theta"])}
    if arch == "gemma3":  # base.py writes the sliding layers' base; gemma.py the window
        meta[p + "rope.freq_base_swa"] = float(c.rope_parameters["sliding_attention"]
                                               ["rope_theta"])
    meta[p + "attention.layer_norm_rms_epsilon"] = float(c.rms_norm_eps)
    if arch in ("qwen3", "gemma3"):   # head_dim is in config.json: the converter writes it
        meta[p + "attention.key_length"] = c.head_dim
        meta[p + "attention.value_length"] = c.head_dim
    if arch == "gemma3":
        meta[p + "attention.sliding_window"] = c.sliding_window
    meta["general.file_type"] = int({"F32": gguf.LlamaFileType.ALL_F32,
                                     "F16": gguf.LlamaFileType.MOSTLY_F16}.get(
                                         qtype, gguf.LlamaFileType.MOSTLY_Q8_0))
    if arch == "gemma3":   # conversion/gemma.py: Gemma's SentencePiece vocabulary, no prefix
        meta.update(spm_metadata(*spm_vocab(GEMMA_SPECIALS, c.vocab_size), add_bos_token=True,
                                 add_space_prefix=False,
                                 chat_template=GEMMA3_TEMPLATE))
        meta["tokenizer.chat_template"] = meta.pop("tokenizer.ggml.chat_template")
    else:
        tokens, merges, types = byte_bpe_vocab(SPECIALS[arch], c.vocab_size)
        meta.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
                     "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                     "tokenizer.ggml.merges": merges})
        meta.update({"tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
                     "tokenizer.ggml.padding_token_id": tokens.index("<|endoftext|>"),
                     "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
                     "tokenizer.ggml.add_bos_token": False})
    apply_keys(meta, keys)

    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    if arch == "gemma3":   # conversion/gemma.py Gemma3Model.norm_shift: every norm as 1 + w
        sd = {k: v + np.float32(1) if k.endswith("norm.weight") else v for k, v in sd.items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(c.num_hidden_layers):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        for src, dst in (GEMMA3_TENSORS if arch == "gemma3" else LAYER_TENSORS).items():
            for kind in ("weight", "bias"):
                if f"{hf}{src}.{kind}" in sd:
                    out[f"{gg}{dst}.{kind}"] = sd[f"{hf}{src}.{kind}"]
    out["output_norm.weight"] = sd["model.norm.weight"]
    if not c.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    out.update(tensors or {})
    for name in drop:
        del out[name]
    return write_file(path, arch, meta, out, qtype)


# tokenizer.ggml.pre -> the special tokens its files carry (a few of each vocabulary's).
VOCAB_SPECIALS = {
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "llama-bpe": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"],
    "gpt-2": ["<|endoftext|>"],
}
# Digit merges: "3333+777" splits differently under each pre-tokenizer (qwen2: every digit;
# llama-bpe: runs of up to 3; gpt-2: whole runs), so a swapped one changes the ids.
DIGIT_MERGES = ["3 3", "33 3", "33 33", "7 7", "77 7", "1 2"]


def write_vocab_gguf(path, pre: str, arch: str = "qwen2", keys: dict | None = None):
    """A GGUF holding only a byte-level BPE tokenizer (`tokenizer.ggml.pre` = `pre`, its
    `VOCAB_SPECIALS` as control tokens at the end, the first of them BOS, the last EOS) and
    `general.architecture` `arch`; `keys` adds or replaces metadata (None removes)."""
    specials = VOCAB_SPECIALS[pre]
    tokens, merges, types = byte_bpe_vocab(specials, 400, DIGIT_MERGES)
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": tokens.index(specials[0]),
            "tokenizer.ggml.eos_token_id": tokens.index(specials[-1] if pre != "llama-bpe"
                                                        else "<|end_of_text|>")}
    apply_keys(meta, keys)
    return write_file(path, arch, meta)


def write_spm_vocab_gguf(path, arch: str = "gemma3", n_vocab: int = 400,
                         specials: list[tuple[str, int]] = GEMMA_SPECIALS,
                         pieces: list[tuple[str, float]] | None = None, keys: dict | None = None):
    """A GGUF holding only a SentencePiece vocabulary (`spm_vocab`, `spm_metadata`) and
    `general.architecture` `arch`; Gemma-style (no space prefix) unless `keys` says
    (key -> value, the full key names; None removes)."""
    meta = spm_metadata(*spm_vocab(specials, n_vocab, pieces))
    if arch == "gemma3":
        meta["tokenizer.ggml.add_space_prefix"] = False
        meta["tokenizer.ggml.add_bos_token"] = True
    apply_keys(meta, keys)
    return write_file(path, arch, meta)
