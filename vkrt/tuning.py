"""Kernel choices as data: one table per device class, read by `vkrt.kernels.Kernels`.

A device class is `Device.info.kind` folded to "gpu" (discrete, integrated, virtual) or
"cpu" (lavapipe). Each entry names the measurement that chose it: a section of
bench/README.md and the command behind it. Launch code (kernels.py) only reads these; a
change of tuning is a change of this file with the measurement beside it.

Decode products (`matvec`, `matvec_add`, `matvec_glu`, `qkv_rope`) take a `Decode` rule: the
first of the kernel's rules whose `max_rows` covers the product's rows and whose `weights`
match ("scalar": f32/f16/bf16, "blocks32": blocks of 32 (Q8_0 ... IQ4_NL), "blocks256": of
256 (the K-quants, IQ4_XS), "blocks": either, "any", or one dtype such as "iq4_xs").
`subgroups`: the workgroup is that many subgroups (local_size_x = subgroups x the device's
subgroup size);
`rows`: rows per workgroup (matvec.comp / matvec_glu.comp ROWS; for qkv_rope pairs of rows,
qkv_rope.comp PAIRS, lowered to a divisor of head_dim / 2); for block types, `split`: invocations per
unit of 32 weights (glsl/unit_x.glsl SPLIT: 1, 2 or 4) and `stage_x`: x loaded through
shared memory (STAGE_X, with split 1; kernels.py drops it where the device's shared memory
cannot hold the stage); `integer_x`: the kernel's `_xq` variant (x quantized per unit to
16-bit integers, integer dot products: glsl/unit_xq.glsl) for the types with an integer form,
with split 1, where the device has shaderIntegerDotProduct and VKRT_XQ allows.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Decode:
    max_rows: int | None     # products of at most this many rows (None: any)
    weights: str             # "scalar", "blocks32", "blocks256", "blocks", "any" or a dtype
    subgroups: int
    rows: int
    source: str              # the measurement (bench/README.md) that chose it
    stage_x: bool = False
    split: int = 1
    integer_x: bool = False  # the `_xq` variant (x as 16-bit integers per unit) where it can
    min_cols: int = 0        # products of at least this many columns

    def matches(self, n_rows: int, block: int, dtype: str = "", n_cols: int = 0) -> bool:
        """For a product of n_rows rows of n_cols columns (0: unknown, matching only rules
        without `min_cols`) of `dtype`, `block` elements per block (1: scalar)."""
        kinds = ("any", "scalar") if block == 1 else ("any", "blocks", f"blocks{block}")
        return ((self.max_rows is None or n_rows <= self.max_rows) and n_cols >= self.min_cols
                and (self.weights in kinds or self.weights == dtype))


@dataclass(frozen=True)
class BatchTile:
    """The batched runner's `matmul` launch (vkrt/glsl/matmul.comp) for products of at most
    `max_tokens` tokens (None: any): `rows` output rows per workgroup (ROWS) and a tile of
    `tokens` tokens (TOKENS; fewer tokens take the least power of two >= their count). A
    token's bits do not depend on either (matmul.comp), so the rule may change with the
    count without breaking batch invariance."""
    max_tokens: int | None
    rows: int
    tokens: int
    source: str

    def matches(self, n_tokens: int) -> bool:
        return self.max_tokens is None or n_tokens <= self.max_tokens


@dataclass(frozen=True)
class BatchCoopTile:
    """The batched runner's `matmul_coop` launch (vkrt/glsl/matmul_coop.comp) for products of
    at most `max_tokens` tokens (None: any): a workgroup tile of `bm` tokens x `bn` rows over
    `sg_m` x `sg_n` subgroups, `sg_k` such groups splitting the columns, `depth` steps of
    columns fetched ahead into registers, `nbuf` shared buffers (2: one barrier per step;
    `Kernels.coop_spec` refuses a tile past the device's shared memory). `dtypes` and
    `min_rows`: the products it serves, of those weight types (vkrt/weight_types.py; ()
    any) and at least that many rows: where a set of tiles names a product's type, only the
    tiles naming it serve that product, else only those naming none. `split_rows`: for its
    products, the engine's `WideBatchDecode.split_rows` instead (None: the rule's). A
    token's bits depend on `sg_k` but not on the rest of the tile (matmul_coop.comp), so
    the tiles that serve a product share one `sg_k` (`Table.batch_coop_tile` checks it)."""
    max_tokens: int | None
    bm: int
    bn: int
    sg_m: int
    sg_n: int
    source: str
    sg_k: int = 1
    depth: int = 1
    nbuf: int = 1
    dtypes: tuple[str, ...] = ()
    min_rows: int = 0
    split_rows: int | None = None

    @classmethod
    def parse(cls, text: str, source: str, max_tokens: int | None = None) -> "BatchCoopTile":
        """A tile from "BMxBN:SG_MxSG_N[xSG_K[xDEPTH[xNBUF]]]" (the benchmarks' options),
        every number at least 1 and NBUF 1 or 2. Raises ValueError naming `text` otherwise."""
        try:
            tile, groups = text.split(":")
            bm, bn = (int(v) for v in tile.split("x"))
            sg_m, sg_n, *more = (int(v) for v in groups.split("x"))
        except ValueError:
            more = None
        if more is None or len(more) > 3 or min(bm, bn, sg_m, sg_n, *more) < 1 \
                or more[2:] not in ([], [1], [2]):
            raise ValueError(f"{text!r} is not BMxBN:SG_MxSG_N[xSG_K[xDEPTH[xNBUF]]] "
                             "(numbers from 1, NBUF 1 or 2)")
        return cls(max_tokens, bm, bn, sg_m, sg_n, source, *more)

    def matches(self, n_tokens: int) -> bool:
        return self.max_tokens is None or n_tokens <= self.max_tokens

    def spec_tile(self) -> tuple[int, int, int, int, int, int, int]:
        """(BM, BN, SG_M, SG_N, SG_K, NBUF, DEPTH), as `Kernels.coop_spec` takes a tile."""
        return self.bm, self.bn, self.sg_m, self.sg_n, self.sg_k, self.nbuf, self.depth


@dataclass(frozen=True)
class WideBatchDecode:
    """The generated tokens' products (the "decode" role) of an engine that batches at least
    `min_max_batch` sequences per step (`Engine(max_batch=...)`, vkrt/serve/engine.py):
    `kernel` instead of `Table.batch_products["decode"]`. An engine's max_batch is fixed for
    its life and its paged KV cache holds the kernels it chose (vkrt/models/batch.py), so each
    of its requests runs on one kernel whatever shares its step: batch invariance within an
    engine. A request's bits may differ between engines of different max_batch.
    `coop_tiles`: the rule's own `matmul_coop` tiles (one column split, `sg_k`, per weight
    type among them), for its engines instead of `Table.batch_coop_tiles`; () keeps the table's.
    `split_rows` (`matmul_coop` only): products of fewer rows and at least `split_min_steps`
    steps of columns (sg_k * 32 each) split their columns across ceil(split_rows / rows)
    workgroups (`Kernels.k_splits`, matmul_coop.comp's n_splits), so that a product of few
    row tiles fills the GPU; 0: never. A short product gains less than its reduction costs.
    `glu_tile` (`matmul_coop` only): the generated tokens' gate and up products of
    `glu_rows` (min, max) rows, bounds included, and SiLU (GELU) times up run as one dispatch
    on this tile (`Kernels.glu_coop`); None: never. `glu_raw_rows`: the bounds instead for
    the weight types matmul_coop fetches as words (`weight_types.RAW4_DTYPES`); None:
    `glu_rows` for them too."""
    min_max_batch: int
    kernel: str
    source: str
    coop_tiles: tuple[BatchCoopTile, ...] = ()
    split_rows: int = 0
    split_min_steps: int = 1
    glu_tile: BatchCoopTile | None = None
    glu_rows: tuple[int, int] = (0, 0)
    glu_raw_rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class PrefillCoopTile:
    """A prefill product's `matmul_coop` launch (vkrt/glsl/matmul_coop.comp) for products of
    at least `min_rows` rows and `min_tokens` tokens: a workgroup tile of `bm` tokens x `bn`
    rows over `sg_m` x `sg_n` subgroups, `sg_k` groups of them splitting the columns, `nbuf`
    shared buffers (2: double-buffered), `depth` steps of columns fetched ahead into
    registers, `splits` workgroups splitting the columns (matmul_coop.comp's n_splits: each
    writes its partial sums, `sum_splits` adds them in order; for products of too few
    tiles to fill the GPU). `kernels.fit_coop_tile` shrinks it on a device whose
    shared memory it does not fit. Prefill promises no batch invariance, so the tile may
    change with the shape."""
    min_rows: int
    min_tokens: int
    bm: int
    bn: int
    sg_m: int
    sg_n: int
    source: str
    sg_k: int = 1
    nbuf: int = 1
    depth: int = 1
    splits: int = 1

    def matches(self, n_rows: int, n_tokens: int) -> bool:
        return n_rows >= self.min_rows and n_tokens >= self.min_tokens


@dataclass(frozen=True)
class Table:
    decode: dict[str, tuple[Decode, ...]]
    argmax_threads: int              # argmax's one workgroup
    attention_threads: int           # attention_decode's workgroup (at most; kernels.py fits it)
    attention_dim_splits: int        # attention_decode's workgroups per head
    prefill_tiled: bool              # prefill products: matmul_tiled (else matmul)
    norm_subgroups: int              # rmsnorm, rmsnorm_add, head_norm_rope: subgroups per row
    # Decode attention: attention_decode (one dispatch, a workgroup per query head) while the
    # query sees at most `decode_positions(head_dim)` positions (and they fit its shared
    # memory, kernels.py), else attention_split (a workgroup of at most
    # `attention_split_threads` invocations per KV head and split of the cache, about
    # `attention_splits` splits, kernels.attention_chunk) and attention_combine.
    # `attention_decode_positions`: (head_dim at most, positions) by increasing head_dim
    # (tests/test_tuning.py checks the order).
    attention_decode_positions: tuple[tuple[int, int], ...] = ((64, 1024), (128, 256))
    attention_split_threads: int = 256
    attention_splits: int = 32
    # The batched runner's products per token role (vkrt/models/batch.py): "decode" (generated
    # tokens, and every logit row) and "prompt" -> "matmul", "matmul_tiled" or "matmul_coop"
    # (f16 operands; "matmul" where the device has no cooperative-matrix shape or
    # VKRT_COOPMAT=0).
    batch_products: dict[str, str] = field(default_factory=dict)
    batch_tiles: tuple[BatchTile, ...] = ()    # the first whose max_tokens covers the count
    batch_coop_tiles: tuple[BatchCoopTile, ...] = ()   # likewise, for "matmul_coop"
    # The "decode" role's kernel by the engine's max_batch: the rule of the largest
    # min_max_batch <= max_batch, or batch_products["decode"] below every rule.
    wide_batch_decode: tuple[WideBatchDecode, ...] = ()
    # Prefill attention (more than one query token): attention_tile.comp on tiles of (QT
    # queries, at most LQ lanes per query, at most KT cache positions per staged tile;
    # kernels.attention_tile_shape fits LQ and KT to the device), or None for
    # attention.comp (one workgroup per head and token).
    prefill_attention: tuple[int, int, int] | None = None
    # Prefill products on matmul_coop (where the device has cooperative matrices): the first
    # rule that matches the product's rows and tokens; the last matches any.
    prefill_coop_tiles: tuple[PrefillCoopTile, ...] = ()
    # Prefill's gate and up products and SiLU (GELU) times up as one dispatch (matmul_coop's
    # GLU build, `Kernels.prefill_glu_tile` and `glu_coop`) on this tile where the products
    # run on matmul_coop and the layer's gate and up share a type and have no biases; None:
    # the two products and silu_mul. Its min_rows and min_tokens are not read.
    prefill_glu_tile: PrefillCoopTile | None = None
    sources: dict[str, str] = field(default_factory=dict)   # the scalar entries' measurements

    def decode_rule(self, kernel: str, n_rows: int, block: int, dtype: str = "",
                    n_cols: int = 0) -> Decode:
        """The rule of decode kernel `kernel` (matvec_add reads matvec's) for `n_rows` rows of
        `n_cols` columns (0: unknown) of `dtype`, a type of `block` elements per block (1:
        f32, f16, bf16)."""
        rules = self.decode["matvec" if kernel == "matvec_add" else kernel]
        return next(r for r in rules if r.matches(n_rows, block, dtype, n_cols))

    def decode_positions(self, head_dim: int) -> int:
        """Most cache positions (int) a decode query attends to in one dispatch
        (attention_decode) for heads of `head_dim` elements: the first entry of
        `attention_decode_positions` whose head_dim is at least `head_dim`, else the last
        entry (a wider head than any measured); 0 (always split) when there is none."""
        entries = self.attention_decode_positions
        if not entries:
            return 0
        return next((p for h, p in entries if head_dim <= h), entries[-1][1])

    def prefill_coop_tile(self, n_rows: int, n_tokens: int) -> PrefillCoopTile:
        """The `matmul_coop` tile of a prefill product of `n_rows` rows and `n_tokens`
        tokens."""
        return next(r for r in self.prefill_coop_tiles if r.matches(n_rows, n_tokens))

    def wide_rule(self, max_batch: int | None) -> WideBatchDecode | None:
        """The `wide_batch_decode` rule of an engine of `max_batch` sequences per step: the
        one of the largest min_max_batch <= max_batch, None below every rule (or None)."""
        rules = [r for r in self.wide_batch_decode
                 if max_batch is not None and r.min_max_batch <= max_batch]
        return max(rules, key=lambda r: r.min_max_batch) if rules else None

    def batch_products_for(self, max_batch: int | None) -> dict[str, str]:
        """The batched runner's kernel per token role ("decode", "prompt") in an engine of
        `max_batch` sequences per step (None: `batch_products` as the table has it)."""
        wide = self.wide_rule(max_batch)
        if wide is None:
            return dict(self.batch_products)
        return {**self.batch_products, "decode": wide.kernel}

    def batch_coop_tiles_for(self, max_batch: int | None) -> tuple[BatchCoopTile, ...]:
        """The `matmul_coop` tiles of the batched products in an engine of `max_batch`
        sequences per step: its wide rule's own, else `batch_coop_tiles`."""
        wide = self.wide_rule(max_batch)
        return wide.coop_tiles if wide is not None and wide.coop_tiles else self.batch_coop_tiles

    def batch_split_for(self, max_batch: int | None) -> tuple[int, int]:
        """(`split_rows`, `split_min_steps`) of the batched products in an engine of
        `max_batch` sequences per step: its wide rule's, else (0, 1) (no split)."""
        wide = self.wide_rule(max_batch)
        return (0, 1) if wide is None else (wide.split_rows, wide.split_min_steps)

    def batch_glu_for(self, max_batch: int | None
                      ) -> tuple[BatchCoopTile | None, tuple[int, int], tuple[int, int]]:
        """(`glu_tile`, `glu_rows`, `glu_raw_rows`) of the batched decode's gate and up
        products in an engine of `max_batch` sequences per step: its wide rule's (the raw
        rows `glu_rows` where it has none), else (None, (0, 0), (0, 0))."""
        wide = self.wide_rule(max_batch)
        if wide is None:
            return None, (0, 0), (0, 0)
        return wide.glu_tile, wide.glu_rows, wide.glu_raw_rows or wide.glu_rows

    def batch_tile(self, n_tokens: int) -> BatchTile:
        """The `matmul` launch of a batched product of `n_tokens` tokens."""
        return next(r for r in self.batch_tiles if r.matches(n_tokens))

    def batch_coop_tile(self, n_tokens: int, tiles: tuple[BatchCoopTile, ...] | None = None,
                        dtype: str = "", n_rows: int = 0) -> BatchCoopTile:
        """The `matmul_coop` launch of a batched product of `n_tokens` tokens of a weight of
        type `dtype` and `n_rows` rows among `tiles` (None: `batch_coop_tiles`; an engine's:
        `batch_coop_tiles_for`): of the tiles whose `min_rows` it has, the first that covers
        the count among those naming `dtype`, or where none does, among those naming no
        type (`BatchCoopTile.dtypes`). Raises ValueError when those tiles split the columns
        differently (`sg_k`): a token's bits would then change with the batch size."""
        tiles = self.batch_coop_tiles if tiles is None else tiles
        tiles = tuple(r for r in tiles if n_rows >= r.min_rows)
        tiles = tuple(r for r in tiles if dtype in r.dtypes) or tuple(
            r for r in tiles if not r.dtypes)
        if len({r.sg_k for r in tiles}) > 1:
            raise ValueError(f"batch_coop_tiles of {dtype or 'any type'} split the columns in "
                             f"more than one way (sg_k {sorted({r.sg_k for r in tiles})}): "
                             "batch invariance needs one")
        return next(r for r in tiles if r.matches(n_tokens))

    def with_decode(self, subgroups: int, rows: int, kernel: str = "matvec",
                    stage_x: bool = False, split: int = 1, integer_x: bool = False) -> "Table":
        """This table with one rule for every product of `kernel` (bench/matvec_types.py's
        --configs)."""
        return replace(self, decode={**self.decode, kernel: (
            Decode(None, "any", subgroups, rows, "override", stage_x, split, integer_x),)})


_TILES = ("bench/README.md, 2026-12-04, third session (bench/attention_prefill.py, H200, "
          "7B heads at 4096 tokens, two commands): 128x2x32 5.9 ms per layer, 64x2x16 6.0, "
          "64x2x32 8.3-8.5, 32x4x32 10.4, 64x1x32 39.8, attention.comp 80.1-85.6")
_TILES_CPU = ("bench/README.md, 2026-12-04, third session (bench/attention_prefill.py, "
              "lavapipe, SmolLM2's heads at 256 tokens): 32x4x32 50.2 ms, 32x2x32 49.1, "
              "attention.comp 227.1")
_REDUCE_ROWS = ("bench/README.md, 2026-12-04, third session (bench/matvec_types.py "
                "--configs, H200, rows summed by reduce_rows.glsl)")
_COOP16 = ("bench/README.md, 2026-12-04, fourth session (bench/matmul_coop.py --tiles, H200, "
           "Q4_1 7B and 1.2B shapes, one tile per process, TFLOP/s)")
_SESSION2 = "bench/README.md, 2026-12-01 second session (vkrt bench --repeat 2-3, A/B)"
_SPLIT23 = ("bench/README.md, 2026-12-07, twenty-third session: the split per KV head "
            "(twenty-first session) on an H100")
_ONE_DISPATCH = ("H200, vkrt bench, 135M at prompts of 256 / 768 / 1536 / 3072 + 128 tokens: "
                 "one dispatch 1063 / 947 / 797 / 606 tok/s, split per query head 963 / 945 "
                 "/ 893 / 767; bench/README.md, 2026-12-04 third session: one dispatch 214.8 "
                 "tok/s at 576 positions of the 7B shape against 210.7 split per query head")
_CROSSOVER23 = ("bench/README.md, 2026-12-07, twenty-third session (H100, vkrt bench, decode "
                "attention us per token, one dispatch against split + combine): head_dim 128 "
                "(7B shape) at 256 / 384 / 512 + 32..128 positions 489-497 / 570-584 / "
                "729-733 against 433-437 / 456-461 / 514, at 200 + 64 443 against the split's "
                "286 before its combine (178-217 in the other arms); "
                "head_dim 64 (1.2B shape) at 704 / 896 + 32 206 / 228 against 254 / 267")
_SESSION1 = "bench/README.md, 2026-12-01 first session (vkrt bench --repeat 1, A/B)"
_PREFILL_GLU = ("bench/README.md, 2026-12-07, twenty-fifth session (bench/ab_trees.py, H100, "
                "512 + 128 tokens, Q4_K_M shape files, prefill tok/s and GPU ms of gate + up + "
                "silu_mul against ffn_glu): 256x64:4x4 7B 5,776 -> 5,859 tok/s, 34.4 -> 32.2 ms; "
                "1.2B 28,785 -> 31,154 tok/s, 5.11 -> 3.93 ms; 128x64:4x4 7B 5,252 tok/s "
                "(42.3 ms), 1.2B 28,386; as landed 7B 5,815 -> 5,932, 1.2B 29,542 -> 31,250")
_BLOCKS = ("bench/README.md, 2026-12-02 block-level reader (bench/matvec_types.py "
           "--configs, H200)")

_GLU19 = ("bench/README.md, 2026-12-06, nineteenth session (vkrt bench per launch of the "
          "7B Q4_1 file's matvec_glu, one process each, alternating)")
_Q4K20 = ("bench/README.md, 2026-12-06, twentieth session (vkrt bench per launch of the "
          "7B and 1.2B Q4_K_M-mix files' Q4_K products, one process each, H100)")
_SWEEP = ("bench/README.md, 2026-12-02 second session (bench/matvec_types.py --glu / --qkv "
          "--configs, H200)")
_AB = ("bench/README.md, 2026-12-02 second session (vkrt bench per-kernel GPU us, A/B, "
       "H200)")
_NORMS = _AB + ": a row's norm on one subgroup"
_BATCHED = ("bench/README.md, 2026-12-02 third session (bench/batched.py, H200): generated "
            "tokens on matmul (few columns, one row per workgroup), prompt tokens tiled")
_XQ = ("bench/README.md, 2026-12-03 (vkrt bench, 7B shapes, A/B of launches and integer x, "
       "H200)")
_PRODUCTS = ("bench/README.md, 2026-12-02 third session (bench/batched_products.py, H200, "
             "us summed over six shapes)")

_SPLIT8 = ("bench/README.md, 2026-12-04 fifth session (bench/batched.py and "
           "bench/batched_products.py, 7B Q4_1, H200)")
_SPLITWG = ("bench/README.md, 2026-12-05, eleventh session (bench/batched.py --split-rows "
            "and bench/batched_products.py --split-rows, H100, A/B alternating)")
_Q41 = ("bench/README.md, 2026-12-06, seventeenth session (bench/batched.py at 16 and 32 "
        "sequences, H100)")
_DEPTH = ("bench/README.md, 2026-12-05, twelfth session (bench/batched_products.py and "
          "bench/batched.py --coop-depth, H100 and H200)")
_SPLIT4 = ("bench/README.md, 2026-12-04 sixth session (bench/batched.py at 64 sequences, "
           "H200)")
_GLU = ("bench/README.md, 2026-12-05, thirteenth session (bench/batched.py --glu-tile and "
        "bench/batched_products.py --glu-tiles, H100)")
_RAW = ("bench/README.md, 2026-12-06, fifteenth session (bench/batched.py --glu-rows and "
        "bench/batched_products.py, H200): Q4_1 fetched as words, 7B's 14336 gate rows at 32 "
        "sequences 2,166.7 / 2,173.8 -> 2,391.0 / 2,403.2 tok/s fused; at 64 3,113.6 / "
        "3,095.9 -> 2,939.3 / 2,939.6, so not from 64; 135M's 1536 12,517.7 / 12,547.0 -> "
        "12,415.7 / 12,133.9, so not below 4096; Q4_K as words too (sixteenth session, H100): "
        "its [14336, 4096] pair 213.2 us fused against 2 x 163.3, a 7B Q4_K_M file at 32 "
        "sequences 1,635.3 / 1,634.8 -> 1,837.3 / 1,837.5")

_SPLIT26 = ("bench/README.md, 2026-12-07, twenty-sixth session (the prompt's products split "
            "across workgroups, H100)")

GPU = Table(
    decode={
        # f32/f16/bf16: up to 8192 rows 4 subgroups, one row per workgroup (f16 [4096,
        # 14336] 3598 GB/s; 4x2 3657, 8x1 3663, but 4x2 is slower for f32 and at 576 x 1536);
        # past that (the logits' 49,152 x 576) one subgroup, 4 rows (2737 GB/s against 1286
        # for 4x1; [14336, 4096]: 3490 against 3683).
        "matvec": (
            Decode(8192, "float32", 8, 1, _BLOCKS + ": f32 8x1 4105, 4x1 3911 GB/s"),
            Decode(8192, "scalar", 4, 1, _BLOCKS + ": f16 4x1 3598, 4x2 3657, 8x1 3663 GB/s"),
            Decode(None, "scalar", 1, 4, _BLOCKS + ": logits f16 1x4 2737, 4x1 1286 GB/s"),
            # Blocks of 32: 4 subgroups, 8 rows, x as integers (the products of a 7B decode
            # step, end to end: each kernel's time against one subgroup, 4 rows, x staged,
            # which bench/matvec_types.py preferred in isolation, 1296 GB/s at [4096, 14336]);
            # at 576 rows 2 subgroups, 2 rows (101 against 80 GB/s); past 8192 rows unstaged
            # 1x4 (logits Q4_1 797 against 620).
            Decode(1024, "blocks", 2, 2, _BLOCKS + ": [576, 1536] 2x2s", stage_x=True),
            # Q4_1 of many columns (a 7B ffn_down, [4096, 14336]): 8 subgroups, 8 rows.
            Decode(8192, "q4_1", 8, 8, _REDUCE_ROWS + ": [4096, 14336] Q4_1 8x8i 1522, 4x8i "
                   "1369, 4x16i 1236 GB/s", integer_x=True, min_cols=8192),
            Decode(8192, "blocks32", 4, 8, _XQ + ": 7B Q4_1 ffn_down 1003 us per token "
                   "(1x4s 1167), attn_output 441 (443); 4x8 f32 x 1138, 476", integer_x=True),
            Decode(8192, "iq4_xs", 1, 4, _BLOCKS + ": IQ4_XS 1x4s 1040, 4x4 876 GB/s",
                   stage_x=True),
            # Blocks of 256: 4 subgroups, 4 rows, unstaged (Q4_K [4096, 14336] 708 against 470
            # for 1x4, 514 for 1x4s); past 8192 rows 1x4 (767 against 741).
            Decode(8192, "blocks256", 4, 4, _BLOCKS + ": Q4_K 4x4 708, 1x4s 514 GB/s"),
            Decode(None, "blocks", 1, 4, _BLOCKS + ": [14336, 4096] Q4_K 1x4 767 GB/s"),
        ),
        # matvec_glu ([14336, 4096] gate and up), GB/s of both matrices against the launch
        # before (1x2s): the K-quants 4x4 (Q4_K 321 against 177, Q6_K 417 against 345; at
        # qwen3's [3072, 1024] 449 against 484 us per token); up to 8192 rows the blocks of 32
        # keep 1 subgroup, 2 rows, x staged (SmolLM2's [1536, 576]: 4x4 380 against 281 us per
        # token, gemma3's [6912, 1152] 1x4s 721 against 669); past that Q4_1 1 subgroup, 4
        # rows, unstaged, x in f32 (a 7B decode step's ffn_glu, on an H100; 4x8 before, 2x8
        # and integer x close behind, x staged and 8 subgroups far behind), the other
        # blocks 1x4s (Q8_0 577 against 475, Q5_0 565 against 492); f32/f16/bf16 4
        # subgroups, one row. Q4_K of 2048 columns or more (the 1.2B and 7B shapes' Q4_K_M
        # files, whole steps timed on an H100) 2 subgroups, 4 rows.
        "matvec_glu": (
            Decode(None, "q4_k", 2, 4, _Q4K20 + ": ffn_glu 7B 1876 us per token (4x4 1993, 2x8 "
                   "1855-1862, 1x4 1889, 2x16 2411), 1.2B 382 (4x4 455, 2x8 402)", min_cols=2048),
            Decode(None, "blocks256", 4, 4, _SWEEP + ": glu Q4_K 4x4 321, 1x2s 177 GB/s"),
            Decode(8192, "blocks", 1, 2, _AB + ": glu [1536, 576] 1x2s", stage_x=True),
            Decode(None, "q4_1", 1, 4, _GLU19 + ": 7B Q4_1 ffn_glu 1919 us per token, 4x8 "
                   "2321-2336, 2x8 1950-1958, 1x8 2021 (H100); on the H200 4x8 1960, 4x4 "
                   "2224 (" + _XQ + ")"),
            Decode(None, "blocks", 1, 4, _SWEEP + ": glu Q8_0 1x4s 577, 1x2s 475 GB/s",
                   stage_x=True),
            Decode(None, "any", 4, 1, _SESSION1 + ": 4 subgroups per row"),
        ),
        # qkv_rope (rows: pairs of rows per workgroup), Q [4096, 4096] with K, V [1024,
        # 4096] (3072 pairs): blocks of 32 4 subgroups, 8 pairs, x as integers (a 7B decode
        # step's attn_qkv); the K-quants one subgroup, 4 pairs, x staged (Q4_1 150 against 86
        # GB/s for the launch before, 4 subgroups and one pair; Q4_K 102 against 63); up to
        # 2048 pairs ([2048, 1024] and a quarter each) one pair (Q4_1 200 against 113, Q6_K
        # 241 against 137). Q4_K of 2048 columns or more 4 subgroups, 4 pairs (the 1.2B
        # and 7B Q4_K_M files' fused layers, whole steps timed on an H100).
        "qkv_rope": (
            Decode(None, "q4_k", 4, 4, _Q4K20 + ": attn_qkv 7B 338 us per token (1x4s 581, "
                   "4x8 343, 4x8i 416, 2x8 449, 8x8 497); 1.2B 4x8 145 (1x1s 179)", min_cols=2048),
            Decode(2048, "blocks", 1, 1, _SWEEP + ": qkv [2048, 1024] 1x1s", stage_x=True),
            Decode(None, "blocks32", 4, 8, _XQ + ": 7B Q4_1 attn_qkv 758 us per token (1x4s "
                   "1046; 4x8 f32 x 812)", integer_x=True),
            Decode(None, "blocks", 1, 4, _SWEEP + ": qkv [4096, 4096] 1x4s", stage_x=True),
            Decode(None, "any", 4, 1, _SESSION1 + ": 4 subgroups per row"),
        ),
    },
    argmax_threads=1024, attention_threads=1024, attention_dim_splits=4, prefill_tiled=True,
    norm_subgroups=8, batch_products={"decode": "matmul", "prompt": "matmul_tiled"},
    # matmul for the batched products (unrolled loops), the tile of least time summed over
    # six shapes per token count (bench/README.md has each figure).
    batch_tiles=(BatchTile(2, 4, 4, _PRODUCTS + ": T <= 2 rows 4, tiles of 4"),
                 BatchTile(4, 2, 8, _PRODUCTS + ": T = 4 rows 2, tiles of 8"),
                 BatchTile(8, 2, 16, _PRODUCTS + ": T = 8 rows 2, tiles of 16"),
                 BatchTile(16, 2, 8, _PRODUCTS + ": T = 16 rows 2, tiles of 8"),
                 BatchTile(32, 2, 16, _PRODUCTS + ": T = 32 rows 2, tiles of 16"),
                 BatchTile(None, 4, 8, _PRODUCTS + ": T = 64 rows 4, tiles of 8")),
    # matmul_coop for the generated tokens of engines of 16 or more sequences, its columns
    # split 8 ways: a token's bits then depend on the engine's max_batch, never on what shares
    # its step. At 1-8 sequences matmul stays (an engine of max_batch 32 decodes one sequence
    # at 62.5 tok/s against matmul's 124.7, eight at 482.2 against 563.2).
    # Two steps fetched ahead (depth 2): the same products, their loads in flight across a
    # step's barriers; 3 ran slower (registers).
    batch_coop_tiles=(BatchCoopTile(None, 32, 32, 2, 2, _SPLIT8 + ": a 7B layer's products at "
                                    "32 tokens 32x32:2x2x8 424.5 us, 32x32:2x2x4 452.5, "
                                    "32x64:2x4x4 522.8, 16x16:1x1x8 793.3, matmul 926.8; "
                                    + _DEPTH + ": at 32 tokens depth 1 / 2 / 3 300.8 / 289.4 / "
                                    "376.9 us (H100); at 32 sequences 1.2B 8,649.7 -> 9,110.9 "
                                    "tok/s, 7B 1,917.4 -> 1,962.6 (H100), 1.2B 8,696.0 / "
                                    "8,869.1 -> 8,765.1 / 8,954.5, 7B 1,883.2 / 1,884.1 -> "
                                    "1,903.3 / 1,930.9 (H200)", 8, 2),
                      # Q4_1's products of 4096 rows or more split the columns 4 ways in the
                      # workgroup, and those under 8192 rows also 2 ways across workgroups
                      # (a 4096-row product: 256 workgroups of 512 invocations, not 128 of
                      # 1,024). A Q4_K_M file loses with it (7B at 32 sequences 1,882.4 /
                      # 1,874.2 -> 1,641.5 / 1,668.3 tok/s), so its types keep the tile
                      # above; the smaller Q4_1 products too (see the source).
                      BatchCoopTile(None, 32, 32, 2, 2, _Q41 + ": 7B Q4_1 decode tok/s at 32 "
                                    "sequences 2,393.7 / 2,392.1 -> 2,467.6 / 2,504.2, at 16 "
                                    "1,270.6 / 1,254.4 -> 1,296.8 / 1,303.6 (the tree before "
                                    "it, 7869bc7, alternating); as the tile of every Q4_1 "
                                    "product (no min_rows) 7B 2,407.8 / 2,406.8 -> 2,521.4 / "
                                    "2,520.1, but 1.2B 11,492.2 / 11,424.7 -> 11,195.0 / "
                                    "11,226.1, 135M 12,659.3 / 12,661.6 -> 12,373.8 / "
                                    "12,314.3; 4 ways without the split 7B 2,245.6 / 2,258.3 "
                                    "against 2,380.1 / 2,394.7, 8 ways with it 2,230.7 / "
                                    "2,260.8", 4, 2, dtypes=("q4_1",), min_rows=4096,
                                    split_rows=8192)),
    # Engines of 64 or more sequences: the columns split 4 ways, 64-token tiles at 33 or more
    # tokens (at 64 tokens a 7B layer's products 64x32:4x2x4 629.5 us against 32x32:2x2x8's
    # 729.9; at 32, 32x32:2x2x4 452.5 against 424.5, hence not below 64 sequences).
    # Engines of 16-63 sequences also split the columns of products of fewer than 4096 rows
    # and at least 16 steps across workgroups (a 1.2B ffn_down's 64 row tiles -> 2 x 64
    # workgroups); not from 64 sequences (7B at 64: 2,926.0 -> 2,804.1 tok/s split).
    # Both run the generated tokens' gate, up and SiLU as one dispatch (matmul_coop's GLU
    # build: one x tile per step for both weights; 32x32:2x2x2x2 below 64 sequences,
    # 64x32:4x2x2x2 from 64) where gate has 4096-8192 rows (H100, decode tok/s, unfused ->
    # fused: 1.2B's 8192 rows at 32 sequences 9,194.5 / 9,162.3 -> 9,595.9 / 9,621.0, at 64
    # 11,212.1 -> 12,022.8; 7B's 14336 at 32 1,961.0 -> 1,864.4, at 64 2,797.0 -> 2,681.4;
    # 135M's 1536 at 32 12,039.6 / 12,106.5 -> 10,953.9 / 10,575.5: its unfused gate and up,
    # 48 row tiles each, run side by side on the GPU). Per pair at 32 tokens (µs, unfused
    # -> fused) a shape of 4864 rows gains as 8192 does (38.6 -> 24.2 against 66.7 -> 49.7);
    # 11008 x 4096 loses (174.6 -> 257.6): the GLU tile splits a step's columns 2 ways, not
    # 8, so long rows of columns cost it more steps. Between 8192 and 11008 rows unmeasured.
    # Q4_1 and Q4_K, whose W tiles matmul_coop holds as words until it stores them, fuse up
    # to 14336 rows below 64 sequences (7B's pair at 32 tokens: Q4_1 158 µs fused against
    # 2 x 107 on an H200, Q4_K 213 against 2 x 163 on an H100).
    wide_batch_decode=(WideBatchDecode(16, "matmul_coop", _SPLIT8 + ": decode tok/s matmul -> "
                                       "matmul_coop at 16 sequences 815.0 -> 902.1, 32 983.0 "
                                       "-> 1679.6, 64 1123.7 -> 2155.1; " + _SPLITWG + ": at 32 "
                                       "sequences 1.2B 8,529.8 / 8,558.2 / 8,538.0 -> 9,026.5 / "
                                       "8,231.0 / 9,078.1, 7B 2,034.0 / 2,019.6 -> 2,042.1 / "
                                       "2,046.1; 135M's 3-6 steps 11,543.7 -> 8,993.9 split; "
                                       "1.2B at 32 split_min_steps 8 -> 16 (ffn_down alone) "
                                       "9,079.9 / 9,019.9 / 8,740.2 -> 9,598.3 / 9,595.9 / "
                                       "9,522.8; " + _RAW, split_rows=4096, split_min_steps=16,
                                       glu_tile=BatchCoopTile(None, 32, 32, 2, 2, _GLU, 2, 2),
                                       glu_rows=(4096, 8192), glu_raw_rows=(4096, 14336)),
                       WideBatchDecode(64, "matmul_coop", _SPLIT4 + ": 7B decode tok/s split 8 "
                                       "-> split 4 2103.5 -> 2392.9; 1.2B and 135M within "
                                       "their repeats' spread; " + _DEPTH + ": depth 2 "
                                       "at 64 sequences (H200) 7B 2,680.1 / 2,658.7 -> "
                                       "2,743.6 / 2,748.5, 1.2B 9,867.0 / 8,785.5 -> 9,766.2 / "
                                       "10,271.6", coop_tiles=(
                                           BatchCoopTile(32, 32, 32, 2, 2, _SPLIT4, 4, 2),
                                           BatchCoopTile(None, 64, 32, 4, 2, _SPLIT4, 4, 2)),
                                       glu_tile=BatchCoopTile(None, 64, 32, 4, 2, _GLU, 2, 2),
                                       glu_rows=(4096, 8192))),
    prefill_attention=(128, 2, 32),
    # 16 subgroups per workgroup, each 32 or 64 tokens x 32 rows: more subgroups in flight
    # on the few workgroups of a 4096-row product (128 at 512 tokens on 132 SMs); fewer
    # rows, smaller tiles and the columns split in two, so that the workgroups fill the
    # GPU. One shared buffer: double-buffering was no faster (128x128:2x4 at 512 tokens, 2
    # buffers against 1: 173.0 against 166.8 us, 820.1 against 815.2, 766.6 against 763.0).
    prefill_coop_tiles=(
        PrefillCoopTile(8192, 256, 256, 128, 4, 4, _COOP16 + ": [14336, 4096] at 512 tokens "
                        "256x128:4x4 111.8-112.0, 128x128:4x4 93.1-93.6, 256x128:4x2 98.3; "
                        "[8192, 2048] 127.5"),
        PrefillCoopTile(4096, 2048, 256, 128, 4, 4, _COOP16 + ": at 2048 tokens 256x128:4x4 "
                        "124.9-129.3, 128x128:4x4 101.7-110.2, 128x128:2x4x2 86.9-92.8"),
        PrefillCoopTile(4096, 0, 128, 128, 4, 4, _COOP16 + ": at 512 tokens [4096, 4096] "
                        "128x128:4x4 129.2, 2x4 96.4-102.9, 256x64:8x2 120.3; [4096, 14336] "
                        "100.0, 2x4 77.5, 256x128:4x4 62.3"),
        PrefillCoopTile(2048, 0, 128, 64, 4, 4, _COOP16 + ": at 512 tokens [2048, 2048] "
                        "128x64:4x4x2 91.6, 128x128:4x4 62.5, 64x128:4x4x2 83.8; [2048, 8192] "
                        "92.0, 60.2, 94.3", sg_k=2),
        # [1024, 4096] (a 7B's K and V) on 128 x 128 tiles, the columns split 4 ways: 8 x 4
        # tiles x 4 splits, where unsplit 64 x 64 tiles gave 16 x 8 workgroups of one
        # accumulator per subgroup.
        PrefillCoopTile(1024, 0, 128, 128, 4, 4, _SPLIT26 + ": 7B Q4_K_M prompt attn_k + "
                        "attn_v 3.78 + 3.39 -> 1.64 + 1.76 ms (+ 0.59 sum_splits), prefill "
                        "5,926 / 5,941 -> 6,134 / 6,141 tok/s; 128x64:4x4 split 4 5,994 / "
                        "6,102, split 8 6,001 / 6,104, 64x64:4x4 split 2 5,778 / 5,878, split "
                        "4 5,902 / 5,758", splits=4),
        PrefillCoopTile(0, 0, 64, 64, 4, 4, _COOP16 + ": at 512 tokens [1024, 4096] 64x64:4x4 "
                        "63.2, 128x128:4x4 32.8, 128x64:4x4x2 50.1; [512, 2048] 29.9, 14.6, "
                        "21.7")),
    # Gate and up as one product of 2 x 64 rows per workgroup: the x tile loaded once for
    # both, no silu_mul pass (256 x 128 x 2 rows is past 48 KB of shared memory).
    prefill_glu_tile=PrefillCoopTile(0, 0, 256, 64, 4, 4, _PREFILL_GLU),
    sources={"batch_products": _BATCHED,
             "norm_subgroups": _NORMS,
             "argmax_threads": _SESSION2 + ": argmax 1024 wide (17.0 -> 9.4 us per token)",
             "attention_threads": _SESSION2 + ": 1024 invocations per head (512: 949)",
             "attention_dim_splits": _SESSION2 + ": attention 4 workgroups per head",
             "attention_decode_positions": _ONE_DISPATCH + "; " + _CROSSOVER23,
             "attention_split_threads": _SPLIT23 + ": 256 (8 planes at head_dim 128) against "
                                        "128, split + combine us per token, 7B shape at 512 "
                                        "+ 128: 515-521 against 539; at 4032 + 64: 968-973 "
                                        "against 1016-1028; 1.2B at 1024 + 64: 281-283 against "
                                        "292-296; 512 at 7B, 512 + 128, beside a slower "
                                        "combine since reverted: 754 against 641",
             "attention_splits": _SPLIT23 + ": 32, the per-query-head split's target (16 and "
                                 "64 give the same 20 splits of 32 positions at 640)",
             "prefill_tiled": _SESSION2 + ": prefill products tiled, 32 rows x 64 tokens",
             "prefill_attention": _TILES},
)

_LAVAPIPE_DECODE = ("glsl/reduce.glsl: lavapipe barriers; f32 x (bench/README.md 2026-12-03, "
                    "second session: SmolLM2 decode 5.3-5.5 tok/s with integer x, 7.1-7.2 "
                    "without)")
# lavapipe: a barrier between subgroups switches every invocation's coroutine
# (glsl/reduce.glsl), so one subgroup per workgroup and no tiling (the tiled matmul was no
# faster there: teacher-forced logits of test_llama 64-68 s against 40-80 s).
CPU = Table(
    decode={k: (Decode(None, "any", 1, 1, _LAVAPIPE_DECODE),)
            for k in ("matvec", "matvec_glu", "qkv_rope")},
    argmax_threads=256, attention_threads=64, attention_dim_splits=1, prefill_tiled=False,
    attention_decode_positions=((64, 1024),), norm_subgroups=1, batch_products={"decode": "matmul", "prompt": "matmul_tiled"},
    batch_tiles=(BatchTile(None, 1, 8, "lavapipe: matmul's tile of 8 tokens, one row "
                                       "(the first session's choice, not timed)"),),
    prefill_attention=(32, 4, 32),
    # lavapipe lists no cooperative matrices; the GPU's tiles, for a pretend shape in tests.
    prefill_coop_tiles=GPU.prefill_coop_tiles,
    prefill_glu_tile=GPU.prefill_glu_tile,
    sources={"batch_products": "the GPU's, so the roles' kernels differ where CI runs too "
                               "(the tiled matmul no slower here: prefill_tiled's source)",
             "prefill_attention": _TILES_CPU,
             "prefill_tiled": "lavapipe, test_llama's teacher-forced logits: tiled 64-68 s, "
                              "matmul 40-80 s (other jobs sharing the box)",
             "argmax_threads": "lavapipe: 256 (the first session's choice, not timed)",
             "attention_threads": "lavapipe: 64 (the first session's choice, not timed)",
             "attention_dim_splits": "glsl/reduce.glsl: lavapipe barriers",
             "attention_decode_positions": "vkrt/kernels.py DECODE_POSITIONS at every "
                                           "head_dim (not timed on lavapipe)",
             "attention_split_threads": "the GPU's (not timed on lavapipe)",
             "attention_splits": "the GPU's (not timed on lavapipe)",
             "norm_subgroups": "glsl/reduce.glsl: lavapipe barriers"},
)

TABLES = {"gpu": GPU, "cpu": CPU}


def device_class(kind: str) -> str:
    """"cpu" for a CPU device (`Device.info.kind`), else "gpu"."""
    return "cpu" if kind == "cpu" else "gpu"


def for_kind(kind: str) -> Table:
    return TABLES[device_class(kind)]
