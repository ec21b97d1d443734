"""Grids past maxComputeWorkGroupCount (65,535 per dimension on lavapipe and on many GPUs):
kernels whose grid grows with the input spread it over y (and tokens over z, glsl/grid.glsl),
and the runtime refuses a grid past the limit naming the module, the grid and the limit
(test_runtime.py). A 2,731-token prompt made silu_mul dispatch 65,544 workgroups in x.

The spill paths are also run with a lowered limit (Kernels.limit), so that a few tokens
exercise them.
"""
from __future__ import annotations

import numpy as np
import pytest

from vkrt import config
from vkrt.kernels import ELEMENTWISE_BLOCK, Kernels, spread
from vkrt.models.llama import rope_table
from vkrt.runtime.device import Device, validation_layer_available
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.stream import Stream


@pytest.fixture(scope="module")
def gpu():
    with config.VALIDATION.override("1" if validation_layer_available() else "0"):
        device = Device()
    stream = Stream(device)
    yield device, stream, Kernels(PipelineCache(device), head_dim=8)
    device.close()
    assert device.validation_errors == []


def test_spread():
    assert spread(10, (65535, 65535, 65535)) == (10, 1)
    assert spread(65544, (65535, 65535, 65535)) == (65535, 2)
    assert spread(10, (4, 4, 4)) == (4, 3)


def test_silu_mul_past_65535_workgroups(gpu):
    """The issue's example: 2,731 tokens x 1,536 = 4,194,816 elements, 65,544 workgroups of 64."""
    device, stream, k = gpu
    n = 2731 * 1536
    assert -(-n // ELEMENTWISE_BLOCK) > 65535
    rng = np.random.default_rng(0)
    g = rng.standard_normal(n).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    tg, tu, to = stream.upload(g), stream.upload(u), stream.upload(np.zeros(n, np.float32))
    d = k.silu_mul(tg, tu, to, n)
    limit_x = device.max_compute_work_group_count[0]   # 65,535 on lavapipe, 2**31 - 1 on H200
    assert d.grid == (min(65544, limit_x), -(-65544 // limit_x), 1)
    stream.record([d])
    got = stream.read(to)   # validation messages (groupCountX-00386) raise here
    want = (g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    for t in (tg, tu, to):
        t.buffer.close()


@pytest.mark.parametrize("n", [1, 64 * 4 + 1, 64 * 12])
def test_add_spread_over_y_with_a_lowered_limit(gpu, n, monkeypatch):
    device, stream, k = gpu
    monkeypatch.setattr(k, "limit", (4, 65535, 65535))
    x = np.arange(n, dtype=np.float32)
    tx, ty = stream.upload(x), stream.upload(2 * x)
    d = k.add(tx, ty, n)
    assert d.grid == (*spread(-(-n // 64), (4,)), 1)
    stream.record([d])
    np.testing.assert_array_equal(stream.read(tx), 3 * x)  # exact: small integers
    tx.buffer.close()
    ty.buffer.close()


@pytest.mark.parametrize("n_tokens", [1, 5, 9])
def test_tokens_spill_into_z_with_a_lowered_limit(gpu, n_tokens, monkeypatch):
    """embed, copy_rows and rope read their token from y and z."""
    device, stream, k = gpu
    monkeypatch.setattr(k, "limit", (65535, 2, 65535))
    rng = np.random.default_rng(n_tokens)
    n_vocab, n_embd = 11, 8
    table = rng.standard_normal((n_vocab, n_embd)).astype(np.float32)
    ids = rng.integers(0, n_vocab, n_tokens).astype(np.uint32)
    t_table, t_ids = stream.upload(table), stream.upload(ids)
    out = stream.upload(np.zeros((n_tokens, n_embd), np.float32))
    rows = stream.upload(np.zeros((n_tokens + 3, n_embd), np.float32))
    cos_sin = stream.upload(rope_table(n_embd, 10000.0, n_tokens + 2))
    rot = stream.upload(np.zeros((n_tokens, n_embd), np.float32))
    records = [k.embed(t_table, t_ids, out, n_tokens), k.copy_rows(out, rows, n_tokens, 3),
               k.rope(out, cos_sin, rot, n_tokens, 1, n_embd, pos0=2)]
    assert all(d.grid[2] == -(-n_tokens // 2) for d in records)
    stream.record(records)
    np.testing.assert_array_equal(stream.read(out), table[ids])
    np.testing.assert_array_equal(stream.read(rows)[3:], table[ids])
    cs = rope_table(n_embd, 10000.0, n_tokens + 2)[2:2 + n_tokens]   # [t, pairs, (cos, sin)]
    x0, x1 = table[ids][:, 0::2], table[ids][:, 1::2]
    want = np.empty_like(table[ids])
    want[:, 0::2] = x0 * cs[..., 0] - x1 * cs[..., 1]
    want[:, 1::2] = x0 * cs[..., 1] + x1 * cs[..., 0]
    np.testing.assert_allclose(stream.read(rot), want, rtol=1e-6, atol=1e-6)
    for t in (t_table, t_ids, out, rows, cos_sin, rot):
        t.buffer.close()


def test_row_kernels_spread_with_a_lowered_limit(gpu, monkeypatch):
    """rmsnorm and matvec spread rows over x and y, matmul spills rows into z, attention its
    tokens into z: 9 rows and 5 tokens against limits of 4 and 2."""
    device, stream, k = gpu
    monkeypatch.setattr(k, "limit", (4, 2, 65535))
    monkeypatch.setattr(k, "tiled_matmul", False)    # matmul_tiled: the next test
    r = np.random.default_rng(3)
    n_rows, n_cols, T = 9, 8, 5
    w = r.standard_normal((n_rows, n_cols)).astype(np.float32)
    x = r.standard_normal((T, n_cols)).astype(np.float32)
    norm_w = r.standard_normal(n_cols).astype(np.float32)
    tw, tx, tn = stream.upload(w), stream.upload(x), stream.upload(norm_w)
    rows = stream.upload(np.zeros((n_rows, n_cols), np.float32))
    normed = stream.upload(np.zeros((n_rows, n_cols), np.float32))
    # Three sentinels after the 9 outputs, inside the bound view: a workgroup past the last
    # row that wrote anyway would overwrite them (a write past a view could be dropped by
    # robust buffer access and go unseen).
    y1 = stream.upload(np.full(n_rows + 3, -7.0, np.float32))
    yT = stream.upload(np.zeros((T, n_rows), np.float32))
    records = [k.rmsnorm(tw, tn, normed, n_rows, 1e-5), k.linear(tx, tw, y1, 1, x_row=2),
               k.linear(tx, tw, yT, T)]
    assert [d.grid for d in records] == [(4, 3, 1), (4, 3, 1), (4, 1, 3)]
    stream.record(records)
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    want_norm = w64 / np.sqrt(np.mean(w64 ** 2, axis=1, keepdims=True) + 1e-5) * norm_w
    np.testing.assert_allclose(stream.read(normed), want_norm, rtol=1e-5, atol=1e-6)
    got = stream.read(y1)
    np.testing.assert_allclose(got[:n_rows], w64 @ x64[2], rtol=1e-5, atol=1e-5)
    # The grid holds 12 workgroups for 9 rows: the last three write nothing.
    np.testing.assert_array_equal(got[n_rows:], -7.0)
    np.testing.assert_allclose(stream.read(yT), x64 @ w64.T, rtol=1e-5, atol=1e-5)
    # attention: one head of dim 8 over 5 positions, tokens (attention.comp) or tiles of one
    # token (attention_tile.comp) spread over y (2) and z (3).
    q = r.standard_normal((T, 8)).astype(np.float32)
    kv = r.standard_normal((2, T, 8)).astype(np.float32)
    tq, tk, tv = stream.upload(q), stream.upload(kv[0]), stream.upload(kv[1])
    out = stream.upload(np.zeros((T, 8), np.float32))
    part = stream.upload(np.zeros(64, np.float32))      # decode's partials: unused here
    s = (q.astype(np.float64) * 0.25) @ kv[0].T.astype(np.float64)
    s[np.triu_indices(T, 1)] = -np.inf
    p = np.exp(s - s.max(1, keepdims=True))
    want = (p / p.sum(1, keepdims=True)) @ kv[1].astype(np.float64)
    for tile, kernel in ((None, "attention"), ((1, 1, 8), "attention_tile")):
        monkeypatch.setattr(k, "attention_tile", tile)
        (d,) = k.attention(tq, tk, tv, out, T, 1, 1, 8, 0, 0.25, part)
        assert d.grid == (1, 2, 3) and d.pipeline.name == kernel
        stream.write(out, np.zeros((T, 8), np.float32))
        stream.record([d])
        np.testing.assert_allclose(stream.read(out), want, rtol=1e-5, atol=1e-5)
    for t in (tw, tx, tn, rows, normed, y1, yT, tq, tk, tv, out, part):
        t.buffer.close()


def test_matmul_tiled_spills_row_tiles_into_z(gpu, monkeypatch):
    """matmul_tiled (a GPU's prefill product) spreads its tiles of TILE_ROWS rows over x and
    z: 200 rows are 7 tiles of 32, against a limit of 4 a grid of (4, 1, 2), the last
    workgroup past the rows."""
    from vkrt.kernels import TILE_ROWS

    device, stream, k = gpu
    monkeypatch.setattr(k, "limit", (4, 2, 65535))
    monkeypatch.setattr(k, "tiled_matmul", True)
    r = np.random.default_rng(4)
    n_rows, n_cols, T = 200, 8, 5
    w = r.standard_normal((n_rows, n_cols)).astype(np.float32)
    x = r.standard_normal((T, n_cols)).astype(np.float32)
    tw, tx = stream.upload(w), stream.upload(x)
    y = stream.upload(np.full(T * n_rows + 3, -7.0, np.float32))
    d = k.linear(tx, tw, y, T)
    assert d.grid == (4, 1, 2) and -(-n_rows // TILE_ROWS) == 7
    stream.record([d])
    got = stream.read(y)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(got[:-3].reshape(T, n_rows), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[-3:], -7.0)
    for t in (tw, tx, y):
        t.buffer.close()


def test_matmul_coop_spills_row_tiles_into_z(gpu, monkeypatch):
    """matmul_coop (prefill on cooperative matrices) spreads its tiles of BN rows over x and
    z as matmul_tiled does: 600 rows are 5 tiles of 128 (the table's BN), against a limit of 4 a
    grid of (4, 1, 2) for 70 tokens, the last three workgroups past the rows. Runs where the
    device has cooperative matrices."""
    device, stream, k = gpu
    if k.coop is None:
        pytest.skip(f"{device.name} lists no f16 cooperative-matrix shape")
    monkeypatch.setattr(k, "limit", (4, 2, 65535))
    r = np.random.default_rng(5)
    n_rows, n_cols, T = 600, 64, 70
    w = r.standard_normal((n_rows, n_cols)).astype(np.float32)
    x = r.standard_normal((T, n_cols)).astype(np.float32)
    tw, tx = stream.upload(w), stream.upload(x)
    y = stream.upload(np.full(T * n_rows + 3, -7.0, np.float32))
    with config.COOPMAT.override("1"):
        d = k.linear(tx, tw, y, T)
    spec = k.coop_spec(n_rows, T)
    assert d.grid == (4, -(-T // spec[4]), -(-(-(-n_rows // spec[5])) // 4))
    stream.record([d])
    got = stream.read(y)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    # f16 operands: within 2^-10 + K 2^-23 of sum |x w| (tests/test_kernels.py).
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    assert np.all(np.abs(got[:-3].reshape(T, n_rows) - want)
                  <= (2.0 ** -10 + n_cols * 2.0 ** -23) * scale)
    np.testing.assert_array_equal(got[-3:], -7.0)
    for t in (tw, tx, y):
        t.buffer.close()
