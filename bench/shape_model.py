"""A GGUF of a named model shape with random weight blocks, for speed runs: shapes and types
set the speed of a forward, not the values (bench/README.md), so anyone can rebuild the files
the README's tables were measured on, and a 4.6 GB file is made where it runs rather than
carried there.

    python bench/shape_model.py PRESET OUT.gguf --vocab VOCAB.gguf [--types q4_1] [--seed 0]
    python bench/shape_model.py vocab SRC.gguf OUT.gguf     # SRC's tokenizer, no tensors

PRESET (`PRESETS`): `135m` (SmolLM2-135M's shape), `1b` (hidden 2048, 16 layers, 32/8 heads,
FFN 8192), `7b` (hidden 4096, 32 layers, 32/8 heads of 128, FFN 14336), `qwen2.5-0.5b`
(Qwen2.5-0.5B's: qwen2, Q/K/V biases), `qwen3-0.6b` (qwen3: per-head Q/K norms, head_dim
128 beside a hidden size of 1024) and `gemma3-1b` (Gemma 3 1B's: post-norms, per-head Q/K
norms, head_dim 256, a 512-position window on 5 of every 6 layers, 262,144 tokens: a
SentencePiece vocabulary padded with `vocab --pad-to 262144`). `--types`:
- `q4_1`, `q8_0`, `q4_0`, `q4_k`, `q6_k`, `f16`, ... (any type of vkrt/weight_types.py): every
  matrix in that type, the embedding and a separate output matrix in Q8_0 (how the 2026-12
  side-by-side files were made);
- `q4_k_m`: llama.cpp's Q4_K_M mix as its quantizer assigns it (src/llama-quant.cpp,
  `llama_tensor_get_type` for LLAMA_FTYPE_MOSTLY_Q4_K_M): Q4_K, but Q6_K for the output
  matrix and for attn_v and ffn_down of the layers `use_more_bits` picks (the first and last
  eighth and every third between); a matrix whose rows are not whole 256-element blocks falls
  back to Q5_0 (for Q4_K) or Q8_0 (for Q6_K), as llama.cpp does. On the Qwen2.5 shape this
  gives the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M file's count of each type (133 Q5_0,
  13 Q8_0, 12 Q6_K, 12 Q4_K; tests/test_bench.py), though not the same layers: that file's
  larger types sit in layers 0, 1, 3, 6-10, 13, 16, 19 and 21.

Blocks are random bytes with their f16 scale fields (ggml-common.h: d, and m or dmin) set to
small finite values of random sign, so every weight is finite; norms are 1, biases 0.
`--vocab` is a GGUF whose `tokenizer.*` keys are copied (a real tokenizer: vkrt and llama.cpp
both load it); its token count must be the preset's vocabulary. `vocab` writes such a file
(a few MB) from a model file, to carry where the model is made.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vkrt.weight_types import BY_GGUF  # noqa: E402


@dataclass(frozen=True)
class Preset:
    arch: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    head_dim: int | None = None      # None: n_embd / n_head
    tied: bool = False
    rope_theta: float = 10000.0
    n_ctx: int = 8192
    window: int = 0                  # gemma3: the sliding layers' window


PRESETS = {
    "135m": Preset("llama", 576, 30, 9, 3, 1536, 49152, tied=True, rope_theta=100000.0),
    "1b": Preset("llama", 2048, 16, 32, 8, 8192, 49152, tied=True),
    "7b": Preset("llama", 4096, 32, 32, 8, 14336, 49152),
    "qwen2.5-0.5b": Preset("qwen2", 896, 24, 14, 2, 4864, 151936, rope_theta=1e6),
    "qwen3-0.6b": Preset("qwen3", 1024, 28, 16, 8, 3072, 151936, head_dim=128, tied=True,
                         rope_theta=1e6),
    "gemma3-1b": Preset("gemma3", 1152, 26, 4, 1, 6912, 262144, head_dim=256, tied=True,
                        rope_theta=1e6, window=512),
}

# Byte offsets of each block type's f16 scale fields (d, and m or dmin): ggml-common.h.
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
              "IQ4_NL": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2),
              "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}
# llama.cpp's fallback when a row is not whole 256-element superblocks (llama-quant.cpp).
K_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0", "Q5_K": "Q5_1", "Q2_K": "Q4_0", "Q3_K": "IQ4_NL",
              "IQ4_XS": "IQ4_NL"}


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's `use_more_bits`: the first and last eighth of the layers and every
    third layer between them get the larger type."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def matrix_type(types: str, name: str, layer: int, p: Preset, n_cols: int) -> str:
    """The GGUF type of matrix `name` (GGUF tensor name) of layer `layer` (-1: none)."""
    if types != "q4_k_m":
        t = types.upper()
        return "Q8_0" if name in ("token_embd.weight", "output.weight") else t
    t = "Q4_K"
    if name == "output.weight":
        t = "Q6_K"
    elif name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(layer, p.n_layer):
        t = "Q6_K"
    return K_FALLBACK[t] if n_cols % 256 else t


def random_matrix(r: np.random.Generator, gtype: str, rows: int, cols: int) -> np.ndarray:
    """Raw blocks uint8 [rows, bytes per row] (or f16/f32 values) of `gtype`, finite."""
    if gtype in ("F32", "F16", "BF16"):
        a = (r.standard_normal((rows, cols), np.float32) * 0.02)
        if gtype == "F32":
            return a
        if gtype == "F16":
            return a.astype(np.float16)
        return (a.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    t = BY_GGUF[gtype]
    if cols % t.block:
        raise SystemExit(f"{gtype}: rows of {cols} are not whole blocks of {t.block}")
    n_blocks = rows * cols // t.block
    raw = r.integers(0, 256, (n_blocks, t.block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[gtype]:
        scale = (r.uniform(0.5, 1.0, n_blocks) * r.choice([-1e-3, 1e-3], n_blocks))
        raw[:, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, -1)


def tensors(p: Preset, types: str):
    """(name, shape [rows, cols] or [n], GGUF type, layer) of every tensor, file order."""
    hd = p.head_dim or p.n_embd // p.n_head
    qw, kvw = p.n_head * hd, p.n_head_kv * hd
    out = [("token_embd.weight", (p.n_vocab, p.n_embd), -1)]
    for i in range(p.n_layer):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (p.n_embd,), i),
                (b + "attn_q.weight", (qw, p.n_embd), i),
                (b + "attn_k.weight", (kvw, p.n_embd), i),
                (b + "attn_v.weight", (kvw, p.n_embd), i)]
        if p.arch == "qwen2":
            out += [(b + "attn_q.bias", (qw,), i), (b + "attn_k.bias", (kvw,), i),
                    (b + "attn_v.bias", (kvw,), i)]
        if p.arch in ("qwen3", "gemma3"):
            out += [(b + "attn_q_norm.weight", (hd,), i), (b + "attn_k_norm.weight", (hd,), i)]
        out.append((b + "attn_output.weight", (p.n_embd, qw), i))
        if p.arch == "gemma3":
            out.append((b + "post_attention_norm.weight", (p.n_embd,), i))
        out += [(b + "ffn_norm.weight", (p.n_embd,), i),
                (b + "ffn_gate.weight", (p.n_ff, p.n_embd), i),
                (b + "ffn_up.weight", (p.n_ff, p.n_embd), i),
                (b + "ffn_down.weight", (p.n_embd, p.n_ff), i)]
        if p.arch == "gemma3":
            out.append((b + "post_ffw_norm.weight", (p.n_embd,), i))
    out.append(("output_norm.weight", (p.n_embd,), -1))
    if not p.tied:
        out.append(("output.weight", (p.n_vocab, p.n_embd), -1))
    return [(n, s, matrix_type(types, n, i, p, s[1]) if len(s) == 2 else "F32", i)
            for n, s, i in out]


def copy_tokenizer(src: gguf.GGUFReader, w: gguf.GGUFWriter, pad_to: int = 0) -> int:
    """Copy every `tokenizer.*` key of `src` into `w`; returns the token count. `pad_to`:
    append unused tokens `<unused_pad_N>` (normal type, score -1e9: never produced) up to that
    many, for a vocabulary of another size than any tokenizer at hand (the real Gemma 3
    vocabulary is not on the package registry)."""
    n = 0
    count = len(src.fields["tokenizer.ggml.tokens"].data)
    extra = max(0, pad_to - count)
    pads = {"tokenizer.ggml.tokens": [f"<unused_pad_{i}>" for i in range(extra)],
            "tokenizer.ggml.scores": [-1e9] * extra, "tokenizer.ggml.token_type": [1] * extra}
    for field in src.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                value = [bytes(field.parts[i]).decode("utf-8", "surrogateescape")
                         for i in field.data]
            else:
                value = [field.parts[i].tolist()[0] for i in field.data]
            value += pads.get(field.name, [])
            w.add_key_value(field.name, value, vtype, sub_type=sub)
            if field.name == "tokenizer.ggml.tokens":
                n = len(value)
        else:
            value = field.contents()
            w.add_key_value(field.name, value, vtype)
    return n


def write_vocab(src_path: str, out: str, pad_to: int = 0) -> None:
    """Write `out`: a GGUF with no tensors holding `src_path`'s architecture and tokenizer
    keys, padded to `pad_to` tokens (`copy_tokenizer`)."""
    src = gguf.GGUFReader(src_path)
    arch = src.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(out, arch)
    n = copy_tokenizer(src, w, pad_to)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    print(f"{out}: {n} tokens of {src_path}")


def write_model(preset: str, out: str, vocab: str, types: str, seed: int) -> None:
    """Write `out`: the GGUF of PRESETS[preset] with `vocab`'s tokenizer keys, matrices of
    `types` (`matrix_type`) as random blocks from PCG64 `seed`, norms 1, biases 0. Raises
    SystemExit when the vocabulary's token count is not the preset's."""
    p = PRESETS[preset]
    hd = p.head_dim or p.n_embd // p.n_head
    src = gguf.GGUFReader(vocab)
    w = gguf.GGUFWriter(out, p.arch)
    a = p.arch
    w.add_string("general.name", f"vkrt shape {preset} {types}")
    w.add_uint32(f"{a}.context_length", p.n_ctx)
    w.add_uint32(f"{a}.embedding_length", p.n_embd)
    w.add_uint32(f"{a}.block_count", p.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", p.n_ff)
    w.add_uint32(f"{a}.attention.head_count", p.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", p.n_head_kv)
    if p.head_dim:
        w.add_uint32(f"{a}.attention.key_length", hd)
        w.add_uint32(f"{a}.attention.value_length", hd)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", p.rope_theta)
    if a == "llama":
        w.add_uint32(f"{a}.rope.dimension_count", hd)
        w.add_uint32(f"{a}.vocab_size", p.n_vocab)
    if p.window:
        w.add_uint32(f"{a}.attention.sliding_window", p.window)
    n_tokens = copy_tokenizer(src, w)
    if n_tokens != p.n_vocab:
        raise SystemExit(f"{vocab}: {n_tokens} tokens, the {preset} preset has a vocabulary of "
                         f"{p.n_vocab}")
    r = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for name, shape, gtype, _ in tensors(p, types):
        if len(shape) == 1:
            value = np.zeros(shape, np.float32) if name.endswith(".bias") else \
                np.ones(shape, np.float32)
            w.add_tensor(name, value)
            continue
        counts[gtype] = counts.get(gtype, 0) + 1
        data = random_matrix(r, gtype, *shape)
        if gtype in ("F32", "F16"):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[gtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out}: {preset} {types}: {os.path.getsize(out)} bytes; matrices "
          + ", ".join(f"{n} {t}" for t, n in sorted(counts.items())))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "vocab":
        ap = argparse.ArgumentParser(prog="shape_model.py vocab",
                                     description="a GGUF of SRC's tokenizer keys only")
        ap.add_argument("src")
        ap.add_argument("out")
        ap.add_argument("--pad-to", type=int, default=0,
                        help="append unused tokens up to this vocabulary size")
        args = ap.parse_args(sys.argv[2:])
        write_vocab(args.src, args.out, args.pad_to)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out")
    ap.add_argument("--vocab", required=True, help="a GGUF whose tokenizer.* keys are copied")
    ap.add_argument("--types", default="q4_1",
                    help="q4_k_m (llama.cpp's mix) or one type for every matrix (default q4_1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.types != "q4_k_m" and args.types.upper() not in (*BY_GGUF, "F32", "F16", "BF16"):
        ap.error(f"--types {args.types}: not q4_k_m nor a type of vkrt/weight_types.py")
    write_model(args.preset, args.out, args.vocab, args.types, args.seed)


if __name__ == "__main__":
    main()
