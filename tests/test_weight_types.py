"""The type table (vkrt/weight_types.py) against gguf-py and the files derived from it: no
device needed."""
from __future__ import annotations

import json

import gguf
import pytest

from vkrt import weight_types
from vkrt.kernels import WEIGHTS
from vkrt.models.llama import WEIGHT_DTYPES
from vkrt.runtime.tensor import BLOCKS, nbytes_of


@pytest.mark.parametrize("t", weight_types.TYPES, ids=lambda t: t.gguf)
def test_row_matches_gguf_py(t):
    """Elements and bytes per block as gguf-py's GGML_QUANT_SIZES (ggml-common.h) give them
    (a scalar type: 1 element of its size); names as the table's conventions derive them."""
    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.gguf]]
    assert (t.block, t.block_bytes) == (block, nbytes)
    assert t.define == f"WEIGHT_{t.gguf}"
    if t.quantized:
        assert t.dtype == t.suffix == t.gguf.lower()
    assert t.alignment == (4 if nbytes % 4 == 0 else 2 if nbytes % 2 == 0 else 1)


def test_every_issue_type_is_read():
    """llama.cpp's presets (Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q3_K_M, Q2_K, IQ4_XS and their
    Q5_0 / Q5_1 / Q8_0 rows) and today's five; nothing else."""
    assert set(weight_types.BY_GGUF) == {
        "F32", "F16", "BF16", "Q8_0", "Q4_1", "Q4_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
        "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}


def test_consumers_read_the_table():
    assert WEIGHTS == {t.dtype: t.suffix for t in weight_types.TYPES}
    assert WEIGHT_DTYPES == {t.gguf: t.dtype for t in weight_types.TYPES}
    assert BLOCKS == {t.dtype: (t.block, t.block_bytes) for t in weight_types.TYPES
                      if t.quantized}
    # A view's bytes: whole blocks, padded to a word (the shaders read uint32 words).
    assert nbytes_of("q6_k", (3, 512)) == 3 * 2 * 210
    assert nbytes_of("q3_k", (1, 256)) == 112


def test_raw4_types_are_the_shaders():
    """weight_types.RAW4_DTYPES (the types matmul_coop fetches as words, which the fused gate /
    up rule treats apart) are the types whose weights.glsl branch defines WEIGHT_RAW4: the
    `#if` / `#elif defined(WEIGHT_...)` line that opens the branch holding the define."""
    import re

    lines = (weight_types.VARIANTS_JSON.parent / "weights.glsl").read_text().splitlines()
    raw = set()
    for i, line in enumerate(lines):
        if line.strip() == "#define WEIGHT_RAW4":
            opener = next(l for l in reversed(lines[:i])
                          if re.match(r"#(el)?if defined\(WEIGHT_[A-Z0-9_]+\)", l))
            raw |= {t.dtype for t in weight_types.TYPES
                    if re.search(rf"defined\({t.define}\)", opener)}
    assert raw == weight_types.RAW4_DTYPES != set()


def test_variants_json_is_generated_from_the_table():
    """vkrt/glsl/variants.json holds every (weight kernel, type) variant with the table's
    defines (the `_xq` kernels only for the types with an integer form), qkv_rope's mixed
    variants, and nothing else for those sources (python -m vkrt.weight_types rewrites
    it)."""
    assert weight_types.main(["--check"]) == 0
    doc = json.loads(weight_types.VARIANTS_JSON.read_text())
    want = 0
    for kernel, (source, extra) in weight_types.KERNEL_SOURCES.items():
        for t in weight_types.TYPES:
            name = f"{kernel}_{t.suffix}"
            if "XQ" in extra and not t.integer_x:
                assert name not in doc
                continue
            assert doc[name] == {"source": source, "defines": {**t.defines(), **extra}}
            want += 1
    # qkv_rope's mixed variants: Q's defines and V's type and block size, blocks of one size.
    for kernel in weight_types.MIXED_QKV_KERNELS:
        for q, v in weight_types.MIXED_QKV:
            tq, tv = weight_types.BY_DTYPE[q], weight_types.BY_DTYPE[v]
            assert tq.block == tv.block == 256 and q != v
            defines = doc[f"{kernel}_{tq.suffix}_v_{tv.suffix}"]["defines"]
            assert defines == {**doc[f"{kernel}_{tq.suffix}"]["defines"],
                               tv.define.replace("WEIGHT_", "WEIGHT_V_"): 1,
                               "WEIGHT_V_BLOCK_BYTES": tv.block_bytes}
            want += 1
    sources = {s for s, _ in weight_types.KERNEL_SOURCES.values()}
    assert sum(1 for v in doc.values() if v["source"] in sources) == want
    assert sorted(t.gguf for t in weight_types.TYPES if not t.integer_x and t.quantized) \
        == ["IQ4_NL", "IQ4_XS"]
