"""The weight types vkrt's kernels read as the GGUF stores them: one row per type.

`TYPES` is the one place that knows a type: its GGUF (ggml) name, the dtype name of its
`vkrt.runtime.tensor.Tensor` views, elements and bytes per block (ggml-common.h's
`block_*` structs, gguf-py's `GGML_QUANT_SIZES`), the `weights.glsl` branch that reads it
and the suffix of its shader variants (`matvec_q4_k`, ...). `Tensor` (`BLOCKS`), `Kernels`
(`WEIGHTS`), the loaders (`GGUF_DTYPES`) and `vkrt/glsl/variants.json` are derived from it:
`python -m vkrt.weight_types` rewrites the weight variants of variants.json from the table
(tests/test_weight_types.py fails when they differ).

Adding a type: its block in weights.glsl (a `WEIGHT_<NAME>` branch defining
`block4(byte offset of the block, element in the block)`, and the block-level reader of the
decode products: `UNITS`, `unit_runs(u)`, `unit_part(o, u, q, xa, xb)`, see CONTRIBUTING.md),
one row here, then `python -m vkrt.weight_types` and `python -m vkrt.gen.cli`. Optionally a
two-phase reader (`raw_at`, `decode4`, `#define WEIGHT_RAW4` and the words' type
`WEIGHT_RAW_T` with its zero `WEIGHT_RAW_ZERO`, as Q4_1's and Q4_K's) and its dtype in
`RAW4_DTYPES`: `matmul_coop` then keeps the type's loads in flight across its fetched steps
(for blocks of 256 that pays where the GLU tile waits on its loads, and costs the single
product 7%: bench/README.md, sixteenth session).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WeightType:
    """One weight type.

    gguf: the ggml type name a GGUF header gives (`"Q4_K"`); dtype: the `Tensor` dtype
    (`"q4_k"`, `"float16"`); block: elements per block (1 for the scalar types F32, F16,
    BF16); block_bytes: bytes per block (the element size of a scalar type); define: the
    weights.glsl `#define` that selects its reader; suffix: its shader variants' suffix.
    """
    gguf: str
    dtype: str
    block: int
    block_bytes: int
    define: str
    suffix: str

    @property
    def quantized(self) -> bool:
        """A block type (read as uint32 words, fields extracted by byte offset)."""
        return self.block > 1

    @property
    def integer_x(self) -> bool:
        """The decode products have an integer form for it (weights.glsl `unit_dot_q`: the
        `*_xq_*` variants, x quantized per unit to 16-bit integers, glsl/unit_xq.glsl): every
        block type whose weights are integers times scales; not IQ4_NL and IQ4_XS (their
        levels are a table)."""
        return self.quantized and not self.gguf.startswith("IQ")

    @property
    def alignment(self) -> int:
        """The byte alignment every block of a tensor has (1, 2 or 4): Q8_0's 34-byte blocks,
        Q4_0's 18, Q5_0's 22, Q3_K's 110 and Q6_K's 210 are only 2-byte aligned."""
        return min(4, self.block_bytes & -self.block_bytes)

    def defines(self) -> dict[str, int]:
        """The defines of its shader variants: `define`, plus WEIGHT_BLOCK and
        WEIGHT_BLOCK_BYTES for a block type (weights.glsl reads the sizes from these)."""
        out = {self.define: 1}
        if self.quantized:
            out.update(WEIGHT_BLOCK=self.block, WEIGHT_BLOCK_BYTES=self.block_bytes)
        return out


# Block layouts: ggml-common.h (block_q4_0 ... block_iq4_xs, QK_K = 256), as gguf-py's
# quants.py dequantizes them; sizes as gguf-py's GGML_QUANT_SIZES lists them.
TYPES = (
    WeightType("F32", "float32", 1, 4, "WEIGHT_F32", "f32"),
    WeightType("F16", "float16", 1, 2, "WEIGHT_F16", "f16"),
    WeightType("BF16", "bfloat16", 1, 2, "WEIGHT_BF16", "bf16"),
    WeightType("Q8_0", "q8_0", 32, 34, "WEIGHT_Q8_0", "q8_0"),
    WeightType("Q4_1", "q4_1", 32, 20, "WEIGHT_Q4_1", "q4_1"),
    WeightType("Q4_0", "q4_0", 32, 18, "WEIGHT_Q4_0", "q4_0"),
    WeightType("Q5_0", "q5_0", 32, 22, "WEIGHT_Q5_0", "q5_0"),
    WeightType("Q5_1", "q5_1", 32, 24, "WEIGHT_Q5_1", "q5_1"),
    WeightType("IQ4_NL", "iq4_nl", 32, 18, "WEIGHT_IQ4_NL", "iq4_nl"),
    WeightType("Q2_K", "q2_k", 256, 84, "WEIGHT_Q2_K", "q2_k"),
    WeightType("Q3_K", "q3_k", 256, 110, "WEIGHT_Q3_K", "q3_k"),
    WeightType("Q4_K", "q4_k", 256, 144, "WEIGHT_Q4_K", "q4_k"),
    WeightType("Q5_K", "q5_k", 256, 176, "WEIGHT_Q5_K", "q5_k"),
    WeightType("Q6_K", "q6_k", 256, 210, "WEIGHT_Q6_K", "q6_k"),
    WeightType("IQ4_XS", "iq4_xs", 256, 136, "WEIGHT_IQ4_XS", "iq4_xs"),
)
BY_DTYPE = {t.dtype: t for t in TYPES}
BY_GGUF = {t.gguf: t for t in TYPES}
GGUF_DTYPES = {t.gguf: t.dtype for t in TYPES}            # GGUF type -> Tensor dtype
WEIGHTS = {t.dtype: t.suffix for t in TYPES}               # Tensor dtype -> variant suffix
BLOCKS = {t.dtype: (t.block, t.block_bytes) for t in TYPES if t.quantized}
# Types whose weights.glsl branch reads in two phases (WEIGHT_RAW4: raw_at, then decode4), so
# that matmul_coop holds their W tile as words until it stores it (the fused gate / up rule of
# vkrt/tuning.py `WideBatchDecode.glu_raw_rows`); tests/test_weight_types.py holds it to the
# shader.
RAW4_DTYPES = frozenset({"q4_1", "q4_k"})

# The kernels built once per weight type: module prefix -> (source, other defines).
KERNEL_SOURCES = {
    "embed": ("embed.comp", {}),
    "embed_range": ("embed_range.comp", {}),
    "matmul": ("matmul.comp", {}),
    "matmul_tiled": ("matmul_tiled.comp", {}),
    "matmul_coop": ("matmul_coop.comp", {}),
    # The batched decode's gate and up products with SiLU (or GELU) times up in one dispatch.
    "matmul_coop_glu": ("matmul_coop.comp", {"GLU": 1}),
    "matvec": ("matvec.comp", {}),
    "matvec_add": ("matvec.comp", {"ADD_OUT": 1}),
    "matvec_glu": ("matvec_glu.comp", {}),
    "qkv_rope": ("qkv_rope.comp", {}),
    # The decode products with x quantized per unit (glsl/unit_xq.glsl), for the types with
    # an integer form (`WeightType.integer_x`).
    "matvec_xq": ("matvec.comp", {"XQ": 1}),
    "matvec_add_xq": ("matvec.comp", {"ADD_OUT": 1, "XQ": 1}),
    "matvec_glu_xq": ("matvec_glu.comp", {"XQ": 1}),
    "qkv_rope_xq": ("qkv_rope.comp", {"XQ": 1}),
    # qkv_rope writing an f16 KV cache (glsl/kv.glsl).
    "qkv_rope_kvf16": ("qkv_rope.comp", {"KV_F16": 1}),
    "qkv_rope_xq_kvf16": ("qkv_rope.comp", {"XQ": 1, "KV_F16": 1}),
}
# (Q and K type, V type) pairs that qkv_rope also reads as one layer (its mixed variants,
# `qkv_rope[_kvf16]_<q suffix>_v_<v suffix>`, glsl/qkv_rope.comp): the attn_v types
# llama.cpp's quantizer gives a K-quant file's layers beside their attn_q / attn_k
# (src/llama-quant.cpp, `attn_v.weight`): Q2_K Q4_K with 4 or more query heads per KV head,
# else Q3_K; Q3_K_M Q5_K in the first 2 layers, else Q4_K; Q3_K_L Q5_K; Q4_K_S Q5_K in the
# first 4 layers; Q4_K_M and Q5_K_M Q6_K where `use_more_bits`.
MIXED_QKV = (("q2_k", "q3_k"), ("q2_k", "q4_k"), ("q3_k", "q4_k"), ("q3_k", "q5_k"),
             ("q4_k", "q5_k"), ("q4_k", "q6_k"), ("q5_k", "q6_k"))
MIXED_QKV_KERNELS = ("qkv_rope", "qkv_rope_kvf16")
VARIANTS_JSON = Path(__file__).resolve().parent / "glsl" / "variants.json"


def mixed_qkv_variants() -> dict[str, dict]:
    """The variants.json entries of qkv_rope's mixed variants: `<kernel>_<q suffix>_v_<v
    suffix>` -> {"source", "defines"}: Q's defines, plus WEIGHT_V_<type> and
    WEIGHT_V_BLOCK_BYTES for V."""
    out = {}
    for kernel in MIXED_QKV_KERNELS:
        source, extra = KERNEL_SOURCES[kernel]
        for q, v in MIXED_QKV:
            tq, tv = BY_DTYPE[q], BY_DTYPE[v]
            out[f"{kernel}_{tq.suffix}_v_{tv.suffix}"] = {"source": source, "defines": {
                **tq.defines(), **extra, "WEIGHT_V_" + tv.define.removeprefix("WEIGHT_"): 1,
                "WEIGHT_V_BLOCK_BYTES": tv.block_bytes}}
    return out


def weight_variants() -> dict[str, dict]:
    """The variants.json entries of every (weight kernel, type): `<kernel>_<suffix>` ->
    {"source", "defines"}; and qkv_rope's mixed variants (`mixed_qkv_variants`)."""
    return {**{f"{kernel}_{t.suffix}": {"source": source, "defines": {**t.defines(), **extra}}
               for kernel, (source, extra) in KERNEL_SOURCES.items() for t in TYPES
               if "XQ" not in extra or t.integer_x}, **mixed_qkv_variants()}


def variants_json(current: dict) -> dict:
    """`current` (variants.json's entries) with every weight kernel's variants replaced by
    `weight_variants()`; other entries kept; sorted by name."""
    sources = {s for s, _ in KERNEL_SOURCES.values()}
    keep = {k: v for k, v in current.items() if v.get("source") not in sources}
    return dict(sorted({**keep, **weight_variants()}.items()))


def dumps(doc: dict) -> str:
    """variants.json's text: one entry per line."""
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m vkrt.weight_types [--check]`: rewrite variants.json's weight variants from
    `TYPES` (with --check: exit 1 when the file differs)."""
    argv = sys.argv[1:] if argv is None else argv
    text = VARIANTS_JSON.read_text()
    want = dumps(variants_json(json.loads(text)))
    if "--check" in argv:
        if text != want:
            print(f"{VARIANTS_JSON}: weight variants differ from vkrt/weight_types.py TYPES "
                  "(run python -m vkrt.weight_types)", file=sys.stderr)
            return 1
        return 0
    if text != want:
        VARIANTS_JSON.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
