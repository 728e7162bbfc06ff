"""Kernels against small, obvious NumPy oracles on fresh random inputs: the CPU kernels' own
signatures, and the backend-generic ones (init, gather, fill) over every available backend."""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
import pytest

from embtrain.embedding.bench_engine import PowerLaw
from embtrain.embedding.config import (
    FeatureConfig,
    InitializerConfig,
    SparseInput,
    TableConfig,
)
from embtrain.embedding.initializers import initial_rows, initializer_code, table_base
from embtrain.embedding.kernel_inputs import frozen
from embtrain.embedding.reference import init_reference, pool_reference
from embtrain.embedding.reference_halves import narrow_nearest_ref, widen_ref
from embtrain.kernels import available_backends, codes, default_backend, get_backend
from embtrain.kernels._llvm import axpy, scale_copy
from embtrain.kernels.cpu_update import row_part

SEEDS = [0, 1, 2]
BACKENDS = available_backends()  # "cuda" too under NUMBA_ENABLE_CUDASIM=1 (scripts/test.sh)


def random_bags(
    rng: np.random.Generator,
    rows: int,
    batch: int,
    max_len: int,
    weights: bool,
    power_law: bool = False,
    fixed: int | None = None,
) -> SparseInput:
    """CSR bags with duplicates and empty bags (unless ``fixed`` hotness, then declared as
    ``bag_size``)."""
    lens = np.full(batch, fixed) if fixed is not None else rng.integers(0, max_len + 1, batch)
    offsets = np.zeros(batch + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    nnz = int(offsets[-1])
    keys = PowerLaw(rows, 1.05).sample(rng, nnz) if power_law else rng.integers(0, rows, nnz)
    w = rng.uniform(0.1, 2.0, nnz).astype(np.float32) if weights else None
    return SparseInput(keys.astype(np.int64), offsets, w, bag_size=fixed or 0)


def bags_read_from_offsets(inputs: dict[str, SparseInput]) -> dict[str, SparseInput]:
    """The same inputs without ``bag_size``: the kernels read every bag's offsets."""
    return {k: dataclasses.replace(v, bag_size=0) for k, v in inputs.items()}


def test_backend_registry():
    assert "cpu" in available_backends()
    be = get_backend("cpu")
    assert be.name == "cpu" and be.xp is np and be.num_workers() >= 1
    for name in available_backends():
        assert get_backend(name).name == name and get_backend(name).num_workers() >= 1
    assert default_backend() in available_backends()
    with pytest.raises(ValueError, match="unknown kernel backend"):
        get_backend("tpu")


def test_empty_allocates_writable_arrays():
    be = get_backend()
    small = be.empty((3, 4), np.float32)
    big = be.empty((1 << 20, 2), np.int64)  # 16 MiB: huge-page mapping
    assert small.shape == (3, 4) and big.shape == (1 << 20, 2)
    assert big.flags.c_contiguous and big.flags.writeable
    for shape in [(3, 4), (1,), (5, 7, 2), (1 << 20, 2)]:
        assert be.empty(shape, np.float32).ctypes.data % 64 == 0
    big[:] = 7
    assert int(big.sum()) == 7 * 2 * (1 << 20)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 12, 16, 20, 33, 64])
def test_vector_row_ops(seed, n):
    rng = np.random.default_rng(seed)

    @numba.njit
    def run(dst, di, src, si, w, n, mode):
        if mode == 0:
            axpy(dst, di, src, si, w, n)
        else:
            scale_copy(dst, di, src, si, w, n)

    src = rng.standard_normal((5, 70)).astype(np.float32)
    dst = rng.standard_normal((4, 80)).astype(np.float32)
    w = np.float32(rng.standard_normal())
    di, si = 80 + 3, 70 * 2 + 5
    want = dst.copy().reshape(-1)
    want[di : di + n] += w * src.reshape(-1)[si : si + n]
    got = dst.copy()
    run(got, di, src, si, w, n, 0)
    np.testing.assert_array_equal(got.reshape(-1), want)
    want = dst.copy().reshape(-1)
    want[di : di + n] = w * src.reshape(-1)[si : si + n]
    got = dst.copy()
    run(got, di, src, si, w, n, 1)
    np.testing.assert_array_equal(got.reshape(-1), want)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "init",
    [
        InitializerConfig("uniform", scale=0.3),
        InitializerConfig("normal", std=0.7),
        InitializerConfig("truncated_normal", std=1.5),
        InitializerConfig("zeros"),
        InitializerConfig("constant", value=0.25),
    ],
    ids=lambda i: i.kind,
)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # simulator's uint64
def test_init_kernels_match_oracle(seed, init, backend):
    be = get_backend(backend)
    rng = np.random.default_rng(seed)
    table = TableConfig(f"tab{seed}", 500, 13, initializer=init)
    rows = rng.integers(0, table.rows, 200)
    want = init_reference(init, seed, table.name, rows, table.dim)
    got = be.to_host(initial_rows(table, seed, rows, backend))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    full = be.xp.full((table.rows, table.dim), np.nan, dtype=np.float32)
    kind, param = initializer_code(init)
    be.init_range(full, np.int64(0), table_base(seed, table.name), kind, param)
    np.testing.assert_array_equal(be.to_host(full)[rows], got)
    np.testing.assert_array_equal(got, initial_rows(table, seed, rows, "cpu"))  # bit for bit


def test_init_distributions():
    n = 200_000
    rows = np.arange(n // 8, dtype=np.int64)
    u = initial_rows(TableConfig("u", n, 8, InitializerConfig("uniform", scale=0.5)), 3, rows)
    assert u.min() >= -0.5 and u.max() < 0.5 and abs(u.mean()) < 0.01
    assert abs(u.std() - 0.5 / np.sqrt(3)) < 0.01
    z = initial_rows(TableConfig("n", n, 8, InitializerConfig("normal", std=2.0)), 3, rows)
    assert abs(z.mean()) < 0.03 and abs(z.std() - 2.0) < 0.03
    t = initial_rows(
        TableConfig("t", n, 8, InitializerConfig("truncated_normal", std=2.0)), 3, rows
    )
    assert np.abs(t).max() <= 4.0 + 1e-6 and abs(t.std() - 2.0 * 0.8796) < 0.03
    # different seeds, names, rows and columns give different values
    a = initial_rows(TableConfig("a", 10, 4), 1, np.arange(10))
    assert len(np.unique(a)) == a.size
    assert not np.array_equal(a, initial_rows(TableConfig("a", 10, 4), 2, np.arange(10)))
    assert not np.array_equal(a, initial_rows(TableConfig("b", 10, 4), 1, np.arange(10)))


def _block_major(features, offsets, batch, block):
    """(feature, position) pairs in the kernels' block-major visiting order."""
    order = []
    for b0 in range(0, batch, block):
        b1 = min(batch, b0 + block)
        for f in features:
            order += [(f, p) for p in range(offsets[f][b0], offsets[f][b1])]
    return order


def _backward_call(table_rows, feats, feat_table, inputs, grads, block, items, lr, stamp=1 << 16,
                   half_grads=False):
    """Run ``backward_update`` (SGD) on one group; ``items``: per worker, (table, lo, hi).
    The row map starts with stale entries of earlier calls: random values below ``stamp``.
    ``half_grads``: ``grads`` (bfloat16 values) handed over as their bfloat16 patterns."""
    be = get_backend()
    nt = len(table_rows)
    table_rows = np.asarray(table_rows, np.int64)
    table_offset = np.zeros(nt, np.int64)
    np.cumsum(table_rows[:-1], out=table_offset[1:])
    feat_table = np.asarray(feat_table, np.int64)
    dim = 8
    widths = [dim * f.hotness if f.combiner == "concat" else dim for f in feats]
    feat_col = np.zeros(len(feats), np.int64)
    np.cumsum(widths[:-1], out=feat_col[1:])
    order = np.argsort(feat_table, kind="stable").astype(np.int64)
    tf_ptr = np.zeros(nt + 1, np.int64)
    np.cumsum(np.bincount(feat_table, minlength=nt), out=tf_ptr[1:])
    nnz = np.bincount(feat_table, weights=[inputs[f.name].keys.size for f in feats], minlength=nt)
    flat = [it for w in items for it in w]
    item_table = np.array([it[0] for it in flat], np.int64)
    item_start = np.zeros(len(flat), np.int64)
    np.cumsum(nnz[item_table][:-1].astype(np.int64), out=item_start[1:])
    wl_ptr = np.zeros(len(items) + 1, np.int64)
    np.cumsum([len(w) for w in items], out=wl_ptr[1:])
    total = int(nnz.sum()) * len(flat) + 1
    rows = int(table_rows.sum())
    values = np.random.default_rng(1).standard_normal((rows, dim)).astype(np.float32)
    before = values.copy()
    meta = np.zeros((rows, 2), np.int32)
    row_map = np.random.default_rng(2).integers(0, stamp, rows).astype(np.int32)
    map_before = row_map.copy()
    uniq = np.full(total, -1, np.int64)
    acc = np.full((total, dim), np.nan, np.float32)
    nuniq = np.zeros(len(flat), np.int64)
    err = np.zeros(len(flat), np.int64)
    hp = np.zeros(codes.HP_SIZE, np.float32)
    hp[codes.HP_LR] = lr
    comb = {"sum": codes.COMB_SUM, "mean": codes.COMB_MEAN, "sqrtn": codes.COMB_SQRTN,
            "concat": codes.COMB_CONCAT}  # fmt: skip
    no_w = np.empty(0, np.float32)
    dummy = np.zeros((1, 1), np.float32)
    batch = grads.shape[0]
    edges = np.append(np.arange(0, batch, block), batch)
    be.backward_update(
        # inputs read-only, as the engine hands them over (the kernels' compiled types)
        be.array_list([frozen(inputs[f.name].keys) for f in feats]),
        be.array_list([frozen(inputs[f.name].offsets) for f in feats]),
        be.array_list([frozen(no_w if inputs[f.name].weights is None else inputs[f.name].weights)
                       for f in feats]),
        np.array([inputs[f.name].bag_size for f in feats], np.int64),
        table_offset, table_rows, feat_col,
        np.array([comb[f.combiner] for f in feats], np.int64), tf_ptr, order,
        frozen(dummy) if half_grads else frozen(grads),
        frozen(narrow_nearest_ref(grads, codes.VAL_BF16) if half_grads
               else np.zeros((0, 0), np.uint16)),
        wl_ptr,
        item_table, np.array([it[1] for it in flat], np.int64),
        np.array([it[2] for it in flat], np.int64), item_start, row_map, np.int64(stamp), uniq, acc,
        nuniq, err,
        codes.OPT_SGD, hp, values, dummy, dummy, meta, np.int64(4), block,
        max(int(np.diff(inputs[f.name].offsets[edges]).max()) for f in feats),
        # float32 values and slots (the half codes and per-table rounding rows are unused)
        np.array([codes.VAL_F32, codes.VAL_F32, codes.ROUND_NEAREST, 0], np.int64),
        np.zeros((nt, 4), np.int64),
        np.zeros(0, np.int64),  # no row keys: static rows
    )  # fmt: skip
    return dict(
        row_map=row_map, map_before=map_before, stamp=stamp, uniq=uniq, acc=acc, nuniq=nuniq, err=err, item_start=item_start,
        flat=flat, table_offset=table_offset, feat_col=feat_col, values=values,
        before=before, meta=meta,
    )  # fmt: skip


def _contributions(f, inp, grads, col, dim):
    """Per position of feature ``f``: float32 gradient contribution, as the kernel forms it."""
    w = inp.weights
    out = np.empty((inp.keys.size, dim), np.float32)
    for b in range(inp.offsets.size - 1):
        s, e = int(inp.offsets[b]), int(inp.offsets[b + 1])
        scale = np.float32(1.0)
        if f.combiner in ("mean", "sqrtn"):
            sw = np.float32(0.0)
            for p in range(s, e):
                wp = w[p] if w is not None else np.float32(1.0)
                sw = np.float32(sw + (wp * wp if f.combiner == "sqrtn" else wp))
            den = sw if f.combiner == "mean" else np.sqrt(sw)
            scale = np.float32(1.0) / den if den != 0 else np.float32(0.0)
        for p in range(s, e):
            c = np.float32(w[p] * scale) if w is not None else scale
            gc = col + (p - s) * dim if f.combiner == "concat" else col
            out[p] = c * grads[b, gc : gc + dim]
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("block", [1, 5, 256])
@pytest.mark.parametrize("declared", [True, False], ids=["bag_size", "offsets"])
@pytest.mark.parametrize("half_grads", [False, True], ids=["float32", "bfloat16_grads"])
def test_backward_dedups_and_sums_in_block_major_order(seed, block, declared, half_grads):
    """Each work item numbers its rows in order of first block-major visit, sums their
    contributions in that order (bit-exact float32 oracle), applies SGD and leaves
    ``stamp + id`` in the map of each row it took (stale entries of earlier calls, below the
    stamp, read as not seen; other entries are left alone); items splitting a table by row part take exactly the rows of their parts. Fixed-size
    bags give the same result whether declared (``bag_size``) or read from the offsets.
    Gradients handed over as bfloat16 patterns (a bfloat16 network's) are read as their exact
    float32 widening (the same oracle on the widened values)."""
    rng = np.random.default_rng(seed)
    table_rows = [50, 1, 1000, 7, 130]
    feats = [
        FeatureConfig("f0", "t2", "sum"),
        FeatureConfig("f1", "t0", "mean"),
        FeatureConfig("f2", "t2", "sum", 1),
        FeatureConfig("f3", "t3", "concat", 3),
        FeatureConfig("f4", "t1", "sum", 1),
        FeatureConfig("f5", "t0", "sqrtn"),
        FeatureConfig("f6", "t4", "sum"),
        FeatureConfig("f7", "t2", "mean"),  # three keys per bag
    ]
    feat_table = [int(f.table[1:]) for f in feats]  # tables 0 and 2 are read by two features
    batch = 29
    inputs = {}
    for f, t in zip(feats, feat_table, strict=True):
        fixed = 3 if f.name == "f7" else f.hotness if f.combiner != "concat" else None
        longest = 3 if f.combiner == "concat" else 6  # (the forward rejects longer concat bags)
        inputs[f.name] = random_bags(rng, table_rows[t], batch, longest, weights=f.name != "f0",
                                     power_law=True, fixed=fixed)  # fmt: skip
    if not declared:
        inputs = bags_read_from_offsets(inputs)
    width = 8 * (len(feats) - 1) + 24
    grads = rng.standard_normal((batch, width)).astype(np.float32)
    if half_grads:  # values of bfloat16, which the kernel reads from their patterns
        grads = widen_ref(narrow_nearest_ref(grads, codes.VAL_BF16), codes.VAL_BF16)
    parts = codes.SPLIT_PARTS
    items = [[(0, 0, parts), (1, 0, parts), (2, 0, 20)],
             [(2, 20, 41)], [(2, 41, parts), (3, 0, parts), (4, 0, 33)],
             [(4, 33, parts)]]  # fmt: skip
    lr = np.float32(1.0)
    r = _backward_call(table_rows, feats, feat_table, inputs, grads, block, items, lr,
                       stamp=int(rng.integers(1, 1 << 13)) << 17, half_grads=half_grads)
    assert not r["err"].any()
    contrib = {f.name: _contributions(f, inputs[f.name], grads, int(c), 8)
               for f, c in zip(feats, r["feat_col"], strict=True)}  # fmt: skip
    touched = np.zeros(sum(table_rows), bool)
    for i, (t, lo, hi) in enumerate(r["flat"]):
        fs = [j for j, tt in enumerate(feat_table) if tt == t]
        visit = _block_major(fs, [inputs[f.name].offsets for f in feats], batch, block)
        want_rows: list[int] = []
        sums: dict[int, np.ndarray] = {}
        for j, p in visit:
            k = int(inputs[feats[j].name].keys[p])
            if not lo <= int(row_part(np.array([k]))[0]) < hi:
                continue
            g = contrib[feats[j].name][p]
            if k not in sums:
                want_rows.append(k)
                sums[k] = g.copy()
            else:
                sums[k] = sums[k] + g
        n, us = int(r["nuniq"][i]), int(r["item_start"][i])
        off = int(r["table_offset"][t])
        np.testing.assert_array_equal(r["uniq"][us : us + n] - off, want_rows)
        for q, k in enumerate(want_rows):
            np.testing.assert_array_equal(r["acc"][us + q], sums[k])
            row = off + k
            np.testing.assert_array_equal(r["values"][row], r["before"][row] - lr * sums[k])
            assert r["meta"][row].tolist() == [1, 5]
            assert r["row_map"][row] == r["stamp"] + q, "map entry: stamp + id"
            assert not touched[row], "a row belongs to one item"
            touched[row] = True
    np.testing.assert_array_equal(r["values"][~touched], r["before"][~touched])
    assert (r["meta"][~touched] == 0).all()
    np.testing.assert_array_equal(r["row_map"][~touched], r["map_before"][~touched])


def test_backward_skips_and_reports_invalid_keys():
    """Keys the forward did not check (changed since) are skipped and flagged, not written."""
    feats = [FeatureConfig("a", "t0", "sum"), FeatureConfig("b", "t1", "sum", 1)]
    inputs = {
        "a": SparseInput(np.array([3, -1, 3, 50], np.int64), np.array([0, 2, 4], np.int64)),
        "b": SparseInput(np.array([1, 9], np.int64), np.array([0, 1, 2], np.int64)),
    }
    grads = np.ones((2, 16), np.float32)
    parts = codes.SPLIT_PARTS
    r = _backward_call([50, 9], feats, [0, 1], inputs, grads, 1, [[(0, 0, parts), (1, 0, parts)]],
                       np.float32(0.5))  # fmt: skip
    assert r["err"].tolist() == [1, 1]
    assert r["nuniq"].tolist() == [1, 1]  # row 3 of t0, row 1 of t1
    assert sorted(np.flatnonzero(r["row_map"] != r["map_before"])) == [3, 51]
    changed = np.flatnonzero((r["values"] != r["before"]).any(axis=1))
    assert changed.tolist() == [3, 51]


def _pool_call(values_by_table, feats, inputs, block, staged=False, ocode=0):
    """``pool_forward`` into a float32 ``out`` (``ocode`` 0), or into the half patterns of
    ``ocode`` (returned as ``out``, uint16; needs ``staged``)."""
    be = get_backend()
    tables = list(values_by_table)
    dim = values_by_table[tables[0]].shape[1]
    rows = np.array([values_by_table[t].shape[0] for t in tables], np.int64)
    table_offset = np.zeros(len(tables), np.int64)
    np.cumsum(rows[:-1], out=table_offset[1:])
    values = np.concatenate([values_by_table[t] for t in tables])
    widths = [dim * f.hotness if f.combiner == "concat" else dim for f in feats]
    feat_col = np.zeros(len(feats), np.int64)
    np.cumsum(widths[:-1], out=feat_col[1:])
    comb = {"sum": codes.COMB_SUM, "mean": codes.COMB_MEAN, "sqrtn": codes.COMB_SQRTN,
            "concat": codes.COMB_CONCAT}  # fmt: skip
    batch = len(inputs[feats[0].name].offsets) - 1
    width = sum(widths)
    if staged:  # 64-byte aligned output, width padded to a multiple of 16
        width = -(-width // 16) * 16
        buf = np.full(batch * width + 16, np.nan, np.float32)
        start = (-buf.ctypes.data % 64) // 4
        out = buf[start : start + batch * width].reshape(batch, width)
        assert out.ctypes.data % 64 == 0
        stage = np.full((3, block, width), np.nan, np.float32)
    else:
        out = np.full((batch, width), np.nan, np.float32)
        stage = np.zeros((1, 1, 1), np.float32)
    err = np.zeros((len(feats), 2), np.int64)
    out16 = np.full(out.shape, 0xFFFF, np.uint16) if ocode else np.zeros((0, 0), np.uint16)
    be.pool_forward(
        be.array_list([frozen(inputs[f.name].keys) for f in feats]),
        be.array_list([frozen(inputs[f.name].offsets) for f in feats]),
        be.array_list(
            [
                frozen(inputs[f.name].weights
                       if inputs[f.name].weights is not None
                       else np.empty(0, np.float32))
                for f in feats
            ]
        ),
        np.array([inputs[f.name].bag_size for f in feats], np.int64),
        np.array([tables.index(f.table) for f in feats], np.int64),
        table_offset,
        rows,
        feat_col,
        np.array([comb[f.combiner] for f in feats], np.int64),
        np.array([f.hotness or 0 for f in feats], np.int64),
        values,
        np.zeros((1, 1), np.float32) if ocode else out,
        out16,
        np.int64(ocode),
        err,
        block,
        stage,
        codes.VAL_F32,  # float32 values
    )
    return (out16 if ocode else out), err, feat_col, widths


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dim", [8, 16, 5])
@pytest.mark.parametrize("block,staged", [(1, False), (7, False), (256, False), (4, True)])
@pytest.mark.parametrize("declared", [True, False], ids=["bag_size", "offsets"])
def test_pool_forward_matches_oracle(seed, dim, block, staged, declared):
    rng = np.random.default_rng(seed)
    values = {
        "a": rng.standard_normal((40, dim)).astype(np.float32),
        "b": rng.standard_normal((300, dim)).astype(np.float32),
    }
    feats = [
        FeatureConfig("s", "a", "sum"),
        FeatureConfig("m", "b", "mean"),
        FeatureConfig("q", "a", "sqrtn"),
        FeatureConfig("c", "b", "concat", 3),
        FeatureConfig("w", "b", "sum"),
        FeatureConfig("o", "a", "sum", 1),
        FeatureConfig("ow", "b", "sum", 1),
        FeatureConfig("om", "b", "mean", 1),
    ]
    batch = 37
    inputs = {
        "s": random_bags(rng, 40, batch, 5, weights=False),
        "m": random_bags(rng, 300, batch, 6, weights=True, power_law=True),
        "q": random_bags(rng, 40, batch, 4, weights=True),
        "c": random_bags(rng, 300, batch, 3, weights=True),
        "w": random_bags(rng, 300, batch, 12, weights=True, power_law=True),
        "o": random_bags(rng, 40, batch, 1, weights=False, fixed=1),
        "ow": random_bags(rng, 300, batch, 1, weights=True, fixed=1),
        "om": random_bags(rng, 300, batch, 1, weights=True, fixed=1),
        "f3": random_bags(rng, 40, batch, 3, weights=True, fixed=3),
        "c3": random_bags(rng, 300, batch, 3, weights=True, fixed=3),
    }
    feats += [FeatureConfig("f3", "a", "mean"), FeatureConfig("c3", "b", "concat", 3)]
    if not declared:
        inputs = bags_read_from_offsets(inputs)
    out, err, cols, widths = _pool_call(values, feats, inputs, block, staged)
    assert not err.any()
    for f, c, w in zip(feats, cols, widths, strict=True):
        want = pool_reference(values[f.table], f, inputs[f.name])
        np.testing.assert_allclose(out[:, c : c + w], want, rtol=1e-5, atol=1e-6, err_msg=f.name)


@pytest.mark.parametrize("ocode", [codes.VAL_BF16, codes.VAL_F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("block", [1, 4, 256])
def test_pool_forward_writes_half_outputs_as_the_float32_ones_rounded_to_nearest(ocode, block):
    """With a half output code the pooled block is narrowed from the stage into ``out16``:
    the patterns of the float32 output rounded to nearest (ties to even), nothing else
    written; without a stage the kernel refuses."""
    rng = np.random.default_rng(block + 10 * ocode)
    values = {"a": rng.standard_normal((40, 8)).astype(np.float32) * 300,
              "b": rng.standard_normal((300, 8)).astype(np.float32)}  # fmt: skip
    feats = [FeatureConfig("s", "a", "sum"), FeatureConfig("m", "b", "mean"),
             FeatureConfig("c", "b", "concat", 3), FeatureConfig("o", "a", "sum", 1)]
    batch = 37
    inputs = {"s": random_bags(rng, 40, batch, 5, weights=True),
              "m": random_bags(rng, 300, batch, 6, weights=True, power_law=True),
              "c": random_bags(rng, 300, batch, 3, weights=False),
              "o": random_bags(rng, 40, batch, 1, weights=False, fixed=1)}  # fmt: skip
    full, err, _, _ = _pool_call(values, feats, inputs, block, staged=True)
    half, err16, _, _ = _pool_call(values, feats, inputs, block, staged=True, ocode=ocode)
    assert not err.any() and not err16.any() and half.dtype == np.uint16
    np.testing.assert_array_equal(half, narrow_nearest_ref(full, ocode))
    with pytest.raises(ValueError, match="a half output needs the staging block"):
        _pool_call(values, feats, inputs, block, staged=False, ocode=ocode)


def test_pool_forward_flags_malformed_bags():
    rng = np.random.default_rng(0)
    values = {"a": rng.standard_normal((10, 8)).astype(np.float32)}
    feats = [FeatureConfig("c", "a", "concat", 2), FeatureConfig("s", "a", "sum")]
    inputs = {
        "c": SparseInput(np.array([1, 2, 3], np.int64), np.array([0, 3, 3], np.int64)),
        "s": SparseInput(np.array([1, 2], np.int64), np.array([0, 2, 1], np.int64)),
    }
    out, err, _, _ = _pool_call(values, feats, inputs, 256)
    assert err[:, codes.BAD_OFFSETS].tolist() == [1, 1]
    assert not err[:, codes.BAD_KEY].any()
    assert np.isfinite(out).all()


@pytest.mark.parametrize("bad", [-1, 10, 2**40, -(2**62)])
@pytest.mark.parametrize("block", [1, 4, 256])
@pytest.mark.parametrize("declared", [True, False], ids=["bag_size", "offsets"])
def test_pool_forward_flags_keys_out_of_range(bad, block, declared):
    """A key outside its table is flagged for its feature, one-hot or not, and never read."""
    rng = np.random.default_rng(0)
    values = {"a": rng.standard_normal((10, 8)).astype(np.float32),
              "b": rng.standard_normal((30, 8)).astype(np.float32)}  # fmt: skip
    feats = [FeatureConfig("o", "a", "sum", 1), FeatureConfig("m", "a", "mean"),
             FeatureConfig("x", "b", "sum", 1)]  # fmt: skip
    for victim in ("o", "m"):
        inputs = {
            "o": random_bags(rng, 10, 9, 1, weights=False, fixed=1),
            "m": random_bags(rng, 10, 9, 4, weights=True, fixed=3),
            "x": random_bags(rng, 10, 9, 1, weights=False, fixed=1),  # in range for "b" only
        }
        inputs[victim].keys[5] = bad
        if not declared:
            inputs = bags_read_from_offsets(inputs)
        _, err, _, _ = _pool_call(values, feats, inputs, block)
        assert err[:, codes.BAD_KEY].tolist() == [victim == "o", victim == "m", 0]
        assert not err[:, codes.BAD_OFFSETS].any()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_rows(seed, backend):
    be = get_backend(backend)
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((100, 6)).astype(np.float32)
    rows = rng.integers(0, 100, 50)
    out = be.xp.full((50, 6), np.nan, dtype=np.float32)
    be.gather_rows(be.xp.asarray(src), be.xp.asarray(rows), out)
    np.testing.assert_array_equal(be.to_host(out), src[rows])


@pytest.mark.parametrize("backend", BACKENDS)
def test_fill_kernels(backend):
    be = get_backend(backend)
    a = be.xp.zeros(1000, np.float32)
    be.fill_f32(a, 0.5)
    assert (be.to_host(a) == 0.5).all()
    b = be.xp.zeros(1000, np.int64)
    be.fill_i64(b, np.int64(-3))
    assert (be.to_host(b) == -3).all()
    c = be.xp.zeros(1000, np.int32)
    be.fill_i32(c, -1)
    assert (be.to_host(c) == -1).all()
    for shape in [(10, 3), (1 << 20, 2)]:
        z = be.zeros(shape, np.int64)
        assert z.shape == shape and not be.to_host(z).any()
