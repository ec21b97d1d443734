"""Every compute shader in vkrt/glsl against a numpy reference (STYLE.md point 9: kernels are
checked against numpy, not through debug paths), on small random inputs whose sizes are odd on
purpose: partial workgroups, token tiles that do not divide, rows written at an offset inside a
larger buffer with sentinels around them to catch stray writes.

Runs on whatever `Device()` picks (lavapipe here). Spec constants are the ones
`vkrt/models/llama.py` uses; the reductions are also run with workgroups of half a subgroup
to 16 subgroups (WORKGROUPS) and rows shorter than one subgroup, so every path of reduce.glsl
and of argmax's tree runs. The subgroup size is the device's: 8 on lavapipe at 256 bits;
`LP_NATIVE_VECTOR_WIDTH=128` (or 512) makes lavapipe's subgroups 4 (or 16) wide.

Tolerances: elementwise copies and adds are exact (one correctly rounded f32 op, or none).
Reductions are compared with float64 references; an fp32 sum of K terms reordered (subgroup
tree vs sequential) is off by at most ~K * 2^-24 * sum|terms| and in practice by ~sqrt(K) *
2^-24 * sum|terms|, so bounds are stated relative to sum|terms|, with the measured error
noted next to each (lavapipe, llvmpipe LLVM 15, 256-bit).
"""
from __future__ import annotations

import dataclasses

from types import SimpleNamespace

import numpy as np
import pytest

from vkrt import config, tuning, weight_types
from vkrt.errors import ShaderInterfaceError, VkrtError
from vkrt.kernels import COOP_MIN_TOKENS, Kernels, coop_shared_bytes, fit_coop_tile
from vkrt.models.llama import rope_table
from vkrt.runtime.device import CoopShape, Device
from vkrt.runtime.dispatch import Dispatch
from vkrt.runtime.memory import Buffer
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.stream import Stream
from vkrt.runtime.tensor import Tensor, nbytes_of
from weight_blocks import quantize_units, random_blocks, unit_elements

ELEMENTWISE = 64   # elementwise kernels' workgroup size, as in llama.py
F32 = 4
SENTINEL = np.float32(-12345.5)


class Gpu:
    """One device, stream and pipeline cache shared by the module; buffers made through it are
    closed after each test so `bytes_in_use` does not grow across tests."""

    def __init__(self, direct_host_access: bool | None = None):
        self.device = Device(direct_host_access=direct_host_access)
        self.stream = Stream(self.device)
        self.cache = PipelineCache(self.device)
        self.sg = self.device.subgroup_size
        self.buffers: list[Buffer] = []

    def upload(self, array: np.ndarray) -> Tensor:
        t = self.stream.upload(np.ascontiguousarray(array))
        self.buffers.append(t.buffer)
        return t

    def filled(self, n: int, value=SENTINEL, dtype=np.float32) -> Tensor:
        """A tensor of n elements all equal to `value` (to detect writes where none belong)."""
        return self.upload(np.full(n, value, dtype))

    def read(self, t: Tensor, dtype=np.float32) -> np.ndarray:
        """The whole buffer under `t` as a 1-D array of `dtype`."""
        return self.stream.read(Tensor.of(t.buffer, np.dtype(dtype).name))

    def run(self, name: str, spec: dict, tensors, groups, push) -> None:
        """One dispatch with raw push-constant bytes (the kernels' contract, not the ops')."""
        pipeline = self.cache.get_pipeline(name, spec)
        self.stream.record([Dispatch(pipeline, tuple(tensors), groups, push.tobytes(), name)])

    def close_buffers(self) -> None:
        while self.buffers:
            self.buffers.pop().close()


def push(*values) -> np.ndarray:
    """Push-constant bytes: ints as u32, floats as f32 bit patterns (each member is 4 bytes)."""
    out = np.zeros(len(values), np.uint32)
    for i, v in enumerate(values):
        out[i] = np.float32(v).view(np.uint32) if isinstance(v, float) else v
    return out


def groups(n: int, block: int) -> int:
    return (n + block - 1) // block


@pytest.fixture(scope="module", params=[None, False], ids=["host-access", "staging"])
def gpu_module(request):
    gpu = Gpu(request.param)
    yield gpu
    gpu.device.close()
    assert gpu.device._children == {}


@pytest.fixture
def gpu(gpu_module):
    yield gpu_module
    gpu_module.stream.finish()
    gpu_module.close_buffers()


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def randn(r: np.random.Generator, *shape) -> np.ndarray:
    return r.standard_normal(shape).astype(np.float32)


def rel_err(got: np.ndarray, want: np.ndarray, scale: np.ndarray) -> float:
    """max |got - want| / scale, with scale the sum of |terms| behind each output."""
    return float(np.max(np.abs(got.astype(np.float64) - want) / scale))


# -- elementwise ---------------------------------------------------------------------------
def test_add_in_place_exact_and_bounded(gpu):
    # n = 1000: 16 workgroups of 64, the last one 24 invocations past n. x and y hold 7
    # extra elements past n: x's must keep their values (the `i < n` bound). y's are nonzero
    # so an unbounded add would change x, not add robustness-zeros past y's end.
    r, n, extra = rng(1), 1000, 7
    x, y = randn(r, n + extra), randn(r, n + extra)
    bx, by = gpu.upload(x), gpu.upload(y)
    gpu.run("add", {0: ELEMENTWISE}, (bx, by), (groups(n, ELEMENTWISE), 1, 1), push(n))
    got = gpu.read(bx)
    # One IEEE f32 add per element: bit-exact against numpy's f32 add.
    np.testing.assert_array_equal(got[:n], x[:n] + y[:n])
    np.testing.assert_array_equal(got[n:], x[n:])


def test_bias_add_rows_exact_and_bounded(gpu):
    # width 70: two workgroups per row, the second mostly past the row end; x holds 2 rows
    # past n_tokens that must keep their values (the `t < n_tokens` bound), and the grid's
    # y is one larger than n_tokens, as `spread` may make it past maxComputeWorkGroupCount.
    r, width, n_tokens, rows = rng(9), 70, 3, 5
    x, b = randn(r, rows, width), randn(r, width)
    bx, bb = gpu.upload(x), gpu.upload(b)
    gpu.run("bias_add", {0: ELEMENTWISE}, (bx, bb), (groups(width, ELEMENTWISE), n_tokens + 1, 1),
            push(width, n_tokens))
    got = gpu.read(bx).reshape(rows, width)
    # One IEEE f32 add per element: bit-exact against numpy's f32 add.
    np.testing.assert_array_equal(got[:n_tokens], x[:n_tokens] + b)
    np.testing.assert_array_equal(got[n_tokens:], x[n_tokens:])


def test_silu_mul(gpu):
    r, n = rng(2), 1001
    g, u = randn(r, n) * 4, randn(r, n)
    bg, bu, bo = gpu.upload(g), gpu.upload(u), gpu.filled(n + 5)
    gpu.run("silu_mul", {0: ELEMENTWISE}, (bg, bu, bo), (groups(n, ELEMENTWISE), 1, 1), push(n))
    got = gpu.read(bo)
    g64 = g.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * u
    # exp, an add of two positives, a divide and a multiply: no cancellation, so the error
    # stays relative (Vulkan allows exp 3 + 2|x| ulp). Measured max relative error 3.6e-7
    # (6 ulp); bound 1e-6 with no absolute slack.
    np.testing.assert_allclose(got[:n], want, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got[n:], SENTINEL)

def test_gelu_mul(gpu):
    """Specialization constant GELU: torch's gelu(approximate="tanh") (Gemma's GeGLU), in
    float64 with torch's formula."""
    r, n = rng(3), 1001
    g, u = randn(r, n) * 4, randn(r, n)
    g[:5] = [0.0, 1e-4, -1e-4, 30.0, -30.0]     # the cancellation near 0, saturation
    bg, bu, bo = gpu.upload(g), gpu.upload(u), gpu.filled(n + 5)
    gpu.run("silu_mul", {0: ELEMENTWISE, 1: 1}, (bg, bu, bo), (groups(n, ELEMENTWISE), 1, 1),
            push(n))
    got = gpu.read(bo)
    g64 = g.astype(np.float64)
    want = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64 ** 3))) * u
    # tanh as 1 - 2 / (exp(2x) + 1): an absolute error of a few ulp of 1 in tanh (exp's
    # 3 + 2|x| ulp are relative to a term that then saturates), times 0.5 |g u|; the rest
    # relative. Bound: 1e-6 relative plus 1e-6 * 0.5 |g u|.
    err = np.abs(got[:n] - want)
    bound = 1e-6 * np.abs(want) + 1e-6 * 0.5 * np.abs(g64 * u)
    assert np.all(err <= bound), np.max(err / bound)
    np.testing.assert_array_equal(got[n:], SENTINEL)


def test_scale_in_place(gpu):
    r, n, sc = rng(4), 1001, float(np.float32(np.sqrt(96)))
    x = randn(r, n)
    bx = gpu.upload(np.concatenate([x, np.full(5, SENTINEL, np.float32)]))
    gpu.run("scale", {0: ELEMENTWISE}, (bx,), (groups(n, ELEMENTWISE), 1, 1), push(n, sc))
    got = gpu.read(bx)
    np.testing.assert_array_equal(got[:n], x * np.float32(sc))   # one f32 rounding, as torch
    np.testing.assert_array_equal(got[n:], SENTINEL)


def test_embed_gathers_rows(gpu):
    # n_embd = 70: two workgroups per token, the second mostly past the row end.
    r, n_vocab, n_embd = rng(3), 37, 70
    table = randn(r, n_vocab, n_embd)
    ids = np.array([5, 0, 36, 5, 17], np.uint32)  # a repeat, the first and the last row
    bt, bi, bo = gpu.upload(table), gpu.upload(ids), gpu.filled(len(ids) * n_embd + 3)
    gpu.run("embed_f32", {0: ELEMENTWISE}, (bt, bi, bo), (groups(n_embd, ELEMENTWISE), len(ids), 1),
            push(n_embd))
    got = gpu.read(bo)
    np.testing.assert_array_equal(got[:-3].reshape(len(ids), n_embd), table[ids])
    np.testing.assert_array_equal(got[-3:], SENTINEL)


def test_copy_rows_into_larger_buffer(gpu):
    r, width, n_tokens, rows, dst_row = rng(4), 70, 3, 9, 4
    src = randn(r, n_tokens, width)
    bs, bd = gpu.upload(src), gpu.filled(rows * width)
    gpu.run("copy_rows", {0: ELEMENTWISE}, (bs, bd), (groups(width, ELEMENTWISE), n_tokens, 1),
            push(width, dst_row))
    got = gpu.read(bd).reshape(rows, width)
    want = np.full((rows, width), SENTINEL)
    want[dst_row:dst_row + n_tokens] = src
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("neox", [False, True], ids=["adjacent", "halves"])
@pytest.mark.parametrize("n_heads,head_dim,n_tokens,pos0,dst_row,rows", [
    (3, 16, 4, 7, 5, 12),    # Q-like: rotated rows land at dst_row in a larger buffer
    (2, 32, 1, 30, 30, 33),  # decode step writing K straight into a cache row
])
def test_rope_pairs(gpu, n_heads, head_dim, n_tokens, pos0, dst_row, rows, neox):
    """Adjacent pairs (2i, 2i + 1) of each head (`llama` files), or halves (i, i + D/2) with
    specialization constant NEOX (`qwen2`, `qwen3` files, transformers' rotate_half)."""
    r = rng(5)
    x = randn(r, n_tokens, n_heads, head_dim)
    table = rope_table(head_dim, 10000.0, pos0 + n_tokens)   # [positions, head_dim/2, (cos, sin)]
    pairs = n_heads * head_dim // 2
    bx, bf, bd = gpu.upload(x), gpu.upload(table), gpu.filled(rows * n_heads * head_dim)
    gpu.run("rope", {0: ELEMENTWISE, 1: int(neox)}, (bx, bf, bd),
            (groups(pairs, ELEMENTWISE), n_tokens, 1), push(n_heads, head_dim, pos0, dst_row))
    got = gpu.read(bd).reshape(rows, n_heads, head_dim)

    # Rotation in float64 with the table's f32 (cos, sin) of each position.
    cos = table[pos0:pos0 + n_tokens, None, :, 0].astype(np.float64)   # [T, 1, D/2]
    sin = table[pos0:pos0 + n_tokens, None, :, 1].astype(np.float64)
    h = head_dim // 2
    first, second = (np.s_[..., :h], np.s_[..., h:]) if neox else (np.s_[..., 0::2],
                                                                    np.s_[..., 1::2])
    x0, x1 = x[first].astype(np.float64), x[second].astype(np.float64)
    want = np.empty((n_tokens, n_heads, head_dim))
    want[first] = x0 * cos - x1 * sin
    want[second] = x0 * sin + x1 * cos
    # Two f32 products and a sum that may cancel: absolute bound for |x| < ~4 of a few f32
    # ulps of 4 (4.8e-7 each); bound 1e-6.
    np.testing.assert_allclose(got[dst_row:dst_row + n_tokens], want, rtol=0, atol=1e-6)
    untouched = np.ones(rows, bool)
    untouched[dst_row:dst_row + n_tokens] = False
    np.testing.assert_array_equal(got[untouched], SENTINEL)


# -- reductions ----------------------------------------------------------------------------
@pytest.mark.parametrize("subgroups", [1, 4], ids=["one-subgroup", "four-subgroups"])
def test_rmsnorm_rows(gpu, subgroups):
    r, n_tokens, n, eps = rng(6), 5, 333, 1e-5
    x = randn(r, n_tokens, n) * np.float32(3)
    x[2] *= np.float32(1e-3)  # a row whose mean square is near eps: eps must matter
    w = randn(r, n)
    bx, bw, bo = gpu.upload(x), gpu.upload(w), gpu.filled(n_tokens * n + 4)
    gpu.run("rmsnorm", {0: gpu.sg * subgroups}, (bx, bw, bo), (n_tokens, 1, 1),
            push(n, eps, n_tokens))
    got = gpu.read(bo)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 ** 2, axis=1, keepdims=True) + eps) * w
    # The mean square is an fp32 sum of 333 positive terms (no cancellation), then 1/sqrt
    # and two multiplies: every output is off by a few ulp relative to itself. Measured max
    # relative error 2.0e-7; bound 1e-6 with no absolute slack.
    np.testing.assert_allclose(got[:-4].reshape(n_tokens, n), want, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got[-4:], SENTINEL)


@pytest.mark.parametrize("subgroups", [1, 4], ids=["one-subgroup", "four-subgroups"])
def test_rmsnorm_add(gpu, subgroups):
    """y += rmsnorm(x) * w per row (Gemma's post-norms into the residual): the rmsnorm
    outputs of test_rmsnorm_rows, each added to y with one more rounding."""
    r, n_tokens, n, eps = rng(8), 5, 333, 1e-6
    x = randn(r, n_tokens, n) * np.float32(3)
    x[3] *= np.float32(1e25)   # squares past the f32 range: rmsnorm.comp's scaling
    w, y0 = randn(r, n), randn(r, n_tokens, n) * np.float32(4)
    bx, bw = gpu.upload(x), gpu.upload(w)
    by = gpu.upload(np.concatenate([y0.reshape(-1), np.full(4, SENTINEL, np.float32)]))
    gpu.run("rmsnorm_add", {0: gpu.sg * subgroups}, (bx, bw, by), (n_tokens, 1, 1),
            push(n, eps, n_tokens))
    got = gpu.read(by)
    x64 = x.astype(np.float64)
    normed = x64 / np.sqrt(np.mean(x64 ** 2, axis=1, keepdims=True) + eps) * w
    # the norm's bound (1e-6 of each normed value) plus the add's rounding of the sum
    err = np.abs(got[:-4].reshape(n_tokens, n) - (y0 + normed))
    assert np.all(err <= 1e-6 * np.abs(normed) + 6e-8 * np.abs(y0 + normed)), err.max()
    np.testing.assert_array_equal(got[-4:], SENTINEL)


@pytest.mark.parametrize("subgroups", [1, 4], ids=["one-subgroup", "four-subgroups"])
def test_add_rmsnorm_is_add_then_rmsnorm(gpu, subgroups):
    """x += r, out = rmsnorm(x) * w in one dispatch (the batched step's residual add and the
    next norm): x and out bit for bit `add` then `rmsnorm` on the same device (an overflowing
    row included), and the sum and the norm against float64 within rmsnorm's bound."""
    r, n_tokens, n, eps = rng(9), 5, 333, 1e-5
    x0 = randn(r, n_tokens, n) * np.float32(3)
    res = randn(r, n_tokens, n)
    x0[3] *= np.float32(1e25)  # squares past the f32 range: rmsnorm.comp's scaling
    w = randn(r, n)
    tail = np.full(4, SENTINEL, np.float32)
    bx, br, bw = gpu.upload(np.concatenate([x0.reshape(-1), tail])), gpu.upload(res), gpu.upload(w)
    bo = gpu.filled(n_tokens * n + 4)
    norm = {0: gpu.sg * subgroups}
    gpu.run("add_rmsnorm", norm, (bx, bw, bo, br), (n_tokens, 1, 1), push(n, eps, n_tokens))
    got_x, got = gpu.read(bx), gpu.read(bo)
    # the two dispatches it replaces, on a copy of x
    cx = gpu.upload(x0)
    cr, co = gpu.upload(res), gpu.filled(n_tokens * n + 4)
    gpu.run("add", {0: ELEMENTWISE}, (cx, cr), (groups(n_tokens * n, ELEMENTWISE), 1, 1),
            push(n_tokens * n))
    gpu.run("rmsnorm", norm, (cx, bw, co), (n_tokens, 1, 1), push(n, eps, n_tokens))
    np.testing.assert_array_equal(got_x[:-4], gpu.read(cx))
    np.testing.assert_array_equal(got_x[-4:], SENTINEL)
    np.testing.assert_array_equal(got, gpu.read(co))
    np.testing.assert_array_equal(got[-4:], SENTINEL)
    np.testing.assert_array_equal(got_x[:-4].reshape(n_tokens, n), x0 + res)  # one f32 add
    s64 = (x0 + res).astype(np.float64)
    want = s64 / np.sqrt(np.mean(s64 ** 2, axis=1, keepdims=True) + eps) * w
    np.testing.assert_allclose(got[:-4].reshape(n_tokens, n), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("subgroups", [1, 4], ids=["one-subgroup", "four-subgroups"])
def test_matvec_with_x_offset(gpu, subgroups):
    # n_cols = 260: 65 vec4 per row, not a multiple of the workgroup; x is row 2 of 3.
    r, n_rows, n_cols, x_row = rng(7), 37, 260, 2
    w, x = randn(r, n_rows, n_cols), randn(r, 3, n_cols)
    bw, bx, by = gpu.upload(w), gpu.upload(x), gpu.filled(n_rows + 3)
    gpu.run("matvec_f32", {0: gpu.sg * subgroups}, (bw, bx, by), (n_rows, 1, 1),
            push(n_cols, x_row * n_cols, n_rows))
    got = gpu.read(by)
    terms = w.astype(np.float64) * x[x_row].astype(np.float64)
    # fp32 dot products of K = 260 terms in the shader's order (vec4 dots, strided partial
    # sums, subgroup tree): the error relative to sum|w*x| is ~sqrt(K) * 2^-24 = 1e-6 in the
    # worst random case and 2^-24 = 6e-8 typical. Measured 1.7e-8 (one subgroup) and 2.6e-8
    # (four); bound 2e-7. A wrong row, column or offset is off by ~1 in these units.
    assert rel_err(got[:n_rows], terms.sum(1), np.abs(terms).sum(1)) < 2e-7
    np.testing.assert_array_equal(got[n_rows:], SENTINEL)


@pytest.mark.parametrize("rows", [2, 3, 4])
def test_matvec_rows_per_workgroup(gpu, rows):
    # ROWS subgroups per workgroup, a row each (the logits on a GPU): 37 rows leave the last
    # workgroup partial (its subgroups past the rows return); 260 columns as above.
    r, n_rows, n_cols = rng(34), 37, 260
    w, x = randn(r, n_rows, n_cols), randn(r, n_cols)
    bw, bx, by = gpu.upload(w), gpu.upload(x), gpu.filled(n_rows + 3)
    gpu.run("matvec_f32", {0: gpu.sg * rows, 1: rows}, (bw, bx, by),
            (groups(n_rows, rows), 1, 1), push(n_cols, 0, n_rows))
    got = gpu.read(by)
    terms = w.astype(np.float64) * x.astype(np.float64)
    assert rel_err(got[:n_rows], terms.sum(1), np.abs(terms).sum(1)) < 2e-7
    np.testing.assert_array_equal(got[n_rows:], SENTINEL)


def test_decode_launch_reads_the_columns(gpu):
    """Kernels.decode_launch looks the table's rule up by the product's columns too: the GPU
    table's Q4_1 rule for many columns (a 7B ffn_down, vkrt/tuning.py) runs 8 subgroups,
    the same rows of fewer columns 4."""
    kernels = Kernels(gpu.cache, tuning=tuning.GPU)
    for n_cols, subgroups in ((8192, 8), (4096, 4)):
        w = upload_weight(gpu, "q4_1", np.zeros(2048 * n_cols // 32 * 20, np.uint8),
                          (2048, n_cols))
        assert kernels.decode_launch("matvec_add", w, 2048)[0] == subgroups * gpu.sg


def test_linear_many_rows_per_workgroup(gpu):
    """Kernels.linear over many rows with the GPU table (vkrt/tuning.py: past 8192 rows, 4
    rows per workgroup): the grid counts workgroups of 4 rows and every row is computed."""
    kernels = Kernels(gpu.cache, tuning=tuning.GPU)
    r, n_rows, n_cols = rng(35), 8192 + 3, 32
    w, x = randn(r, n_rows, n_cols), randn(r, n_cols)
    bw, bx, by = gpu.upload(w), gpu.upload(x), gpu.filled(n_rows + 3)
    d = kernels.linear(bx, bw, by, 1)
    assert kernels.decode_launch("matvec", bw, n_rows)[1] == 4
    assert d.grid[0] * d.grid[1] == -(-n_rows // 4)
    gpu.stream.record([d])
    got = gpu.read(by)
    terms = w.astype(np.float64) * x.astype(np.float64)
    assert rel_err(got[:n_rows], terms.sum(1), np.abs(terms).sum(1)) < 2e-7
    np.testing.assert_array_equal(got[n_rows:], SENTINEL)


@pytest.mark.parametrize("subgroups,tokens,tokens_key", [(1, 8, 1), (4, 3, "TOKENS")],
                         ids=["one-subgroup-tokens8", "four-subgroups-tokens3-by-name"])
def test_matmul_partial_token_tile(gpu, subgroups, tokens, tokens_key):
    # n_tokens = 11: the last tile of 8 (or of 3) is partial; rows past n_tokens must not be
    # stored (a sentinel tail follows y). n_rows = 37 divides nothing. The second case names
    # the TOKENS constant instead of giving its id.
    spec = {0: gpu.sg * subgroups, tokens_key: tokens}
    r, n_tokens, n_rows, n_cols = rng(8), 11, 37, 260
    w, x = randn(r, n_rows, n_cols), randn(r, n_tokens, n_cols)
    bw, bx, by = gpu.upload(w), gpu.upload(x), gpu.filled(n_tokens * n_rows + 5)
    gpu.run("matmul_f32", spec, (bw, bx, by), (n_rows, groups(n_tokens, tokens), 1),
            push(n_cols, n_rows, n_tokens))
    got = gpu.read(by)
    terms = x.astype(np.float64)[:, None, :] * w.astype(np.float64)[None, :, :]  # [T, N, K]
    # Same reasoning and bound as matvec: measured 4.6e-8 (TOKENS 8, one subgroup) and
    # 2.9e-8 (TOKENS 3, four subgroups) relative to sum|x*w|.
    assert rel_err(got[:-5].reshape(n_tokens, n_rows), terms.sum(2), np.abs(terms).sum(2)) < 2e-7
    np.testing.assert_array_equal(got[-5:], SENTINEL)


# Workgroup sizes in units of the device's subgroup size (8 on lavapipe): half a subgroup
# (one partial subgroup), 1, 2, 3 (not a power of two), 1.5 (the last subgroup partial) and
# 8 subgroups, then 16 and 12.5 (past reduce.glsl's REDUCE_SERIAL partials, which subgroup 0
# reduces; the last subgroup partial). reduce.glsl combines several subgroups through shared
# memory, so each size runs a different path; the kernels must not assume one subgroup per
# workgroup, nor a power-of-two workgroup.
WORKGROUPS = {"half-subgroup": 0.5, "1-subgroup": 1, "2-subgroups": 2, "3-subgroups": 3,
              "1.5-subgroups": 1.5, "8-subgroups": 8, "16-subgroups": 16,
              "12.5-subgroups": 12.5}


def workgroup(gpu, subgroups: float) -> int:
    return max(1, int(gpu.sg * subgroups))


@pytest.mark.parametrize("n", [3, 77, 1000],
                         ids=["row-shorter-than-a-subgroup", "row-77", "row-1000"])
@pytest.mark.parametrize("subgroups", WORKGROUPS.values(), ids=WORKGROUPS.keys())
def test_rmsnorm_any_workgroup(gpu, subgroups, n):
    r, n_tokens, eps = rng(30), 3, 1e-5
    x, w = randn(r, n_tokens, n) * np.float32(3), randn(r, n)
    bx, bw, bo = gpu.upload(x), gpu.upload(w), gpu.filled(n_tokens * n + 4)
    gpu.run("rmsnorm", {0: workgroup(gpu, subgroups)}, (bx, bw, bo), (n_tokens, 1, 1),
            push(n, eps, n_tokens))
    got = gpu.read(bo)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 ** 2, axis=1, keepdims=True) + eps) * w
    # As test_rmsnorm_rows: a sum of positive terms, relative error of a few ulp.
    np.testing.assert_allclose(got[:-4].reshape(n_tokens, n), want, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got[-4:], SENTINEL)


@pytest.mark.parametrize("subgroups", [1, 4], ids=["one-subgroup", "four-subgroups"])
def test_rmsnorm_past_the_f32_range_of_squares(gpu, subgroups):
    """Rows whose squares overflow f32 (|x| from 1e20 up to near FLT_MAX, where x * x is inf)
    are normed as finite rows are: the kernel scales the row by a power of two first. A
    row of ordinary size beside them keeps the plain path."""
    r, n, eps = rng(33), 333, 1e-5
    x = randn(r, 4, n)
    for row, scale in ((0, 1e20), (1, 1e30), (2, 1e38)):
        x[row] *= np.float32(scale)
    x[2, 7] = np.float32(3.3e38)                     # near FLT_MAX: its square is inf
    w = randn(r, n)
    bx, bw, bo = gpu.upload(x), gpu.upload(w), gpu.filled(4 * n + 4)
    gpu.run("rmsnorm", {0: gpu.sg * subgroups}, (bx, bw, bo), (4, 1, 1), push(n, eps, 4))
    got = gpu.read(bo)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 ** 2, axis=1, keepdims=True) + eps) * w
    # As test_rmsnorm_rows: the power-of-two scaling is exact, so the same few ulp.
    np.testing.assert_allclose(got[:-4].reshape(4, n), want, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got[-4:], SENTINEL)


@pytest.mark.parametrize("n_cols", [4, 20, 260], ids=["1-vec4", "5-vec4", "65-vec4"])
@pytest.mark.parametrize("subgroups", WORKGROUPS.values(), ids=WORKGROUPS.keys())
def test_matvec_any_workgroup(gpu, subgroups, n_cols):
    # 1 and 5 vec4 per row: fewer than one subgroup's lanes hold data.
    r, n_rows = rng(31), 5
    w, x = randn(r, n_rows, n_cols), randn(r, n_cols)
    bw, bx, by = gpu.upload(w), gpu.upload(x), gpu.filled(n_rows + 3)
    gpu.run("matvec_f32", {0: workgroup(gpu, subgroups)}, (bw, bx, by), (n_rows, 1, 1),
            push(n_cols, 0, n_rows))
    got = gpu.read(by)
    terms = w.astype(np.float64) * x.astype(np.float64)
    # As test_matvec_with_x_offset (bound 2e-7 relative to sum|w*x|).
    assert rel_err(got[:n_rows], terms.sum(1), np.abs(terms).sum(1)) < 2e-7
    np.testing.assert_array_equal(got[n_rows:], SENTINEL)


@pytest.mark.parametrize("n_cols", [4, 260], ids=["1-vec4", "65-vec4"])
@pytest.mark.parametrize("subgroups", WORKGROUPS.values(), ids=WORKGROUPS.keys())
def test_matmul_any_workgroup(gpu, subgroups, n_cols):
    r, n_tokens, n_rows, tokens = rng(32), 5, 3, 4
    w, x = randn(r, n_rows, n_cols), randn(r, n_tokens, n_cols)
    bw, bx, by = gpu.upload(w), gpu.upload(x), gpu.filled(n_tokens * n_rows + 5)
    gpu.run("matmul_f32", {0: workgroup(gpu, subgroups), 1: tokens}, (bw, bx, by),
            (n_rows, groups(n_tokens, tokens), 1), push(n_cols, n_rows, n_tokens))
    got = gpu.read(by)
    terms = x.astype(np.float64)[:, None, :] * w.astype(np.float64)[None, :, :]
    assert rel_err(got[:-5].reshape(n_tokens, n_rows), terms.sum(2), np.abs(terms).sum(2)) < 2e-7
    np.testing.assert_array_equal(got[-5:], SENTINEL)


# matmul_tiled with tiles of every shape its constants allow: 1 invocation (4 x 4), 6 (8 rows
# x 12 tokens), the GPU's 128 (32 x 64); 11 tokens and 37 rows divide no tile; 260 columns
# (65 vec4) leave the last 32-column step one vec4 wide, 96 are three whole steps.
@pytest.mark.parametrize("n_cols", [96, 260])
@pytest.mark.parametrize("rows,tokens", [(4, 4), (8, 12), (32, 64)],
                         ids=["4x4", "8x12", "32x64"])
def test_matmul_tiled_any_tile(gpu, rows, tokens, n_cols):
    r, n_tokens, n_rows = rng(33), 11, 37
    w, x = randn(r, n_rows, n_cols), randn(r, n_tokens, n_cols)
    bw, bx, by = gpu.upload(w), gpu.upload(x), gpu.filled(n_tokens * n_rows + 5)
    gpu.run("matmul_tiled_f32", {0: rows * tokens // 16, 1: rows, 2: tokens}, (bw, bx, by),
            (groups(n_rows, rows), groups(n_tokens, tokens), 1), push(n_cols, n_rows, n_tokens))
    got = gpu.read(by)
    terms = x.astype(np.float64)[:, None, :] * w.astype(np.float64)[None, :, :]
    # A blocked sum (32 columns, then the blocks): each rounding is 2^-24 of a partial sum,
    # so about 2^-24 of sum|terms| in all, as matmul's strided sums; bound as matmul's, 2e-7.
    assert rel_err(got[:-5].reshape(n_tokens, n_rows), terms.sum(2), np.abs(terms).sum(2)) < 2e-7
    np.testing.assert_array_equal(got[-5:], SENTINEL)


def attention_reference(q, k_cache, v_cache, pos0, scale, window=0):
    """Causal softmax attention with grouped-query heads, float64; `window` > 0: each query
    sees its last `window` positions only.
    q: [T, H, D]; k_cache, v_cache: [n_ctx, H_kv, D] -> [T, H, D]."""
    n_tokens, n_heads, _ = q.shape
    group = n_heads // k_cache.shape[1]
    out = np.zeros(q.shape)
    for t in range(n_tokens):
        last = pos0 + t
        first = max(0, last + 1 - window) if window else 0
        for h in range(n_heads):
            k = k_cache[first:last + 1, h // group].astype(np.float64)  # [S, D]
            v = v_cache[first:last + 1, h // group].astype(np.float64)
            s = k @ q[t, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h] = p @ v / p.sum()
    return out


def causal_case(r, n_tokens, pos0, head_dim, q_scale, n_heads=6, n_kv_heads=2):
    """(q [T, H, D] times q_scale, k_cache, v_cache [pos0 + T + 6, H_kv, D]) of standard
    normals. Positions after the last query must never be read: they hold NaN, which poisons
    any output that touches them (score or value)."""
    n_ctx = pos0 + n_tokens + 6
    q = randn(r, n_tokens, n_heads, head_dim) * np.float32(q_scale)
    k_cache = randn(r, n_ctx, n_kv_heads, head_dim)
    v_cache = randn(r, n_ctx, n_kv_heads, head_dim)
    k_cache[pos0 + n_tokens:] = np.nan
    v_cache[pos0 + n_tokens:] = np.nan
    return q, k_cache, v_cache


# atol: scores are fp32 dots of head_dim terms, exp and the online rescaling add a few ulp
# per block, and the output is a convex combination of values ~N(0, 1). Score errors are
# relative to |q|.|k|, so the bound grows with q_scale. Measured max abs error: 3.1e-7,
# 3.3e-7, 1.5e-7 at q_scale 1 (bound 1e-6); 3.6e-6 at q_scale 30 (bound 1e-5).
@pytest.mark.parametrize("head_dim,n_tokens,pos0,q_scale,atol", [
    (16, 5, 37, 1.0, 1e-6),    # positions 37..41: three blocks of 16, the last partial
    (32, 7, 0, 1.0, 1e-6),     # prefill from position 0; token 6 sees 7 positions
    (32, 1, 70, 1.0, 1e-6),    # decode: 71 positions, blocks 0-31, 32-63, 64-70
    (16, 3, 40, 30.0, 1e-5),   # scores of +-100s: exp overflows f32 unless each block's
                               # max is subtracted (the online softmax's stability)
], ids=["hd16-3blocks", "hd32-prefill", "hd32-decode", "hd16-large-scores"])
def test_attention_gqa_causal(gpu, head_dim, n_tokens, pos0, q_scale, atol):
    n_heads, n_kv_heads = 6, 2
    q, k_cache, v_cache = causal_case(rng(9), n_tokens, pos0, head_dim, q_scale)
    scale = 1.0 / np.sqrt(head_dim)
    bq, bk, bv = gpu.upload(q), gpu.upload(k_cache), gpu.upload(v_cache)
    bo = gpu.filled(q.size + 3)
    gpu.run("attention", {0: head_dim}, (bq, bk, bv, bo), (n_heads, n_tokens, 1),
            push(n_heads, n_kv_heads, head_dim, pos0, float(scale)))
    got = gpu.read(bo)
    want = attention_reference(q, k_cache, v_cache, pos0, float(np.float32(scale)))
    np.testing.assert_allclose(got[:-3].reshape(q.shape), want, rtol=0, atol=atol)
    np.testing.assert_array_equal(got[-3:], SENTINEL)


# attention_tile.comp's tiles: queries per workgroup (a partial last tile of queries), lanes
# per query (1 to 8: the shuffle tree), positions per staged tile (a partial last tile of
# positions, and tiles longer than the history); bound and NaN tail as
# test_attention_gqa_causal (measured max abs error below 4e-7 at q_scale 1).
@pytest.mark.parametrize("tile", [(1, 1, 1), (3, 2, 4), (4, 4, 8), (8, 8, 16), (32, 4, 32)],
                         ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("head_dim,n_tokens,pos0,q_scale,atol", [
    (32, 7, 0, 1.0, 1e-6),     # prefill from position 0
    (32, 13, 45, 1.0, 1e-6),   # a chunk after 45 cached positions
    (16, 5, 40, 30.0, 1e-5),   # large scores: each tile's max subtracted
], ids=["hd32-prefill", "hd32-chunk", "hd16-large-scores"])
def test_attention_tiles(gpu, tile, head_dim, n_tokens, pos0, q_scale, atol):
    q, k_cache, v_cache = causal_case(rng(29), n_tokens, pos0, head_dim, q_scale)
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))
    got = run_attention_tiles(gpu, q, k_cache, v_cache, pos0, scale, tile=tile)
    want = attention_reference(q, k_cache, v_cache, pos0, scale)
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)


def test_attention_tile_shape():
    """kernels.attention_tile_shape: LQ a power of two dividing head_dim / 4 within the
    subgroup, QT halved until QT * LQ invocations fit the device's limit, KT halved until K
    and V fit shared memory."""
    from vkrt.kernels import attention_tile_shape

    assert attention_tile_shape(128, 32, 49152, (32, 4, 32)) == (32, 4, 32)
    assert attention_tile_shape(128, 32, 16383, (32, 4, 32)) == (32, 4, 8)
    assert attention_tile_shape(24, 32, 49152, (16, 8, 32)) == (16, 2, 32)
    assert attention_tile_shape(64, 2, 49152, (16, 8, 32)) == (16, 2, 32)
    assert attention_tile_shape(4, 32, 49152, (16, 8, 32)) == (16, 1, 32)
    # The GPU table's 128 x 2 on a device of the spec's least limit, 128 invocations.
    assert attention_tile_shape(128, 32, 49152, (128, 2, 32), 256) == (128, 2, 32)
    assert attention_tile_shape(128, 32, 49152, (128, 2, 32), 128) == (64, 2, 32)
    assert attention_tile_shape(128, 32, 49152, (128, 4, 32), 100) == (16, 4, 32)


F32_MAX = float(np.finfo(np.float32).max)


def safe_attention_reference(q, k_cache, v_cache, pos0, scale):
    """`attention_reference` for scores that may be infinite, float64. A score is
    scale * q . k in float64, made +-inf where it leaves the f32 range (the kernel's scores
    are f32). Weights: -inf weighs 0; if any score is +inf, the +inf scores share the weight
    equally (softmax's limit as they grow); a row of only -inf gives zeros."""
    n_tokens, n_heads, _ = q.shape
    group = n_heads // k_cache.shape[1]
    out = np.zeros(q.shape)
    with np.errstate(invalid="raise", over="ignore"):
        for t in range(n_tokens):
            last = pos0 + t
            for h in range(n_heads):
                k = k_cache[:last + 1, h // group].astype(np.float64)
                v = v_cache[:last + 1, h // group].astype(np.float64)
                s = (k * q[t, h].astype(np.float64)).sum(1) * scale
                s[s > F32_MAX], s[s < -F32_MAX] = np.inf, -np.inf
                if np.isposinf(s).any():
                    w = np.isposinf(s).astype(np.float64)
                elif np.isneginf(s).all():
                    continue
                else:
                    w = np.exp(s - s.max())
                out[t, h] = w @ v / w.sum()
    return out


# The four attention kernels: prefill's one pass over every query token (one workgroup per
# head and token, or on tiles of query tokens), and each token as a decode step, split over
# the cache and merged or in one workgroup per head.
ATTENTION_MODES = ["one-pass", "tiles", "split", "decode"]
# attention_tile.comp's (QT queries, LQ lanes at most, KT positions per tile) in the "tiles"
# mode: small, so that the tests' few tokens and positions span several of each.
TEST_TILE = (2, 4, 8)


def kv_suffix(k_cache) -> str:
    """The variant suffix of the attention kernels that read caches of k_cache's dtype:
    "_kvf16" for float16 (vkrt/glsl/kv.glsl), "" for float32."""
    return "_kvf16" if k_cache.dtype == np.float16 else ""


def run_attention(gpu, q, k_cache, v_cache, pos0, scale, mode="one-pass", window=0):
    """attention.comp on q [T, H, D], caches [n_ctx, H_kv, D] (float32, or float16: the
    `_kvf16` variants); returns [T, H, D] and checks the sentinel tail after the output.
    `mode` "split" or "decode": each token as a decode step instead, through
    attention_split.comp + attention_combine.comp (`run_attention_decode`) or
    attention_decode.comp (`run_attention_one_dispatch`). `window`: specialization constant
    WINDOW (a sliding-window layer)."""
    if mode == "tiles":
        return run_attention_tiles(gpu, q, k_cache, v_cache, pos0, scale, window)
    if mode != "one-pass":
        run = run_attention_decode if mode == "split" else run_attention_one_dispatch
        return np.stack([run(gpu, q[t], k_cache, v_cache, pos0 + t, scale, window=window)
                         for t in range(q.shape[0])])
    n_tokens, n_heads, head_dim = q.shape
    bq, bk, bv = gpu.upload(q), gpu.upload(k_cache), gpu.upload(v_cache)
    bo = gpu.filled(q.size + 3)
    gpu.run("attention" + kv_suffix(k_cache), {0: head_dim, 1: window}, (bq, bk, bv, bo), (n_heads, n_tokens, 1),
            push(n_heads, k_cache.shape[1], head_dim, pos0, float(scale)))
    got = gpu.read(bo)
    np.testing.assert_array_equal(got[-3:], SENTINEL)
    return got[:-3].reshape(q.shape)


def run_attention_tiles(gpu, q, k_cache, v_cache, pos0, scale, window=0, tile=TEST_TILE):
    """attention_tile.comp on q [T, H, D] (as `run_attention`), for the table-like `tile`
    (QT, LQ, KT) fitted to the device by kernels.attention_tile_shape; returns [T, H, D]."""
    from vkrt.kernels import attention_tile_shape

    n_tokens, n_heads, head_dim = q.shape
    qt, lq, kt = attention_tile_shape(head_dim, gpu.sg,
                                      gpu.device.limits.maxComputeSharedMemorySize, tile)
    bq, bk, bv = gpu.upload(q), gpu.upload(k_cache), gpu.upload(v_cache)
    bo = gpu.filled(q.size + 3)
    gpu.run("attention_tile" + kv_suffix(k_cache),
            {0: qt * lq, 1: window, 2: head_dim, 3: qt, 4: kt}, (bq, bk, bv, bo),
            (n_heads, -(-n_tokens // qt), 1),
            push(n_heads, k_cache.shape[1], head_dim, pos0, n_tokens, float(scale)))
    got = gpu.read(bo)
    np.testing.assert_array_equal(got[-3:], SENTINEL)
    return got[:-3].reshape(q.shape)


def run_attention_decode(gpu, q, k_cache, v_cache, pos0, scale, window=0, lanes=None,
                         threads=256, pos_buffer=None):
    """One query q [H, D] at position pos0 (plus `pos_buffer`, the replay variant's u32):
    the split kernel, one workgroup per KV head and split of `attention_chunk` positions
    (the model's choice), a workgroup of at most `threads` invocations (kernels.split_shape),
    `lanes` invocations scoring each position (the model's choice, `split_score_lanes`, when
    None), then the combine; [H, D]."""
    from vkrt.kernels import attention_chunk, split_shape

    n_heads, head_dim = q.shape
    n_kv_heads = k_cache.shape[1]
    size, model_lanes, planes = split_shape(head_dim, gpu.sg, threads)
    lanes = lanes or model_lanes
    # Replayed: the splits cover every row of the cache, those past the query empty.
    n_pos = pos0 + 1 if pos_buffer is None else k_cache.shape[0]
    chunk = attention_chunk(n_pos, size // lanes)
    splits = -(-n_pos // chunk)
    bq, bk, bv = gpu.upload(q), gpu.upload(k_cache), gpu.upload(v_cache)
    part, bo = gpu.filled(n_heads * splits * (head_dim + 2) + 3), gpu.filled(q.size + 3)
    name, bound = "attention_split", ()
    if pos_buffer is not None:
        name, bound = "attention_split_pos", (gpu.upload(np.array([pos_buffer], np.uint32)),)
    gpu.run(name + kv_suffix(k_cache),
            {0: size, 1: window, 2: lanes, 3: planes, 4: n_heads // n_kv_heads, 5: head_dim},
            (bq, bk, bv, part, *bound), (n_kv_heads, splits, 1),
            push(n_kv_heads, pos0, chunk, float(scale)))
    gpu.run("attention_combine", {0: head_dim}, (part, bo), (n_heads, 1, 1),
            push(head_dim, splits))
    got, partial = gpu.read(bo), gpu.read(part)
    np.testing.assert_array_equal(got[-3:], SENTINEL)
    np.testing.assert_array_equal(partial[-3:], SENTINEL)
    return got[:-3].reshape(q.shape)


def run_attention_one_dispatch(gpu, q, k_cache, v_cache, pos0, scale, threads=64,
                               max_positions=4096, pos_buffer=None, dim_splits=1, window=0):
    """One query q [H, D] at position pos0 (plus `pos_buffer`, the replay variant's u32)
    through attention_decode.comp, `threads` invocations per workgroup and `dim_splits`
    workgroups per head; [H, D]."""
    n_heads, head_dim = q.shape
    bq, bk, bv = gpu.upload(q), gpu.upload(k_cache), gpu.upload(v_cache)
    bo = gpu.filled(q.size + 3)
    spec = {0: threads, 1: head_dim, 2: max_positions, 3: dim_splits, 4: window}
    name, bound = "attention_decode", ()
    if pos_buffer is not None:
        name, bound = "attention_decode_pos", (gpu.upload(np.array([pos_buffer], np.uint32)),)
    name += kv_suffix(k_cache)
    gpu.run(name, spec, (bq, bk, bv, bo, *bound), (n_heads, dim_splits, 1),
            push(n_heads, k_cache.shape[1], pos0, float(scale)))
    got = gpu.read(bo)
    np.testing.assert_array_equal(got[-3:], SENTINEL)
    return got[:-3].reshape(q.shape)


# Decode attention in one workgroup per head: workgroups of one to several lanes of head_dim
# / 4 invocations (odd lane counts exercise the tree), positions fewer and more than the
# workgroup, the replay variant's position buffer. Bound as test_attention_gqa_causal.
@pytest.mark.parametrize("head_dim,pos0,threads,q_scale,atol", [
    (16, 0, 64, 1.0, 1e-6),       # one position
    (16, 37, 4, 1.0, 1e-6),       # one lane: the workgroup is one vec4 row
    (16, 37, 12, 1.0, 1e-6),      # three lanes (odd tree)
    (32, 300, 40, 1.0, 1e-6),     # five lanes, several positions per invocation
    (64, 1000, 64, 1.0, 1e-6),    # SmolLM2's head_dim
    (16, 500, 100, 1.0, 1e-6),    # 25 lanes; on lavapipe 12.5 subgroups (reduce.glsl's
                                  # subgroup-0 path, the last subgroup partial)
    (16, 500, 100, 300.0, 1e-5),  # ... scores ~ N(0, 300): a wrong maximum overflows exp
    (16, 40, 64, 30.0, 1e-5),     # large scores
], ids=["one-position", "one-lane", "three-lanes", "five-lanes", "hd64", "25-lanes",
        "25-lanes-large-scores", "large-scores"])
@pytest.mark.parametrize("use_pos", [False, True], ids=["pos0", "pos-buffer"])
@pytest.mark.parametrize("dim_splits", [1, 2, 4], ids=["1-workgroup", "2-workgroups",
                                                       "4-workgroups"])
def test_attention_decode_one_dispatch(gpu, head_dim, pos0, threads, q_scale, atol, use_pos,
                                       dim_splits):
    r, n_heads, n_kv_heads = rng(24), 6, 2
    q = randn(r, 1, n_heads, head_dim) * np.float32(q_scale)
    k_cache = randn(r, pos0 + 5, n_kv_heads, head_dim)
    v_cache = randn(r, pos0 + 5, n_kv_heads, head_dim)
    k_cache[pos0 + 1:] = np.nan         # never read past the query's position
    v_cache[pos0 + 1:] = np.nan
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))
    # The replay variant gets pos0 - 3 as its push constant and 3 from the buffer.
    shift = min(pos0, 3) if use_pos else None
    got = run_attention_one_dispatch(gpu, q[0], k_cache, v_cache, pos0 - (shift or 0), scale,
                                     threads, pos_buffer=shift, dim_splits=dim_splits)
    want = attention_reference(q, k_cache, v_cache, pos0, scale)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)


def test_attention_decode_size_fits_the_device(gpu):
    """The host's workgroup and position count (kernels._decode_attention_size) fit the
    device's limits and leave room for every shared array of attention_decode.comp."""
    from vkrt.kernels import DECODE_POSITIONS, _decode_attention_size

    limits = gpu.device.limits
    for head_dim, table in ((64, tuning.GPU), (64, tuning.CPU), (4, tuning.GPU),
                            (128, tuning.CPU)):
        threads, positions = _decode_attention_size(limits, head_dim, table.attention_threads)
        assert threads % (head_dim // 4) == 0
        assert threads <= limits.maxComputeWorkGroupInvocations
        assert 0 < positions <= DECODE_POSITIONS
        assert 4 * positions + 20 * threads + 4 * head_dim <= limits.maxComputeSharedMemorySize


@pytest.mark.parametrize("head_dim", [64, 128])
def test_attention_decode_chosen_within_its_positions(gpu, head_dim):
    """Kernels.attention runs one query token in one dispatch while its positions fit
    attention_decode's shared scores and the table's crossover for its head_dim
    (decode_positions), and splits it over the cache past that (the shader would index past
    its shared array)."""
    from vkrt.kernels import Kernels, _decode_attention_size, attention_partials

    k = Kernels(gpu.cache, head_dim=head_dim, tuning=tuning.GPU)   # its crossover by head_dim
    limit = k.decode_positions
    _, fit = _decode_attention_size(gpu.device.limits, head_dim, k.tuning.attention_threads)
    assert limit == min(fit, k.tuning.decode_positions(head_dim)) > 0
    n_ctx = limit + 1
    q, out = gpu.filled(9 * head_dim), gpu.filled(9 * head_dim)
    k_cache, v_cache = gpu.filled(n_ctx * 3 * head_dim), gpu.filled(n_ctx * 3 * head_dim)
    part = gpu.filled(attention_partials(9, head_dim))
    for pos0, kernels in ((limit - 1, ["attention_decode"]),
                          (limit, ["attention_split", "attention_combine"])):
        ds = k.attention(q, k_cache, v_cache, out, 1, 9, 3, head_dim, pos0, 0.125, part)
        assert [d.pipeline.name for d in ds] == kernels


def test_decode_attention_refuses_uneven_query_groups(gpu):
    """Kernels.attention at decode: query heads that do not divide among the KV heads
    (7 over 2) are a one-line ShaderInterfaceError naming both counts, not a split whose
    workgroups serve a group of 3 and leave a head unwritten."""
    from vkrt.kernels import attention_partials

    k = Kernels(gpu.cache, head_dim=64)
    q, out = gpu.filled(7 * 64), gpu.filled(7 * 64)
    k_cache, v_cache = gpu.filled(40 * 2 * 64), gpu.filled(40 * 2 * 64)
    part = gpu.filled(attention_partials(7, 64))
    with pytest.raises(ShaderInterfaceError, match="7 query heads do not share 2 KV heads"):
        k.attention(q, k_cache, v_cache, out, 1, 7, 2, 64, 30, 0.125, part)


def test_prefill_attention_follows_the_table(gpu):
    """Kernels.attention runs a prompt of several tokens on attention_tile.comp, one workgroup
    per head and tile of QT queries, where the table names tiles (both device classes' do),
    and on attention.comp, one per head and token, where it names none; the tile's
    specialization is the fitted shape."""
    from vkrt.kernels import attention_partials

    table = tuning.for_kind(gpu.device.info.kind)
    assert table.prefill_attention is not None
    q, out = gpu.filled(70 * 9 * 64), gpu.filled(70 * 9 * 64)
    k_cache, v_cache = gpu.filled(80 * 3 * 64), gpu.filled(80 * 3 * 64)
    part = gpu.filled(attention_partials(9, 64))
    k = Kernels(gpu.cache, head_dim=64)
    (d,) = k.attention(q, k_cache, v_cache, out, 70, 9, 3, 64, 5, 0.125, part)
    qt, lq, kt = k.attention_tile
    assert d.pipeline.name == "attention_tile"
    assert d.grid[0] == 9 and d.grid[1] * d.grid[2] >= -(-70 // qt)
    assert d.pipeline.local_size[0] == qt * lq
    k = Kernels(gpu.cache, head_dim=64,
                tuning=dataclasses.replace(table, prefill_attention=None))
    (d,) = k.attention(q, k_cache, v_cache, out, 70, 9, 3, 64, 5, 0.125, part)
    assert d.pipeline.name == "attention" and d.grid[0] == 9 and d.grid[1] * d.grid[2] >= 70


# Decode attention split over the cache: one query token, a workgroup per KV head and split
# of whole passes (kernels.attention_chunk: at most ATTENTION_SPLITS = 64 splits), merged.
# Groups of 1, 3, 4 and 7 query heads per KV head; workgroups of a few planes (many passes
# per split) and of many. Bound as test_attention_gqa_causal (the merge adds one rescaling
# per split).
@pytest.mark.parametrize("head_dim,pos0,q_scale,atol,n_heads,n_kv_heads,threads", [
    (16, 0, 1.0, 1e-6, 6, 2, 256),        # one position, one split
    (16, 37, 1.0, 1e-6, 6, 2, 32),        # 38 positions: passes of 8 or fewer, the last partial
    (32, 70, 1.0, 1e-6, 7, 1, 256),       # a group of 7
    (16, 1500, 1.0, 1e-6, 6, 2, 64),      # ~32 splits of several passes each, the last short
    (16, 40, 30.0, 1e-5, 4, 4, 256),      # large scores, one head per KV head
    (64, 300, 1.0, 1e-6, 9, 3, 256),      # SmolLM2's heads
    (128, 200, 1.0, 1e-6, 8, 2, 256),     # head_dim 128, groups of 4
], ids=["one-position", "partial-pass", "group-of-7", "passes-per-split", "large-scores",
        "smollm2-heads", "hd128"])
@pytest.mark.parametrize("lanes", [1, 2, 4, 8], ids=lambda n: f"{n}-lanes")
def test_attention_decode_split(gpu, head_dim, pos0, q_scale, atol, n_heads, n_kv_heads,
                                threads, lanes):
    """Each position scored by `lanes` invocations (shuffle-added partial dots), 8 where
    head_dim / 4 allows it and the subgroup holds them, else the model's choice."""
    from vkrt.kernels import attention_chunk, split_shape

    r = rng(23)
    n_ctx = pos0 + 5
    q = randn(r, 1, n_heads, head_dim) * np.float32(q_scale)
    k_cache = randn(r, n_ctx, n_kv_heads, head_dim)
    v_cache = randn(r, n_ctx, n_kv_heads, head_dim)
    k_cache[pos0 + 1:] = np.nan         # never read past the query's position
    v_cache[pos0 + 1:] = np.nan
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))
    if (head_dim // 4) % lanes or lanes > gpu.sg:
        lanes = None
    got = run_attention_decode(gpu, q[0], k_cache, v_cache, pos0, scale, lanes=lanes,
                               threads=threads)
    want = attention_reference(q, k_cache, v_cache, pos0, scale)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    size, model_lanes, _ = split_shape(head_dim, gpu.sg, threads)
    assert -(-(pos0 + 1) // attention_chunk(pos0 + 1, size // (lanes or model_lanes))) <= 64


@pytest.mark.parametrize("pos0,shift", [(37, 3), (300, 1), (0, 0)])
def test_attention_split_replay_position(gpu, pos0, shift):
    """attention_split_pos: the query at pos0 + the buffer's u32, the grid sized for the
    whole cache (as a replayed step), the splits past the query empty (the merge weighs
    them 0); cache rows past the query are NaN."""
    r, head_dim, n_heads, n_kv_heads = rng(29), 32, 8, 2
    n_ctx = pos0 + 200
    q = randn(r, 1, n_heads, head_dim)
    k_cache = randn(r, n_ctx, n_kv_heads, head_dim)
    v_cache = randn(r, n_ctx, n_kv_heads, head_dim)
    k_cache[pos0 + 1:] = np.nan
    v_cache[pos0 + 1:] = np.nan
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))
    got = run_attention_decode(gpu, q[0], k_cache, v_cache, pos0 - shift, scale,
                               threads=64, pos_buffer=shift)
    want = attention_reference(q, k_cache, v_cache, pos0, scale)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_split_shape():
    """kernels.split_shape: head_dim / 4 x PLANES invocations, PLANES a power of two within
    the subgroup and the thread cap (one at least), LANES split_score_lanes'."""
    from vkrt.kernels import split_shape

    assert split_shape(128, 32, 256) == (256, 8, 8)
    assert split_shape(64, 32, 256) == (256, 8, 16)
    assert split_shape(64, 8, 256) == (128, 8, 8)
    assert split_shape(256, 32, 256) == (256, 8, 4)
    assert split_shape(256, 32, 32) == (64, 8, 1)
    assert split_shape(16, 4, 64) == (16, 4, 4)


def test_split_score_lanes():
    """kernels.split_score_lanes: a power of two, at most 8 and the subgroup size, dividing
    head_dim / 4."""
    from vkrt.kernels import split_score_lanes

    assert [split_score_lanes(hd, 32) for hd in (4, 12, 16, 24, 32, 64, 128, 256)] == \
        [1, 1, 4, 2, 8, 8, 8, 8]
    assert split_score_lanes(128, 4) == 4 and split_score_lanes(128, 1) == 1


# One sequence's f16 KV cache (vkrt.load(kv_cache_dtype="f16")): the `_kvf16` variants
# convert each K and V element to f32 as they load it (kv.glsl) and compute as the f32
# kernels do, so over caches holding the same f16 values their outputs have the same bits,
# in every mode, windowed or not, with and without the replay's position buffer.
@pytest.mark.parametrize("mode", ATTENTION_MODES)
@pytest.mark.parametrize("window", [0, 5], ids=["causal", "window-5"])
def test_attention_reads_an_f16_cache_exactly(gpu, mode, window):
    kv_dtype_of(gpu, "f16")
    r, head_dim, n_heads, n_kv_heads, pos0, n_tokens = rng(47), 16, 4, 2, 37, 3
    q = randn(r, n_tokens, n_heads, head_dim)
    k16, v16 = (randn(r, pos0 + n_tokens, n_kv_heads, head_dim).astype(np.float16)
                for _ in "kv")
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))
    want = run_attention(gpu, q, k16.astype(np.float32), v16.astype(np.float32), pos0, scale,
                         mode, window)
    got = run_attention(gpu, q, k16, v16, pos0, scale, mode, window)
    np.testing.assert_array_equal(got, want)
    if mode == "decode":          # the replay variant: pos0 + the buffer's 2
        want = run_attention_one_dispatch(gpu, q[0], k16.astype(np.float32),
                                          v16.astype(np.float32), pos0, scale, pos_buffer=2,
                                          window=window)
        got = run_attention_one_dispatch(gpu, q[0], k16, v16, pos0, scale, pos_buffer=2,
                                         window=window)
        np.testing.assert_array_equal(got, want)


def test_attention_chunk_keeps_16_to_64_splits():
    """kernels.attention_chunk: whole passes of `block` positions; every pass a split up to
    32 passes, then between 16 and ATTENTION_SPLITS (64) splits, never more, at every
    context length up to 2^17 positions (passes of 8 to 128 positions, splits aimed at 32;
    aimed at 8 and 64, never past 64); the H200's measured cases (bench/README.md,
    2026-12-04) choose the faster split."""
    from vkrt.kernels import ATTENTION_SPLITS, attention_chunk

    assert ATTENTION_SPLITS == 64
    for block in (8, 32, 128):
        for n in range(1, 1 << 17, 7):
            chunk = attention_chunk(n, block)
            splits = -(-n // chunk)
            assert chunk % block == 0 and splits <= ATTENTION_SPLITS, (block, n, chunk)
            if n <= 32 * block:
                assert chunk == block, (block, n, chunk)
            else:
                assert splits >= 16, (block, n, chunk)
            for target in (8, 64):
                chunk = attention_chunk(n, block, target)
                assert chunk % block == 0 and -(-n // chunk) <= ATTENTION_SPLITS
    assert attention_chunk(4128, 128) == 128     # 33 splits of one block, not 17 of two
    assert attention_chunk(8160, 128) == 256     # 32 splits of two blocks, not 64 of one
    assert attention_chunk(640, 32, 8) == 96      # 7 splits for a target of 8, not 20
    assert attention_chunk(2049, 32, 64) == 64    # 33 splits: 65 would pass the cap


# Sliding-window layers (gemma3): each query attends to its last `window` positions. Cache
# rows before the first query's window are NaN, so a kernel that reads them (a score, or a
# value weighed 0) fails; windows shorter and longer than a block of head_dim positions, one
# wider than every query's history (nothing masked), and many splits.
@pytest.mark.parametrize("mode", ATTENTION_MODES)
@pytest.mark.parametrize("window,pos0,n_tokens", [(5, 20, 4), (21, 30, 3), (100, 20, 4),
                                                  (40, 1300, 2)],
                         ids=["inside-a-block", "across-blocks", "wider-than-history",
                              "many-splits"])
def test_attention_sliding_window(gpu, mode, window, pos0, n_tokens):
    r, head_dim, n_heads, n_kv_heads = rng(25), 16, 4, 2
    q = randn(r, n_tokens, n_heads, head_dim)
    k_cache = randn(r, pos0 + n_tokens + 2, n_kv_heads, head_dim)
    v_cache = randn(r, pos0 + n_tokens + 2, n_kv_heads, head_dim)
    k_cache[pos0 + n_tokens:] = np.nan
    v_cache[pos0 + n_tokens:] = np.nan
    first = max(0, pos0 + 1 - window)
    k_cache[:first] = np.nan
    v_cache[:first] = np.nan
    scale = float(np.float32(1 / np.sqrt(head_dim)))
    got = run_attention(gpu, q, k_cache, v_cache, pos0, scale, mode, window=window)
    want = attention_reference(q, k_cache, v_cache, pos0, scale, window)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_attention_four_minus_infinity_scores_give_zeros(gpu):
    # The issue's example: one query at position 3, its four scores all -inf. The kernel
    # returned NaN (exp(-inf - -inf) in the first block, then 0 / 0).
    head_dim = 4
    q = np.ones((1, 1, head_dim), np.float32)
    k_cache = np.ones((4, 1, head_dim), np.float32)
    k_cache[:, 0, 0] = -np.inf                   # q . k = -inf + 3
    v_cache = randn(rng(20), 4, 1, head_dim)
    for mode in ATTENTION_MODES:
        got = run_attention(gpu, q, k_cache, v_cache, 3, 0.5, mode)
        np.testing.assert_array_equal(got, np.zeros_like(q))


# Masked positions: k[p, kv head 0, 0] = -inf with q[..., 0] = 1 > 0 makes the score of every
# query head of KV head 0 at p exactly -inf (the other terms are finite); KV head 1 is not
# masked. head_dim 8 = block size, positions 0..23 = blocks [0, 8), [8, 16), [16, 24) for the
# last query; 4 query tokens at pos0 20 see 21..24 positions.
MASKS = {
    "first-block": range(0, 8),             # a whole -inf block before any finite score
    "first-block-and-a-half": range(0, 12),  # ... and the next block starts with -inf
    "across-boundary": range(5, 11),
    "middle-block": range(8, 16),
    "last-block": range(16, 24),            # the last block of the last query all -inf
    "all-but-last": range(0, 23),           # only position 23 is finite
    "all": range(0, 24),                    # every score -inf: zeros, not NaN
}


@pytest.mark.parametrize("mode", ATTENTION_MODES)
@pytest.mark.parametrize("masked", MASKS.values(), ids=MASKS.keys())
def test_attention_minus_infinity_scores(gpu, masked, mode):
    r, head_dim, n_heads, n_kv_heads, n_tokens, pos0 = rng(21), 8, 4, 2, 4, 20
    q = randn(r, n_tokens, n_heads, head_dim)
    q[..., 0] = 1.0
    k_cache = randn(r, pos0 + n_tokens, n_kv_heads, head_dim)
    v_cache = randn(r, pos0 + n_tokens, n_kv_heads, head_dim)
    k_cache[list(masked), 0, 0] = -np.inf
    scale = float(np.float32(1 / np.sqrt(head_dim)))
    got = run_attention(gpu, q, k_cache, v_cache, pos0, scale, mode)
    want = safe_attention_reference(q, k_cache, v_cache, pos0, scale)
    assert not np.isnan(got).any()
    # Unmasked scores behave as in test_attention_gqa_causal (q_scale 1): bound 1e-6.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    if len(masked) == 24:  # the last token of KV head 0's query heads saw only -inf
        np.testing.assert_array_equal(got[-1, :2], 0.0)


# Scores past the f32 range: k[p, 0, 0] = big with q[..., 0] = 8, scale 1/4, so the score is
# ~2 * big. +-2e38 is finite; +-8e38 overflows to +-inf (the true score is finite but not an
# f32). The rest of q . k is ~N(0, 8).
OVERFLOW = {
    "one-overflow": {13: 4e38},
    "two-overflows-share": {3: 4e38, 17: 4e38},        # two +inf scores: half the weight each
    "overflow-after-huge-finite": {2: 1e38, 20: 4e38},  # +inf displaces a finite maximum
    "huge-finite-then-overflow-negative": {9: 1e38, 10: -4e38, 11: -1e38},
    "first-block-overflows-negative": {p: -4e38 for p in range(8)},
}


@pytest.mark.parametrize("mode", ATTENTION_MODES)
@pytest.mark.parametrize("big", OVERFLOW.values(), ids=OVERFLOW.keys())
def test_attention_scores_past_f32_range(gpu, big, mode):
    r, head_dim, n_heads, n_kv_heads, n_tokens, pos0 = rng(22), 8, 2, 1, 2, 22
    q = randn(r, n_tokens, n_heads, head_dim)
    q[..., 0] = 8.0
    k_cache = randn(r, pos0 + n_tokens, n_kv_heads, head_dim)
    v_cache = randn(r, pos0 + n_tokens, n_kv_heads, head_dim)
    for p, value in big.items():
        k_cache[p, 0, 0] = value / 2
    scale = 0.25
    got = run_attention(gpu, q, k_cache, v_cache, pos0, scale, mode)
    want = safe_attention_reference(q, k_cache, v_cache, pos0, scale)
    assert not np.isnan(got).any()
    # Where a score is +inf or ~1e38 every other weight is exactly 0 (exp of < -1e38): the
    # output is one value row, or the mean of two (one rounding). Otherwise as above.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


# -- argmax --------------------------------------------------------------------------------
def run_argmax(gpu, logits: np.ndarray, n: int, offset: int) -> int:
    bl, bt = gpu.upload(logits.astype(np.float32)), gpu.filled(1, 0xDEAD, np.uint32)
    gpu.run("argmax", {0: 256}, (bl, bt), (1, 1, 1), push(n, offset))
    return int(gpu.read(bt, np.uint32)[0])


def test_argmax_random(gpu):
    logits = randn(rng(10), 1000)
    assert run_argmax(gpu, logits, 1000, 0) == int(np.argmax(logits))


@pytest.mark.parametrize("ties", [(300, 700), (3, 259, 515), (700, 300, 301), (0, 999)],
                         ids=["across-invocations", "same-invocation", "unordered", "ends"])
def test_argmax_ties_pick_smallest_index(gpu, ties):
    # (3, 259, 515) all fall on invocation 3 (stride 256); the others on different invocations,
    # so both the strided loop and the tree reduction must keep the first maximum.
    logits = randn(rng(11), 1000)
    logits[list(ties)] = 9.0
    assert run_argmax(gpu, logits, 1000, 0) == min(ties)


def test_argmax_offset_and_short_row(gpu):
    # Row 1 of [3, 97] logits: n < workgroup size; row 0 holds a larger value and row 2 too,
    # which an offset or bound error would pick.
    logits = randn(rng(12), 3, 97)
    logits[0, 5] = logits[2, 1] = 50.0
    logits[1, 96] = 10.0  # the last element of the row
    assert run_argmax(gpu, logits.reshape(-1), 97, 97) == 96
    logits[1, 40] = 10.0
    assert run_argmax(gpu, logits.reshape(-1), 97, 97) == 40


def test_argmax_of_a_negative_row_ignores_what_follows_it(gpu):
    # Every logit negative and n past one unrolled block of the loop: the elements after the
    # row (and the loop's padding past n) must not compete.
    logits = -np.abs(randn(rng(13), 3000)) - 1.0
    logits[2500:] = 5.0                   # after the row
    logits[1234] = -0.5
    assert run_argmax(gpu, logits, 2500, 0) == 1234


@pytest.mark.parametrize("n", [3, 50], ids=["row-shorter-than-a-subgroup", "row-50"])
@pytest.mark.parametrize("subgroups", WORKGROUPS.values(), ids=WORKGROUPS.keys())
def test_argmax_any_workgroup(gpu, subgroups, n):
    # Every position in turn holds the maximum, tied at the position one workgroup later when
    # there is one (the same invocation's next element), so every invocation's and every
    # subgroup's partial result must reach the answer and the first maximum must win.
    size = workgroup(gpu, subgroups)
    base = randn(rng(33), n)
    for i in range(n):
        logits = base.copy()
        logits[i] = 9.0
        if i + size < n:
            logits[i + size] = 9.0
        bl, bt = gpu.upload(logits), gpu.filled(1, 0xDEAD, np.uint32)
        gpu.run("argmax", {0: size}, (bl, bt), (1, 1, 1), push(n, 0))
        assert int(gpu.read(bt, np.uint32)[0]) == int(np.argmax(logits)) == i, (i, size)


def test_argmax_of_all_minus_infinity_is_an_index(gpu):
    # torch.argmax returns 0 here. Starting from bv = -inf and taking only strictly greater
    # values would return the "none" index 0xFFFFFFFF, an out-of-range token id that `embed`
    # would then read past its table with (generate feeds argmax to embed).
    logits = np.full(300, -np.inf, np.float32)
    assert run_argmax(gpu, logits, 300, 0) == 0


# -- OPT kernels: LayerNorm, ReLU, learned positions, sliced embeddings ---------------------
@pytest.mark.parametrize("n", [3, 333], ids=["row-shorter-than-a-subgroup", "row-333"])
@pytest.mark.parametrize("subgroups", WORKGROUPS.values(), ids=WORKGROUPS.keys())
def test_layernorm_rows(gpu, subgroups, n):
    # Rows with a large common offset (mean 50, spread 3): a one-pass E[x^2] - E[x]^2 would
    # cancel; a row near constant (variance ~eps) where eps must matter.
    r, n_tokens, eps = rng(40), 4, 1e-5
    x = randn(r, n_tokens, n) * np.float32(3) + np.float32(50)
    x[2] = np.float32(7) + randn(r, n) * np.float32(1e-3)
    w, b = randn(r, n), randn(r, n)
    bx, bw, bb, bo = gpu.upload(x), gpu.upload(w), gpu.upload(b), gpu.filled(n_tokens * n + 4)
    gpu.run("layernorm", {0: workgroup(gpu, subgroups)}, (bx, bw, bb, bo),
            (n_tokens + 1, 1, 1), push(n, eps, n_tokens))   # one workgroup past the rows
    got = gpu.read(bo)
    x64 = x.astype(np.float64)
    mean = x64.mean(1, keepdims=True)
    norm = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(1, keepdims=True) + eps)
    want = norm * w + b
    # f32 rounding of the row sums perturbs the mean and the deviations by a few ulp of the
    # row's largest |x|, amplified by 1/sigma (sigma = sqrt(var + eps)): error bound in units
    # of u = 2^-24 * max|x| / sigma * |w| + 2^-24 * |b|. Measured max 2.7 units (lavapipe; the row of
    # 7 +- 1e-3, sigma ~ 3.3e-3, is ill-conditioned for torch too); bound 32 units.
    # A dropped mean, bias or eps is off by ~1 / 2^-24 units.
    sigma = np.sqrt(((x64 - mean) ** 2).mean(1, keepdims=True) + eps)
    unit = 2.0 ** -24 * (np.abs(x64).max(1, keepdims=True) / sigma * np.abs(w) + np.abs(b))
    err = np.abs(got[:-4].reshape(n_tokens, n) - want) / unit
    assert err.max() < 32, err.max()
    np.testing.assert_array_equal(got[-4:], SENTINEL)


def test_relu_in_place_exact_and_bounded(gpu):
    r, n, extra = rng(41), 1001, 6
    x = randn(r, n + extra)
    x[:4] = [0.0, -0.0, np.inf, -np.inf]
    bx = gpu.upload(x)
    gpu.run("relu", {0: ELEMENTWISE}, (bx,), (groups(n, ELEMENTWISE), 1, 1), push(n))
    got = gpu.read(bx)
    np.testing.assert_array_equal(got[:n], np.maximum(x[:n], 0))
    np.testing.assert_array_equal(got[n:], x[n:])   # past n: untouched, negatives too


def test_add_rows_adds_table_rows_from_row0(gpu):
    # width 70: two workgroups per row; rows 2 past n_tokens keep their values; the grid's y
    # is one larger than n_tokens; row0 = pos0 + 2 as OPT uses it.
    r, width, n_tokens, rows, n_table, row0 = rng(42), 70, 3, 5, 12, 7
    x, table = randn(r, rows, width), randn(r, n_table, width)
    bx, bt = gpu.upload(x), gpu.upload(table)
    gpu.run("add_rows", {0: ELEMENTWISE}, (bx, bt),
            (groups(width, ELEMENTWISE), n_tokens + 1, 1), push(width, row0, n_tokens))
    got = gpu.read(bx).reshape(rows, width)
    # One IEEE f32 add per element: bit-exact.
    np.testing.assert_array_equal(got[:n_tokens], x[:n_tokens] + table[row0:row0 + n_tokens])
    np.testing.assert_array_equal(got[n_tokens:], x[n_tokens:])


@pytest.mark.parametrize("dtype", [t.dtype for t in weight_types.TYPES])
def test_embed_range_writes_only_its_ids(gpu, kernels, dtype):
    # Two slices of a 37-row table (rows 0..19, 20..36) in two dispatches cover every id;
    # one slice alone leaves the other ids' rows untouched (sentinel). The table as stored:
    # f32 (OPT's slices) or any weight type (a Llama embedding past one binding), 70 columns
    # or 3 blocks.
    r, n_vocab, split = rng(43), 37, 20
    n_embd = 70 if dtype == "float32" else cols(dtype)
    raw, table = weight_bytes(dtype, randn(r, n_vocab, n_embd), seed=43)
    ids = np.array([5, 0, 36, 20, 19, 5], np.uint32)
    bi = gpu.upload(ids)
    lo = upload_weight(gpu, dtype, raw[:split], (split, n_embd))
    hi = upload_weight(gpu, dtype, raw[split:], (n_vocab - split, n_embd))
    out = gpu.filled(len(ids) * n_embd + 3)
    gpu.stream.record([kernels.embed_range(hi, split, bi, out, len(ids))])
    got = gpu.read(out)[:-3].reshape(len(ids), n_embd)
    mine = ids >= split
    np.testing.assert_array_equal(got[mine], table[ids[mine]])
    np.testing.assert_array_equal(got[~mine], SENTINEL)
    gpu.stream.record([kernels.embed_range(lo, 0, bi, out, len(ids))])
    got = gpu.read(out)
    np.testing.assert_array_equal(got[:-3].reshape(len(ids), n_embd), table[ids])
    np.testing.assert_array_equal(got[-3:], SENTINEL)


def test_copy_block_into_wider_rows(gpu):
    r, width, dst_width, col0, n_tokens = rng(44), 70, 157, 81, 3
    src = randn(r, n_tokens, width)
    bs, bd = gpu.upload(src), gpu.filled(n_tokens * dst_width + 5)
    gpu.run("copy_block", {0: ELEMENTWISE}, (bs, bd),
            (groups(width, ELEMENTWISE), n_tokens + 1, 1), push(width, dst_width, col0, n_tokens))
    got = gpu.read(bd)
    want = np.full((n_tokens, dst_width), SENTINEL)
    want[:, col0:col0 + width] = src
    np.testing.assert_array_equal(got[:-5].reshape(n_tokens, dst_width), want)
    np.testing.assert_array_equal(got[-5:], SENTINEL)


# -- weights as the GGUF stores them (embed_*, matvec_*, matmul_* variants) ------------------
# Every type of vkrt/weight_types.py. F16 and BF16 are quantized by gguf-py (rounding casts);
# a block type is random blocks (tests/weight_blocks.py: every bit random, f16 scales finite),
# and the kernels are compared with `gguf.quants.dequantize` of the same bytes, so the layout
# the shaders read is the one gguf-py and ggml define. The ops come from `Kernels`, which
# picks the variant from the weight tensor's dtype. Rows are 96 elements (3 blocks of 32) or
# 768 (3 blocks of 256), so rows of 2-byte-aligned blocks start at both offsets mod 4.
WEIGHT_TYPES = {t.dtype: t.gguf for t in weight_types.TYPES}


def xq_decode(kernels: Kernels, dtype: str, n_rows: int, kernel: str = "matvec") -> bool:
    """Decode product `kernel` over `n_rows` rows (pairs for qkv_rope) of `dtype` runs its
    `_xq` variant (Kernels.decode_integer_x) and takes its integer path: a unit per
    invocation (SPLIT 1; a split unit takes the float path, glsl/unit_x.glsl)."""
    t = weight_types.BY_DTYPE[dtype]
    return (kernels.decode_integer_x(kernel, dtype, n_rows)
            and kernels.tuning.decode_rule(kernel, n_rows, t.block, dtype).split == 1)


def decode_x(kernels: Kernels, dtype: str, x: np.ndarray, n_rows: int,
             kernel: str = "matvec") -> np.ndarray:
    """x [..., K] as decode product `kernel` over `n_rows` rows of `dtype` sees it,
    float64: x^ (x quantized per unit, tests/weight_blocks.py quantize_units) where it
    takes the integer path (xq_decode), else x. Its products are then those of the float
    kernels with x^ for x, and the float kernels' bounds hold
    (test_linear_weights_as_stored)."""
    if xq_decode(kernels, dtype, n_rows, kernel):
        return quantize_units(x, dtype)
    return x.astype(np.float64)


def decode_norm_x(kernels: Kernels, dtype: str, x: np.ndarray, norm_w: np.ndarray, eps: float,
                  n_rows: int, kernel: str) -> np.ndarray:
    """n(x) = rmsnorm(x) * norm_w as the fused decode product `kernel` (matvec_glu,
    qkv_rope) of `dtype` sees it: the product of the row x * norm_w (rms_in.glsl
    x_weighted: one f32 multiply, which numpy repeats) with the weights, times the norm's
    scale; on the `_xq` variants that row is quantized per unit (decode_x)."""
    if not xq_decode(kernels, dtype, n_rows, kernel):
        return rms_reference(x, norm_w, eps)
    xd = x.astype(np.float64)
    weighted = x.astype(np.float32) * norm_w.astype(np.float32)
    return decode_x(kernels, dtype, weighted, n_rows, kernel) / np.sqrt(np.mean(xd * xd) + eps)


def cols(dtype: str) -> int:
    """Columns of a test matrix: 3 blocks of the type (96 for scalar types)."""
    return 3 * max(32, weight_types.BY_DTYPE[dtype].block)


def weight_bytes(dtype: str, w: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw, values): a weight of `w`'s shape as `dtype` stores it, uint8 [rows, bytes per
    row], and its values as gguf-py dequantizes those bytes, float64: `w` itself rounded for
    F32/F16/BF16, random blocks of `w`'s standard deviation (rng `seed`) for a block type."""
    import gguf

    qtype = gguf.GGMLQuantizationType[WEIGHT_TYPES[dtype]]
    if weight_types.BY_DTYPE[dtype].quantized:
        return random_blocks(rng(seed), WEIGHT_TYPES[dtype], *w.shape, float(w.std()))
    raw = np.ascontiguousarray(gguf.quants.quantize(w, qtype))
    values = gguf.quants.dequantize(raw, qtype).astype(np.float64).reshape(w.shape)
    return raw.view(np.uint8).reshape(w.shape[0], -1), values


def upload_weight(gpu, dtype: str, raw: np.ndarray, shape: tuple[int, int]) -> Tensor:
    """`raw` (weight_bytes) on the device as a `dtype` view of exactly
    `nbytes_of(dtype, shape)` bytes (block types padded to whole words)."""
    nbytes = nbytes_of(dtype, shape)
    buf = Buffer(gpu.device, nbytes, name=dtype)
    gpu.buffers.append(buf)
    gpu.stream.write(Tensor(buf, 0, nbytes, "uint8", (nbytes,)),
                     np.ascontiguousarray(raw).reshape(-1))
    return Tensor(buf, 0, nbytes, dtype, shape, name=dtype)


def stored_weight(gpu, dtype: str, w: np.ndarray, seed: int = 0) -> tuple[Tensor, np.ndarray]:
    """A weight of `w`'s shape stored as `dtype` on the device and its values, float64
    (weight_bytes, upload_weight)."""
    raw, values = weight_bytes(dtype, w, seed)
    return upload_weight(gpu, dtype, raw, w.shape), values


@pytest.fixture
def kernels(gpu):
    return Kernels(gpu.cache)


@pytest.mark.parametrize("n_tokens,tiled", [(1, False), (7, False), (9, False), (7, True),
                                            (70, True)],
                         ids=["1", "7", "9", "7-tiled", "70-tiled"])
@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
def test_linear_weights_as_stored(gpu, kernels, dtype, n_tokens, tiled):
    # n_rows = 37: not a multiple of any workgroup; n_cols = 3 blocks (96, or 768 for blocks of
    # 256), an odd number of blocks per row, so rows of 2-byte-aligned blocks (Q8_0's 102
    # bytes, Q6_K's 630) start at every byte offset mod 4 the alignment allows and the tensor
    # ends inside a word (111 blocks). Decode (1 token) reads
    # x at row 2 of 3; prefill tiles 7 and 9 tokens by 8 (one partial tile, then two), or,
    # tiled (matmul_tiled, a GPU's prefill), 7 and 70 tokens by 64 and 37 rows by 32.
    kernels.tiled_matmul = tiled
    kernels.coop = None        # the f32 kernels (matmul_coop: test_linear_coop_weights_as_stored)
    r, n_rows, n_cols = rng(40), 37, cols(dtype)
    w = randn(r, n_rows, n_cols)
    tw, values = stored_weight(gpu, dtype, w, seed=40)
    x_row = 2 if n_tokens == 1 else 0
    x = randn(r, x_row + n_tokens, n_cols)
    tx, ty = gpu.upload(x), gpu.filled(n_tokens * n_rows + 5)
    gpu.stream.record([kernels.linear(tx, tw, ty, n_tokens, x_row=x_row)])
    got = gpu.read(ty)
    xs = (decode_x(kernels, dtype, x[x_row:], n_rows) if n_tokens == 1
          else x[x_row:].astype(np.float64))
    terms = xs[:, None, :] * values[None, :, :]   # [T, N, K]
    # The shader dequantizes each weight exactly as gguf-py does in f32 (d * scale * q is
    # exact: an 11-bit f16 scale times integers of at most 7 + 5 bits; a min term "+ m" or
    # "- dmin * m" is one f32 rounding of exact terms, fused into an fma or not) and sums in
    # f32, so the bound of test_matvec_with_x_offset holds: 2e-7 relative to sum|w*x| (about
    # sqrt(96) * 2^-24 = 6e-7 in the worst random case, 2^-24 typical; measured at most
    # 1.1e-7, BF16 tiled over 70 tokens, and 8.5e-8 for every block type).
    # A wrong block, scale, nibble, high bit or min is off by ~1e-2 or more in these units.
    err = rel_err(got[:-5].reshape(n_tokens, n_rows), terms.sum(2), np.abs(terms).sum(2))
    assert err < 2e-7, err
    np.testing.assert_array_equal(got[-5:], SENTINEL)


@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
def test_embed_weights_as_stored(gpu, kernels, dtype):
    # n_embd = 160 = 32 * 5: three workgroups of 64 per token, the last one partial (768 = 3
    # blocks of 256 for the K-quants and IQ4_XS); 37 rows of Q8_0 end inside a word.
    r, n_vocab = rng(41), 37
    n_embd = 160 if weight_types.BY_DTYPE[dtype].block <= 32 else 768
    table, values = stored_weight(gpu, dtype, randn(r, n_vocab, n_embd), seed=41)
    ids = np.array([5, 0, 36, 5, 17], np.uint32)  # a repeat, the first and the last row
    bi, bo = gpu.upload(ids), gpu.filled(len(ids) * n_embd + 3)
    gpu.stream.record([kernels.embed(table, bi, bo, len(ids))])
    got = gpu.read(bo)
    # A copy of each dequantized value, bit-exact: the products of scales and integers are
    # exact in f32 and a min term is the one rounding gguf-py makes too (fused or not).
    np.testing.assert_array_equal(got[:-3].reshape(len(ids), n_embd), values[ids])
    np.testing.assert_array_equal(got[-3:], SENTINEL)


def test_weight_types_the_kernels_do_not_read_are_refused(gpu, kernels):
    # A view of a dtype with no variant (IQ2_XS) is refused naming the tensor; rows of a block
    # type must be whole blocks of its type (256 for Q4_K), and a view's bytes must be those
    # of its type and shape (Q6_K: 210 bytes per 256, padded to a word).
    buf = gpu.filled(256).buffer
    x, y = gpu.filled(256), gpu.filled(4)
    with pytest.raises(ShaderInterfaceError, match=r"matvec: no variant reads weights of iq2_xs "
                                                   r"\(tensor 'w'\)"):
        kernels.linear(x, Tensor(buf, 0, 74, "iq2_xs", (1, 256), name="w"), y, 1)
    with pytest.raises(VkrtError, match=r"q8_0 rows of 48 elements are not whole blocks of 32"):
        Tensor.of(buf, "q8_0", (1, 48))
    with pytest.raises(VkrtError, match=r"'w': q4_k rows of 96 elements are not whole blocks "
                                        r"of 256"):
        Tensor.of(buf, "q4_k", (1, 96), name="w")
    with pytest.raises(VkrtError, match=r"tensor 'w': shape \(1, 256\) of q6_k is 212 bytes, "
                                        r"the view has 210"):
        Tensor(buf, 0, 210, "q6_k", (1, 256), name="w")
    with pytest.raises(ShaderInterfaceError, match=r"binding 0 \(Wt\) takes q8_0, got q4_1"):
        kernels.weight_op("matvec", Tensor.of(buf, "q8_0", (2, 32)))(
            Tensor.of(buf, "q4_1", (2, 32)), x, y, grid=(2, 1, 1), n_cols=32, x_offset=0,
            n_rows=2)


# -- prefill on cooperative matrices (matmul_coop_*, VK_KHR_cooperative_matrix) -------------
def coop_or_skip(kernels):
    """Skip (with the reason) on a device that lists no f16 x f16 -> f32 subgroup shape."""
    if kernels.coop is None:
        pytest.skip(f"{kernels._pipelines.device.name} lists no f16 -> f32 subgroup "
                    "cooperative-matrix shape (VK_KHR_cooperative_matrix): lavapipe has none")


# Every weight type through matmul_coop at odd sizes: 70 tokens (a token tile of 64 and one of
# 6) by 37 rows (n_rows % 4 != 0: every tile stored through the staging tile), and 129 tokens
# (two whole tiles and one of 1) by 72 rows (n_rows % 4 == 0: whole accumulators stored
# straight into y, the last row tile's through staging); scalar types over 100 columns (three
# 32-column steps and one of 4), block types 3 blocks (96 or 768).
# Bound (relative to sum_k |x_k w_k|, w as gguf-py dequantizes it, float64): x and the
# dequantized w are each rounded once to f16 (unit roundoff u = 2^-11, round to nearest), so
# each product is off by at most (2u + u^2) |x w|; the tensor core sums the exact f16 products
# into f32 over K terms, at most K * 2^-24 of sum |x w| with rounding, K * 2^-23 allowed for
# accumulators that truncate. Bound: 2^-10 + K * 2^-23 per output (llama.cpp's
# tests/test-backend-ops.cpp gates its matrix products by a normalized mean squared error
# over the whole output instead; this bound is per element and worst case). F16 weights are
# exact in f16, so their products carry only x's rounding. A wrong block, scale, nibble or tile is off by ~1e-2 or
# more in these units.
# Each rule of the table's tiles runs in turn as the only rule (vkrt/tuning.py
# prefill_coop_tiles, fitted to the device's shared memory by fit_coop_tile): 256 tokens x
# 128 rows makes one partial token tile of 70 or 129 tokens and one partial row tile, and
# 128 x 64 splits the columns in two. Then a split-K tile: 3 groups of 2 subgroups over 32
# tokens x 32 rows (a step of 96 columns: the scalar types' 100 take a second step of 4, the
# group sums added through shared memory); and a double-buffered tile (64 x 64 over 2 x 2,
# two shared buffers: one barrier per step); then those two fetching 2 and 3 steps ahead into
# registers (DEPTH: the same products, so the same bound).
@pytest.mark.parametrize("tile", [f"rule{i}" for i in range(len(tuning.GPU.prefill_coop_tiles))]
                         + ["splitk", "double", "splitk-deep", "double-deep"])
@pytest.mark.parametrize("n_tokens,n_rows", [(70, 37), (129, 72)], ids=["70x37", "129x72"])
@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
def test_linear_coop_weights_as_stored(gpu, kernels, dtype, n_tokens, n_rows, tile,
                                       monkeypatch):
    coop_or_skip(kernels)
    rules = kernels.tuning.prefill_coop_tiles
    first = dataclasses.replace(rules[0], min_rows=0, min_tokens=0)
    if tile.startswith("rule"):
        rule = dataclasses.replace(rules[int(tile[4:])], min_rows=0, min_tokens=0)
        monkeypatch.setattr(kernels, "tuning", dataclasses.replace(
            kernels.tuning, prefill_coop_tiles=(rule,)))
    base = tile.removesuffix("-deep")
    if base == "splitk":
        split = dataclasses.replace(first, bm=32, bn=32, sg_m=1, sg_n=2, sg_k=3)
        monkeypatch.setattr(kernels, "tuning", dataclasses.replace(
            kernels.tuning, prefill_coop_tiles=(split,)))
        assert kernels.coop_spec(n_rows, n_tokens)[8] == 3
    if base == "double":
        double = dataclasses.replace(first, bm=64, bn=64, sg_m=2, sg_n=2, nbuf=2)
        monkeypatch.setattr(kernels, "tuning", dataclasses.replace(
            kernels.tuning, prefill_coop_tiles=(double,)))
        assert kernels.coop_spec(n_rows, n_tokens)[9] == 2
    if tile.endswith("-deep"):   # the same tiles fetching 2 / 3 steps ahead (DEPTH)
        deep = dataclasses.replace(kernels.tuning.prefill_coop_tile(n_rows, n_tokens),
                                   depth=2 if tile == "splitk-deep" else 3)
        monkeypatch.setattr(kernels, "tuning", dataclasses.replace(
            kernels.tuning, prefill_coop_tiles=(deep,)))
        assert kernels.coop_spec(n_rows, n_tokens)[10] == deep.depth
    r = rng(43)
    n_cols = cols(dtype) + (4 if not weight_types.BY_DTYPE[dtype].quantized else 0)
    tw, values = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=43)
    x = randn(r, n_tokens, n_cols)
    tx, ty = gpu.upload(x), gpu.filled(n_tokens * n_rows + 5)
    with config.COOPMAT.override("1"):
        assert kernels.prefill_kernel(n_tokens) == "matmul_coop"
        gpu.stream.record([kernels.linear(tx, tw, ty, n_tokens)])
    got = gpu.read(ty)
    terms = x.astype(np.float64)[:, None, :] * values[None, :, :]
    err = rel_err(got[:-5].reshape(n_tokens, n_rows), terms.sum(2), np.abs(terms).sum(2))
    bound = 2.0 ** -10 + n_cols * 2.0 ** -23
    print(f"matmul_coop {dtype} {n_tokens}x{n_rows}x{n_cols}: error {err:.2e} of sum|xw| "
          f"(bound {bound:.2e})")
    assert err < bound, err
    np.testing.assert_array_equal(got[-5:], SENTINEL)


FAKE_SHAPE = CoopShape(16, 16, 16, "float16", "float16", "float32", "float32", "subgroup")


def test_prefill_kernel_choice(gpu, kernels):
    # VKRT_COOPMAT: auto takes matmul_coop from COOP_MIN_TOKENS tokens where the device has a
    # shape, 1 from 2 tokens (refused without a shape), 0 never; without a shape (lavapipe)
    # the f32 kernels as before. A pretend shape stands in on a device without one.
    fallback = "matmul_tiled" if kernels.tiled_matmul else "matmul"
    kernels.coop = None
    for mode in ("auto", "0"):
        with config.COOPMAT.override(mode):
            assert kernels.prefill_kernel(4096) == fallback
    with config.COOPMAT.override("1"), pytest.raises(VkrtError, match="VKRT_COOPMAT=1 but .* "
                                                                       "lists no f16"):
        kernels.prefill_kernel(64)
    kernels.coop = FAKE_SHAPE
    with config.COOPMAT.override("auto"):
        assert kernels.prefill_kernel(COOP_MIN_TOKENS - 1) == fallback
        assert kernels.prefill_kernel(COOP_MIN_TOKENS) == "matmul_coop"
    with config.COOPMAT.override("1"):
        assert kernels.prefill_kernel(2) == "matmul_coop"
    with config.COOPMAT.override("0"):
        assert kernels.prefill_kernel(4096) == fallback
    # The table's tiles (vkrt/tuning.py prefill_coop_tiles, the same on both device classes,
    # tests/test_tuning.py has the rules), fitted to the device's shared memory
    # (fit_coop_tile): 128 x 128 over 4 x 4 subgroups of the device's width at 4096 rows and
    # 512 tokens needs 36864 bytes, which the H200 has (49152) and lavapipe not (32768):
    # there BM is halved to 64 (31744 bytes).
    limit = gpu.device.limits.maxComputeSharedMemorySize
    assert coop_shared_bytes(128, 128, 4, 4, 1, 1, FAKE_SHAPE) == 20480 + 16384
    assert coop_shared_bytes(256, 128, 4, 4, 1, 1, FAKE_SHAPE) == 30720 + 16384
    assert coop_shared_bytes(32, 32, 2, 2, 4, 1, FAKE_SHAPE) == 20480 + 4096
    assert coop_shared_bytes(64, 64, 2, 2, 1, 2, FAKE_SHAPE) == 20480 + 4096
    for n_rows, n_tokens in ((4096, 512), (8192, 256), (2048, 512), (64, 2048)):
        r = kernels.tuning.prefill_coop_tile(n_rows, n_tokens)
        bm, bn, sg_m, sg_n, sg_k, nbuf = fit_coop_tile(
            (r.bm, r.bn, r.sg_m, r.sg_n, r.sg_k, r.nbuf), FAKE_SHAPE, limit)
        assert kernels.coop_spec(n_rows, n_tokens) == {
            0: sg_m * sg_n * sg_k * gpu.sg, 1: 16, 2: 16, 3: 16, 4: bm, 5: bn, 6: sg_m,
            7: sg_n, 8: sg_k, 9: nbuf, 10: r.depth}
    assert kernels.coop_spec(4096, 512)[4] == (128 if limit >= 36864 else 64)
    spec = kernels.coop_spec(4096, 512)
    # A split-K tile (the batched runner's): 4 groups of 2 x 2 subgroups, 16 in all.
    assert kernels.coop_spec(4096, 32, (32, 32, 2, 2, 4)) == {
        **spec, 0: 16 * gpu.sg, 4: 32, 5: 32, 6: 2, 7: 2, 8: 4}
    # A tile names its shared buffers and the steps it fetches ahead (1 when it does not).
    assert kernels.coop_spec(4096, 512, (32, 32, 1, 2, 1, 2))[9] == 2
    deep = kernels.coop_spec(4096, 512, (32, 32, 1, 2, 1, 2, 3))
    assert (deep[9], deep[10]) == (2, 3)
    assert kernels.coop_spec(4096, 512, (32, 32, 1, 2, 1, 2))[10] == 1
    kernels.tuning = dataclasses.replace(kernels.tuning, prefill_coop_tiles=(
        dataclasses.replace(kernels.tuning.prefill_coop_tile(4096, 512), depth=2),))
    assert kernels.coop_spec(4096, 512) == {**spec, 10: 2}
    # A tile past the device's shared memory is refused, naming both sizes.
    with pytest.raises(VkrtError, match=f"matmul_coop tile 256x128:4x2x2 with 1 shared "
                                        f"buffers needs 69632 bytes of shared memory; "
                                        f".* has {limit}"):
        kernels.coop_spec(4096, 512, (256, 128, 4, 2, 2))


def test_prefill_glu_tile(gpu, kernels):
    # A prompt's gate, up and activation as one glu_coop dispatch: the table's tile, fitted
    # to the device's shared memory for two W tiles, only where the products run on
    # matmul_coop (vkrt/tuning.py prefill_glu_tile: 256 x 64 over 4 x 4 subgroups, 256 + 2 x
    # 64 rows of 80 bytes and 16 staging tiles: 47104 bytes, which an H100 has (49152) and
    # lavapipe not (32768): there BM is halved twice, to 64: 31744 bytes).
    r = kernels.tuning.prefill_glu_tile
    assert (r.bm, r.bn, r.sg_m, r.sg_n, r.sg_k, r.nbuf) == (256, 64, 4, 4, 1, 1) and r.source
    assert coop_shared_bytes(256, 64, 4, 4, 1, 1, FAKE_SHAPE, products=2) == 30720 + 16384
    limit = gpu.device.limits.maxComputeSharedMemorySize
    kernels.coop = None
    assert kernels.prefill_glu_tile(512) is None
    kernels.coop = FAKE_SHAPE
    with config.COOPMAT.override("auto"):
        assert kernels.prefill_glu_tile(COOP_MIN_TOKENS - 1) is None
        assert kernels.prefill_glu_tile(COOP_MIN_TOKENS) == (
            *fit_coop_tile((256, 64, 4, 4, 1, 1), FAKE_SHAPE, limit, products=2), 1)
        assert kernels.prefill_glu_tile(512)[0] == (256 if limit >= 47104 else
                                                     128 if limit >= 36864 else 64)
    with config.COOPMAT.override("0"):
        assert kernels.prefill_glu_tile(512) is None
    kernels.tuning = dataclasses.replace(kernels.tuning, prefill_glu_tile=None)
    with config.COOPMAT.override("1"):
        assert kernels.prefill_glu_tile(512) is None


def test_prefill_splits(kernels):
    """A prompt product's column split across workgroups: the rule's `splits` for its rows,
    at most one workgroup per step of sg_k * 32 columns, only where the products run on
    matmul_coop; `prefill_partials` sizes the partials of a layer's product (its weights
    in every layer) for any prompt up to n_tokens tokens (the rule a smaller prompt would
    match included)."""
    rules = (tuning.PrefillCoopTile(4096, 0, 128, 128, 4, 4, "t", splits=2),
             tuning.PrefillCoopTile(2048, 0, 128, 64, 4, 4, "t", sg_k=2, splits=3),
             tuning.PrefillCoopTile(0, 1024, 64, 64, 4, 4, "t"),
             tuning.PrefillCoopTile(0, 0, 64, 64, 4, 4, "t", splits=4))
    kernels.tuning = dataclasses.replace(kernels.tuning, prefill_coop_tiles=rules)

    def w(rows, cols):
        return SimpleNamespace(shape=(rows, cols))

    kernels.coop = FAKE_SHAPE
    with config.COOPMAT.override("auto"):
        assert kernels.prefill_splits(w(4096, 4096), 512) == 2
        assert kernels.prefill_splits(w(2048, 8192), 512) == 3
        assert kernels.prefill_splits(w(2048, 64), 512) == 1       # one step of 64 columns
        assert kernels.prefill_splits(w(2048, 128), 512) == 2      # two steps
        assert kernels.prefill_splits(w(1024, 4096), 512) == 4
        assert kernels.prefill_splits(w(1024, 4096), 1024) == 1    # the unsplit rule
        assert kernels.prefill_splits(w(1024, 4096), COOP_MIN_TOKENS - 1) == 1
        assert kernels.prefill_splits(w(1024, 4096), 1) == 1
        ws = [w(4096, 4096), w(1024, 4096), w(14336, 4096)]
        # 14336 rows x 2 splits at 2048 tokens; 1023 tokens x 1024 rows x 4 (the rule below
        # 1024 tokens) is less
        assert kernels.prefill_partials(ws, 2048) == 2048 * 14336 * 2
        assert kernels.prefill_partials([w(1024, 4096)], 2048) == 1023 * 1024 * 4
        assert kernels.prefill_partials([w(1024, 4096)], 512) == 512 * 1024 * 4
        assert kernels.prefill_partials(ws, COOP_MIN_TOKENS - 1) == 0
    with config.COOPMAT.override("0"):
        assert kernels.prefill_splits(w(1024, 4096), 512) == 1
        assert kernels.prefill_partials(ws, 512) == 0
    kernels.tuning = dataclasses.replace(
        kernels.tuning, prefill_coop_tiles=(tuning.PrefillCoopTile(0, 0, 64, 64, 4, 4, "t"),))
    with config.COOPMAT.override("1"):
        assert kernels.prefill_splits(w(1024, 4096), 2048) == 1
        assert kernels.prefill_partials(ws, 2048) == 0


def test_fit_coop_tile():
    """fit_coop_tile: a tile that fits stays; else the second buffer goes, then the column
    split, then BM and BN are halved, then the subgroups; the Vulkan minimum of 16 KB still
    gets a tile."""
    big = (256, 128, 4, 4, 2, 2)
    assert fit_coop_tile(big, FAKE_SHAPE, 1 << 20) == big
    assert fit_coop_tile(big, FAKE_SHAPE, 65536) == (256, 128, 4, 4, 1, 1)   # 47104 bytes
    assert fit_coop_tile(big, FAKE_SHAPE, 32768) == (64, 128, 4, 4, 1, 1)    # 31744
    assert fit_coop_tile(big, FAKE_SHAPE, 16384) == (32, 32, 2, 2, 1, 1)     # 9216
    assert fit_coop_tile(big, FAKE_SHAPE, 0) == (16, 16, 1, 1, 1, 1)
    for limit in (16384, 24576, 32768, 49152):
        bm, bn, sg_m, sg_n, sg_k, nbuf = fit_coop_tile((128, 64, 4, 4, 2, 1), FAKE_SHAPE, limit)
        assert coop_shared_bytes(bm, bn, sg_m, sg_n, sg_k, nbuf, FAKE_SHAPE) <= limit
        assert bm % (sg_m * 16) == 0 and bn % (sg_n * 16) == 0
    # The GLU build's two W tiles count twice: the same tile fits 48 KB alone, not with two.
    glu = (256, 128, 4, 4, 1, 1)
    assert fit_coop_tile(glu, FAKE_SHAPE, 49152) == glu
    assert fit_coop_tile(glu, FAKE_SHAPE, 49152, products=2) == (128, 128, 4, 4, 1, 1)
    for limit in (16384, 32768, 49152):
        bm, bn, sg_m, sg_n, sg_k, nbuf = fit_coop_tile(glu, FAKE_SHAPE, limit, products=2)
        assert coop_shared_bytes(bm, bn, sg_m, sg_n, sg_k, nbuf, FAKE_SHAPE, 2) <= limit


def test_coop_shape_choice():
    # Device.coop_shape over a listed set (as vkGetPhysicalDeviceCooperativeMatrixProperties-
    # KHR reports them): f16 A/B and f32 C/Result at subgroup scope only, M/N/K of 8, 16 or
    # 32; 16x16x16 first, else the largest K.
    def shape(m, n, k, a="float16", c="float32", scope="subgroup"):
        return CoopShape(m, n, k, a, a, c, c, scope)

    def pick(*shapes):
        return Device.coop_shape(SimpleNamespace(coop_shapes=shapes))

    nv = (shape(16, 8, 16), shape(16, 8, 8), shape(16, 16, 16, c="float16"),
          shape(16, 16, 16), shape(16, 16, 32, a="int8", c="int32"))
    assert pick(*nv) == shape(16, 16, 16)
    assert pick(shape(16, 8, 8), shape(16, 8, 16)) == shape(16, 8, 16)
    assert pick(shape(16, 16, 16, scope="workgroup"), shape(16, 16, 16, c="float16")) is None
    assert pick(shape(16, 16, 16, a="int8")) is None
    assert pick(shape(16, 16, 24), shape(24, 16, 16)) is None     # K must divide 32
    assert pick() is None


def test_coop_module_refused_without_cooperative_matrix(gpu, kernels):
    # matmul_coop declares CooperativeMatrixKHR (reflected into modules.json): a device
    # without VK_KHR_cooperative_matrix refuses it in one line before any shader module is
    # made, and linear routes a prefill product there when told to (a pretend shape).
    meta = gpu.cache.modules["matmul_coop_q4_k"]
    assert {"CooperativeMatrixKHR", "Float16", "VulkanMemoryModel"} <= set(meta.capabilities)
    assert "CooperativeMatrixKHR" not in gpu.cache.modules["matmul_tiled_q4_k"].capabilities
    if gpu.device.features["cooperativeMatrix"]:
        pytest.skip(f"{gpu.device.name} has cooperative matrices")
    kernels.coop = FAKE_SHAPE
    w = Tensor.of(gpu.filled(37 * 96).buffer, "float32", (37, 96), name="w")
    x, y = gpu.filled(70 * 96), gpu.filled(70 * 37)
    with config.COOPMAT.override("1"), pytest.raises(ShaderInterfaceError) as info:
        kernels.linear(x, w, y, 70)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg == (f"matmul_coop_f32: declares the SPIR-V capability CooperativeMatrixKHR, "
                   f"which {gpu.device.name} does not support (device feature "
                   f"cooperativeMatrix)")


@pytest.mark.parametrize("dtype", [t.dtype for t in weight_types.TYPES if t.quantized])
def test_matvec_rows_per_workgroup_weights_as_stored(gpu, kernels, dtype):
    # 3 rows per workgroup (matvec.comp's ROWS, a GPU's logits) over 37 rows of each block
    # type: the last workgroup is partial and the sentinels past the last row stay.
    r, n_rows, n_cols, rows = rng(42), 37, cols(dtype), 3
    tw, values = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=42)
    x = randn(r, n_cols)
    tx, ty = gpu.upload(x), gpu.filled(n_rows + 3)
    op = kernels.weight_op("matvec", tw, gpu.sg * rows, {1: rows})
    gpu.stream.record([op(tw, tx, ty, grid=(groups(n_rows, rows), 1, 1), n_cols=n_cols,
                          x_offset=0, n_rows=n_rows)])
    got = gpu.read(ty)
    terms = values * x.astype(np.float64)         # "matvec" named: the f32-x variant
    assert rel_err(got[:n_rows], terms.sum(1), np.abs(terms).sum(1)) < 2e-7
    np.testing.assert_array_equal(got[n_rows:], SENTINEL)


# -- fused decode kernels ------------------------------------------------------------------
# One token's matvec_add, matvec_glu and qkv_rope against float64 references of the unfused
# chain (rmsnorm, products, silu_mul / rope, cache writes), for every weight type. The fused
# RMSNorm scales the product instead of its input: s * sum_k W[k] (x[k] w_n[k]), so the
# product's bound (2e-7 relative to sum|terms|, test_linear_weights_as_stored) holds with the
# terms W[k] * n(x)[k] and a few more roundings of s (each 2^-24 relative).
# (subgroups per workgroup, rows per workgroup, x staged) of every decode product
# (vkrt/tuning.py): a CPU device's (1, 1), a GPU's few-rows (4, 1), and rows per workgroup
# that leave the last workgroup of 37 rows partial (3: 13 workgroups, the last with 1 row,
# block types' x through shared memory: glsl/unit_x.glsl; 8 with one subgroup, 4
# invocations per unit of 32 weights).
# Block types' x as integers (`_xq` variants, glsl/unit_xq.glsl) in the launches marked so,
# as f32 in the others (the split launch runs the `_xq` variant's float path).
ROW_LAUNCHES = {"1-subgroup-rows-xq": (1, 1, False, 1, True),
                "4-subgroup-rows": (4, 1, False, 1, False),
                "2-subgroups-3-rows-staged-xq": (2, 3, True, 1, True),
                "1-subgroup-8-rows-4-per-unit-xq": (1, 8, False, 4, True)}


@pytest.fixture(params=list(ROW_LAUNCHES.values()), ids=list(ROW_LAUNCHES))
def row_kernels(gpu, request):
    """Kernels whose decode products run `param` = (subgroups, rows) per workgroup, so both
    reductions and partial last workgroups run here."""
    subgroups, rows, stage, split, integer_x = request.param
    # head_norm_rope (qkv_rope's second dispatch) on as many subgroups.
    table = dataclasses.replace(tuning.CPU, norm_subgroups=subgroups)
    for kernel in ("matvec", "matvec_glu", "qkv_rope"):
        table = table.with_decode(subgroups, rows, kernel, stage_x=stage, split=split,
                                  integer_x=integer_x)
    return Kernels(gpu.cache, tuning=table)


def test_norms_take_the_tables_subgroups(gpu):
    """rmsnorm, rmsnorm_add, add_rmsnorm and head_norm_rope run a row on the table's
    norm_subgroups subgroups (vkrt/tuning.py; the GPU's 8, lavapipe's 1)."""
    for n in (1, 3):
        k = Kernels(gpu.cache, tuning=dataclasses.replace(tuning.CPU, norm_subgroups=n))
        for op in (k._rmsnorm, k._rmsnorm_add, k._add_rmsnorm, *k._head_norm_rope.values()):
            assert op.pipeline.local_size[0] == gpu.sg * n, op.pipeline.name


# Sizes the unit walk of the decode products (weights.glsl unit_dot, glsl/unit_x.glsl) makes
# risky: rows of one block (fewer units than invocations), and many blocks (67 of 32, 9 of
# 256: several chunks of units, the last partial), rows not a multiple of the rows per
# workgroup; x staged or not.
UNIT_LAUNCHES = {"2-subgroups-3-rows-staged": (2, 3, True, 1, False),
                 "2-subgroups-3-rows-staged-xq": (2, 3, True, 1, True),
                 "1-subgroup-5-rows-2-per-unit-xq": (1, 5, False, 2, True),
                 "2-subgroups-2-rows-4-per-unit": (2, 2, False, 4, False),
                 "8-subgroups-8-rows-xq": (8, 8, False, 1, True)}   # the GPU's ffn_down


@pytest.mark.parametrize("launch", list(UNIT_LAUNCHES))
@pytest.mark.parametrize("blocks,n_rows", [(1, 7), (-1, 11)], ids=["one-block", "many-blocks"])
@pytest.mark.parametrize("dtype", [t.dtype for t in weight_types.TYPES if t.quantized])
def test_matvec_units_odd_sizes(gpu, dtype, blocks, n_rows, launch):
    t = weight_types.BY_DTYPE[dtype]
    blocks = blocks if blocks > 0 else (67 if t.block == 32 else 9)
    subgroups, rows, stage, split, integer_x = UNIT_LAUNCHES[launch]
    k = Kernels(gpu.cache, tuning=tuning.CPU.with_decode(subgroups, rows, stage_x=stage,
                                                         split=split, integer_x=integer_x))
    r, n_cols = rng(43), blocks * t.block
    tw, values = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=43)
    x = randn(r, 2, n_cols)
    tx, ty = gpu.upload(x), gpu.filled(n_rows + 3)
    d = k.linear(tx, tw, ty, 1, x_row=1)
    assert d.grid[0] * d.grid[1] == -(-n_rows // rows)
    assert k.decode_launch("matvec", tw, n_rows)[2] == (
        {6: split} if split > 1 else {7: 1} if stage else {})
    gpu.stream.record([d])
    got = gpu.read(ty)
    terms = values * decode_x(k, dtype, x[1], n_rows)
    # As test_linear_weights_as_stored (2e-7 relative to sum|w*x|; 67 blocks: sqrt(2144)
    # * 2^-24 = 2.8e-6 in the worst case, ~2^-24 typical).
    assert rel_err(got[:n_rows], terms.sum(1), np.abs(terms).sum(1)) < 2e-7
    np.testing.assert_array_equal(got[n_rows:], SENTINEL)


XQ_TYPES = [t.dtype for t in weight_types.TYPES if t.integer_x]


@pytest.mark.parametrize("dtype", XQ_TYPES)
def test_matvec_xq_units_at_the_edges(gpu, dtype):
    """The quantized x of the `_xq` decode products (glsl/unit_xq.glsl) at its edges, one
    row of x per case, 9 rows of weights: a max |x| just below a power of two in every unit
    (m / dx rounds to 32768, past int16: the clamp to 32767), units of tiny values (1e-35:
    the float path, no step of 2^130) and of zeros, an infinity and a NaN in one unit each
    (the float path: IEEE results, as the f32 kernels give them). Each row against numpy's
    x^ (quantize_units) with the float kernels' bound; non-finite outputs exactly."""
    kernels = Kernels(gpu.cache, tuning=tuning.CPU.with_decode(1, 1, integer_x=True))
    assert kernels.decode_integer_x("matvec", dtype, 9), \
        "lavapipe and the H200 have shaderIntegerDotProduct"
    t = weight_types.BY_DTYPE[dtype]
    r, n_rows, n_cols = rng(44), 9, 2 * t.block
    tw, values = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=44)
    cases = {"below-a-power-of-two": np.clip(randn(r, n_cols), -3, 3) * np.float32(0.25),
             "tiny-and-zero": np.zeros(n_cols, np.float32), "inf": randn(r, n_cols),
             "nan": randn(r, n_cols)}
    units = (np.arange(n_cols).reshape(-1, t.block)[:, unit_elements(dtype)]).reshape(-1, 32)
    for u in units:           # each unit's max 1 - 2^-20: f 2^15 = 32767.97 rounds to 32768
        cases["below-a-power-of-two"][u[7]] = np.float32(1 - 2.0 ** -20) * (-1) ** u[0]
    cases["tiny-and-zero"][units[0]] = randn(r, 32) * np.float32(1e-35)
    cases["inf"][units[-1][3]] = np.inf
    cases["nan"][units[0][5]] = np.nan
    for name, x in cases.items():
        tx, ty = gpu.upload(x), gpu.filled(n_rows + 3)
        gpu.stream.record([kernels.linear(tx, tw, ty, 1)])
        got = gpu.read(ty)
        xs = quantize_units(x, dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            terms = values * xs
            want = terms.sum(1)
        finite = np.isfinite(want)
        np.testing.assert_array_equal(got[:n_rows][~finite], want[~finite], err_msg=name)
        if finite.any():
            # The float kernels' bound, plus what flushing denormals costs: the tiny unit's
            # terms (1e-35 times weights) reach below 2^-126, where Vulkan lets a device
            # flush results to zero (NVIDIA's driver does; lavapipe keeps them), each of at
            # most 64 operations per output off by less than 2^-126.
            diff = np.abs(got[:n_rows][finite].astype(np.float64) - want[finite])
            bound = 2e-7 * np.abs(terms[finite]).sum(1) + 64 * 2.0 ** -126
            assert np.all(diff <= bound), (name, float(np.max(diff / bound)))
        np.testing.assert_array_equal(got[n_rows:], SENTINEL)


def rms_reference(x: np.ndarray, norm_w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x) + eps) * norm_w


@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
def test_matvec_add_accumulates_into_y(gpu, row_kernels, dtype):
    # y += W x: the residual add folded into the projection; rows past n_rows keep their
    # values (sentinels).
    r, n_rows, n_cols = rng(60), 37, cols(dtype)
    tw, values = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=60)
    x, y0 = randn(r, n_cols), randn(r, n_rows)
    tx, ty = gpu.upload(x), gpu.upload(np.concatenate([y0, np.full(5, SENTINEL, np.float32)]))
    gpu.stream.record([row_kernels.linear(tx, tw, ty, 1, accumulate=True)])
    got = gpu.read(ty)
    terms = values * decode_x(row_kernels, dtype, x, n_rows)[None, :]
    want = y0 + terms.sum(1)
    # One more f32 rounding (the add) than the product: 2^-24 |y|, inside the bound.
    assert rel_err(got[:-5], want, np.abs(terms).sum(1) + np.abs(y0)) < 2e-7
    np.testing.assert_array_equal(got[-5:], SENTINEL)


# SiLU with every weight type, GELU-tanh (its code after the products) with a third of them.
GLU_CASES = [(d, gelu) for i, d in enumerate(WEIGHT_TYPES)
             for gelu in ((False, True) if i % 3 == 0 else (False,))]


@pytest.mark.parametrize("dtype,gelu", GLU_CASES,
                         ids=[f"{d}-{'gelu-tanh' if g else 'silu'}" for d, g in GLU_CASES])
def test_matvec_glu_is_rmsnorm_gate_up_silu(gpu, row_kernels, dtype, gelu):
    """silu(gate) * up, or with `gelu` (specialization constant GELU, Gemma's GeGLU)
    gelu_tanh(gate) * up, as test_gelu_mul."""
    r, n_ff, n_embd, eps = rng(61), 37, cols(dtype), 1e-5
    tg, g_values = stored_weight(gpu, dtype, randn(r, n_ff, n_embd), seed=61)
    tu, u_values = stored_weight(gpu, dtype, randn(r, n_ff, n_embd), seed=62)
    x, norm_w = randn(r, n_embd) * 3, randn(r, n_embd)
    tx, tn, to = gpu.upload(x), gpu.upload(norm_w), gpu.filled(n_ff + 5)
    gpu.stream.record([row_kernels.glu(tx, tn, tg, tu, to, eps, gelu=gelu)])
    got = gpu.read(to)
    xn = decode_norm_x(row_kernels, dtype, x, norm_w, eps, n_ff, "matvec_glu")
    g_terms, u_terms = g_values * xn, u_values * xn
    g, u = g_terms.sum(1), u_terms.sum(1)
    if gelu:
        silu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
    else:
        silu = g / (1 + np.exp(-g))
    # Errors of g and u (2e-7 of sum|terms|) carried through the activation (slope within
    # [-0.1, 1.1] for SiLU, [-0.17, 1.13] for GELU-tanh) and the product; exp and the
    # division add a few ulps of the result (GELU's tanh an absolute few ulps of 1, times
    # 0.5 |g u|: test_gelu_mul).
    bound = 2e-7 * ((1.2 if gelu else 1.1) * np.abs(g_terms).sum(1) * np.abs(u)
                    + np.abs(silu) * np.abs(u_terms).sum(1))
    bound += 1e-6 * np.abs(silu * u) + (1e-6 * 0.5 * np.abs(g * u) if gelu else 0)
    assert np.all(np.abs(got[:-5] - silu * u) <= bound), \
        np.max(np.abs(got[:-5] - silu * u) / bound)
    np.testing.assert_array_equal(got[-5:], SENTINEL)


def test_fused_norm_past_the_f32_range_of_squares(gpu, row_kernels):
    """The RMSNorm folded into matvec_glu (rms_in.glsl, shared with qkv_rope) of a row whose
    squares overflow f32 (x * 1e30): checked as test_matvec_glu_is_rmsnorm_gate_up_silu
    checks an ordinary row, against float64. Without the power-of-two scaling the sum of
    squares is inf and the output 0 or NaN."""
    r, n_ff, n_embd, eps = rng(63), 37, 96, 1e-5
    tg, g_values = stored_weight(gpu, "float32", randn(r, n_ff, n_embd))
    tu, u_values = stored_weight(gpu, "float32", randn(r, n_ff, n_embd))
    x, norm_w = randn(r, n_embd) * np.float32(1e30), randn(r, n_embd)
    tx, tn, to = gpu.upload(x), gpu.upload(norm_w), gpu.filled(n_ff + 5)
    gpu.stream.record([row_kernels.glu(tx, tn, tg, tu, to, eps)])
    got = gpu.read(to)
    xn = rms_reference(x, norm_w, eps)
    g_terms, u_terms = g_values * xn, u_values * xn
    g, u = g_terms.sum(1), u_terms.sum(1)
    silu = g / (1 + np.exp(-g))
    bound = 2e-7 * (1.1 * np.abs(g_terms).sum(1) * np.abs(u)
                    + np.abs(silu) * np.abs(u_terms).sum(1))
    assert np.all(np.abs(got[:-5] - silu * u) <= bound + 1e-6 * np.abs(silu * u)), \
        np.max(np.abs(got[:-5] - silu * u) / (bound + 1e-6 * np.abs(silu * u)))
    np.testing.assert_array_equal(got[-5:], SENTINEL)


# layout: (RoPE on halves, Q/K/V biases, per-head Q/K RMSNorm)
QKV_LAYOUTS = {"adjacent": (False, False, False), "halves-biased": (True, True, False),
               "halves-qk-norm": (True, False, True),
               "adjacent-biased-qk-norm": (False, True, True)}
# Every weight type with the plain layout and with one other in turn (a layout's code runs
# after the products, the same for every type), so each layout meets a third of the types
# (float, legacy and K-quant blocks among them), at every launch. The full cross product
# doubled the pipelines lavapipe compiles (each type x layout x launch is one).
# V of its own type (the mixed variants, weight_types.MIXED_QKV): every pair with the plain
# layout, V's units read at their own runs and block size.
QKV_CASES = [(d, layout, d) for i, d in enumerate(WEIGHT_TYPES)
             for layout in ("adjacent", list(QKV_LAYOUTS)[1 + i % 3])] \
    + [(q, "adjacent", v) for q, v in weight_types.MIXED_QKV]


@pytest.mark.parametrize("use_pos", [False, True], ids=["pos0", "pos-buffer"])
@pytest.mark.parametrize("dtype,layout,v_dtype", QKV_CASES,
                         ids=[f"{d}-{lay}" if v == d else f"{d}-v-{v}-{lay}"
                              for d, lay, v in QKV_CASES])
def test_qkv_rope_writes_q_and_the_cache_row(gpu, row_kernels, dtype, use_pos, layout, v_dtype):
    # 3 query heads and 1 KV head of 32: 80 row pairs; position 5 as pos0 = 5, or as pos0 = 3
    # plus 2 from the position buffer (a replayed step). Cache rows other than 5 keep their
    # sentinels. "halves-biased": RoPE on halves (NEOX) and Q/K/V biases added before it
    # (qwen2's layout); "...-qk-norm": each Q and K head RMS-normed before RoPE (QK_NORM:
    # qwen3, gemma3), a workgroup per head. V of another type runs the mixed variant, x in
    # f32 at every launch.
    neox, biased, qk_norm = QKV_LAYOUTS[layout]
    r, n_embd, head_dim, n_heads, n_kv, rows, eps = rng(62), cols(dtype), 32, 3, 1, 8, 1e-5
    pos0, shift = (3, 2) if use_pos else (5, 7)  # the buffer's 7 must be ignored without use_pos
    p = pos0 + (shift if use_pos else 0)
    wq = stored_weight(gpu, dtype, randn(r, n_heads * head_dim, n_embd), seed=63)
    wk = stored_weight(gpu, dtype, randn(r, n_kv * head_dim, n_embd), seed=64)
    wv = stored_weight(gpu, v_dtype, randn(r, n_kv * head_dim, n_embd), seed=65)
    x, norm_w = randn(r, n_embd), randn(r, n_embd)
    table = rope_table(head_dim, 10000.0, rows)
    tx, tn, tcs = gpu.upload(x), gpu.upload(norm_w), gpu.upload(table)
    tq = gpu.filled(n_heads * head_dim + 3)
    kvw = n_kv * head_dim
    tk, tv = gpu.filled(rows * kvw), gpu.filled(rows * kvw)
    tk, tv = (Tensor.of(t.buffer, "float32", (rows, kvw)) for t in (tk, tv))
    tpos = gpu.upload(np.array([shift], np.uint32))
    bias = [randn(r, n) if biased else np.zeros(n, np.float32)
            for n in (n_heads * head_dim, kvw, kvw)]
    tb = tuple(gpu.upload(b) for b in bias) if biased else None
    head_w = [randn(r, head_dim), randn(r, head_dim)]   # q_norm, k_norm weights
    tqk = tuple(gpu.upload(w) for w in head_w) if qk_norm else None
    ds = row_kernels.qkv_rope(tx, tn, wq[0], wk[0], wv[0], tcs, tq, tk, tv, head_dim, pos0,
                              eps, tpos, use_pos, neox=neox, biases=tb, qk_norm=tqk)
    # The table's rows are pairs per workgroup, lowered to a divisor of head_dim / 2 (16):
    # 1, 3 -> 2, 8 (qkv_rope.comp PAIRS); the norms are a second dispatch, one head each.
    per_group = max(d for d in (1, 2, 4, 8, 16) if d <= row_kernels.tuning.decode_rule(
        "qkv_rope", 1, 1).rows)
    assert ds[0].grid[0] * ds[0].grid[1] == (n_heads + 2 * n_kv) * head_dim // 2 // per_group
    assert len(ds) == (2 if qk_norm else 1)
    assert ds[0].pipeline.name.endswith(f"_v_{v_dtype}") == (v_dtype != dtype)
    gpu.stream.record(ds)
    xn = (decode_norm_x(row_kernels, dtype, x, norm_w, eps,
                        (n_heads + 2 * n_kv) * head_dim // 2, "qkv_rope")
          if v_dtype == dtype else rms_reference(x, norm_w, eps))

    def rotated(values, b, w=None):
        terms = values * xn
        y, scale = terms.sum(1) + b, np.abs(terms).sum(1) + np.abs(b)
        if w is not None:
            # RMSNorm per head: y_e w_e / rms. An error dy_j of every value moves rms by at
            # most max |dy_j|, so the normed value's error is bounded by
            # |w_e| / rms (dy_e + |y_e| max_j dy_j / rms), plus its own roundings.
            heads, sc = y.reshape(-1, head_dim), scale.reshape(-1, head_dim)
            rms = np.sqrt(np.mean(heads ** 2, axis=1, keepdims=True) + eps)
            normed = heads / rms * w
            sc = np.abs(w) / rms * (sc + np.abs(heads) / rms * sc.max(1, keepdims=True)) \
                + np.abs(normed)
            y, scale = normed.reshape(-1), sc.reshape(-1)
        # the pairs RoPE rotates, as rows of [pairs, 2]
        order = (np.arange(len(y)).reshape(-1, 2, head_dim // 2).swapaxes(1, 2).reshape(-1)
                 if neox else np.arange(len(y)))
        y, scale = y[order].reshape(-1, 2), scale[order].reshape(-1, 2)
        c, s = (table[p, np.arange(len(y)) % (head_dim // 2)].astype(np.float64).T)
        out = np.empty(2 * len(y))
        out[order] = np.stack([y[:, 0] * c - y[:, 1] * s, y[:, 0] * s + y[:, 1] * c], 1).reshape(-1)
        return out, np.repeat(scale.sum(1), 2)[np.argsort(order)]

    q, q_scale = rotated(wq[1], bias[0], head_w[0] if qk_norm else None)
    got_q = gpu.read(tq)
    assert rel_err(got_q[:-3], q, q_scale) < 3e-7
    np.testing.assert_array_equal(got_q[-3:], SENTINEL)
    k, k_scale = rotated(wk[1], bias[1], head_w[1] if qk_norm else None)
    v_terms = wv[1] * xn
    for t, want, scale in ((tk, k, k_scale), (tv, v_terms.sum(1) + bias[2],
                                              np.abs(v_terms).sum(1) + np.abs(bias[2]))):
        got = gpu.read(t).reshape(rows, kvw)
        assert rel_err(got[p], want, scale) < 3e-7
        np.testing.assert_array_equal(np.delete(got, p, axis=0), SENTINEL)


# One sequence's f16 KV cache (vkrt.load(kv_cache_dtype="f16")): each writer's `_kvf16`
# variant stores the values its f32 variant stores, rounded to f16 as numpy rounds them
# (nearest even, which lavapipe does; Vulkan also allows toward zero: kv.glsl), at row p =
# pos0 (+ the position buffer's 2 when a replayed step passes it), every other row untouched.
# qkv_rope writes K and V (the fused decode; adjacent pairs, or halves with biases), rope K
# (the unfused path and the prefill, both pair layouts), copy_rows V.
@pytest.mark.parametrize("writer", ["qkv_rope", "qkv_rope-halves-biased", "rope",
                                    "rope-halves", "copy_rows"])
@pytest.mark.parametrize("use_pos", [False, True], ids=["pos0", "pos-buffer"])
def test_cache_writers_store_f16_as_the_f32_values_rounded(gpu, kernels, writer, use_pos):
    _, _, sentinel16 = kv_dtype_of(gpu, "f16")
    r, n_heads, n_kv, head_dim, rows, n_embd, pos0, shift = rng(48), 2, 1, 16, 8, 64, 3, 2
    p, kvw = pos0 + (shift if use_pos else 0), n_kv * head_dim
    tpos = gpu.upload(np.array([shift], np.uint32))
    table = gpu.upload(rope_table(head_dim, 10000.0, rows))
    pos = tpos if use_pos else None

    def caches(dtype, value):
        return [Tensor.of(gpu.filled(rows * kvw, value, dtype).buffer, np.dtype(dtype).name,
                          (rows, kvw)) for _ in "kv"]

    if writer.startswith("qkv_rope"):
        halves = writer.endswith("halves-biased")
        wq, wk, wv = (stored_weight(gpu, "float32", randn(r, n, n_embd))[0]
                      for n in (n_heads * head_dim, kvw, kvw))
        x, norm_w = gpu.upload(randn(r, n_embd)), gpu.upload(randn(r, n_embd))
        biases = (tuple(gpu.upload(randn(r, n)) for n in (n_heads * head_dim, kvw, kvw))
                  if halves else None)

        def write(k, v):
            return kernels.qkv_rope(x, norm_w, wq, wk, wv, table, gpu.filled(n_heads * head_dim),
                                    k, v, head_dim, pos0, 1e-5, tpos, use_pos, neox=halves,
                                    biases=biases)
        written = (0, 1)
    elif writer.startswith("rope"):
        src = gpu.upload(randn(r, 1, kvw))

        def write(k, v):
            return [kernels.rope(src, table, k, 1, n_kv, head_dim, pos0, dst_row=pos0, pos=pos,
                                 dst_at_pos=use_pos, neox=writer == "rope-halves")]
        written = (0,)
    else:
        src = gpu.upload(randn(r, 1, kvw))

        def write(k, v):
            return [kernels.copy_rows(src, v, 1, pos0, pos=pos)]
        written = (1,)
    f32, f16 = caches(np.float32, SENTINEL), caches(np.float16, sentinel16)
    gpu.stream.record(write(*f32))
    ds = write(*f16)
    assert all("_kvf16" in d.pipeline.name for d in ds)
    gpu.stream.record(ds)
    for i in (0, 1):
        want = gpu.read(f32[i]).reshape(rows, kvw)
        got = gpu.read(f16[i], np.float16).reshape(rows, kvw)
        if i in written:
            assert np.all(want[p] != SENTINEL)
            np.testing.assert_array_equal(got[p], want[p].astype(np.float16))
        np.testing.assert_array_equal(np.delete(got, p if i in written else [], axis=0),
                                      sentinel16)


def test_qkv_rope_refuses_an_f16_cache_with_per_head_norms(gpu, kernels):
    """head_norm_rope (qkv_rope's second dispatch for per-head Q/K norms) reads and writes an
    f32 cache: qkv_rope refuses an f16 one in one line (the model runs such layers unfused)."""
    kv_dtype_of(gpu, "f16")
    w = stored_weight(gpu, "float32", randn(rng(49), 16, 64))[0]
    x = gpu.upload(randn(rng(49), 64))
    k, v = (Tensor(t.buffer, 0, t.nbytes, "float16", (8, 16), f"blk.0.{what}")
            for what, t in (("k_cache", gpu.filled(8 * 16, 0, np.float16)),
                            ("v_cache", gpu.filled(8 * 16, 0, np.float16))))
    qk = (gpu.upload(randn(rng(49), 16)), gpu.upload(randn(rng(49), 16)))
    with pytest.raises(ShaderInterfaceError, match=r"qkv_rope: per-head Q/K norms .* float32 "
                                                   r"KV cache, not float16 "
                                                   r"\('blk\.0\.k_cache'\)"):
        kernels.qkv_rope(x, x, w, w, w, x, gpu.filled(16), k, v, 16, 0, 1e-5,
                         gpu.upload(np.zeros(1, np.uint32)), False, qk_norm=qk)


@pytest.mark.parametrize("types", [("q4_k", "q5_k", "q4_k"), ("q4_k", "q4_k", "q8_0"),
                                   ("q6_k", "q6_k", "q4_k")],
                         ids=["k-of-another-type", "v-not-a-k-quant", "v-pair-not-mixed"])
def test_qkv_rope_refuses_types_that_do_not_stack(gpu, kernels, types):
    """Q and K of one type, V of it or of the V type of a pair in weight_types.MIXED_QKV:
    anything else is one line naming the three tensors and their dtypes (the model runs such
    layers unfused, Llama.fused_parts)."""
    assert (types[0], types[2]) not in weight_types.MIXED_QKV
    r = rng(50)
    wq, wk, wv = (stored_weight(gpu, t, randn(r, 32, 256))[0] for t in types)
    x = gpu.upload(randn(r, 256))
    cache = Tensor.of(gpu.filled(8 * 32).buffer, "float32", (8, 32))
    with pytest.raises(ShaderInterfaceError, match=rf"qkv_rope: q .* {types[0]} \[32, 256\], "
                                                   rf"k .* {types[1]} .*, v .* {types[2]} .* "
                                                   r"do not stack"):
        kernels.qkv_rope(x, x, wq, wk, wv, x, gpu.filled(32), cache, cache, 16, 0, 1e-5,
                         gpu.upload(np.zeros(1, np.uint32)), False)


# -- the batched runner (vkrt/models/batch.py): positions, slot mapping, block tables -------
def test_rope_positions_per_token(gpu):
    """rope_positions: token t rotated by the angles of positions[t] (any order, repeats),
    written at row t; the same bits as `rope` at that position."""
    r, n_heads, head_dim = rng(40), 3, 16
    positions = np.array([7, 0, 31, 7, 12], np.uint32)
    x = randn(r, len(positions), n_heads, head_dim)
    table = rope_table(head_dim, 10000.0, 32)
    pairs = n_heads * head_dim // 2
    for neox in (0, 1):
        bx, bf, bp = gpu.upload(x), gpu.upload(table), gpu.upload(positions)
        bd = gpu.filled(x.size + 3)
        gpu.run("rope_positions", {0: ELEMENTWISE, 1: neox}, (bx, bf, bd, bp),
                (groups(pairs, ELEMENTWISE), len(positions), 1), push(n_heads, head_dim, 0, 0))
        got = gpu.read(bd)
        np.testing.assert_array_equal(got[-3:], SENTINEL)
        for t, p in enumerate(positions):
            one, out = gpu.upload(x[t]), gpu.filled(n_heads * head_dim)
            gpu.run("rope", {0: ELEMENTWISE, 1: neox}, (one, bf, out),
                    (groups(pairs, ELEMENTWISE), 1, 1), push(n_heads, head_dim, int(p), 0))
            np.testing.assert_array_equal(got[:-3].reshape(x.shape)[t],
                                          gpu.read(out).reshape(n_heads, head_dim))


# The paged KV cache's dtypes: (numpy dtype, the variant suffix, a sentinel it holds exactly).
KV = {"f32": (np.float32, "", SENTINEL), "f16": (np.float16, "_kvf16", np.float16(-1000.0))}


def kv_dtype_of(gpu, kv: str):
    """KV[kv], skipping an f16 cache on a device without storageBuffer16BitAccess."""
    if kv == "f16" and not gpu.device.features.get("storageBuffer16BitAccess"):
        pytest.skip(f"{gpu.device.name} has no storageBuffer16BitAccess (f16 KV cache)")
    return KV[kv]


@pytest.mark.parametrize("kv", list(KV))
def test_kv_write_by_slot_mapping(gpu, kv):
    """K and V rows into their slots; an f16 cache holds each value rounded to nearest even
    (numpy's float16 rounding), every other slot untouched."""
    dtype, suffix, sentinel = kv_dtype_of(gpu, kv)
    r, width, n_slots = rng(41), 24, 13
    slots = np.array([9, 0, 12, 4], np.uint32)
    k, v = randn(r, len(slots), width), randn(r, len(slots), width)
    bk, bv, bs = gpu.upload(k), gpu.upload(v), gpu.upload(slots)
    kc, vc = gpu.filled(n_slots * width, sentinel, dtype), gpu.filled(n_slots * width, sentinel,
                                                                       dtype)
    gpu.run("kv_write" + suffix, {0: ELEMENTWISE}, (bk, bv, bs, kc, vc),
            (groups(width, ELEMENTWISE), len(slots), 1), push(width))
    for cache, src in ((kc, k), (vc, v)):
        want = np.full((n_slots, width), sentinel, dtype)
        want[slots] = src.astype(dtype)
        np.testing.assert_array_equal(gpu.read(cache, dtype).reshape(n_slots, width), want)


@pytest.mark.parametrize("kv", list(KV))
def test_rope_kv_write_is_rope_positions_and_kv_write(gpu, kv):
    """rope_kv_write (the batched step's fused RoPE and KV-cache write): Q rotated at each
    token's position into q_out, K rotated and V copied into the slots of the slot mapping
    (grouped-query: K/V rows of half Q's width), both pair layouts; the same bits as
    rope_positions and kv_write (an f16 cache: those f32 bits rounded as numpy's float16),
    every other slot untouched."""
    dtype, suffix, sentinel = kv_dtype_of(gpu, kv)
    r, n_heads, n_kv_heads, head_dim, n_slots = rng(45), 4, 2, 16, 13
    positions = np.array([7, 0, 31, 12], np.uint32)
    slots = np.array([9, 0, 12, 4], np.uint32)
    T, qw, kw = len(positions), n_heads * head_dim, n_kv_heads * head_dim
    q, k, v = randn(r, T, qw), randn(r, T, kw), randn(r, T, kw)
    table = rope_table(head_dim, 10000.0, 32)
    bq, bk, bv, bf = gpu.upload(q), gpu.upload(k), gpu.upload(v), gpu.upload(table)
    bp, bs = gpu.upload(positions), gpu.upload(slots)
    for neox in (0, 1):
        q_out = gpu.filled(T * qw + 3)
        kc, vc = (gpu.filled(n_slots * kw, sentinel, dtype) for _ in "kv")
        gpu.run("rope_kv_write" + suffix, {0: ELEMENTWISE, 1: neox},
                (bq, bk, bv, bf, bp, bs, q_out, kc, vc),
                (groups(qw // 2, ELEMENTWISE), T, 1), push(n_heads, n_kv_heads, head_dim))
        want_q, want_k = gpu.filled(T * qw), gpu.filled(T * kw)
        for src, dst, heads in ((bq, want_q, n_heads), (bk, want_k, n_kv_heads)):
            gpu.run("rope_positions", {0: ELEMENTWISE, 1: neox}, (src, bf, dst, bp),
                    (groups(heads * head_dim // 2, ELEMENTWISE), T, 1),
                    push(heads, head_dim, 0, 0))
        got_q = gpu.read(q_out)
        np.testing.assert_array_equal(got_q[-3:], SENTINEL)
        np.testing.assert_array_equal(got_q[:-3], gpu.read(want_q))
        for cache, rows in ((kc, gpu.read(want_k).reshape(T, kw)), (vc, v)):
            want = np.full((n_slots, kw), sentinel, dtype)
            want[slots] = rows.astype(dtype)
            np.testing.assert_array_equal(gpu.read(cache, dtype).reshape(n_slots, kw), want)


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("window", [0, 5], ids=["causal", "window-5"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_attention_paged_reads_each_sequence_through_its_block_table(gpu, window, block_size,
                                                                     kv):
    """Three sequences' keys in shuffled physical blocks (every other slot NaN, so a slot read
    outside a token's own sequence and window poisons its output); tokens of all three
    interleaved. Each token equals float64 attention over its own sequence, and is
    bit-identical to attention.comp over that sequence's contiguous cache (batch
    invariance: the same reduction order). An f16 cache is read exactly: the float64
    reference and attention.comp (f32) take the f16 values."""
    dtype, suffix, _ = kv_dtype_of(gpu, kv)
    r, head_dim, n_heads, n_kv_heads = rng(42), 16, 4, 2
    lengths = [37, 5, 20]
    queries = [(1, 4), (0, 30), (2, 19), (0, 31), (0, 36), (2, 3)]   # (sequence, position)
    need = [-(-n // block_size) for n in lengths]
    num_blocks = sum(need) + 3
    order = list(r.permutation(num_blocks))
    tables = np.full((len(lengths), max(need)), order[-1], np.uint32)   # unused: a NaN block
    k_cache = np.full((num_blocks * block_size, n_kv_heads, head_dim), np.nan, np.float32)
    v_cache = k_cache.copy()
    ks, vs = [], []
    for s, n in enumerate(lengths):
        tables[s, :need[s]] = [order.pop(0) for _ in range(need[s])]
        ks.append(randn(r, n, n_kv_heads, head_dim).astype(dtype).astype(np.float32))
        vs.append(randn(r, n, n_kv_heads, head_dim).astype(dtype).astype(np.float32))
        for j in range(n):
            slot = tables[s, j // block_size] * block_size + j % block_size
            k_cache[slot], v_cache[slot] = ks[s][j], vs[s][j]
    q = randn(r, len(queries), n_heads, head_dim)
    seq = np.array([s for s, _ in queries], np.uint32)
    positions = np.array([p for _, p in queries], np.uint32)
    scale = float(np.float32(1 / np.sqrt(head_dim)))
    bufs = [gpu.upload(a) for a in (q, k_cache.astype(dtype), v_cache.astype(dtype))]
    bo = gpu.filled(q.size + 3)
    bufs += [bo] + [gpu.upload(a) for a in (positions, seq, tables)]
    spec = {0: head_dim, 1: window} if window else {0: head_dim}
    gpu.run("attention_paged" + suffix, spec, bufs, (n_heads, len(queries), 1),
            push(n_heads, n_kv_heads, block_size, tables.shape[1], scale))
    got = gpu.read(bo)
    np.testing.assert_array_equal(got[-3:], SENTINEL)
    got = got[:-3].reshape(q.shape)
    for t, (s, p) in enumerate(queries):
        kc = np.concatenate([ks[s][:p + 1], np.full((3, n_kv_heads, head_dim), np.nan,
                                                    np.float32)])
        vc = np.concatenate([vs[s][:p + 1], np.full((3, n_kv_heads, head_dim), np.nan,
                                                    np.float32)])
        want = attention_reference(q[t:t + 1], kc, vc, p, scale, window)[0]
        np.testing.assert_allclose(got[t], want, rtol=0, atol=1e-6)
        alone = run_attention(gpu, q[t:t + 1], kc, vc, p, scale, window=window)[0]
        assert np.array_equal(got[t], alone), (s, p)


def test_argmax_rows_one_row_each(gpu):
    logits = randn(rng(43), 5, 300)
    logits[1, [7, 250]] = 9.0      # a tie: the smaller index
    logits[3] = -np.inf            # all -inf: index 0
    bl, bt = gpu.upload(logits), gpu.filled(6, 0xDEAD, np.uint32)
    gpu.run("argmax_rows", {0: 64}, (bl, bt), (5, 1, 1), push(300, 0))
    got = gpu.read(bt, np.uint32)
    assert list(got) == [int(np.argmax(logits[0])), 7, int(np.argmax(logits[2])), 0,
                         int(np.argmax(logits[4])), 0xDEAD]


@pytest.mark.parametrize("n_tokens", [1, 63, 65, 130])
def test_feed_sampled_takes_the_named_rows_only(gpu, kernels, n_tokens):
    """ids[t] = sampled[src[t]] where src[t] is not 0xFFFFFFFF, for t < n_tokens only: the
    numpy expectation over odd counts (one workgroup of 64 and a part of the next), the
    ids past n_tokens untouched."""
    r = rng(44 + n_tokens)
    ids = r.integers(0, 1000, n_tokens + 3).astype(np.uint32)
    src = np.where(r.random(n_tokens + 3) < 0.5, 0xFFFFFFFF,
                   r.integers(0, 9, n_tokens + 3)).astype(np.uint32)
    sampled = r.integers(1000, 2000, 9).astype(np.uint32)
    bi, bs, bv = gpu.upload(ids), gpu.upload(src), gpu.upload(sampled)
    gpu.stream.record([kernels.feed_sampled(bi, bs, bv, n_tokens)])
    want = ids.copy()
    fed = src[:n_tokens] != 0xFFFFFFFF
    want[:n_tokens][fed] = sampled[src[:n_tokens][fed]]
    assert 0 < fed.sum() < n_tokens or n_tokens == 1
    assert np.array_equal(gpu.read(bi, np.uint32), want)


@pytest.mark.parametrize("kernel,tiles", [
    ("matmul", ((1, 8),)), ("matmul", ((4, 8), (3, 16), (2, 32), (1, 1))),
    ("matmul_tiled", ()),
    ("matmul_coop", ((16, 64, 1, 2), (32, 128, 2, 4), (64, 128, 2, 4), (128, 128, 2, 4))),
    ("matmul_coop", ((16, 32, 1, 2, 4), (32, 16, 2, 1, 4), (64, 64, 2, 2, 4), (16, 16, 1, 1, 4)))],
    ids=["matmul", "matmul-tiles", "matmul_tiled", "matmul_coop-tiles", "matmul_coop-splitk"])
def test_batched_linear_rows_independent_of_the_token_count(gpu, kernels, kernel, tiles):
    """Kernels.linear(batched=kernel), the batched runner's products on the kernel the table
    names for a role (`Kernels.batch_products`): token t's row has the same bits whether 1,
    2, 3, 5, 8 or 70 tokens run, whichever row the product starts at (token0) and, for
    matmul and matmul_coop, whatever tile the table gives (`Table.batch_tiles`: rows per
    workgroup x tokens per tile; `batch_coop_tiles`: tokens x rows over subgroups, one
    column split (sg_k) for all, 4 groups over 96 columns: one step of 128); the rules
    cycled over the counts; 70 rows leave partial row groups); rows outside token0 ..
    token0 + n - 1 are not written. matmul_coop (f16 operands) within its bound of sum |x w|
    (test_linear_coop_weights_as_stored's), the f32 kernels within 1e-6."""
    from vkrt.tuning import BatchCoopTile, BatchTile

    if kernel == "matmul_coop":
        coop_or_skip(kernels)
    change = {"batch_products": {"decode": kernel, "prompt": kernel}}
    r, n_rows, n_cols = rng(44), 70, 96
    w, x = randn(r, n_rows, n_cols), randn(r, 70, n_cols)
    bw, bx = gpu.upload(w), gpu.upload(x)
    rows = {}
    for i, n in enumerate((70, 1, 2, 3, 5, 8)):
        if tiles and kernel == "matmul":
            change["batch_tiles"] = (BatchTile(None, *tiles[i % len(tiles)], "test"),)
        elif tiles:
            bm, bn, sg_m, sg_n, *sg_k = tiles[i % len(tiles)]
            change["batch_coop_tiles"] = (BatchCoopTile(None, bm, bn, sg_m, sg_n, "test",
                                                        *sg_k),)
        kernels.tuning = dataclasses.replace(kernels.tuning, **change)
        for token0, role in ((0, "decode"), (70 - n, "prompt")):
            by = gpu.filled(70 * n_rows)
            d = kernels.linear(bx, bw, by, n, batched=kernels.batch_products()[role],
                               token0=token0)
            assert d.pipeline.name == f"{kernel}_f32"
            gpu.stream.record([d])
            got = gpu.read(by).reshape(70, n_rows)
            rows[n, token0] = got[token0:token0 + n]
            assert np.all(got[:token0] == SENTINEL) and np.all(got[token0 + n:] == SENTINEL)
    for (n, token0), got in rows.items():
        np.testing.assert_array_equal(got, rows[70, 0][token0:token0 + n])
    terms = w[None].astype(np.float64) * x[:, None].astype(np.float64)
    bound = 2.0 ** -10 + n_cols * 2.0 ** -23 if kernel == "matmul_coop" else 1e-6
    assert rel_err(rows[70, 0], terms.sum(2), np.abs(terms).sum(2)) < bound
    # The prefill's own choice (cooperative matrices from COOP_MIN_TOKENS tokens) does not
    # change the batched products' kernel.
    kernels.prefill_kernel = lambda n_tokens: ("matmul_tiled" if kernel == "matmul_coop"
                                               else "matmul_coop")
    d = kernels.linear(bx, bw, gpu.filled(70 * n_rows), 70,
                       batched=kernels.batch_products()["prompt"])
    assert d.pipeline.name == f"{kernel}_f32"


def test_batched_coop_takes_the_engines_tiles(gpu, kernels):
    """Kernels.linear(batched="matmul_coop", coop_tiles=...): the product runs on the tile
    of the set it is given (an engine's, `Kernels.batch_coop_tiles(max_batch)`), not the
    table's `batch_coop_tiles` (its grid: row tiles of BN, token tiles of BM), and without a
    set on the table's; the tile naming the weight's type before one naming none; each
    within matmul_coop's bound."""
    from vkrt.tuning import BatchCoopTile

    coop_or_skip(kernels)
    kernels.tuning = dataclasses.replace(kernels.tuning, batch_coop_tiles=(
        BatchCoopTile(None, 32, 32, 2, 2, "test", 4),))
    own = (BatchCoopTile(None, 16, 64, 1, 2, "test", 2),)
    r, n_rows, n_cols, n = rng(45), 70, 96, 8
    w, x = randn(r, n_rows, n_cols), randn(r, n, n_cols)
    bw, bx = gpu.upload(w), gpu.upload(x)
    terms = w[None].astype(np.float64) * x[:, None].astype(np.float64)
    typed = (*kernels.tuning.batch_coop_tiles,
             BatchCoopTile(None, 16, 64, 1, 2, "test", 2, dtypes=(bw.dtype,)))
    for tiles, grid in ((own, (2, 1, 1)), (None, (3, 1, 1)), (typed, (2, 1, 1))):
        by = gpu.filled(n * n_rows)
        d = kernels.linear(bx, bw, by, n, batched="matmul_coop", coop_tiles=tiles)
        assert tuple(d.grid) == grid, tiles
        gpu.stream.record([d])
        got = gpu.read(by).reshape(n, n_rows)
        assert rel_err(got, terms.sum(2), np.abs(terms).sum(2)) < 2.0 ** -10 + n_cols * 2.0 ** -23


def test_sum_splits_adds_the_partials_in_order(gpu, kernels):
    """sum_splits.comp: y[token0 + t] = partial 0 + partial 1 + ... in float32, left to
    right (numpy's sequential sum, bit for bit), into rows token0 .. token0 + n_tokens - 1
    of y and nowhere else; one split copies."""
    r = rng(47)
    n_tokens, n_rows, token0 = 5, 37, 3
    for splits in (1, 2, 3, 7):
        part = randn(r, splits, n_tokens, n_rows) * np.float32(1e3)
        want = part[0].copy()
        for p in range(1, splits):
            want += part[p]
        tp, ty = gpu.upload(part.reshape(-1)), gpu.filled((token0 + n_tokens + 2) * n_rows)
        gpu.stream.record([kernels.sum_splits(tp, ty, n_tokens, n_rows, splits, token0)])
        got = gpu.read(ty).reshape(-1, n_rows)
        np.testing.assert_array_equal(got[token0:token0 + n_tokens], want, err_msg=str(splits))
        assert (got[:token0] == SENTINEL).all() and (got[token0 + n_tokens:] == SENTINEL).all()


def test_k_splits_depend_on_the_weight_shape_alone(kernels):
    """Kernels.k_splits: products of fewer than split_rows rows and at least min_steps steps
    of sg_k * 32 columns split their columns over ceil(split_rows / rows) workgroups, at most
    one per step; sg_k and split_rows those of the weight type's own tile where the engine
    has one (`BatchCoopTile.dtypes`, `split_rows`); never by the token count (it is not an
    argument: batch invariance)."""
    from types import SimpleNamespace

    from vkrt.tuning import BatchCoopTile

    tiles8 = (BatchCoopTile(None, 32, 32, 2, 2, "test", 8),)
    tiles4 = (BatchCoopTile(32, 32, 32, 2, 2, "test", 4),
              BatchCoopTile(None, 64, 32, 4, 2, "test", 4))
    typed = (*tiles8, BatchCoopTile(None, 32, 32, 2, 2, "test", 4, 2, dtypes=("q4_1",),
                                    min_rows=1024, split_rows=8192))
    for rows, cols, split_rows, tiles, min_steps, want, dtype in (
            (4096, 4096, 4096, typed, 16, 2, "q4_1"),    # its own: 8192 rows, 32 steps
            (4096, 14336, 4096, typed, 16, 2, "q4_1"),
            (1024, 4096, 4096, typed, 16, 8, "q4_1"),
            (4096, 4096, 4096, typed, 16, 1, "q4_k"),    # the type-blind tile
            (1024, 4096, 4096, typed, 16, 4, "q4_k"),    # 16 steps of 256 columns
            (1024, 2048, 4096, typed, 16, 1, "q6_k"),    # 8 steps of 256: too short
            (1024, 2048, 4096, typed, 16, 8, "q4_1"),    # 16 steps of 128
            (1000, 4096, 4096, typed, 16, 5, "q4_1")):   # under its min_rows: type-blind
        w = SimpleNamespace(shape=(rows, cols), dtype=dtype)
        assert kernels.k_splits(w, split_rows, tiles, min_steps) == want, (rows, cols, dtype)
    for rows, cols, split_rows, tiles, min_steps, want in (
            (1024, 4096, 4096, tiles8, 1, 4),  # a 7B attn_k: 32 row tiles -> 128 workgroups
            (4096, 4096, 4096, tiles8, 1, 1),  # enough rows
            (14336, 4096, 4096, tiles8, 1, 1),
            (512, 2048, 4096, tiles8, 1, 8),   # 8 steps of 256 columns, 8 splits
            (512, 2048, 8192, tiles8, 1, 8),   # at most one split per step
            (512, 2048, 8192, tiles4, 1, 16),  # steps of 128 columns: 16
            (100, 64, 4096, tiles8, 1, 1),     # one step
            (3000, 4096, 4096, tiles8, 1, 2),
            (1024, 4096, 0, tiles8, 1, 1),     # split_rows 0: never
            (512, 2048, 4096, tiles8, 8, 8),   # 8 steps, at least 8 asked
            (576, 1536, 4096, tiles8, 8, 1),   # a 135M ffn_down: 6 steps, too short
            (576, 1536, 4096, tiles4, 8, 8)):  # 12 steps of 128 columns
        w = SimpleNamespace(shape=(rows, cols), dtype="q4_1")
        assert kernels.k_splits(w, split_rows, tiles, min_steps) == want, (rows, cols,
                                                                          split_rows)


@pytest.mark.parametrize("dtype", ["float32", "q4_1"])
def test_linear_coop_split_across_workgroups(gpu, kernels, dtype):
    """Kernels.linear(batched="matmul_coop", k_splits=s, partials=P) then sum_splits: each
    of s workgroups per tile sums a run of the column steps into P, the reduction adds them
    in order; within matmul_coop's bound at 1-7 splits of 5 steps (7: two runs empty); one
    split is the product without it, bit for bit; rows token0 .. of y only."""
    from vkrt.tuning import BatchCoopTile

    coop_or_skip(kernels)
    tiles = (BatchCoopTile(None, 32, 32, 2, 2, "test", 2),)   # steps of 64 columns
    r, n_rows, n_cols, n, token0 = rng(49), 70, 320, 9, 2
    tw, values = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=49)
    x = randn(r, token0 + n, n_cols)
    bx = gpu.upload(x)
    terms = values[None] * x[token0:, None].astype(np.float64)
    plain = gpu.filled((token0 + n) * n_rows)
    gpu.stream.record([kernels.linear(bx, tw, plain, n, batched="matmul_coop",
                                      coop_tiles=tiles, token0=token0)])
    plain = gpu.read(plain).reshape(-1, n_rows)
    for splits in (1, 2, 3, 5, 7):
        part = gpu.filled(splits * n * n_rows)
        by = gpu.filled((token0 + n + 1) * n_rows)
        gpu.stream.record([
            kernels.linear(bx, tw, by if splits == 1 else part, n, batched="matmul_coop",
                           coop_tiles=tiles, token0=token0, k_splits=splits,
                           partials=part if splits > 1 else None),
            *([kernels.sum_splits(part, by, n, n_rows, splits, token0)] if splits > 1
              else [])])
        got = gpu.read(by).reshape(-1, n_rows)
        assert (got[:token0] == SENTINEL).all() and (got[token0 + n:] == SENTINEL).all()
        got = got[token0:token0 + n]
        if splits == 1:
            np.testing.assert_array_equal(got, plain[token0:])
        err = rel_err(got, terms.sum(2), np.abs(terms).sum(2))
        assert err < 2.0 ** -10 + n_cols * 2.0 ** -23, (splits, err)



@pytest.mark.parametrize("dtype", ["float32", "q4_1"])
def test_linear_coop_fetch_depth_keeps_the_bits(gpu, kernels, dtype):
    """matmul_coop's DEPTH (steps of columns fetched ahead into registers: `BatchCoopTile` /
    `PrefillCoopTile` `depth`) changes when the loads are issued, not the products: at
    depth 2, 3 and 7 (past a run's 1-5 steps) every output has the bits of depth 1, for the
    batched runner's tile (one shared buffer) split across 1, 2 and 3 workgroups, and for a
    prefill tile with two shared buffers; depth 1 within matmul_coop's bound."""
    from vkrt.tuning import BatchCoopTile, PrefillCoopTile

    coop_or_skip(kernels)
    r, n_rows, n_cols, n = rng(50), 70, 320, 9      # 5 steps of 64 columns, then 10 of 32
    tw, values = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=50)
    x = randn(r, n, n_cols)
    bx = gpu.upload(x)
    terms = values[None] * x[:, None].astype(np.float64)

    def batched(depth, splits):
        tiles = (BatchCoopTile(None, 32, 32, 2, 2, "test", 2, depth),)
        part, by = gpu.filled(splits * n * n_rows), gpu.filled(n * n_rows)
        gpu.stream.record([
            kernels.linear(bx, tw, by if splits == 1 else part, n, batched="matmul_coop",
                           coop_tiles=tiles, k_splits=splits,
                           partials=part if splits > 1 else None),
            *([kernels.sum_splits(part, by, n, n_rows, splits)] if splits > 1 else [])])
        return gpu.read(by).reshape(n, n_rows)

    def prefill(depth):
        kernels.tuning = dataclasses.replace(kernels.tuning, prefill_coop_tiles=(
            PrefillCoopTile(0, 0, 32, 32, 2, 2, "test", 1, 2, depth),))
        by = gpu.filled(n * n_rows)
        with config.COOPMAT.override("1"):
            d = kernels.linear(bx, tw, by, n)
        assert d.pipeline.spec[9] == 2 and d.pipeline.spec[10] == depth, d.pipeline.spec
        gpu.stream.record([d])
        return gpu.read(by).reshape(n, n_rows)

    for splits in (1, 2, 3):
        want = batched(1, splits)
        err = rel_err(want, terms.sum(2), np.abs(terms).sum(2))
        assert err < 2.0 ** -10 + n_cols * 2.0 ** -23, (splits, err)
        for depth in (2, 3, 7):
            np.testing.assert_array_equal(batched(depth, splits), want, f"{splits} {depth}")
    want = prefill(1)
    assert rel_err(want, terms.sum(2), np.abs(terms).sum(2)) < 2.0 ** -10 + n_cols * 2.0 ** -23
    for depth in (2, 3, 7):
        np.testing.assert_array_equal(prefill(depth), want, f"prefill {depth}")


def coop_split_in_tiles(bm: int, bn: int, sg_k: int) -> bool:
    """Whether matmul_coop.comp adds the SG_K groups' sums of a one-buffer, one-product tile
    in the x and W tiles' shared memory (SG_K > 2 and (SG_K - 1) * BM * BN floats within
    SG_K * (BM + BN) * 20) rather than one accumulator at a time through `stage`, on a device
    whose accumulators hold their TM x TN elements once over the subgroup (NVIDIA's)."""
    return sg_k > 2 and (sg_k - 1) * bm * bn <= 20 * sg_k * (bm + bn)


@pytest.mark.parametrize("dtype", ["float32", "q4_1"])
@pytest.mark.parametrize("sg_k", [3, 4])
def test_linear_coop_split_sums_keep_the_bits(gpu, kernels, dtype, sg_k):
    """matmul_coop's SG_K groups' sums are added in the order g = 0, 1, ... whether the
    other groups' accumulators go through the x and W tiles' memory at once (32 x 32 over 2
    x 2 subgroups) or one at a time through `stage` (64 x 64 over 2 x 2: too large for the
    tiles; 2 groups always take `stage`): every output has the same bits (the tiles' f16
    halves carry the floats' bits unchanged), at 9 tokens and 1 (batch invariance across
    the two paths); within matmul_coop's bound."""
    from vkrt.tuning import BatchCoopTile

    coop_or_skip(kernels)
    chain = (64, 64, 2, 2)
    assert coop_split_in_tiles(32, 32, sg_k) and not coop_split_in_tiles(*chain[:2], sg_k)
    assert not coop_split_in_tiles(32, 32, 2)
    r, n_rows, n_cols, n = rng(53), 70, 320, 9
    tw, values = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=53)
    x = randn(r, n, n_cols)
    bx = gpu.upload(x)
    terms = values[None] * x[:, None].astype(np.float64)

    def product(tile, m):
        by = gpu.filled(n * n_rows)
        gpu.stream.record([kernels.linear(bx, tw, by, m, batched="matmul_coop", coop_tiles=(
            BatchCoopTile(None, *tile, "test", sg_k),))])
        return gpu.read(by).reshape(n, n_rows)[:m]

    want = product(chain, n)
    assert rel_err(want, terms.sum(2), np.abs(terms).sum(2)) < 2.0 ** -10 + n_cols * 2.0 ** -23
    np.testing.assert_array_equal(product((32, 32, 2, 2), n), want)
    np.testing.assert_array_equal(product((32, 32, 2, 2), 1), want[:1])


@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "gelu"])
def test_glu_coop_is_the_products_then_the_activation(gpu, kernels, dtype, gelu):
    """Kernels.glu_coop (matmul_coop's GLU build): act(gate @ x) * (up @ x) in one dispatch
    over rows token0 .. of x and y, equal to matmul_coop's two products on the same tile
    then silu_mul (within 2e-6 of the largest output: the activation compiled in another
    module; the two products, held against numpy for every type by
    test_linear_coop_weights_as_stored, are the same chains, so up's weights are read as
    gate's are), every weight type, on tiles of one and two shared buffers, depth 1 and 2, a
    column split of 2 and 4 (320 columns: 5 and 3 steps; 768 for blocks of 256; tails of
    rows and tokens); each token's row with the same bits at 1, 2, 5 and 9 tokens (batch
    invariance); rows outside token0 .. token0 + n - 1 untouched. Refuses gate and up of
    different shapes, naming both."""
    coop_or_skip(kernels)
    n_cols = 320 if weight_types.BY_DTYPE[dtype].block <= 32 else cols(dtype)
    r, n_rows, n, token0 = rng(51), 70, 9, 2
    tg, _ = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=51)
    tu, _ = stored_weight(gpu, dtype, randn(r, n_rows, n_cols), seed=52)
    bx = gpu.upload(randn(r, token0 + n, n_cols))
    for tile in ((32, 32, 2, 2, 2), (16, 16, 1, 1, 4, 1, 2), (32, 16, 2, 1, 2, 2, 2)):
        g, u, act = (gpu.filled((token0 + n) * n_rows) for _ in range(3))
        bm, bn, sg_m, sg_n, sg_k, *rest = tile
        plain = dataclasses.replace(kernels.tuning, batch_coop_tiles=(
            tuning.BatchCoopTile(None, bm, bn, sg_m, sg_n, "test", sg_k),))
        saved, kernels.tuning = kernels.tuning, plain
        gpu.stream.record([
            kernels.linear(bx, tg, g, n, batched="matmul_coop", token0=token0),
            kernels.linear(bx, tu, u, n, batched="matmul_coop", token0=token0)])
        kernels.tuning = saved
        gpu.stream.record([kernels.silu_mul(g, u, act, (token0 + n) * n_rows, gelu=gelu)])
        want = gpu.read(act).reshape(-1, n_rows)[token0:]
        rows = {}
        for m in (9, 1, 2, 5):
            by = gpu.filled((token0 + n + 1) * n_rows)
            gpu.stream.record([kernels.glu_coop(bx, tg, tu, by, m, tile, token0, gelu)])
            got = gpu.read(by).reshape(-1, n_rows)
            assert (got[:token0] == SENTINEL).all() and (got[token0 + m:] == SENTINEL).all()
            rows[m] = got[token0:token0 + m]
        np.testing.assert_allclose(rows[9], want, rtol=0, atol=2e-6 * np.abs(want).max(),
                                   err_msg=str(tile))
        for m in (1, 2, 5):
            np.testing.assert_array_equal(rows[m], rows[9][:m], str((tile, m)))
    short = gpu.upload(np.zeros((n_rows - 6, n_cols), np.float32))
    with pytest.raises(ShaderInterfaceError, match=rf"gate .* \[70, {n_cols}\] and up .* "
                                                   rf"\[64, {n_cols}\] differ"):
        kernels.glu_coop(bx, tg, short, gpu.filled(n * n_rows), n, (32, 32, 2, 2, 2))


def test_batch_glu_follows_the_engines_decode_kernel(kernels):
    """Kernels.batch_glu: the wide rule's GLU tile as coop_spec takes it (one shared buffer,
    its depth) and its rows (min, max) where the engine's decode products are on matmul_coop;
    (None, (0, 0)) where they fall back to matmul (no cooperative matrices, VKRT_COOPMAT=0) or
    the rule has no tile."""
    from vkrt.tuning import BatchCoopTile, WideBatchDecode

    tile = BatchCoopTile(None, 32, 16, 2, 1, "test", 4, 2)
    kernels.tuning = dataclasses.replace(kernels.tuning, wide_batch_decode=(
        WideBatchDecode(16, "matmul_coop", "test", glu_tile=tile, glu_rows=(1024, 4096)),))
    kernels.coop = SimpleNamespace(m=16, n=16, k=16)
    assert kernels.batch_glu(16) == ((32, 16, 2, 1, 4, 1, 2), (1024, 4096), (1024, 4096))
    assert kernels.batch_glu(8) == (None, (0, 0), (0, 0))
    with config.COOPMAT.override("0"):
        assert kernels.batch_glu(16) == (None, (0, 0), (0, 0))
    kernels.coop = None
    assert kernels.batch_glu(16) == (None, (0, 0), (0, 0))


def test_batch_products_fall_back_to_matmul_without_coop(kernels):
    """`Kernels.batch_products`: the table's matmul_coop where the device lists a shape and
    VKRT_COOPMAT allows it, else matmul; the other kernels as the table names them; the
    same for a kernel the table chooses by the engine's max_batch."""
    from vkrt.tuning import WideBatchDecode

    kernels.tuning = dataclasses.replace(kernels.tuning, batch_products={
        "decode": "matmul_coop", "prompt": "matmul_tiled"})
    kernels.coop = None
    assert kernels.batch_products() == {"decode": "matmul", "prompt": "matmul_tiled"}
    kernels.coop = SimpleNamespace(m=16, n=16, k=16)
    assert kernels.batch_products()["decode"] == "matmul_coop"
    with config.COOPMAT.override("0"):
        assert kernels.batch_products()["decode"] == "matmul"
    with config.COOPMAT.override("1"):
        assert kernels.batch_products()["decode"] == "matmul_coop"
    kernels.tuning = dataclasses.replace(kernels.tuning, batch_products={
        "decode": "matmul", "prompt": "matmul_tiled"}, wide_batch_decode=(
        WideBatchDecode(16, "matmul_coop", "test"),))
    assert kernels.batch_products(16)["decode"] == "matmul_coop"
    assert kernels.batch_products(15)["decode"] == "matmul"
    kernels.coop = None
    assert kernels.batch_products(16) == {"decode": "matmul", "prompt": "matmul_tiled"}
