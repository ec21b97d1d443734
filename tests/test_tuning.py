"""vkrt/tuning.py: every device class's table gives every decode product of every weight type a
launch, each citing the measurement that chose it (no device needed)."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from vkrt import tuning, weight_types
from vkrt.kernels import coop_shared_bytes
from vkrt.runtime.device import CoopShape

SHAPE_16 = CoopShape(16, 16, 16, "float16", "float16", "float32", "float32", "subgroup")


@pytest.mark.parametrize("table", list(tuning.TABLES))
def test_every_product_has_a_cited_launch(table):
    t = tuning.TABLES[table]
    for kernel in ("matvec", "matvec_add", "matvec_glu", "qkv_rope"):
        for wt in weight_types.TYPES:
            for n_rows, n_cols in itertools.product((1, 576, 1024, 1025, 8192, 8193, 49152),
                                                    (0, 576, 4096, 14336)):
                rule = t.decode_rule(kernel, n_rows, wt.block, wt.dtype, n_cols)
                assert rule.subgroups >= 1 and rule.rows >= 1 and rule.split in (1, 2, 4)
                assert rule.source, (table, kernel, wt.dtype, n_rows)


def test_rules_apply_in_order():
    # The GPU table: blocks of 32 up to 8192 rows with x as integers, the K-quants not;
    # IQ4_XS by name, staged.
    gpu = tuning.GPU
    assert gpu.decode_rule("matvec", 4096, 32, "q4_1").integer_x
    assert not gpu.decode_rule("matvec", 4096, 256, "q4_k").integer_x
    assert not gpu.decode_rule("matvec", 4096, 256, "q4_k").stage_x
    assert gpu.decode_rule("matvec", 4096, 256, "iq4_xs").stage_x
    assert gpu.decode_rule("matvec", 49152, 32, "q8_0").rows == 4
    # Q4_1 of many columns (a 7B ffn_down): 8 subgroups; the same rows of fewer columns, or
    # of unknown columns, 4.
    assert gpu.decode_rule("matvec_add", 4096, 32, "q4_1", 14336).subgroups == 8
    assert gpu.decode_rule("matvec_add", 4096, 32, "q4_1", 4096).subgroups == 4
    assert gpu.decode_rule("matvec_add", 4096, 32, "q4_1").subgroups == 4
    assert gpu.decode_rule("matvec_add", 4096, 32, "q8_0", 14336).subgroups == 4
    # Q4_K of 2048 columns or more (the 1.2B and 7B Q4_K_M files): GLU 2 subgroups x 4 rows,
    # qkv_rope 4 x 4 pairs, ahead of the rule for 2048 pairs or fewer; fewer columns (Qwen3
    # 0.6B's [3072, 1024]) and the other K-quants keep 4 x 4 and 1 subgroup.
    glu = gpu.decode_rule("matvec_glu", 14336, 256, "q4_k", 4096)
    assert (glu.subgroups, glu.rows) == (2, 4)
    assert gpu.decode_rule("matvec_glu", 3072, 256, "q4_k", 1024).subgroups == 4
    assert gpu.decode_rule("matvec_glu", 14336, 256, "q6_k", 4096).subgroups == 4
    qkv = gpu.decode_rule("qkv_rope", 1536, 256, "q4_k", 2048)
    assert (qkv.subgroups, qkv.rows, qkv.stage_x) == (4, 4, False)
    assert gpu.decode_rule("qkv_rope", 3072, 256, "q6_k", 4096).subgroups == 1
    assert tuning.device_class("cpu") == "cpu" and tuning.device_class("discrete") == "gpu"


@pytest.mark.parametrize("table", list(tuning.TABLES))
def test_every_batched_product_has_a_cited_kernel_and_tile(table):
    """Both token roles name a kernel the batched runner has; every token count finds a
    matmul tile (and a matmul_coop tile, for a table that names it), each cited."""
    t = tuning.TABLES[table]
    assert set(t.batch_products) == {"decode", "prompt"}
    assert set(t.batch_products.values()) <= {"matmul", "matmul_tiled", "matmul_coop"}
    assert t.sources["batch_products"]
    for n in (1, 2, 3, 4, 5, 8, 64, 65, 4096):
        tile = t.batch_tile(n)
        assert tile.rows >= 1 and tile.tokens >= 1 and tile.source, (table, n)
        if t.batch_coop_tiles:
            coop = t.batch_coop_tile(n)
            assert coop.bm % (coop.sg_m * 16) == 0 and coop.source, (table, n)


@pytest.mark.parametrize("table", list(tuning.TABLES))
def test_wide_batch_decode_rules_are_cited(table):
    """Every rule choosing the "decode" role's kernel by the engine's max_batch names a
    kernel the batched runner has and cites its measurement; a rule's own matmul_coop tiles
    cover every token count, each cited."""
    for r in tuning.TABLES[table].wide_batch_decode:
        assert r.min_max_batch >= 2 and r.source
        assert r.kernel in ("matmul", "matmul_tiled", "matmul_coop")
        for n in (1, 8, 32, 33, 64, 65, 4096) if r.coop_tiles else ():
            coop = tuning.TABLES[table].batch_coop_tile(n, r.coop_tiles)
            assert coop.bm % (coop.sg_m * 16) == 0 and coop.source, (table, n)
        if r.glu_tile is not None:
            g = r.glu_tile
            assert r.kernel == "matmul_coop" and 0 <= r.glu_rows[0] <= r.glu_rows[1], r
            assert g.source and g.max_tokens is None, g
            assert g.bm % (g.sg_m * 16) == 0 and g.bn % (g.sg_n * 16) == 0, g
            # gate and up tiles in 48 KB, the shared memory of every NVIDIA GPU's workgroup
            assert coop_shared_bytes(g.bm, g.bn, g.sg_m, g.sg_n, g.sg_k, 1,
                                     SHAPE_16, products=2) <= 49152, g


def test_batch_products_by_max_batch():
    """`Table.batch_products_for`: the rule of the largest min_max_batch at or below the
    engine's max_batch replaces the "decode" role's kernel; below every rule, or max_batch
    None, the table's batch_products; the "prompt" role's kernel never changes."""
    t = dataclasses.replace(tuning.CPU, batch_products={"decode": "matmul",
                                                        "prompt": "matmul_tiled"},
                            wide_batch_decode=(tuning.WideBatchDecode(32, "matmul_coop", "t"),
                                               tuning.WideBatchDecode(8, "matmul_tiled", "t")))
    got = {n: t.batch_products_for(n)["decode"] for n in (None, 1, 7, 8, 31, 32, 64)}
    assert got == {None: "matmul", 1: "matmul", 7: "matmul", 8: "matmul_tiled",
                   31: "matmul_tiled", 32: "matmul_coop", 64: "matmul_coop"}
    assert {t.batch_products_for(n)["prompt"] for n in (None, 1, 8, 64)} == {"matmul_tiled"}
    assert t.batch_products == {"decode": "matmul", "prompt": "matmul_tiled"}   # not changed


def test_batch_coop_tiles_by_max_batch():
    """`Table.batch_coop_tiles_for`: an engine's matmul_coop tiles are its wide rule's own
    where the rule has them, else the table's `batch_coop_tiles` (a rule without tiles, below
    every rule, max_batch None); `batch_coop_tile` picks among the set it is given. The GPU
    table's rules keep one column split per set."""
    own = (tuning.BatchCoopTile(32, 32, 32, 2, 2, "t", 4),
           tuning.BatchCoopTile(None, 64, 32, 4, 2, "t", 4))
    t = dataclasses.replace(tuning.GPU, wide_batch_decode=(
        tuning.WideBatchDecode(16, "matmul_coop", "t"),
        tuning.WideBatchDecode(64, "matmul_coop", "t", coop_tiles=own)))
    got = {n: t.batch_coop_tiles_for(n) for n in (None, 8, 16, 63, 64, 128)}
    assert got == {None: t.batch_coop_tiles, 8: t.batch_coop_tiles, 16: t.batch_coop_tiles,
                   63: t.batch_coop_tiles, 64: own, 128: own}
    assert t.batch_coop_tiles != own
    assert [t.batch_coop_tile(n, own).bm for n in (1, 32, 33, 64)] == [32, 32, 64, 64]
    assert t.batch_coop_tile(64).sg_k == 8                  # the table's, without a set
    for n in (None, 16, 32, 64, 128):
        tiles = tuning.GPU.batch_coop_tiles_for(n)
        for dtype in ("", "q4_1", "q4_k", "q6_k", "q8_0"):   # raises on two splits of a type
            assert tuning.GPU.batch_coop_tile(1, tiles, dtype).sg_k in (4, 8), (n, dtype)
    assert {r.sg_k for r in tuning.GPU.batch_coop_tiles_for(64)} == {4}


def test_batch_split_rows_by_max_batch():
    """Table.batch_split_for: (split_rows, split_min_steps) of the engine's wide rule (the
    largest min_max_batch <= max_batch), (0, 1) below every rule and without a max_batch."""
    t = dataclasses.replace(tuning.GPU, wide_batch_decode=(
        tuning.WideBatchDecode(16, "matmul_coop", "t", split_rows=4096, split_min_steps=8),
        tuning.WideBatchDecode(64, "matmul_coop", "t", split_rows=8192)))
    assert [t.batch_split_for(b) for b in (None, 8, 16, 32, 64, 128)] == [
        (0, 1), (0, 1), (4096, 8), (4096, 8), (8192, 1), (8192, 1)]


def test_batch_coop_tiles_keep_one_column_split():
    """A token's bits under matmul_coop depend on its column split (`sg_k`,
    matmul_coop.comp), so a table whose tiles split the columns two ways is refused when a
    tile is asked for; one split with different tiles by token count is taken."""
    same = dataclasses.replace(tuning.GPU, batch_coop_tiles=(
        tuning.BatchCoopTile(8, 16, 32, 1, 2, "test", 4),
        tuning.BatchCoopTile(None, 32, 32, 1, 1, "test", 4)))
    assert (same.batch_coop_tile(8).bm, same.batch_coop_tile(9).bm) == (16, 32)
    mixed = dataclasses.replace(same, batch_coop_tiles=(
        tuning.BatchCoopTile(8, 16, 32, 1, 2, "test", 4),
        tuning.BatchCoopTile(None, 32, 32, 1, 1, "test", 2)))
    with pytest.raises(ValueError, match=r"sg_k \[2, 4\]\): batch invariance needs one"):
        mixed.batch_coop_tile(9)


def test_batch_coop_tiles_by_weight_type():
    """BatchCoopTile.dtypes and min_rows: a product of a type some tiles name (among those
    whose min_rows it has) takes the first of those that covers its count, any other
    product the first of the tiles naming none; each type's tiles keep one column split
    (two types may differ), and a split of two ways within a type's tiles is refused naming
    it."""
    plain = tuning.BatchCoopTile(None, 32, 32, 2, 2, "test", 8)
    q41 = (tuning.BatchCoopTile(16, 16, 32, 1, 2, "test", 4, dtypes=("q4_1", "q8_0")),
           tuning.BatchCoopTile(None, 32, 32, 2, 2, "test", 4, dtypes=("q4_1",)))
    t = dataclasses.replace(tuning.GPU, batch_coop_tiles=(plain, *q41))
    assert [t.batch_coop_tile(n, dtype=d) for n, d in (
        (8, "q4_1"), (32, "q4_1"), (8, "q8_0"), (32, "q4_k"), (8, "")
    )] == [q41[0], q41[1], q41[0], plain, plain]
    mixed = dataclasses.replace(t, batch_coop_tiles=(
        plain, q41[0], dataclasses.replace(q41[1], sg_k=2)))
    assert mixed.batch_coop_tile(32, dtype="q4_k") == plain
    with pytest.raises(ValueError, match=r"of q4_1 split the columns .* \[2, 4\]"):
        mixed.batch_coop_tile(32, dtype="q4_1")
    big = dataclasses.replace(t, batch_coop_tiles=(
        plain, dataclasses.replace(q41[1], min_rows=4096)))
    assert [big.batch_coop_tile(32, dtype="q4_1", n_rows=r) for r in (4095, 4096, 14336)] == [
        plain, big.batch_coop_tiles[1], big.batch_coop_tiles[1]]
    gpu = tuning.GPU.batch_coop_tiles_for(32)
    assert gpu == tuning.GPU.batch_coop_tiles
    assert tuning.GPU.batch_coop_tile(32, gpu, "q4_1", 4096).split_rows == 8192
    assert tuning.GPU.batch_coop_tile(32, gpu, "q4_1", 2048).split_rows is None
    assert tuning.GPU.batch_coop_tile(32, gpu, "q4_k", 4096).split_rows is None


@pytest.mark.parametrize("table", list(tuning.TABLES))
def test_every_prefill_product_has_a_cited_coop_tile(table):
    """Every prefill product's shape finds a matmul_coop tile (the last rule matches any),
    each cited, whole cooperative matrices of 16 per subgroup."""
    t = tuning.TABLES[table]
    assert t.prefill_coop_tiles[-1].min_rows == t.prefill_coop_tiles[-1].min_tokens == 0
    for n_rows, n_tokens in itertools.product((1, 576, 4096, 8192, 14336, 152064),
                                              (2, 64, 255, 256, 2047, 2048, 8192)):
        r = t.prefill_coop_tile(n_rows, n_tokens)
        assert r.bm % (r.sg_m * 16) == 0 and r.bn % (r.sg_n * 16) == 0 and r.source


def test_prefill_coop_tiles_by_shape():
    """The GPU table's prefill tiles (bench/README.md, 2026-12-04 fourth session): 256 tokens x
    128 rows from 8192 rows and 256 tokens, or from 4096 rows and 2048 tokens; 128 x 128
    from 4096 rows; 128 x 64 split in two from 2048 rows; 128 x 128 with the columns split
    across 4 workgroups from 1024 (twenty-sixth session); 64 x 64 below."""
    tiles = {(n, t): (lambda r: (r.bm, r.bn, r.sg_k, r.splits))(tuning.GPU.prefill_coop_tile(n, t))
             for n, t in itertools.product((1023, 1024, 2047, 2048, 4095, 4096, 8191, 8192),
                                           (255, 256, 2047, 2048))}
    large, square, split = (256, 128, 1, 1), (128, 128, 1, 1), (128, 64, 2, 1)
    wide, small = (128, 128, 1, 4), (64, 64, 1, 1)
    assert tiles == {
        **{(1023, t): small for t in (255, 256, 2047, 2048)},
        **{(n, t): wide for n in (1024, 2047) for t in (255, 256, 2047, 2048)},
        **{(n, t): split for n in (2048, 4095) for t in (255, 256, 2047, 2048)},
        **{(n, t): square for n in (4096, 8191) for t in (255, 256, 2047)},
        (4096, 2048): large, (8191, 2048): large, (8192, 255): square,
        **{(8192, t): large for t in (256, 2047, 2048)}}


def test_batch_glu_by_max_batch():
    """Table.batch_glu_for: the wide rule's glu_tile, glu_rows and glu_raw_rows (glu_rows
    where it has none) for engines at or past its min_max_batch, (None, (0, 0), (0, 0))
    below and without one."""
    tile = tuning.BatchCoopTile(None, 32, 32, 2, 2, "t", 2, 2)
    t = dataclasses.replace(tuning.GPU, wide_batch_decode=(
        tuning.WideBatchDecode(16, "matmul_coop", "t", glu_tile=tile, glu_rows=(4096, 8192),
                               glu_raw_rows=(4096, 14336)),
        tuning.WideBatchDecode(64, "matmul_coop", "t", glu_tile=tile, glu_rows=(1, 2)),
        tuning.WideBatchDecode(128, "matmul_coop", "t")))
    none = (None, (0, 0), (0, 0))
    assert t.batch_glu_for(None) == none and t.batch_glu_for(15) == none
    assert t.batch_glu_for(16) == (tile, (4096, 8192), (4096, 14336)) == t.batch_glu_for(63)
    assert t.batch_glu_for(64) == (tile, (1, 2), (1, 2))
    assert t.batch_glu_for(128) == none


def test_batch_coop_tile_parse():
    """BatchCoopTile.parse: the benchmarks' "BMxBN:SG_MxSG_N[xSG_K[xDEPTH[xNBUF]]]", the
    omitted numbers 1; a missing or extra field, a zero, a word or NBUF other than 1 or 2
    is a ValueError naming the text."""
    from vkrt.tuning import BatchCoopTile

    t = BatchCoopTile.parse("32x64:2x4x8x3x2", "here", 16)
    assert (t.max_tokens, t.bm, t.bn, t.sg_m, t.sg_n, t.sg_k, t.depth, t.nbuf, t.source) == (
        16, 32, 64, 2, 4, 8, 3, 2, "here")
    t = BatchCoopTile.parse("16x32:1x2", "here")
    assert (t.max_tokens, t.sg_k, t.depth, t.nbuf) == (None, 1, 1, 1)
    for bad in ("16x32", "16x32:1", "16x32:1x2x1x1x3", "16x32:1x2x1x1x1x1", "16x0:1x2",
                "16x32:1x2x0", "16xa:1x2", "16x32x8:1x2", "16x32:1x2:1"):
        with pytest.raises(ValueError, match=f"'{bad}' is not BMxBN:SG_MxSG_N"):
            BatchCoopTile.parse(bad, "here")


@pytest.mark.parametrize("table", list(tuning.TABLES))
def test_every_scalar_entry_is_cited(table):
    """Each scalar entry of a table (workgroup sizes, splits, crossovers) names the
    measurement or reason that chose it in `sources`."""
    t = tuning.TABLES[table]
    scalars = [f.name for f in dataclasses.fields(t)
               if isinstance(getattr(t, f.name), (bool, int))]
    assert "attention_splits" in scalars
    assert [n for n in scalars if not t.sources.get(n)] == []
    assert t.sources.get("attention_decode_positions")


@pytest.mark.parametrize("table", list(tuning.TABLES))
def test_decode_positions_entries_increase(table):
    """The crossover's entries run by increasing head_dim (decode_positions takes the first
    that covers the model's), with positive positions."""
    entries = tuning.TABLES[table].attention_decode_positions
    dims = [h for h, _ in entries]
    assert dims == sorted(set(dims)) and all(p > 0 for _, p in entries), entries


def test_decode_positions_by_head_dim():
    """The one-dispatch decode attention's crossover is the first entry whose head_dim covers
    the model's, the last entry past them all, 0 (always split) with none."""
    t = dataclasses.replace(tuning.GPU, attention_decode_positions=((64, 1024), (128, 256)))
    assert [t.decode_positions(d) for d in (32, 64, 80, 128, 256)] == [1024, 1024, 256, 256, 256]
    assert dataclasses.replace(t, attention_decode_positions=()).decode_positions(64) == 0
