"""The project's compute kernels as ops: one method per shader of `vkrt/glsl`, each turning
tensors and sizes into a `Dispatch` (its grid, its push constants by name, the shape checks
that keep the shader inside its views). Models call these and never count workgroups or pack
bytes; the shader's header comment is the contract each method follows.

All tensors are float32 except token ids (uint32) and the weights of `linear` and `embed`,
which are read as the GGUF stores them: float32, float16, bfloat16 or a GGUF block type
(q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k ... q6_k, iq4_xs; `WEIGHTS`: the shader variant
of each, vkrt/weight_types.py and vkrt/glsl/variants.json). Shapes are `[tokens, width]`
row-major; a tensor may hold more rows than a call uses (activations are sized for the
longest forward).
Every method raises `ShaderInterfaceError` (module, binding, numbers) when a tensor has the
wrong dtype or is too small for the call.
"""
from __future__ import annotations

from vkrt import config, weight_types
from vkrt import tuning as tuning_tables
from vkrt.errors import ShaderInterfaceError, VkrtError
from vkrt.runtime.dispatch import Dispatch
from vkrt.runtime.op import Op
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.tensor import Tensor

ELEMENTWISE_BLOCK = 64   # workgroup size of elementwise kernels
MATMUL_TOKENS = 8        # tokens per matmul workgroup (each W row read once per tile)
# Prefill products on a GPU (vkrt/tuning.py prefill_tiled): matmul_tiled's tile of output
# rows x tokens (bench/README.md has the A/B).
TILE_ROWS, TILE_TOKENS = 32, 64
# Prefill products on cooperative matrices (matmul_coop: f16 operands, f32 accumulation) on a
# device that lists an f16 x f16 -> f32 subgroup shape (`Device.coop_shape`), for products of
# at least COOP_MIN_TOKENS tokens (VKRT_COOPMAT=auto); their workgroup tiles are the device
# class's table's (vkrt/tuning.py prefill_coop_tiles).
COOP_MIN_TOKENS = 64
F32, U32, F16 = "float32", "uint32", "float16"
# Splits of the KV cache per KV head at decode (attention_split): about the table's
# `attention_splits`, at most ATTENTION_SPLITS (`attention_chunk`).
ATTENTION_TARGET_SPLITS, ATTENTION_SPLITS = 32, 64
# Invocations per scored position in attention_split (at most; `split_score_lanes`).
SPLIT_SCORE_LANES = 8
# Decode attention in one dispatch (attention_decode: a workgroup per head, its scores in
# shared memory) while the cache holds at most the table's `decode_positions(head_dim)`
# (fewer where the device's shared memory is smaller, at most DECODE_POSITIONS); split
# attention past that. One workgroup per head reads the whole cache of its head, so its time
# grows with the context faster than the split's. Its workgroup size and workgroups per head
# (each weighing V for a share of the head's dims) are vkrt/tuning.py's attention_threads
# and attention_dim_splits.
DECODE_POSITIONS = 1024


def attention_chunk(n_positions: int, block: int,
                    target: int = ATTENTION_TARGET_SPLITS) -> int:
    """Cache positions per split at decode, whole passes of `block` positions
    (attention_split's loop step): ceil(n_positions / target) rounded up or down to whole
    blocks (one block at least), whichever leaves a split count nearer `target` (rounding up
    on a tie), never past ATTENTION_SPLITS splits (rounding up then). Why not always up or
    always down: bench/README.md, 2026-12-04, "Decode attention's splits at 4k" (H200, 7B
    shape, 4,128 and 8,160 positions)."""
    per_split = -(-n_positions // target)
    up = -(-per_split // block) * block
    down = max(1, per_split // block) * block
    if -(-n_positions // down) > ATTENTION_SPLITS:
        return up
    return min((up, down), key=lambda c: abs(-(-n_positions // c) - target))


def split_shape(head_dim: int, subgroup_size: int, threads: int) -> tuple[int, int, int]:
    """(workgroup size, LANES, PLANES) of attention_split.comp for `head_dim` on a device
    with `subgroup_size`, at most `threads` invocations (the table's
    attention_split_threads, fitted down to a power of two of planes, one plane at least):
    LANES = split_score_lanes, PLANES the largest power of two within the subgroup with
    head_dim / 4 * PLANES <= threads. A pass covers size / LANES positions."""
    g = max(1, head_dim // 4)
    planes = 1
    while planes * 2 <= subgroup_size and g * planes * 2 <= threads:
        planes *= 2
    return g * planes, split_score_lanes(head_dim, subgroup_size), planes


def split_score_lanes(head_dim: int, subgroup_size: int) -> int:
    """Invocations that score one cache position together in attention_split.comp
    (specialization constant LANES): the largest power of two up to SPLIT_SCORE_LANES that
    divides head_dim / 4 (whole vec4 columns per lane) and fits in a subgroup (the lanes add
    their partial dots by subgroup shuffles). 8 lanes read a 128-dim K row of f32 as 8 x 16
    contiguous bytes per load, a row of f16 as 8 x 8."""
    lanes = 1
    while (lanes * 2 <= min(SPLIT_SCORE_LANES, subgroup_size)
           and (head_dim // 4) % (lanes * 2) == 0):
        lanes *= 2
    return lanes


def attention_tile_shape(head_dim: int, subgroup_size: int, shared_bytes: int,
                         tile: tuple[int, int, int],
                         max_invocations: int = 1 << 30) -> tuple[int, int, int]:
    """(QT, LQ, KT) of attention_tile.comp for the table's `tile` (QT queries per
    workgroup, at most LQ lanes per query and KT positions per staged tile): LQ the largest
    power of two up to tile's and the subgroup size that divides head_dim / 4 (whole vec4
    columns per lane), QT the table's halved until QT * LQ invocations fit `max_invocations`
    (maxComputeWorkGroupInvocations, and maxComputeWorkGroupSize[0]), KT the largest power
    of two up to tile's whose K and V stage (2 * KT * head_dim * 4 bytes) fits
    `shared_bytes` (maxComputeSharedMemorySize)."""
    qt, lq_max, kt_max = tile
    lq = 1
    while lq * 2 <= min(lq_max, subgroup_size) and (head_dim // 4) % (lq * 2) == 0:
        lq *= 2
    while qt > 1 and qt * lq > max_invocations:
        qt //= 2
    kt = kt_max
    while kt > 1 and 2 * kt * head_dim * 4 > shared_bytes:
        kt //= 2
    return qt, lq, kt


def coop_shared_bytes(bm: int, bn: int, sg_m: int, sg_n: int, sg_k: int, nbuf: int,
                      shape, products: int = 1) -> int:
    """Bytes of shared memory matmul_coop.comp declares for a tile: NBUF * SG_K * (BM +
    products * BN) rows of a step's 32 columns padded to 40 f16 (80 bytes; products 2: the
    GLU build's gate and up tiles), and SG_M * SG_N staging tiles of the cooperative-matrix
    `shape`'s M x N f32."""
    return (nbuf * sg_k * (bm + products * bn) * 80
            + sg_m * sg_n * shape.m * shape.n * 4)


def fit_coop_tile(tile: tuple[int, int, int, int, int, int], shape,
                  limit: int, products: int = 1) -> tuple[int, int, int, int, int, int]:
    """A table's matmul_coop tile (BM, BN, SG_M, SG_N, SG_K, NBUF) made to fit `limit` bytes
    of shared memory (maxComputeSharedMemorySize; `coop_shared_bytes` of `products` W
    tiles: 2 for the GLU build), giving up in this
    order: the second buffer, the column split, then halving BM, BN, and the subgroups
    along both (their staging tiles). The tile unchanged when it fits; every tile ends at
    one 16 x 16 matrix per subgroup of one subgroup at worst (3,584 bytes)."""
    bm, bn, sg_m, sg_n, sg_k, nbuf = tile
    while coop_shared_bytes(bm, bn, sg_m, sg_n, sg_k, nbuf, shape, products) > limit:
        if nbuf > 1:
            nbuf = 1
        elif sg_k > 1:
            sg_k = 1
        elif bm > sg_m * shape.m:
            bm //= 2
        elif bn > sg_n * shape.n:
            bn //= 2
        elif sg_m * sg_n > 1:
            sg_m, sg_n = max(1, sg_m // 2), max(1, sg_n // 2)
            bm, bn = sg_m * shape.m, sg_n * shape.n
        else:
            break
    return bm, bn, sg_m, sg_n, sg_k, nbuf


def attention_partials(n_heads: int, head_dim: int) -> int:
    """f32 elements of the decode attention's partial states (`Kernels.attention` part)."""
    return n_heads * ATTENTION_SPLITS * (head_dim + 2)

# Weight dtype (vkrt.runtime.tensor) -> the suffix of its shader variants (embed_*, matvec_*,
# matmul_*), from the type table (vkrt/weight_types.py); block types need rows of whole
# blocks (32 elements, 256 for the K-quants and IQ4_XS).
WEIGHTS = weight_types.WEIGHTS
MIXED_QKV = weight_types.MIXED_QKV

# A KV cache's element dtype -> the suffix of the variants that write or read it (paged:
# kv_write, rope_kv_write, attention_paged; one sequence's: qkv_rope, rope, copy_rows,
# attention, attention_decode, attention_split; vkrt/glsl/kv.glsl).
KV_DTYPES = {"float32": "", "float16": "_kvf16"}

# Decode products (matvec, matvec_add, matvec_glu, qkv_rope): their workgroup size and rows
# per workgroup come from the device class's table, vkrt/tuning.py (`Kernels.decode_launch`).

# The decode products with `_xq` variants (vkrt/weight_types.py KERNEL_SOURCES).
XQ_KERNELS = ("matvec", "matvec_add", "matvec_glu", "qkv_rope")

# Kernels with a variant per weight dtype -> the dtype of each binding ("W": the weights';
# "V": qkv_rope's V weights, of W's dtype or, in a mixed variant, of its own).
WEIGHT_KERNELS = {"embed": ("W", U32, F32), "embed_range": ("W", U32, F32),
                  "matvec": ("W", F32, F32),
                  "matvec_add": ("W", F32, F32), "matmul": ("W", F32, F32),
                  "matmul_tiled": ("W", F32, F32), "matmul_coop": ("W", F32, F32),
                  "matmul_coop_glu": ("W", F32, F32, "W"),
                  "matvec_glu": ("W", F32, F32, "W", F32),
                  "qkv_rope": ("W", F32, F32, "W", "V", F32, F32, F32, F32, U32, F32, F32, F32)}
WEIGHT_KERNELS.update({f"{k}_xq": WEIGHT_KERNELS[k] for k in XQ_KERNELS})
# qkv_rope writing an f16 KV cache (bindings 7 and 8).
WEIGHT_KERNELS.update({f"{k}_kvf16": (*WEIGHT_KERNELS[k][:7], F16, F16, *WEIGHT_KERNELS[k][9:])
                       for k in ("qkv_rope", "qkv_rope_xq")})


def _decode_attention_size(limits, head_dim: int, threads: int) -> tuple[int, int]:
    """(workgroup size, most positions) of attention_decode on a device with `limits`
    (VkPhysicalDeviceLimits): at most `threads` (the table's attention_threads), a multiple of
    head_dim / 4 within maxComputeWorkGroupInvocations, positions as many scores as
    maxComputeSharedMemorySize holds beside the shader's other shared arrays (20 bytes per
    invocation, 16 per vec4 of q), at most DECODE_POSITIONS; 0 positions when nothing fits."""
    g = max(1, head_dim // 4)
    cap = min(threads, limits.maxComputeWorkGroupInvocations,
              limits.maxComputeWorkGroupSize[0])
    threads = max(g, cap // g * g)
    room = (limits.maxComputeSharedMemorySize - 20 * threads - 16 * g) // 4
    return threads, max(0, min(DECODE_POSITIONS, room))


def _groups(n: int, block: int) -> int:
    return (n + block - 1) // block


def spread(groups: int, limit: tuple[int, ...]) -> tuple[int, int]:
    """(x, y) with x * y >= groups and x within `limit[0]`: a 1-D grid of `groups` workgroups
    laid over two dimensions (the shader side is glsl/grid.glsl). Past limit_x * limit_y the
    op refuses the grid, naming it."""
    x = min(groups, limit[0])
    return x, -(-groups // x)


class Kernels:
    """The ops of one device, specialized for its subgroup size (reductions run one subgroup
    per workgroup, see glsl/reduce.glsl) and tuned by its device class's table
    (vkrt/tuning.py; `tuning` replaces it)."""

    def __init__(self, pipelines: PipelineCache, head_dim: int | None = None,
                 tuning: tuning_tables.Table | None = None):
        p, sg = pipelines.get_pipeline, pipelines.device.subgroup_size
        self.sg = sg
        self.tuning = tuning or tuning_tables.for_kind(pipelines.device.info.kind)
        self.limit = pipelines.device.max_compute_work_group_count
        self._pipelines, self._weight_ops = pipelines, {}
        self._weight_spec = {"embed": {0: ELEMENTWISE_BLOCK},
                             "embed_range": {0: ELEMENTWISE_BLOCK}, "matvec": {0: sg},
                             "matvec_add": {0: sg}, "matvec_glu": {0: sg}, "qkv_rope": {0: sg},
                             **{f"{k}_xq": {0: sg} for k in XQ_KERNELS},
                             "qkv_rope_kvf16": {0: sg}, "qkv_rope_xq_kvf16": {0: sg},
                             "matmul": {0: sg, 1: MATMUL_TOKENS},
                             "matmul_tiled": {0: TILE_ROWS * TILE_TOKENS // 16,
                                              1: TILE_ROWS, 2: TILE_TOKENS}}
        self.tiled_matmul = self.tuning.prefill_tiled   # prefill: matmul_tiled, else matmul
        # Decode products may run their `_xq` variants (x as 16-bit integers per unit,
        # integer dot products: glsl/unit_xq.glsl) where a table rule says so: VKRT_XQ and
        # the device (shaderIntegerDotProduct) allow it (`decode_integer_x`).
        self.integer_x = bool(config.XQ.value
                              and pipelines.device.features.get("shaderIntegerDotProduct"))
        # The cooperative-matrix shape matmul_coop runs on (a `CoopShape`), or None: the
        # device lists none (lavapipe), or VKRT_COOPMAT says never (`prefill_kernel`).
        self.coop = pipelines.device.coop_shape()
        self._weight_spec["matmul_coop"] = {}     # from `coop` at each call: coop_spec
        self._weight_spec["matmul_coop_glu"] = {}
        # A row's norm over `norm_subgroups` subgroups (vkrt/tuning.py).
        norm = sg * self.tuning.norm_subgroups
        self._rmsnorm = Op(p("rmsnorm", {0: norm}), (F32, F32, F32))
        self._rmsnorm_add = Op(p("rmsnorm_add", {0: norm}), (F32, F32, F32))
        self._add_rmsnorm = Op(p("add_rmsnorm", {0: norm}), (F32, F32, F32, F32))
        # rope.comp's pairs: adjacent (False) or halves (True, specialization constant NEOX).
        self._rope = {neox: Op(p("rope", {0: ELEMENTWISE_BLOCK, 1: int(neox)}), (F32, F32, F32))
                      for neox in (False, True)}
        self._copy_rows = Op(p("copy_rows", {0: ELEMENTWISE_BLOCK}), (F32, F32))
        # qkv_rope's second dispatch for the families with per-head Q/K norms.
        self._head_norm_rope = {neox: Op(p("head_norm_rope", {0: norm, 1: int(neox)}),
                                         (F32, F32, F32, F32, F32, U32))
                                for neox in (False, True)}
        # Position from a device buffer (replayed decode steps, see `pos=` below).
        self._rope_pos = {neox: Op(p("rope_pos", {0: ELEMENTWISE_BLOCK, 1: int(neox)}),
                                   (F32, F32, F32, U32)) for neox in (False, True)}
        self._copy_rows_pos = Op(p("copy_rows_pos", {0: ELEMENTWISE_BLOCK}), (F32, F32, U32))
        # The batched runner's ops (vkrt/models/batch.py), built on first use (`_batch_op`):
        # RoPE at positions from a device tensor, the KV-cache write by slot mapping,
        # attention over a paged KV cache, argmax per row. A model that never batches
        # builds none of their pipelines.
        self._batch_ops: dict[tuple, Op] = {}
        self._advance_pos = Op(p("advance_pos", {}), (U32,))
        # silu_mul.comp's activation: SiLU (False) or GELU-tanh (True, constant GELU).
        self._silu_mul = {gelu: Op(p("silu_mul", {0: ELEMENTWISE_BLOCK, 1: int(gelu)}),
                                   (F32, F32, F32)) for gelu in (False, True)}
        self._scale = Op(p("scale", {0: ELEMENTWISE_BLOCK}), (F32,))
        self._add = Op(p("add", {0: ELEMENTWISE_BLOCK}), (F32, F32))
        self._sum_splits = Op(p("sum_splits", {0: ELEMENTWISE_BLOCK}), (F32, F32))
        self._bias_add = Op(p("bias_add", {0: ELEMENTWISE_BLOCK}), (F32, F32))
        self._argmax = Op(p("argmax", {0: self.tuning.argmax_threads}),
                          (F32, U32))
        # attention's workgroup is one head: local_size_x = head_dim. Sliding-window layers
        # get their own pipelines (specialization constant WINDOW; `_windowed`).
        self._attention = self._attention_combine = None
        self._windows: dict[tuple[int, str], tuple] = {}
        self._splits: dict[tuple[int, str, int, bool], Op] = {}
        self._head_dim = head_dim
        self.decode_threads = self.decode_positions = 0
        # attention_split's workgroup size, LANES and PLANES (`split_shape`).
        self.split_threads = self.decode_dim_splits = self.split_lanes = self.split_planes = 1
        # Prefill attention on query tiles (attention_tile.comp): its (QT, LQ, KT), or None
        # for one workgroup per (head, token) (attention.comp); the table's prefill_attention.
        self.attention_tile: tuple[int, int, int] | None = None
        self._attention_tiles: dict[tuple[int, str], Op] = {}
        if head_dim:
            self._attention = Op(p("attention", {0: head_dim}), (F32, F32, F32, F32))
            if self.tuning.prefill_attention is not None and head_dim % 4 == 0:
                limits = pipelines.device.limits
                self.attention_tile = attention_tile_shape(
                    head_dim, sg, limits.maxComputeSharedMemorySize,
                    self.tuning.prefill_attention,
                    min(limits.maxComputeWorkGroupInvocations,
                        limits.maxComputeWorkGroupSize[0]))
            self.split_threads, self.split_lanes, self.split_planes = split_shape(
                head_dim, sg, min(self.tuning.attention_split_threads,
                                  pipelines.device.limits.maxComputeWorkGroupInvocations,
                                  pipelines.device.limits.maxComputeWorkGroupSize[0]))
            self._attention_combine = Op(p("attention_combine", {0: head_dim}), (F32, F32))
            self.decode_threads, self.decode_positions = _decode_attention_size(
                pipelines.device.limits, head_dim, self.tuning.attention_threads)
            self.decode_positions = min(self.decode_positions,
                                        self.tuning.decode_positions(head_dim))
            g = max(1, head_dim // 4)
            self.decode_dim_splits = next(d for d in (self.tuning.attention_dim_splits, 2, 1)
                                          if g % d == 0)
            if self.decode_positions and head_dim % 4 == 0 and sg >= 4:
                spec = {0: self.decode_threads, 1: head_dim, 2: self.decode_positions,
                        3: self.decode_dim_splits}
                self._attention_decode = Op(p("attention_decode", spec), (F32, F32, F32, F32))
                self._attention_decode_pos = Op(p("attention_decode_pos", spec),
                                                (F32, F32, F32, F32, U32))
            else:
                self.decode_positions = 0
        # OPT (vkrt/models/opt.py): LayerNorm, ReLU, learned positions, sliced embeddings.
        self._layernorm = Op(p("layernorm", {0: sg}), (F32, F32, F32, F32))
        self._relu = Op(p("relu", {0: ELEMENTWISE_BLOCK}), (F32,))
        self._add_rows = Op(p("add_rows", {0: ELEMENTWISE_BLOCK}), (F32, F32))
        self._copy_block = Op(p("copy_block", {0: ELEMENTWISE_BLOCK}), (F32, F32))

    def _windowed(self, window: int, kv: str = F32) -> tuple:
        """(attention, attention_decode, attention_decode_pos) ops attending to the last
        `window` positions (0: all) of a KV cache of dtype `kv` (a key of KV_DTYPES), built
        on first use for a window and dtype."""
        if window == 0 and kv == F32:
            return (self._attention, getattr(self, "_attention_decode", None),
                    getattr(self, "_attention_decode_pos", None))
        ops = self._windows.get((window, kv))
        if ops is None:
            p, hd, x = self._pipelines.get_pipeline, self._head_dim, KV_DTYPES[kv]
            decode = decode_pos = None
            if self.decode_positions:
                spec = {0: self.decode_threads, 1: hd, 2: self.decode_positions,
                        3: self.decode_dim_splits, 4: window}
                decode = Op(p("attention_decode" + x, spec), (F32, kv, kv, F32))
                decode_pos = Op(p("attention_decode_pos" + x, spec), (F32, kv, kv, F32, U32))
            ops = self._windows[window, kv] = (
                Op(p("attention" + x, {0: hd, 1: window}), (F32, kv, kv, F32)), decode,
                decode_pos)
        return ops

    def _split(self, window: int, kv: str, group: int, replay: bool) -> Op:
        """attention_split (`replay`: attention_split_pos) for `group` query heads per KV
        head, attending to the last `window` positions (0: all) of a cache of dtype `kv`,
        built on first use."""
        key = (window, kv, group, replay)
        op = self._splits.get(key)
        if op is None:
            name = "attention_split" + ("_pos" if replay else "") + KV_DTYPES[kv]
            spec = {0: self.split_threads, 1: window, 2: self.split_lanes,
                    3: self.split_planes, 4: group, 5: self._head_dim}
            op = self._splits[key] = Op(self._pipelines.get_pipeline(name, spec),
                                        (F32, kv, kv, F32) + ((U32,) if replay else ()))
        return op

    def _batch_op(self, module: str, spec: dict, dtypes: tuple) -> Op:
        """The op of `module` specialized by `spec`, built on first use (the batched runner's
        kernels, and the f16 KV cache's variants of rope and copy_rows)."""
        key = (module, *sorted(spec.items()))
        op = self._batch_ops.get(key)
        if op is None:
            op = self._batch_ops[key] = Op(self._pipelines.get_pipeline(module, spec), dtypes)
        return op

    @staticmethod
    def _kv_variant(module: str, k_cache: Tensor, v_cache: Tensor) -> tuple[str, str]:
        """(the variant of `module` for a KV cache of k_cache's dtype, that dtype). Raises
        ShaderInterfaceError when K and V differ in dtype or no variant reads it."""
        if k_cache.dtype != v_cache.dtype or k_cache.dtype not in KV_DTYPES:
            raise ShaderInterfaceError(
                f"{module}: a KV cache of {k_cache.dtype} K ({k_cache.name!r}) and "
                f"{v_cache.dtype} V ({v_cache.name!r}); the kernels read "
                f"{' or '.join(KV_DTYPES)}, K and V alike")
        return module + KV_DTYPES[k_cache.dtype], k_cache.dtype

    def decode_launch(self, kernel: str, weight: Tensor, n_rows: int) -> tuple[int, int, dict]:
        """(workgroup size, rows per workgroup, other specialization constants) of decode
        product `kernel` (matvec, matvec_add, matvec_glu, qkv_rope) over `n_rows` rows of
        `weight`: the table's rule (vkrt/tuning.py) in invocations of this device's
        subgroups; for a block type SPLIT (constant 6) where the rule splits units and the
        split divides the workgroup, STAGE_X (constant 7) where the rule stages x, does not
        split, and the stage (144 bytes per invocation, glsl/unit_x.glsl) fits the shared
        memory."""
        wt = weight_types.BY_DTYPE.get(weight.dtype)
        block = wt.block if wt is not None else 1     # unknown dtypes: weight_op refuses them
        quantized = block > 1
        rule = self.tuning.decode_rule(kernel, n_rows, block, weight.dtype, weight.shape[-1])
        threads, spec = rule.subgroups * self.sg, {}
        if quantized and rule.split > 1 and threads % rule.split == 0:
            spec[6] = rule.split
        elif (quantized and rule.stage_x and 144 * threads + 4096
              <= self._pipelines.device.limits.maxComputeSharedMemorySize):
            spec[7] = 1
        return threads, rule.rows, spec

    def decode_integer_x(self, kernel: str, dtype: str, n_rows: int, n_cols: int = 0) -> bool:
        """Whether decode product `kernel` (a key of `XQ_KERNELS`) over `n_rows` rows of
        `n_cols` columns (0: unknown) of `dtype` runs its `_xq` variant: the table's rule says
        so (vkrt/tuning.py `integer_x`), the type has an integer form
        (`WeightType.integer_x`), and VKRT_XQ and the device allow it (`integer_x`). A rule that splits units (SPLIT > 1) runs the
        variant's float path (glsl/unit_x.glsl)."""
        t = weight_types.BY_DTYPE.get(dtype)
        if not (self.integer_x and t is not None and t.integer_x):
            return False
        return self.tuning.decode_rule(kernel, n_rows, t.block, dtype, n_cols).integer_x

    def decode_module(self, kernel: str, weight: Tensor, n_rows: int) -> str:
        """The weight kernel (a key of `WEIGHT_KERNELS`) decode product `kernel` runs over
        `n_rows` rows of `weight`: `kernel`, or `<kernel>_xq` (`decode_integer_x`)."""
        if self.decode_integer_x(kernel, weight.dtype, n_rows, weight.shape[-1]):
            return f"{kernel}_xq"
        return kernel

    def weight_op(self, kernel: str, weight: Tensor, threads: int | None = None,
                  spec: dict | None = None, v_dtype: str | None = None) -> Op:
        """The op of `kernel` (a key of `WEIGHT_KERNELS`) for weights of `weight.dtype`: its
        variant `<kernel>_<WEIGHTS[dtype]>`, built on first use; `threads`: its workgroup size
        (specialization constant 0) instead of the kernel's default; `spec`: more
        specialization constants; `v_dtype` (qkv_rope): V's weights of another dtype, the
        mixed variant `<kernel>_<WEIGHTS[dtype]>_v_<WEIGHTS[v_dtype]>` (a pair of
        weight_types.MIXED_QKV). Raises ShaderInterfaceError for a dtype no variant reads,
        naming the tensor."""
        key = (kernel, weight.dtype, threads, v_dtype)      # built per dispatch: kept cheap
        if spec:
            key += tuple(sorted(spec.items()))
        op = self._weight_ops.get(key)
        if op is None:
            if weight.dtype not in WEIGHTS:
                raise ShaderInterfaceError(
                    f"{kernel}: no variant reads weights of {weight.dtype} (tensor "
                    f"{weight.name!r}); kernels read {', '.join(WEIGHTS)}")
            constants = {**self._weight_spec[kernel], **(spec or {})}
            if threads is not None:
                constants[0] = threads
            module = f"{kernel}_{WEIGHTS[weight.dtype]}"
            if v_dtype is not None:
                module += f"_v_{WEIGHTS[v_dtype]}"
            pipeline = self._pipelines.get_pipeline(module, constants)
            dtypes = tuple(weight.dtype if d == "W" else (v_dtype or weight.dtype) if d == "V"
                           else d for d in WEIGHT_KERNELS[kernel])
            op = self._weight_ops[key] = Op(pipeline, dtypes)
        return op

    def embed(self, table: Tensor, ids: Tensor, out: Tensor, n_tokens: int,
              name: str = "") -> Dispatch:
        """out[t] = table[ids[t]] dequantized to f32 for t < n_tokens; table [n_vocab, n_embd]
        of any `WEIGHTS` dtype, out f32."""
        n_embd = table.shape[1]
        grid = (_groups(n_embd, ELEMENTWISE_BLOCK), *spread(n_tokens, self.limit[1:]))
        return self.weight_op("embed", table)(table, ids, out, grid=grid, name=name,
                                              need=(None, n_tokens, n_tokens * n_embd),
                                              n_embd=n_embd)

    def rmsnorm(self, x: Tensor, weight: Tensor, out: Tensor, n_tokens: int, eps: float,
                name: str = "") -> Dispatch:
        """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight for t < n_tokens; weight [n]."""
        n = weight.shape[0]
        return self._rmsnorm(x, weight, out, grid=(*spread(n_tokens, self.limit), 1), name=name,
                             need=(n_tokens * n, None, n_tokens * n), n=n, eps=eps,
                             n_rows=n_tokens)

    def add_rmsnorm(self, x: Tensor, r: Tensor, weight: Tensor, out: Tensor, n_tokens: int,
                    eps: float, name: str = "") -> Dispatch:
        """x[t] += r[t], then out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight for t <
        n_tokens, in one dispatch (a residual add and the next norm: the bits of `add` then
        `rmsnorm`); weight [n], x, r, out [tokens, n] f32."""
        n = weight.shape[0]
        return self._add_rmsnorm(x, weight, out, r, grid=(*spread(n_tokens, self.limit), 1),
                                 name=name, need=(n_tokens * n, None, n_tokens * n, n_tokens * n),
                                 n=n, eps=eps, n_rows=n_tokens)

    def rmsnorm_add(self, x: Tensor, weight: Tensor, y: Tensor, n_tokens: int, eps: float,
                    name: str = "") -> Dispatch:
        """y[t] += x[t] / sqrt(mean(x[t]^2) + eps) * weight for t < n_tokens (a norm after
        a block, then the residual add); weight [n], x, y [tokens, n] f32."""
        n = weight.shape[0]
        return self._rmsnorm_add(x, weight, y, grid=(*spread(n_tokens, self.limit), 1),
                                 name=name, need=(n_tokens * n, None, n_tokens * n), n=n,
                                 eps=eps, n_rows=n_tokens)

    def coop_spec(self, n_rows: int, n_tokens: int, tile: tuple | None = None,
                  products: int = 1) -> dict:
        """matmul_coop's specialization constants for a product of n_tokens x n_rows on the
        shape `coop`: workgroup size, TM, TN, TK, BM (tokens), BN (rows), SG_M, SG_N, SG_K,
        NBUF, DEPTH (`tile` (BM, BN, SG_M, SG_N[, SG_K[, NBUF[, DEPTH]]]) when given, else
        the table's `prefill_coop_tile` as `fit_coop_tile` fits it to the device's shared
        memory; SG_K groups of SG_M x SG_N subgroups split the columns, NBUF shared buffers,
        DEPTH steps fetched ahead into registers: matmul_coop.comp; `products` 2: the GLU
        build's, two W tiles in shared memory). Raises VkrtError for
        a tile whose shared memory (`coop_shared_bytes`) the device does not have: a
        pipeline past maxComputeSharedMemorySize may hang the driver rather than fail."""
        limit = self._pipelines.device.limits.maxComputeSharedMemorySize
        c = self.coop
        if tile is None:
            r = self.tuning.prefill_coop_tile(n_rows, n_tokens)
            tile = fit_coop_tile((r.bm, r.bn, r.sg_m, r.sg_n, r.sg_k, r.nbuf), c, limit)
            tile = (*tile, r.depth)       # registers, not shared memory
        bm, bn, sg_m, sg_n, *k = tile
        sg_k = k[0] if k else 1
        nbuf = k[1] if len(k) > 1 else 1
        depth = k[2] if len(k) > 2 else 1
        assert bm % (sg_m * c.m) == 0 and bn % (sg_n * c.n) == 0 and sg_k >= 1, (tile, c)
        assert nbuf in (1, 2) and depth >= 1, tile
        need = coop_shared_bytes(bm, bn, sg_m, sg_n, sg_k, nbuf, c, products)
        if need > limit:
            raise VkrtError(f"matmul_coop tile {bm}x{bn}:{sg_m}x{sg_n}x{sg_k} with {nbuf} "
                            f"shared buffers needs {need} bytes of shared memory; "
                            f"{self._pipelines.device.name} has {limit} "
                            "(maxComputeSharedMemorySize)")
        return {0: sg_m * sg_n * sg_k * self._pipelines.device.subgroup_size, 1: c.m, 2: c.n,
                3: c.k, 4: bm, 5: bn, 6: sg_m, 7: sg_n, 8: sg_k, 9: nbuf, 10: depth}

    def prefill_glu_tile(self, n_tokens: int) -> tuple | None:
        """The tile (BM, BN, SG_M, SG_N, SG_K, NBUF, DEPTH) on which a prefill of `n_tokens`
        tokens runs a layer's gate and up products and the activation as one `glu_coop`
        dispatch: the table's `prefill_glu_tile` fitted to the device's shared memory for two
        W tiles (`fit_coop_tile`), where `prefill_kernel` picks matmul_coop; None otherwise
        (the table has none, or the products run on another kernel)."""
        r = self.tuning.prefill_glu_tile
        if r is None or self.prefill_kernel(n_tokens) != "matmul_coop":
            return None
        limit = self._pipelines.device.limits.maxComputeSharedMemorySize
        tile = fit_coop_tile((r.bm, r.bn, r.sg_m, r.sg_n, r.sg_k, r.nbuf), self.coop, limit,
                             products=2)
        return (*tile, r.depth)

    def prefill_splits(self, weight: Tensor, n_tokens: int) -> int:
        """How many workgroups split the columns of a prefill product of `n_tokens` tokens by
        `weight` [n_rows, n_cols] (`linear(..., k_splits=, partials=)` then `sum_splits`):
        the table's `prefill_coop_tile(n_rows, n_tokens).splits`, at most one per step of
        sg_k * 32 columns, where `prefill_kernel` picks matmul_coop; else 1."""
        if n_tokens < 2 or self.prefill_kernel(n_tokens) != "matmul_coop":
            return 1
        n_rows, n_cols = weight.shape
        r = self.tuning.prefill_coop_tile(n_rows, n_tokens)
        return max(1, min(r.splits, -(-n_cols // (32 * r.sg_k))))

    def prefill_partials(self, weights: list[Tensor], n_tokens: int) -> int:
        """f32 elements of partial sums that the split prefill products of `weights` need for
        any prompt of 2 .. n_tokens tokens (`prefill_splits`), so that one buffer serves them
        all: the most of splits x tokens x rows, taken at n_tokens and just below each
        rule's min_tokens (a rule holds over a range of token counts, and its need grows
        with them); 0 where no product splits."""
        counts = {n_tokens, *(r.min_tokens - 1 for r in self.tuning.prefill_coop_tiles
                              if 2 <= r.min_tokens - 1 < n_tokens)}
        most = 0
        for w in weights:
            for t in counts:
                splits = self.prefill_splits(w, t)
                if splits > 1:
                    most = max(most, t * w.shape[0] * splits)
        return most

    def batch_products(self, max_batch: int | None = None) -> dict[str, str]:
        """The kernel of the batched runner's products per token role ("decode", "prompt") in
        an engine of `max_batch` sequences per step (None: the table's `batch_products`;
        `Table.batch_products_for`), "matmul" instead of "matmul_coop" where the device lists
        no cooperative-matrix shape or VKRT_COOPMAT=0. The paged KV cache holds the choice for
        its engine's life (batch invariance: vkrt/models/batch.py)."""
        coop = self.coop is not None and config.COOPMAT.value != "off"
        return {role: "matmul" if kernel == "matmul_coop" and not coop else kernel
                for role, kernel in self.tuning.batch_products_for(max_batch).items()}

    def batch_coop_tiles(self, max_batch: int | None = None) -> tuple:
        """The `matmul_coop` tiles (vkrt/tuning.py `BatchCoopTile`, one column split per
        weight type among them) of the batched runner's products in an engine of
        `max_batch` sequences per step (`Table.batch_coop_tiles_for`); the paged KV cache
        holds them with the kernels."""
        return self.tuning.batch_coop_tiles_for(max_batch)

    def prefill_kernel(self, n_tokens: int) -> str:
        """The kernel `linear` runs a product of `n_tokens` > 1 tokens on: `matmul_coop`
        where the device has a cooperative-matrix shape (`coop`) and VKRT_COOPMAT allows it
        (auto: n_tokens >= COOP_MIN_TOKENS; on: always), else `matmul_tiled` on a GPU and
        `matmul` on a CPU device. Raises VkrtError for VKRT_COOPMAT=1 on a device without a
        shape."""
        mode = config.COOPMAT.value
        if mode == "on" and self.coop is None:
            raise VkrtError(f"VKRT_COOPMAT=1 but {self._pipelines.device.name} lists no "
                            "f16 x f16 -> f32 subgroup cooperative-matrix shape "
                            "(VK_KHR_cooperative_matrix)")
        if self.coop is not None and (mode == "on" or mode == "auto"
                                      and n_tokens >= COOP_MIN_TOKENS):
            return "matmul_coop"
        return "matmul_tiled" if self.tiled_matmul else "matmul"

    def batch_split(self, max_batch: int | None = None) -> tuple[int, int]:
        """(split_rows, split_min_steps): which of the batched runner's `matmul_coop`
        products split their columns across workgroups in an engine of `max_batch` sequences
        per step (`Table.batch_split_for`; split_rows 0: none; `k_splits`); the paged KV
        cache holds it with the kernels."""
        return self.tuning.batch_split_for(max_batch)

    def batch_glu(self, max_batch: int | None = None
                  ) -> tuple[tuple | None, tuple[int, int], tuple[int, int]]:
        """(tile, (min_rows, max_rows), raw rows): the `glu_coop` tile (BM, BN, SG_M, SG_N,
        SG_K, NBUF, DEPTH) on which an engine of `max_batch` sequences runs its generated
        tokens' gate and up products of min_rows to max_rows rows as one dispatch, and the
        bounds for `weight_types.RAW4_DTYPES` (`Table.batch_glu_for`), or (None, (0, 0), (0,
        0)): where the table has none or the engine's decode products are not on
        `matmul_coop` (`batch_products`). The paged KV cache holds it with the kernels."""
        tile, rows, raw_rows = self.tuning.batch_glu_for(max_batch)
        if tile is None or self.batch_products(max_batch)["decode"] != "matmul_coop":
            return None, (0, 0), (0, 0)
        return tile.spec_tile(), rows, raw_rows

    def k_splits(self, weight: Tensor, split_rows: int, coop_tiles: tuple | None = None,
                 min_steps: int = 1) -> int:
        """How many workgroups split the columns of the batched `matmul_coop` product of
        `weight` [n_rows, n_cols] (matmul_coop.comp, n_splits): ceil(split_rows / n_rows) for
        n_rows < split_rows and at least `min_steps` steps of the tile's sg_k * 32 columns,
        at most one per step; else 1; split_rows the tile's own where it has one (the
        engine's tile for the weight's type, `Table.batch_coop_tile`). It depends on the
        weight's shape and type and the engine's tiles alone, never on the token count
        (batch invariance: a token's bits depend on the split)."""
        n_rows, n_cols = weight.shape
        tile = self.tuning.batch_coop_tile(1, coop_tiles, weight.dtype, n_rows)
        split_rows = split_rows if tile.split_rows is None else tile.split_rows
        steps = -(-n_cols // (32 * tile.sg_k))
        if n_rows >= split_rows or steps < min_steps:
            return 1
        return min(steps, -(-split_rows // n_rows))

    def sum_splits(self, partials: Tensor, y: Tensor, n_tokens: int, n_rows: int,
                   k_splits: int, token0: int = 0, name: str = "") -> Dispatch:
        """y[token0 + t] = partials[0, t] + partials[1, t] + ... (left to right) for t <
        n_tokens: the sum of a product `linear(..., k_splits=k_splits, partials=partials)`
        split across workgroups (sum_splits.comp); partials [>= k_splits * n_tokens * n_rows]
        f32, y [rows, n_rows] f32."""
        n = n_tokens * n_rows
        grid = (*spread(_groups(n, ELEMENTWISE_BLOCK), self.limit), 1)
        return self._sum_splits(partials, y, grid=grid, name=name,
                                need=(k_splits * n, (token0 + n_tokens) * n_rows), n=n,
                                n_rows=n_rows, y_row0=token0, n_splits=k_splits)

    def linear(self, x: Tensor, weight: Tensor, y: Tensor, n_tokens: int, x_row: int = 0,
               name: str = "", accumulate: bool = False, batched: str | None = None,
               token0: int = 0, coop_tiles: tuple | None = None, k_splits: int = 1,
               partials: Tensor | None = None) -> Dispatch:
        """y[t] = weight @ x[x_row + t] for t < n_tokens, f32 accumulation; weight [n_out, n_in]
        of any `WEIGHTS` dtype (n_in % 4 == 0; a multiple of the block for block types, which
        `Tensor` enforces), x and y f32. One token is a matrix-vector product (decode; its
        workgroup and rows per workgroup from `decode_launch`), more a matrix product
        (prefill; x_row must be 0): `prefill_kernel` picks `matmul_coop` (f16 tensor cores)
        where the device has them, else `matmul_tiled` where the table says so (a GPU),
        `matmul` otherwise. `accumulate` (one token only): y += the product instead
        (`matvec_add`: a residual add folded into the projection).
        `batched` ("matmul", "matmul_tiled" or "matmul_coop": a kernel of `batch_products`): the
        batched runner's product of its tokens' role over rows token0 .. token0 + n_tokens - 1
        of x and y on that kernel (even for one token; never the decode matvecs), its tile
        from the table (`matmul_coop`: among `coop_tiles`, an engine's `batch_coop_tiles`;
        None: the table's; by the weight's type and rows, `Table.batch_coop_tile`). These
        kernels compute
        a token's row in an order fixed by that row alone, whatever the tile, so it does not
        depend on how many tokens run with it (vkrt/models/batch.py: batch invariance).
        `k_splits` > 1 (`matmul_coop` only, `k_splits()`): the columns split across that
        many workgroups, each sum written to `partials` ([k_splits, n_tokens, n_out] f32)
        instead of y; `sum_splits` then adds them into y."""
        n_out, n_in = weight.shape
        if n_tokens == 1 and batched is None:
            kernel = "matvec_add" if accumulate else "matvec"
            threads, rows, spec = self.decode_launch(kernel, weight, n_out)
            op = self.weight_op(self.decode_module(kernel, weight, n_out), weight, threads,
                                {**spec, **({1: rows} if rows > 1 else {})} or None)
            return op(
                weight, x, y, grid=(*spread(_groups(n_out, rows), self.limit), 1), name=name,
                need=(None, (x_row + 1) * n_in, n_out), n_cols=n_in, x_offset=x_row * n_in,
                n_rows=n_out)
        assert x_row == 0 and not accumulate, "matmul reads x from row 0 and overwrites y"
        assert batched is not None or token0 == 0, "token0 is the batched runner's"
        need = (None, (token0 + n_tokens) * n_in, (token0 + n_tokens) * n_out)
        assert batched in (None, "matmul", "matmul_tiled", "matmul_coop"), batched
        assert batched != "matmul_coop" or self.coop is not None, "no cooperative matrices"
        kernel = batched if batched is not None else self.prefill_kernel(n_tokens)
        assert k_splits == 1 or (kernel == "matmul_coop" and partials is not None), k_splits
        if kernel == "matmul_coop":
            tile = None
            if batched is not None:
                tile = self.tuning.batch_coop_tile(n_tokens, coop_tiles, weight.dtype,
                                                   n_out).spec_tile()
            spec = self.coop_spec(n_out, n_tokens, tile)
            x_groups, z_groups = spread(_groups(n_out, spec[5]), self.limit)
            grid = (x_groups, _groups(n_tokens, spec[4]) * k_splits, z_groups)
            out, y_row0 = y, token0
            if k_splits > 1:
                out, y_row0 = partials, 0
                need = (None, need[1], k_splits * n_tokens * n_out)
            return self.weight_op("matmul_coop", weight, spec=spec)(
                weight, x, out, grid=grid, name=name, need=need, n_cols=n_in, n_rows=n_out,
                n_tokens=n_tokens, token0=token0, y_row0=y_row0, n_splits=k_splits)
        if kernel == "matmul_tiled":
            x_groups, z_groups = spread(_groups(n_out, TILE_ROWS), self.limit)
            grid = (x_groups, _groups(n_tokens, TILE_TOKENS), z_groups)
            return self.weight_op("matmul_tiled", weight)(
                weight, x, y, grid=grid, name=name, need=need, n_cols=n_in, n_rows=n_out,
                n_tokens=n_tokens, token0=token0)
        assert kernel == "matmul", kernel
        # The batched runner's tile from the table (rows per workgroup, tokens per tile; a
        # tile of the least power of two >= T when fewer); the prefill's MATMUL_TOKENS.
        # A token's sum runs the same loop over k for any tile (matmul.comp), so its bits do
        # not depend on the tile (tests/test_kernels.py checks it).
        rows, tokens = 1, MATMUL_TOKENS
        if batched is not None:
            tile = self.tuning.batch_tile(n_tokens)
            rows, tokens = tile.rows, min(tile.tokens, 1 << (n_tokens - 1).bit_length())
        x_groups, z_groups = spread(_groups(n_out, rows), self.limit)
        grid = (x_groups, _groups(n_tokens, tokens), z_groups)
        spec = {**({1: tokens} if tokens != MATMUL_TOKENS else {}),
                **({2: rows} if rows != 1 else {})}
        return self.weight_op("matmul", weight, spec=spec or None)(
            weight, x, y, grid=grid, name=name, need=need, n_cols=n_in, n_rows=n_out,
            n_tokens=n_tokens, token0=token0)

    def glu(self, x: Tensor, norm_weight: Tensor, gate: Tensor, up: Tensor, out: Tensor,
            eps: float, name: str = "", gelu: bool = False) -> Dispatch:
        """out = silu(gate @ n(x)) * (up @ n(x)) for one token, n(x) = rmsnorm(x) * norm_weight
        (`matvec_glu`: rmsnorm, two products and silu_mul in one dispatch); `gelu`:
        GELU-tanh instead of SiLU (GeGLU); gate, up [n_ff, n_embd] of one `WEIGHTS` dtype; x,
        norm_weight [n_embd], out [n_ff] f32."""
        n_out, n_in = gate.shape
        if up.dtype != gate.dtype or up.shape != gate.shape:
            raise ShaderInterfaceError(f"matvec_glu: gate {gate.name!r} {gate.dtype} "
                                       f"{list(gate.shape)} and up {up.name!r} {up.dtype} "
                                       f"{list(up.shape)} differ")
        threads, rows, spec = self.decode_launch("matvec_glu", gate, n_out)
        spec = {**spec, **({1: 1} if gelu else {}), **({2: rows} if rows > 1 else {})}
        return self.weight_op(self.decode_module("matvec_glu", gate, n_out), gate, threads,
                              spec or None)(
            gate, x, out, up, norm_weight, grid=(*spread(_groups(n_out, rows), self.limit), 1),
            name=name,
            need=(None, n_in, n_out, None, n_in), n_cols=n_in, n_rows=n_out, eps=eps)

    def glu_coop(self, x: Tensor, gate: Tensor, up: Tensor, y: Tensor, n_tokens: int,
                 tile: tuple, token0: int = 0, gelu: bool = False, name: str = "") -> Dispatch:
        """y[token0 + t] = silu(gate @ x[token0 + t]) * (up @ x[token0 + t]) for t < n_tokens
        (GELU-tanh instead of SiLU with `gelu`) in one dispatch: matmul_coop's GLU build, each
        workgroup's step loading the x tile once for both W tiles, the activation applied to
        the f32 accumulators before they are stored. `tile` (BM, BN, SG_M, SG_N, SG_K[, NBUF[,
        DEPTH]]) as `coop_spec` takes it; a token's bits depend on SG_K alone, as matmul_coop's
        (the batched runner's batch invariance). gate, up [n_ff, n_embd] of one `WEIGHTS`
        dtype; x, y [rows, n_embd] and [rows, n_ff] f32. Raises ShaderInterfaceError when gate
        and up differ in dtype or shape, VkrtError for a tile past the device's shared
        memory."""
        n_out, n_in = gate.shape
        if up.dtype != gate.dtype or up.shape != gate.shape:
            raise ShaderInterfaceError(f"matmul_coop_glu: gate {gate.name!r} {gate.dtype} "
                                       f"{list(gate.shape)} and up {up.name!r} {up.dtype} "
                                       f"{list(up.shape)} differ")
        assert self.coop is not None, "no cooperative matrices"
        spec = {**self.coop_spec(n_out, n_tokens, tile, products=2), **({11: 1} if gelu else {})}
        x_groups, z_groups = spread(_groups(n_out, spec[5]), self.limit)
        grid = (x_groups, _groups(n_tokens, spec[4]), z_groups)
        return self.weight_op("matmul_coop_glu", gate, spec=spec)(
            gate, x, y, up, grid=grid, name=name,
            need=(None, (token0 + n_tokens) * n_in, (token0 + n_tokens) * n_out, None),
            n_cols=n_in, n_rows=n_out, n_tokens=n_tokens, token0=token0, y_row0=token0,
            n_splits=1)

    def qkv_rope(self, x: Tensor, norm_weight: Tensor, wq: Tensor, wk: Tensor, wv: Tensor,
                 cos_sin: Tensor, q_out: Tensor, k_cache: Tensor, v_cache: Tensor,
                 head_dim: int, pos0: int, eps: float, pos: Tensor, use_pos: bool,
                 name: str = "", neox: bool = False,
                 biases: tuple[Tensor, Tensor, Tensor] | None = None,
                 qk_norm: tuple[Tensor, Tensor] | None = None) -> list[Dispatch]:
        """For one token at position p = pos0 (+ pos[0] at run time when `use_pos`): n(x) =
        rmsnorm(x) * norm_weight, q_out = rope(wq @ n(x) + bq, p), k_cache[p] = rope(wk @
        n(x) + bk, p), v_cache[p] = wv @ n(x) + bv (`qkv_rope`: seven to ten dispatches of
        three or four stages in one).
        wq [n_heads * head_dim, n_embd], wk, wv [n_kv_heads * head_dim, n_embd] of one
        `WEIGHTS` dtype, or wv of the V dtype of a pair of weight_types.MIXED_QKV (llama.cpp's
        K-quant mixes; f32 x, whatever the table's `integer_x`); x, norm_weight [n_embd];
        cos_sin [positions, head_dim / 2, 2];
        caches [rows, n_kv_heads * head_dim]; pos [1] u32 (bound either way); `biases`
        (bq [n_heads * head_dim], bk, bv [n_kv_heads * head_dim] f32) or None; `neox`: RoPE
        on halves (i, i + head_dim / 2) of each head instead of adjacent pairs (rope.comp);
        `qk_norm` (qn, kn [head_dim] f32) or None: each head of Q and K RMS-normed (eps) with
        those weights before RoPE (qwen3, gemma3): a second dispatch, `head_norm_rope`, one
        workgroup per head, after qkv_rope writes Q and K unrotated.
        Pairs of rows per workgroup: the table's `rows` (vkrt/tuning.py), lowered to a
        divisor of head_dim / 2. Sizes are checked for pos[0] = 0: with `use_pos` the
        caller keeps p within the caches. Caches of float32, or float16 (the `_kvf16`
        variants, K and V rounded as stored); ShaderInterfaceError for K and V of different
        dtypes, or an f16 cache with `qk_norm` (head_norm_rope reads and writes f32)."""
        qw, n_in = wq.shape
        kvw = wk.shape[0]
        mixed = wv.dtype != wq.dtype
        if not (wk.dtype == wq.dtype and (not mixed or (wq.dtype, wv.dtype) in MIXED_QKV)
                and wv.shape == wk.shape and wk.shape[1] == n_in and qw % head_dim == 0
                and kvw % head_dim == 0):
            raise ShaderInterfaceError(
                f"qkv_rope: q {wq.name!r} {wq.dtype} {list(wq.shape)}, k {wk.name!r} {wk.dtype} "
                f"{list(wk.shape)}, v {wv.name!r} {wv.dtype} {list(wv.shape)} do not stack "
                f"(one dtype, or V's of a pair in weight_types.MIXED_QKV; one n_embd; heads "
                f"of {head_dim})")
        pairs = (qw + 2 * kvw) // 2
        module, kv = self._kv_variant(
            "qkv_rope" if mixed else self.decode_module("qkv_rope", wq, pairs), k_cache, v_cache)
        if kv != F32 and qk_norm is not None:
            raise ShaderInterfaceError(f"qkv_rope: per-head Q/K norms (head_norm_rope) read "
                                       f"and write a float32 KV cache, not {kv} "
                                       f"({k_cache.name!r}): run the unfused path")
        threads, rows, stage = self.decode_launch("qkv_rope", wq, pairs)
        per_group = max(d for d in range(1, max(1, rows) + 1) if (head_dim // 2) % d == 0)
        spec = {1: int(neox), 2: int(biases is not None), 3: int(qk_norm is not None),
                **({4: per_group} if per_group > 1 else {}), **stage}
        # Without biases (norms) those bindings are not read: norm_weight stands in for them.
        bq, bk, bv = biases if biases is not None else (norm_weight,) * 3
        bias_need = (qw, kvw, kvw) if biases is not None else (None,) * 3
        out = [self.weight_op(module, wq, threads, spec, wv.dtype if mixed else None)(
            wq, x, q_out, wk, wv, norm_weight, cos_sin, k_cache, v_cache, pos, bq, bk, bv,
            grid=(*spread(pairs // per_group, self.limit), 1), name=name,
            need=(None, n_in, qw, None, None, n_in, (pos0 + 1) * head_dim,
                  (pos0 + 1) * kvw, (pos0 + 1) * kvw, 1, *bias_need),
            n_cols=n_in, n_heads=qw // head_dim, n_kv_heads=kvw // head_dim, head_dim=head_dim,
            pos0=pos0, use_pos=int(use_pos), eps=eps)]
        if qk_norm is None:
            return out
        heads = qw // head_dim + kvw // head_dim
        return out + [self._head_norm_rope[neox](
            q_out, k_cache, *qk_norm, cos_sin, pos, grid=(*spread(heads, self.limit), 1),
            name=name + "_norm", need=(qw, (pos0 + 1) * kvw, head_dim, head_dim,
                                       (pos0 + 1) * head_dim, 1),
            n_heads=qw // head_dim, n_kv_heads=kvw // head_dim, head_dim=head_dim, pos0=pos0,
            use_pos=int(use_pos), eps=eps)]

    def rope(self, src: Tensor, cos_sin: Tensor, dst: Tensor, n_tokens: int, n_heads: int,
             head_dim: int, pos0: int, dst_row: int = 0, name: str = "",
             pos: Tensor | None = None, dst_at_pos: bool = False,
             neox: bool = False) -> Dispatch:
        """dst[dst_row + t] = src[t] rotated by the angles of position pos0 + t (adjacent
        pairs (2i, 2i + 1) of each head, or halves (i, i + head_dim / 2) when `neox`); src
        [tokens, n_heads * head_dim]; cos_sin [positions, head_dim / 2, 2].
        `pos` (a [1] u32 tensor, P at run time): positions pos0 + P + t instead (a replayed
        step), and rows dst_row + P + t when `dst_at_pos` (K into the cache); the sizes are
        then checked for P = 0 and the caller keeps P + pos0 + n_tokens within the rows of
        cos_sin (and of dst). A float16 dst (an f16 KV cache) takes the `_kvf16`
        variants: the f32 results rounded as they are stored (glsl/kv.glsl)."""
        width = n_heads * head_dim
        grid = (_groups(width // 2, ELEMENTWISE_BLOCK), *spread(n_tokens, self.limit[1:]))
        need = (n_tokens * width, (pos0 + n_tokens) * head_dim, (dst_row + n_tokens) * width)
        if dst.dtype == F16:           # K into an f16 KV cache
            module = "rope_pos_kvf16" if pos is not None else "rope_kvf16"
            op = self._batch_op(module, {0: ELEMENTWISE_BLOCK, 1: int(neox)},
                                (F32, F32, F16) + ((U32,) if pos is not None else ()))
        else:
            op = (self._rope_pos if pos is not None else self._rope)[neox]
        if pos is not None:
            return op(src, cos_sin, dst, pos, grid=grid, name=name, need=(*need, 1),
                      n_heads=n_heads, head_dim=head_dim, pos0=pos0, dst_row=dst_row,
                      dst_at_pos=int(dst_at_pos))
        return op(src, cos_sin, dst, grid=grid, name=name, need=need, n_heads=n_heads,
                  head_dim=head_dim, pos0=pos0, dst_row=dst_row)

    def copy_rows(self, src: Tensor, dst: Tensor, n_tokens: int, dst_row: int,
                  name: str = "", pos: Tensor | None = None) -> Dispatch:
        """dst[dst_row + t] = src[t] for t < n_tokens; rows of dst's width. `pos` ([1] u32, P
        at run time): rows dst_row + P + t instead (as `rope`). A float16 dst (an f16 KV
        cache) takes the `_kvf16` variants: src rounded to f16 as it is stored."""
        width = dst.shape[-1]
        grid = (_groups(width, ELEMENTWISE_BLOCK), *spread(n_tokens, self.limit[1:]))
        need = (n_tokens * width, (dst_row + n_tokens) * width)
        if dst.dtype == F16:           # V into an f16 KV cache
            module = "copy_rows_pos_kvf16" if pos is not None else "copy_rows_kvf16"
            op = self._batch_op(module, {0: ELEMENTWISE_BLOCK},
                                (F32, F16) + ((U32,) if pos is not None else ()))
        else:
            op = self._copy_rows_pos if pos is not None else self._copy_rows
        if pos is not None:
            return op(src, dst, pos, grid=grid, name=name, need=(*need, 1), width=width,
                      dst_row=dst_row)
        return op(src, dst, grid=grid, name=name, need=need, width=width, dst_row=dst_row)

    def rope_kv_write(self, q: Tensor, k: Tensor, v: Tensor, cos_sin: Tensor, positions: Tensor,
                      slots: Tensor, q_out: Tensor, k_cache: Tensor, v_cache: Tensor,
                      n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int,
                      name: str = "", neox: bool = False) -> Dispatch:
        """For t < n_tokens: q_out[t] = rope(q[t], positions[t]), k_cache[slots[t]] =
        rope(k[t], positions[t]), v_cache[slots[t]] = v[t] (`rope_kv_write`: rope.comp's
        `rope_positions` variant of Q and K and `kv_write` in one dispatch, the same
        arithmetic); q, q_out [tokens, n_heads * head_dim], k, v [tokens, n_kv_heads *
        head_dim] f32, cos_sin [n_positions, head_dim / 2, 2] f32, positions and slots
        [tokens] u32, caches [n_slots, n_kv_heads * head_dim] f32 or f16 (`KV_DTYPES`: K and
        V rounded to f16 as they are stored). The caller keeps every position below
        n_positions and every slot below n_slots (vkrt/models/batch.py checks them on the
        host)."""
        qw, kw = n_heads * head_dim, n_kv_heads * head_dim
        grid = (_groups(qw // 2, ELEMENTWISE_BLOCK), *spread(n_tokens, self.limit[1:]))
        module, kv = self._kv_variant("rope_kv_write", k_cache, v_cache)
        op = self._batch_op(module, {0: ELEMENTWISE_BLOCK, 1: int(neox)},
                            (F32, F32, F32, F32, U32, U32, F32, kv, kv))
        return op(q, k, v, cos_sin, positions, slots, q_out, k_cache, v_cache, grid=grid,
                  name=name, need=(n_tokens * qw, n_tokens * kw, n_tokens * kw, head_dim,
                                   n_tokens, n_tokens, n_tokens * qw, kw, kw),
                  n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)

    def kv_write(self, k: Tensor, v: Tensor, slots: Tensor, k_cache: Tensor, v_cache: Tensor,
                 n_tokens: int, name: str = "") -> Dispatch:
        """k_cache[slots[t]] = k[t], v_cache[slots[t]] = v[t] for t < n_tokens: this step's K
        (after RoPE) and V into a paged KV cache by slot mapping (`kv_write`); k, v [tokens,
        width] f32, slots [tokens] u32, caches [n_slots, width] f32 or f16 (`KV_DTYPES`:
        rounded to f16 as stored). The caller keeps every slot below n_slots
        (vkrt/models/batch.py checks the slot mapping on the host)."""
        width = k_cache.shape[-1]
        grid = (_groups(width, ELEMENTWISE_BLOCK), *spread(n_tokens, self.limit[1:]))
        module, kv = self._kv_variant("kv_write", k_cache, v_cache)
        op = self._batch_op(module, {0: ELEMENTWISE_BLOCK}, (F32, F32, U32, kv, kv))
        return op(k, v, slots, k_cache, v_cache, grid=grid, name=name,
                  need=(n_tokens * width, n_tokens * width, n_tokens, width, width), width=width)

    def attention_paged(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor,
                        positions: Tensor, seq_of_token: Tensor, block_tables: Tensor,
                        n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int,
                        block_size: int, scale: float, name: str = "",
                        window: int = 0) -> Dispatch:
        """Causal grouped-query attention of n_tokens queries of several sequences over a
        paged KV cache (`attention_paged`, one workgroup per (head, token)): token t attends to
        positions 0 ..= positions[t] (the last `window` of them when window > 0) of sequence
        seq_of_token[t], position j at slot block_tables[seq, j // block_size] * block_size +
        j % block_size. q, out [tokens, n_heads * head_dim] f32; caches [n_slots, n_kv_heads *
        head_dim] f32 or f16 (`KV_DTYPES`, read as f32); positions, seq_of_token [tokens] u32;
        block_tables [rows, table_width] u32 (device tensors the batched runner writes each
        step; it checks every slot a token reaches on the host). A token's result depends only
        on its position and its sequence's keys (the reduction order of attention.comp)."""
        if head_dim % 4:
            raise ShaderInterfaceError(f"attention_paged: head_dim {head_dim} is not a multiple "
                                       "of 4 (vec4 loads)")
        module, kv = self._kv_variant("attention_paged", k_cache, v_cache)
        op = self._batch_op(module, {0: head_dim, 1: window} if window else {0: head_dim},
                            (F32, kv, kv, F32, U32, U32, U32))
        qn = n_tokens * n_heads * head_dim
        kvw = n_kv_heads * head_dim
        return op(q, k_cache, v_cache, out, positions, seq_of_token, block_tables,
                  grid=(n_heads, *spread(n_tokens, self.limit[1:])), name=name,
                  need=(qn, kvw, kvw, qn, n_tokens, n_tokens, block_tables.shape[-1]),
                  n_heads=n_heads, n_kv_heads=n_kv_heads, block_size=block_size,
                  table_width=block_tables.shape[-1], scale=scale)

    def argmax_rows(self, logits: Tensor, out: Tensor, n: int, n_rows: int,
                    name: str = "") -> Dispatch:
        """out[r] = the smallest index of the largest of logits[r * n : (r + 1) * n] for
        r < n_rows (`argmax_rows`, one workgroup per row); logits f32, out u32."""
        op = self._batch_op("argmax_rows", {0: self.tuning.argmax_threads}, (F32, U32))
        return op(logits, out, grid=(n_rows, 1, 1), name=name,
                                 need=(n_rows * n, n_rows), n=n, offset=0)

    def feed_sampled(self, ids: Tensor, src: Tensor, sampled: Tensor, n_tokens: int,
                     name: str = "feed_sampled") -> Dispatch:
        """ids[t] = sampled[src[t]] where src[t] != 0xFFFFFFFF, for t < n_tokens
        (`feed_sampled`): the tokens of a batched step that are the greedy tokens of the step
        before it, read on the GPU (asynchronous scheduling, vkrt/models/batch.py). ids, src
        [n_tokens] u32; sampled [rows] u32 (the previous step's argmax rows)."""
        op = self._batch_op("feed_sampled", {}, (U32, U32, U32))
        return op(ids, src, sampled, grid=(-(-n_tokens // 64), 1, 1), name=name,
                  need=(n_tokens, n_tokens, 1), n_tokens=n_tokens)

    def advance_pos(self, pos: Tensor, n: int, name: str = "advance_pos") -> Dispatch:
        """pos[0] += n on the GPU: the last dispatch of a replayed step ([1] u32)."""
        return self._advance_pos(pos, grid=(1, 1, 1), name=name, need=(1,), n=n)

    def attention(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor,
                  n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, pos0: int,
                  scale: float, part: Tensor, name: str = "",
                  pos: Tensor | None = None, window: int = 0) -> list[Dispatch]:
        """Causal grouped-query attention of n_tokens queries at positions pos0.. over the
        cache rows 0 .. pos0 + n_tokens - 1; q, out [tokens, n_heads * head_dim].
        One token (decode) runs `decode_dim_splits` workgroups per head (`attention_decode`,
        one dispatch) while the positions it may see fit `decode_positions`; past that it
        is split over the cache (`attention_split`: KV heads x splits of
        `attention_chunk(pos0 + 1, ...)` positions, each workgroup serving the query heads
        that share its KV head, partial states in `part`, f32 [n_heads * ATTENTION_SPLITS *
        (head_dim + 2)] at least) and merged (`attention_combine`): two dispatches. More
        tokens (prefill) run one dispatch: on tiles of query tokens (`attention_tile`,
        `attention_tile` (QT, LQ, KT): a workgroup per head and QT tokens) where the table
        names them (`Table.prefill_attention`), else one workgroup per head and token
        (`attention`). `pos` ([1] u32, P at run time; one token):
        the query is at position pos0 + P (a replayed step), and the splits cover every row
        of the cache (those past the query do nothing). `window` > 0: a query at position p
        attends to positions p - window + 1 ..= p only (a sliding-window layer); 0: all.
        Caches of float32 or float16 (the `_kvf16` variants read each element exactly);
        ShaderInterfaceError when K and V differ in dtype, or (one token) when head_dim is
        not a multiple of 4 or n_heads not a multiple of n_kv_heads."""
        kvn = (pos0 + n_tokens) * n_kv_heads * head_dim
        _, kv = self._kv_variant("attention", k_cache, v_cache)
        attention, decode, decode_pos = self._windowed(window, kv)
        if n_tokens == 1:
            if head_dim % 4:
                raise ShaderInterfaceError(f"attention_split: head_dim {head_dim} is not a "
                                           "multiple of 4 (vec4 loads)")
            if n_kv_heads <= 0 or n_heads % n_kv_heads:
                raise ShaderInterfaceError(f"attention_split: {n_heads} query heads do not "
                                           f"share {n_kv_heads} KV heads evenly")
            assert head_dim == self._head_dim, "built for head_dim"
            # Replayed (`pos`): sized for the longest context the caches hold.
            n_pos = pos0 + 1 if pos is None else k_cache.shape[0]
            qn = n_heads * head_dim
            if n_pos <= self.decode_positions:
                op, extra = (decode, ()) if pos is None else (decode_pos, (pos,))
                return [op(q, k_cache, v_cache, out, *extra,
                           grid=(n_heads, self.decode_dim_splits, 1), name=name,
                           need=(qn, kvn, kvn, qn) + (1,) * len(extra), n_heads=n_heads,
                           n_kv_heads=n_kv_heads, pos0=pos0, scale=scale)]
            chunk = attention_chunk(n_pos, self.split_threads // self.split_lanes,
                                    self.tuning.attention_splits)
            splits = _groups(n_pos, chunk)
            pn = n_heads * splits * (head_dim + 2)
            op = self._split(window, kv, n_heads // n_kv_heads, pos is not None)
            extra = () if pos is None else (pos,)
            return [op(q, k_cache, v_cache, part, *extra, grid=(n_kv_heads, splits, 1),
                       name=name + "_split", need=(qn, kvn, kvn, pn) + (1,) * len(extra),
                       n_kv_heads=n_kv_heads, pos0=pos0, chunk=chunk, scale=scale),
                    self._attention_combine(part, out, grid=(n_heads, 1, 1), name=name,
                                            need=(pn, qn), head_dim=head_dim, n_splits=splits)]
        if head_dim % 4:
            raise ShaderInterfaceError(f"attention: head_dim {head_dim} is not a multiple of 4 "
                                       "(vec4 loads)")
        qn = n_tokens * n_heads * head_dim
        if self.attention_tile is not None:
            # The tiles' pipelines are built for this Kernels' head_dim (HEAD_DIM).
            assert head_dim == self._head_dim, "built for head_dim"
            qt, lq, kt = self.attention_tile
            op = self._attention_tiles.get((window, kv))
            if op is None:
                spec = {0: qt * lq, 1: window, 2: head_dim, 3: qt, 4: kt}
                op = self._attention_tiles[window, kv] = Op(self._pipelines.get_pipeline(
                    "attention_tile" + KV_DTYPES[kv], spec), (F32, kv, kv, F32))
            return [op(q, k_cache, v_cache, out, name=name,
                       grid=(n_heads, *spread(_groups(n_tokens, qt), self.limit[1:])),
                       need=(qn, kvn, kvn, qn), n_heads=n_heads, n_kv_heads=n_kv_heads,
                       head_dim=head_dim, pos0=pos0, n_tokens=n_tokens, scale=scale)]
        op = attention
        assert op is not None and op.pipeline.local_size[0] == head_dim, "built for head_dim"
        return [op(q, k_cache, v_cache, out, grid=(n_heads, *spread(n_tokens, self.limit[1:])),
                   name=name,
                   need=(qn, kvn, kvn, qn), n_heads=n_heads, n_kv_heads=n_kv_heads,
                   head_dim=head_dim, pos0=pos0, scale=scale)]

    def silu_mul(self, gate: Tensor, up: Tensor, out: Tensor, n: int,
                 name: str = "", gelu: bool = False) -> Dispatch:
        """out[i] = silu(gate[i]) * up[i] for i < n; with `gelu`, gelu_tanh(gate[i]) * up[i]
        (GELU's tanh approximation, Gemma's GeGLU)."""
        grid = (*spread(_groups(n, ELEMENTWISE_BLOCK), self.limit), 1)
        return self._silu_mul[gelu](gate, up, out, grid=grid, name=name, need=(n, n, n), n=n)

    def scale(self, x: Tensor, n: int, s: float, name: str = "") -> Dispatch:
        """x[i] *= s for i < n (f32 s)."""
        grid = (*spread(_groups(n, ELEMENTWISE_BLOCK), self.limit), 1)
        return self._scale(x, grid=grid, name=name, need=(n,), n=n, s=s)

    def add(self, x: Tensor, y: Tensor, n: int, name: str = "") -> Dispatch:
        """x[i] += y[i] for i < n (in place)."""
        grid = (*spread(_groups(n, ELEMENTWISE_BLOCK), self.limit), 1)
        return self._add(x, y, grid=grid, name=name, need=(n, n), n=n)

    def bias_add(self, x: Tensor, bias: Tensor, n_tokens: int, name: str = "") -> Dispatch:
        """x[t, i] += bias[i] for t < n_tokens, i < width (in place); x [tokens, width],
        bias [width]: the bias of a linear layer (nn.Linear: y = x W^T + b)."""
        width = bias.shape[0]
        return self._bias_add(x, bias, grid=(_groups(width, ELEMENTWISE_BLOCK),
                                             *spread(n_tokens, self.limit[1:])),
                              name=name, need=(n_tokens * width, width), width=width,
                              n_tokens=n_tokens)

    def argmax(self, logits: Tensor, out: Tensor, n: int, offset: int = 0,
               name: str = "") -> Dispatch:
        """out[0] = the smallest index of the largest of logits[offset : offset + n]."""
        return self._argmax(logits, out, grid=(1, 1, 1), name=name, need=(offset + n, 1), n=n,
                            offset=offset)

    # -- OPT -------------------------------------------------------------------------------
    def layernorm(self, x: Tensor, weight: Tensor, bias: Tensor, out: Tensor, n_tokens: int,
                  eps: float, name: str = "") -> Dispatch:
        """out[t] = (x[t] - mean) / sqrt(var + eps) * weight + bias for t < n_tokens (biased
        variance over the row, torch.nn.LayerNorm); weight, bias [n]."""
        n = weight.shape[0]
        return self._layernorm(x, weight, bias, out, grid=(*spread(n_tokens, self.limit), 1),
                               name=name, need=(n_tokens * n, None, n, n_tokens * n), n=n,
                               eps=eps, n_rows=n_tokens)

    def relu(self, x: Tensor, n: int, name: str = "") -> Dispatch:
        """x[i] = max(x[i], 0) for i < n (in place)."""
        grid = (*spread(_groups(n, ELEMENTWISE_BLOCK), self.limit), 1)
        return self._relu(x, grid=grid, name=name, need=(n,), n=n)

    def add_rows(self, x: Tensor, table: Tensor, n_tokens: int, row0: int,
                 name: str = "") -> Dispatch:
        """x[t] += table[row0 + t] for t < n_tokens (in place); x [tokens, width], table
        [rows, width]: learned position embeddings (row0 = first position + offset)."""
        width = table.shape[1]
        return self._add_rows(x, table, grid=(_groups(width, ELEMENTWISE_BLOCK),
                                              *spread(n_tokens, self.limit[1:])),
                              name=name, need=(n_tokens * width, (row0 + n_tokens) * width),
                              width=width, row0=row0, n_tokens=n_tokens)

    def embed_range(self, table: Tensor, row0: int, ids: Tensor, out: Tensor, n_tokens: int,
                    name: str = "") -> Dispatch:
        """out[t] = table[ids[t] - row0] dequantized to f32 for the t < n_tokens whose id lies
        in row0 .. row0 + rows - 1 (other rows of out untouched); table [rows, n_embd] of any
        `WEIGHTS` dtype is the slice of an embedding from row row0 (a table larger than one
        binding, bound in slices); out f32."""
        n_rows, n_embd = table.shape
        return self.weight_op("embed_range", table)(
            table, ids, out, grid=(_groups(n_embd, ELEMENTWISE_BLOCK),
                                   *spread(n_tokens, self.limit[1:])),
            name=name, need=(None, n_tokens, n_tokens * n_embd), n_embd=n_embd, row0=row0,
            n_rows=n_rows, n_tokens=n_tokens)

    def copy_block(self, src: Tensor, dst: Tensor, n_tokens: int, width: int, col0: int,
                   name: str = "") -> Dispatch:
        """dst[t, col0 + i] = src[t, i] for t < n_tokens, i < width; src [tokens, width],
        dst [tokens, dst_width] with col0 + width <= dst_width."""
        dst_width = dst.shape[-1]
        assert col0 + width <= dst_width, (col0, width, dst_width)
        return self._copy_block(src, dst, grid=(_groups(width, ELEMENTWISE_BLOCK),
                                                *spread(n_tokens, self.limit[1:])),
                                name=name, need=(n_tokens * width, n_tokens * dst_width),
                                width=width, dst_width=dst_width, col0=col0, n_tokens=n_tokens)
