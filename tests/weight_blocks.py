"""Random weight blocks of every GGUF block type vkrt reads, and their values as gguf-py
dequantizes them (the oracle of tests/test_kernels.py and tests/test_llama_types.py).

gguf-py cannot quantize K-quants, but any block whose f16 scales are finite is a valid weight
and `gguf.quants.dequantize` defines its values. Every byte of a block is random (so every
bit of every scale, min, high-bit mask and nibble matters: Q4_K/Q5_K's 6-bit scales and mins
of sub-blocks 4-7, whose high bits sit in bytes 0-7; Q5_K's qh; Q3_K's hmask; Q6_K's int8
scales and its d stored last; every IQ4 level), except the f16 scale fields, which are set to
finite values of random sign so that the weights have a chosen standard deviation.
"""
from __future__ import annotations

import gguf
import numpy as np

from vkrt.weight_types import BY_DTYPE, BY_GGUF

# Byte offsets of each block type's f16 scale fields (d, and dmin or m): ggml-common.h.
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
              "IQ4_NL": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2),
              "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}


def random_blocks(r: np.random.Generator, gguf_type: str, n_rows: int, n_cols: int,
                  std: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(raw, values): `raw` uint8 [n_rows, bytes per row], random blocks of `gguf_type`
    whose dequantized values have a standard deviation of about `std`; `values` float64
    [n_rows, n_cols], gguf-py's dequantization of `raw`."""
    t = BY_GGUF[gguf_type]
    qtype = gguf.GGMLQuantizationType[gguf_type]
    n_blocks = n_rows * n_cols // t.block
    assert n_cols % t.block == 0, (gguf_type, n_cols)
    raw = r.integers(0, 256, (n_blocks, t.block_bytes), dtype=np.uint8)
    fields = F16_FIELDS[gguf_type]
    base = r.uniform(0.5, 1.0, (n_blocks, len(fields))) * r.choice([-1.0, 1.0], (n_blocks,
                                                                                 len(fields)))

    def values(factor: float) -> np.ndarray:
        for i, off in enumerate(fields):
            raw[:, off:off + 2] = (base[:, i] * factor).astype(np.float16).view(np.uint8) \
                .reshape(n_blocks, 2)
        return gguf.quants.dequantize(raw, qtype).astype(np.float64)

    factor = std / values(1.0).std()
    out = values(factor).reshape(n_rows, n_cols)
    assert np.isfinite(out).all()
    return raw.reshape(n_rows, -1), out


def unit_elements(dtype: str) -> np.ndarray:
    """[units per block, 32]: the elements of each unit of 32 weights of a block, in the
    order the decode products read them (vkrt/glsl/weights.glsl `unit_runs`: run x's 16
    elements, then run y's; xv[0..3], xv[4..7])."""
    t = BY_DTYPE[dtype]
    if t.block == 32:
        starts = [(0, 16)]
    elif t.gguf in ("Q2_K", "Q3_K"):
        starts = [(a, a + 32) for u in range(8)
                  for a in [128 * (u // 4) + 64 * (u // 2 % 2) + 16 * (u % 2)]]
    elif t.gguf in ("Q4_K", "Q5_K"):
        starts = [(a, a + 32) for u in range(8) for a in [64 * (u // 2) + 16 * (u % 2)]]
    elif t.gguf == "Q6_K":
        starts = [(a, a + 64) for u in range(8)
                  for a in [128 * (u // 4) + 32 * (u // 2 % 2) + 16 * (u % 2)]]
    else:
        starts = [(32 * u, 32 * u + 16) for u in range(8)]        # IQ4_XS
    return np.array([list(range(a, a + 16)) + list(range(b, b + 16)) for a, b in starts])


def quantize_units(x: np.ndarray, dtype: str) -> np.ndarray:
    """x^ [..., K] float64: x [..., K] f32 as the `_xq` decode products see it
    (vkrt/glsl/unit_xq.glsl), each unit of 32 elements (`unit_elements`) on the step
    dx = 2^(E - 15), E the exponent of its max |x|: x^ = dx * round_half_even(min(x / dx,
    32767)), exact in f64; a unit whose sum is not finite or whose max |x| is below 1e-30
    keeps x (the float path)."""
    t = BY_DTYPE[dtype]
    x = np.asarray(x, np.float32)
    idx = unit_elements(dtype)                                  # [U, 32]
    blocks = x.reshape(*x.shape[:-1], -1, t.block)              # [..., B, block]
    u = blocks[..., idx]                                        # [..., B, U, 32]
    m = np.abs(u).max(-1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        ok = np.isfinite(u.sum(-1, dtype=np.float32, keepdims=True)) & (m >= np.float32(1e-30))
    e = np.frexp(np.where(ok, m, 1.0))[1]
    inv, dx = np.ldexp(1.0, 15 - e), np.ldexp(1.0, e - 15)
    q = np.rint(np.minimum(np.where(ok, u, 0).astype(np.float64) * inv, 32767.0))
    uq = np.where(ok, q * dx, u.astype(np.float64))
    out = np.empty(blocks.shape, np.float64)
    out[..., idx] = uq
    return out.reshape(x.shape)
