"""The embedding engine: grouping, forward pooling, backward gradients, state, errors."""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
import pytest

from embtrain.embedding import (
    EmbeddingEngine,
    FeatureConfig,
    InitializerConfig,
    KeyOutOfRangeError,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
    initial_rows,
)
from embtrain.embedding.bench_engine import PowerLaw
from embtrain.embedding.bench_engine import main as bench_main
from embtrain.embedding.config import DynamicConfig
from embtrain.embedding.reference import (
    init_reference,
    pool_reference,
    sum_duplicates,
    table_key_grads,
)
from embtrain.errors import DataError
from embtrain.kernels import cpu_schedule
from embtrain.kernels.codes import SPLIT_PARTS
from embtrain.kernels.contract import KernelTuning
from embtrain.kernels.cpu_schedule import backward_items
from embtrain.kernels.cpu_update import row_part

SEEDS = [0, 1, 2]


def bags(rng, rows, batch, max_len, weights, power_law=True, fixed=None):
    lens = np.full(batch, fixed) if fixed is not None else rng.integers(0, max_len + 1, batch)
    offsets = np.zeros(batch + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    n = int(offsets[-1])
    keys = PowerLaw(rows, 1.05).sample(rng, n) if power_law else rng.integers(0, rows, n)
    w = rng.uniform(0.1, 2.0, n).astype(np.float32) if weights else None
    return SparseInput(keys.astype(np.int64), offsets, w, bag_size=fixed or 0)


TABLES = [
    TableConfig("a", 60, 8),
    TableConfig("b", 500, 16, InitializerConfig("normal", std=0.1)),
    TableConfig("c", 1, 8, InitializerConfig("constant", value=0.5)),
    TableConfig("d", 200, 5, InitializerConfig("truncated_normal", std=0.2)),
    TableConfig("e", 3000, 16),
]
FEATURES = [
    FeatureConfig("a_sum", "a", "sum"),
    FeatureConfig("b_mean", "b", "mean"),
    FeatureConfig("a_sqrtn", "a", "sqrtn"),
    FeatureConfig("c_one", "c", "sum", 1),
    FeatureConfig("d_concat", "d", "concat", 3),
    FeatureConfig("e_sum", "e", "sum", 10),
    FeatureConfig("b_one", "b", "sum", 1),
    FeatureConfig("e_mean", "e", "mean"),
]


def make_inputs(rng, batch=41):
    return {
        "a_sum": bags(rng, 60, batch, 5, weights=False),
        "b_mean": bags(rng, 500, batch, 6, weights=True),
        "a_sqrtn": bags(rng, 60, batch, 4, weights=True),
        "c_one": bags(rng, 1, batch, 1, weights=False, fixed=1),
        "d_concat": bags(rng, 200, batch, 3, weights=True, power_law=False),
        "e_sum": bags(rng, 3000, batch, 10, weights=False, fixed=10),
        "b_one": bags(rng, 500, batch, 1, weights=False, fixed=1),
        "e_mean": bags(rng, 3000, batch, 8, weights=True),
    }


def make_engine(opt=None, seed=7, tables=TABLES, features=FEATURES):
    opt = opt or SparseOptimizerConfig("sgd", lr=1.0)
    return EmbeddingEngine(tables, features, opt, seed=seed)


def table_values(engine):
    return {t: engine.export_table(t).values for t in engine.table_names}


def test_grouping_and_layout():
    eng = make_engine()
    groups = eng.groups
    assert [(g.dim, g.tables) for g in groups] == [
        (8, ("a", "c")),
        (16, ("b", "e")),
        (5, ("d",)),
    ]
    assert groups[0].features == ("a_sum", "a_sqrtn", "c_one")
    assert groups[1].features == ("b_mean", "b_one", "e_sum", "e_mean")  # table by table
    assert groups[2].width == 15 and groups[1].width == 64 and groups[0].total_rows == 61
    assert eng.layout["a_sqrtn"] == (0, 8, 8)
    assert eng.layout["e_mean"] == (1, 48, 16)
    assert eng.layout["d_concat"] == (2, 0, 15)
    assert list(eng.layout) == [f.name for f in FEATURES]
    assert eng.slot_names == ()
    assert make_engine(SparseOptimizerConfig("ftrl")).slot_names == ("accumulator", "linear")


@pytest.mark.parametrize("seed", SEEDS)
def test_forward_matches_numpy_oracle(seed):
    rng = np.random.default_rng(seed)
    eng = make_engine(seed=seed)
    inputs = make_inputs(rng)
    outs = eng.forward(inputs)
    assert [o.shape for o in outs] == [(41, g.width) for g in eng.groups]
    vals = table_values(eng)
    for f in FEATURES:
        g, c, w = eng.layout[f.name]
        want = pool_reference(vals[f.table], f, inputs[f.name])
        np.testing.assert_allclose(outs[g][:, c : c + w], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_forward_matches_tensorflow(seed):
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(seed)
    eng = make_engine(seed=seed)
    inputs = make_inputs(rng)
    outs = eng.forward(inputs)
    vals = table_values(eng)
    for f in FEATURES:
        if f.combiner == "concat":
            continue
        inp = inputs[f.name]
        batch = len(inp.offsets) - 1
        lens = np.diff(inp.offsets)
        rows = np.repeat(np.arange(batch), lens)
        cols = np.arange(len(inp.keys)) - np.repeat(inp.offsets[:-1], lens)
        idx = np.stack([rows, cols], 1).astype(np.int64)
        shape = [batch, max(1, int(lens.max(initial=0)))]
        sp_ids = tf.sparse.SparseTensor(idx, inp.keys, shape)
        sp_w = None
        if inp.weights is not None:
            sp_w = tf.sparse.SparseTensor(idx, inp.weights, shape)
        want = tf.nn.safe_embedding_lookup_sparse(
            tf.constant(vals[f.table]), sp_ids, sp_w, combiner=f.combiner
        ).numpy()
        g, c, w = eng.layout[f.name]
        np.testing.assert_allclose(outs[g][:, c : c + w], want, rtol=1e-5, atol=1e-6)


def _grads_by_feature(eng, grads):
    return {f: grads[g][:, c : c + w] for f, (g, c, w) in eng.layout.items()}


@pytest.mark.parametrize("seed", SEEDS)
def test_backward_sums_duplicate_key_gradients(seed):
    """SGD with lr=1 from zero values: each touched row becomes minus its summed gradient."""
    rng = np.random.default_rng(seed)
    zero = [TableConfig(t.name, t.rows, t.dim, InitializerConfig("zeros")) for t in TABLES]
    eng = make_engine(tables=zero, seed=seed)
    inputs = make_inputs(rng)
    outs = eng.forward(inputs)
    grads = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
    eng.backward_update(grads, step=0)
    by_f = _grads_by_feature(eng, grads)
    for t in zero:
        keys, g = table_key_grads(FEATURES, inputs, by_f, t.name, t.dim)
        uniq, summed = sum_duplicates(keys, g)
        want = np.zeros((t.rows, t.dim), np.float32)
        want[uniq] = -summed
        state = eng.export_table(t.name)
        np.testing.assert_allclose(state.values, want, rtol=1e-5, atol=1e-6, err_msg=t.name)
        touched = np.zeros(t.rows, bool)
        touched[uniq] = True
        np.testing.assert_array_equal(state.update_count, touched.astype(np.int64))
        np.testing.assert_array_equal(state.last_step, np.where(touched, 0, -1))


@pytest.mark.parametrize("seed", SEEDS)
def test_backward_matches_tensorflow_gradients(seed):
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(seed)
    zero = [TableConfig(t.name, t.rows, t.dim, InitializerConfig("zeros")) for t in TABLES]
    feats = [f for f in FEATURES if f.combiner != "concat"]
    eng = make_engine(tables=zero, features=feats, seed=seed)
    inputs = {k: v for k, v in make_inputs(rng).items() if k in eng.layout}
    outs = eng.forward(inputs)
    grads = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
    eng.backward_update(grads, step=0)
    by_f = _grads_by_feature(eng, grads)
    init = {t.name: rng.standard_normal((t.rows, t.dim)).astype(np.float32) for t in zero}
    tvars = {n: tf.Variable(v) for n, v in init.items()}
    with tf.GradientTape() as tape:
        loss = 0.0
        for f in feats:
            inp = inputs[f.name]
            batch = len(inp.offsets) - 1
            lens = np.diff(inp.offsets)
            rows = np.repeat(np.arange(batch), lens)
            cols = np.arange(len(inp.keys)) - np.repeat(inp.offsets[:-1], lens)
            idx = np.stack([rows, cols], 1).astype(np.int64)
            shape = [batch, max(1, int(lens.max(initial=0)))]
            sp_ids = tf.sparse.SparseTensor(idx, inp.keys, shape)
            sp_w = None if inp.weights is None else tf.sparse.SparseTensor(idx, inp.weights, shape)
            emb = tf.nn.safe_embedding_lookup_sparse(
                tvars[f.table], sp_ids, sp_w, combiner=f.combiner
            )
            loss += tf.reduce_sum(emb * by_f[f.name])
    tgrads = tape.gradient(loss, [tvars[t.name] for t in zero])
    for t, tg in zip(zero, tgrads, strict=True):
        dense = tf.convert_to_tensor(tg).numpy() if tg is not None else np.zeros((t.rows, t.dim))
        np.testing.assert_allclose(
            eng.export_table(t.name).values, -dense, rtol=1e-5, atol=1e-6, err_msg=t.name
        )


def test_initial_values_independent_of_grouping():
    shared = TableConfig("shared", 1000, 8, InitializerConfig("normal", std=0.3))
    e1 = EmbeddingEngine(
        [TableConfig("x", 77, 8), shared], [], SparseOptimizerConfig("sgd"), seed=5
    )
    e2 = EmbeddingEngine(
        [shared, TableConfig("y", 10, 16), TableConfig("z", 5, 8)],
        [FeatureConfig("f", "shared")],
        SparseOptimizerConfig("adagrad"),
        seed=5,
    )
    v1 = e1.export_table("shared").values
    v2 = e2.export_table("shared").values
    np.testing.assert_array_equal(v1, v2)
    rows = np.array([0, 999, 5, 5, 123])
    np.testing.assert_array_equal(initial_rows(shared, 5, rows), v1[rows])
    np.testing.assert_array_equal(e2.read_rows("shared", rows), v1[rows])
    np.testing.assert_allclose(
        v1, init_reference(shared.initializer, 5, "shared", np.arange(1000), 8), rtol=1e-6
    )
    e3 = EmbeddingEngine([shared], [], SparseOptimizerConfig("sgd"), seed=6)
    assert not np.array_equal(e3.export_table("shared").values, v1)


@pytest.mark.parametrize("bad", [-1, 500, 2**40])
def test_out_of_range_key_names_feature(bad):
    rng = np.random.default_rng(0)
    eng = make_engine()
    inputs = make_inputs(rng)
    before = eng.forward(inputs)
    broken = dict(inputs)
    keys = inputs["b_mean"].keys.copy()
    keys[len(keys) // 2] = bad
    broken["b_mean"] = SparseInput(keys, inputs["b_mean"].offsets, inputs["b_mean"].weights)
    with pytest.raises(KeyOutOfRangeError) as exc:
        eng.forward(broken)
    err = exc.value
    assert isinstance(err, ValueError) and isinstance(err, DataError)
    assert err.feature == "b_mean" and err.value == bad and err.table == "b"
    assert "b_mean" in str(err) and str(bad) in str(err)
    with pytest.raises(RuntimeError):
        eng.backward_update(before, 0)  # the failed forward left nothing to apply
    after = eng.forward(inputs)  # the dedup map was restored
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_input_validation():
    rng = np.random.default_rng(1)
    eng = make_engine()
    inputs = make_inputs(rng)
    with pytest.raises(ValueError, match="missing input for feature 'a_sum'"):
        eng.forward({k: v for k, v in inputs.items() if k != "a_sum"})
    with pytest.raises(ValueError, match="unknown features"):
        eng.forward({**inputs, "zzz": inputs["a_sum"]})
    short = dict(inputs)
    short["c_one"] = SparseInput.one_hot(np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="'c_one'"):
        eng.forward(short)
    long_bag = dict(inputs)
    offs = np.arange(42, dtype=np.int64) * 4  # 4 keys per sample > hotness 3
    long_bag["d_concat"] = SparseInput(np.zeros(164, np.int64), offs)
    with pytest.raises(ValueError, match="d_concat"):
        eng.forward(long_bag)
    for bag, keys in ((3, 41 * 10), (10, 41 * 10 - 1), (-1, 41 * 10)):
        wrong = dict(inputs)  # bag_size that contradicts the keys or offsets
        e = inputs["e_sum"]
        wrong["e_sum"] = SparseInput(e.keys[:keys], np.minimum(e.offsets, keys), bag_size=bag)
        with pytest.raises(ValueError, match=f"feature 'e_sum': bag_size {bag} does not match"):
            eng.forward(wrong)
    uneven = inputs["e_sum"].offsets.copy()
    uneven[1] = 9  # bags of 9 and 11 keys, declared as 10 each
    wrong = {**inputs, "e_sum": SparseInput(inputs["e_sum"].keys, uneven, bag_size=10)}
    with pytest.raises(ValueError, match="feature 'e_sum': bag_size 10 does not match"):
        eng.forward(wrong)
    with pytest.raises(ValueError, match="unknown table"):
        EmbeddingEngine(TABLES, [FeatureConfig("f", "nope")], SparseOptimizerConfig(), 0)
    with pytest.raises(ValueError, match="concat"):
        FeatureConfig("f", "a", "concat")
    with pytest.raises(ValueError, match="dtype"):
        TableConfig("t", 1, 1, dtype="float64")


def test_backward_protocol_errors():
    rng = np.random.default_rng(2)
    eng = make_engine()
    with pytest.raises(RuntimeError):
        eng.backward_update([], 0)
    outs = eng.forward(make_inputs(rng))
    with pytest.raises(ValueError, match="expected 3 gradient"):
        eng.backward_update(outs[:2], 0)
    with pytest.raises(ValueError, match="gradient shape"):
        eng.backward_update([outs[0], outs[1][:, :3], outs[2]], 0)
    outs = eng.forward(make_inputs(rng))
    eng.backward_update(outs, 0)
    with pytest.raises(RuntimeError):
        eng.backward_update(outs, 1)  # a forward is used once


def test_forward_into_reused_buffers():
    rng = np.random.default_rng(3)
    eng = make_engine()
    inputs = make_inputs(rng)
    want = eng.forward(inputs)
    bufs = eng.new_outputs(41)
    got = eng.forward(inputs, out=bufs)
    assert all(g is b for g, b in zip(got, bufs, strict=True))
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="out"):
        eng.forward(inputs, out=eng.new_outputs(40))


@pytest.mark.parametrize("block", [1, 8, 64])
def test_block_size_does_not_change_results(block):
    """Blocked kernels (and the staged, non-temporal output path) give the same numbers.

    The first forward is bit-identical; afterwards the block size may change the float
    summation order of a shared table's duplicate keys (block-major), so 1-ulp differences.
    """
    tables = [TableConfig("x", 300, 16), TableConfig("y", 50, 16), TableConfig("z", 90, 8)]
    feats = [
        FeatureConfig("x1", "x", "sum", 1),
        FeatureConfig("x3", "x", "mean"),
        FeatureConfig("y1", "y", "sum", 1),
        FeatureConfig("yc", "y", "concat", 2),
        FeatureConfig("z1", "z", "sqrtn"),
    ]
    rows = {"x": 300, "y": 50, "z": 90}
    opt = SparseOptimizerConfig("adagrad", lr=0.1)
    ref = EmbeddingEngine(tables, feats, opt, seed=3)
    eng = EmbeddingEngine(tables, feats, opt, seed=3)
    eng.block = block
    bufs = eng.new_outputs(50)
    rng = np.random.default_rng(block)
    for step in range(3):
        inputs = {}
        for f in feats:
            fixed = f.hotness if f.combiner != "concat" else None
            inputs[f.name] = bags(rng, rows[f.table], 50, 2, weights=True, fixed=fixed)
        want = ref.forward(inputs)
        got = eng.forward(inputs, out=bufs)
        for a, b in zip(want, got, strict=True):
            if step == 0:
                np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        grads = [np.tanh(o) for o in want]
        ref.backward_update(grads, step)
        eng.backward_update(grads, step)
    for t in ref.table_names:
        a, b = ref.export_table(t), eng.export_table(t)
        np.testing.assert_allclose(a.values, b.values, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a.slots["accumulator"], b.slots["accumulator"], rtol=1e-5)


def _train(eng, rng, steps, batch=41):
    for step in range(steps):
        outs = eng.forward(make_inputs(rng, batch))
        eng.backward_update([np.tanh(o) + 0.1 for o in outs], step)


def assert_same_tables(x_engine, y_engine):
    """Every table of the two engines: bit-identical values, slots and metadata."""
    for t in x_engine.table_names:
        x, y = x_engine.export_table(t), y_engine.export_table(t)
        np.testing.assert_array_equal(x.values, y.values)
        for s in x.slots:
            np.testing.assert_array_equal(x.slots[s], y.slots[s])
        np.testing.assert_array_equal(x.update_count, y.update_count)
        np.testing.assert_array_equal(x.last_step, y.last_step)


@pytest.mark.parametrize("kind", ["adagrad", "rowwise_adagrad"])
def test_an_update_without_pooling_equals_one_after_the_pooling_forward(kind):
    """``forward(pool=False)`` (the data-parallel replicas' update) stages the same rows: the
    update is the same bits, and nothing is pooled."""
    opt = SparseOptimizerConfig(kind, lr=0.05)
    pooled, staged = make_engine(opt), make_engine(opt)
    rng = np.random.default_rng(5)
    for step in range(3):
        inputs = make_inputs(rng)
        grads = [np.tanh(o) + 0.1 for o in pooled.forward(inputs)]
        pooled.backward_update(grads, step)
        assert staged.forward(inputs, pool=False) == []
        staged.backward_update(grads, step)
    assert_same_tables(pooled, staged)


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_deterministic_across_thread_counts(kind):
    opt = SparseOptimizerConfig(kind, lr=0.05)
    n0 = numba.get_num_threads()
    results = []
    for threads in sorted({1, n0}):
        numba.set_num_threads(threads)
        try:
            eng = make_engine(opt)
            _train(eng, np.random.default_rng(11), 4)
        finally:
            numba.set_num_threads(n0)
        results.append({t: eng.export_table(t) for t in eng.table_names})
    for t in results[0]:
        a, b = results[0][t], results[-1][t]
        np.testing.assert_array_equal(a.values, b.values)
        for s in a.slots:
            np.testing.assert_array_equal(a.slots[s], b.slots[s])


def test_export_import_roundtrip():
    opt = SparseOptimizerConfig("rowwise_adagrad", lr=0.1)
    eng = make_engine(opt)
    _train(eng, np.random.default_rng(4), 3)
    other = make_engine(opt, seed=99)
    for t in eng.table_names:
        other.import_table(t, eng.export_table(t))
    for t in eng.table_names:
        a, b = eng.export_table(t), other.export_table(t)
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.slots["accumulator"], b.slots["accumulator"])
        assert a.slots["accumulator"].shape == (eng.table_config(t).rows,)
        np.testing.assert_array_equal(a.update_count, b.update_count)
        np.testing.assert_array_equal(a.last_step, b.last_step)
    assert eng.export_table("e").update_count.max() >= 1
    inputs = make_inputs(np.random.default_rng(5))
    for x, y in zip(eng.forward(inputs), other.forward(inputs), strict=True):
        np.testing.assert_array_equal(x, y)
    state = eng.export_table("a")
    state.values = state.values[:, :3]
    with pytest.raises(ValueError, match="values shape"):
        other.import_table("a", state)
    np.testing.assert_array_equal(
        eng.read_slot("e", "accumulator", np.array([0, 1])),
        eng.export_table("e").slots["accumulator"][:2],
    )


def test_export_is_a_copy():
    eng = make_engine()
    s = eng.export_table("a")
    s.values[:] = 123.0
    assert not (eng.export_table("a").values == 123.0).any()


def test_bench_smoke(capsys):
    assert bench_main(["--scale", "1e-5", "--batch", "64", "--steps", "1", "--warmup", "1",
                       "--json"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert '"total_ms"' in out and '"tables": 55' in out and '"inputs": 58' in out


@pytest.mark.parametrize("seed", SEEDS)
def test_backward_work_split_covers_every_row_once(seed):
    """Every part of every table with keys goes to exactly one work item; tables stay in
    group order and each worker's items are a contiguous run of them."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        nt, workers = int(rng.integers(1, 12)), int(rng.integers(1, 9))
        nnz = rng.integers(0, 100, nt) * (rng.random(nt) < 0.8)
        nnz[rng.integers(nt)] += 5000 * int(rng.random() < 0.3)
        unique = nnz * rng.random(nt)
        t, lo, hi, ptr = backward_items(nnz, unique, workers)
        assert ptr[0] == 0 and ptr[-1] == len(t) and (np.diff(ptr) >= 0).all()
        assert (np.diff(t) >= 0).all()  # tables in order, a contiguous run per worker
        for tt in range(nt):
            cover = np.zeros(SPLIT_PARTS, int)
            for a, b in zip(lo[t == tt], hi[t == tt], strict=True):
                assert 0 <= a < b <= SPLIT_PARTS
                cover[a:b] += 1
            assert (cover == (1 if nnz[tt] else 0)).all()


def test_row_parts_share_power_law_rows_fairly():
    """Splitting a table by ``row_part`` gives each part a fair share of a batch's unique
    rows even when the hot ids are the small ones (a split by id range would not)."""
    rng = np.random.default_rng(0)
    rows = np.unique(PowerLaw(1_000_000, 1.05).sample(rng, 200_000))
    parts = row_part(rows)
    assert parts.min() >= 0 and parts.max() < SPLIT_PARTS
    share = np.bincount(parts, minlength=SPLIT_PARTS) / rows.size
    assert share.min() > 0.7 / SPLIT_PARTS and share.max() < 1.3 / SPLIT_PARTS


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_results_do_not_depend_on_the_backward_split(kind):
    """Tables split between 2, 3, 5 or 8 work lists (by row part) give bit-identical state."""
    opt = SparseOptimizerConfig(kind, lr=0.05)
    results = []
    for workers in (1, 2, 3, 5, 8):
        eng = make_engine(opt)
        eng.workers = workers
        _train(eng, np.random.default_rng(12), 4, batch=300)
        results.append({t: eng.export_table(t) for t in eng.table_names})
    for other in results[1:]:
        for t, a in results[0].items():
            b = other[t]
            np.testing.assert_array_equal(a.values, b.values)
            for s in a.slots:
                np.testing.assert_array_equal(a.slots[s], b.slots[s])
            np.testing.assert_array_equal(a.update_count, b.update_count)
            np.testing.assert_array_equal(a.last_step, b.last_step)


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_declared_bag_size_changes_nothing(kind):
    """Fixed-size bags declared with ``bag_size`` (offsets not read) and the same bags read
    from their offsets give bit-identical outputs and state."""
    opt = SparseOptimizerConfig(kind, lr=0.05)
    declared, read = make_engine(opt), make_engine(opt)
    rng = np.random.default_rng(13)
    for step in range(4):
        inputs = make_inputs(rng, 300)
        assert inputs["e_sum"].bag_size == 10 and inputs["b_one"].bag_size == 1
        plain = {k: dataclasses.replace(v, bag_size=0) for k, v in inputs.items()}
        a, b = declared.forward(inputs), read.forward(plain)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        declared.backward_update([np.tanh(o) + 0.1 for o in a], step)
        read.backward_update([np.tanh(o) + 0.1 for o in b], step)
    assert_same_tables(declared, read)


def test_row_map_stamps_run_out_and_grow_safely(monkeypatch):
    """The backward's row map is never restored row by row: each call stamps its entries
    above the previous call's, and the map is zeroed when the stamps run out or the ids need
    more bits. An engine that runs out of stamps every third step, and whose id bits grow
    with the batch, keeps bit-identical outputs and state to a plain one."""
    monkeypatch.setattr(cpu_schedule, "_MIN_ID_BITS", 1)  # id bits follow the batch
    opt = SparseOptimizerConfig("adam", lr=0.05)
    plain, tight = make_engine(opt), make_engine(opt)
    rng = np.random.default_rng(14)
    grown = set()
    for step, batch in enumerate([5, 40, 300, 7, 300, 120, 40, 300, 300, 6, 300]):
        if step == 4:
            for g in tight._groups:
                g.scratch.map_id_bits, g.scratch.map_stamp = 29, 3  # out of stamps: zeroed, then 1, 2, 3
        inputs = make_inputs(rng, batch)
        a, b = plain.forward(inputs), tight.forward(inputs)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        plain.backward_update([np.tanh(o) + 0.1 for o in a], step)
        tight.backward_update([np.tanh(o) + 0.1 for o in b], step)
        grown.add(plain._groups[0].scratch.map_id_bits)
        if step >= 4:
            assert [g.scratch.map_stamp for g in tight._groups] == [(step - 4) % 3 + 1] * len(b)
    assert len(grown) > 1, "the id bits grew with the batch"
    assert_same_tables(plain, tight)


def test_keys_changed_after_forward_are_caught():
    """The backward reads the forward's keys again: a key made invalid in between is
    skipped (no write outside the tables) and reported."""
    eng = make_engine()
    inputs = make_inputs(np.random.default_rng(2))
    outs = eng.forward(inputs)
    inputs["e_sum"].keys[3] = 10**9
    with pytest.raises(RuntimeError, match="changed between forward and backward_update"):
        eng.backward_update(outs, 0)
    outs = eng.forward(make_inputs(np.random.default_rng(3)))  # the engine still works
    eng.backward_update(outs, 1)




def test_kernel_tuning_reaches_every_group_and_survives_a_group_rebuilt_for_new_keys():
    """``block``/``workers`` set on the engine go to the CPU scratch of every group, and a
    dynamic group rebuilt with more scratch rows (many keys not yet admitted in one step)
    keeps them."""
    tables = [TableConfig("s", 40, 8),
              TableConfig("d", 5000, 16, dynamic=DynamicConfig(eviction="lru", admission="count", min_count=2))]
    feats = [FeatureConfig("s1", "s", "sum"), FeatureConfig("d1", "d", "sum")]
    eng = EmbeddingEngine(tables, feats, SparseOptimizerConfig("sgd", lr=0.1), seed=1)
    eng.tuning = KernelTuning(block=8, workers=3)
    assert (eng.block, eng.workers) == (8, 3)
    eng.block = 16
    assert eng.tuning == KernelTuning(16, 3)
    dynamic_group = eng._groups[1]
    rng = np.random.default_rng(0)
    keys = rng.choice(1 << 40, size=3000, replace=False).astype(np.int64)
    eng.forward({"s1": SparseInput(rng.integers(0, 40, 1000), np.arange(1001)),
                 "d1": SparseInput(keys, np.arange(0, 3001, 3))}, step=1)
    assert eng._groups[1] is not dynamic_group  # rebuilt for the new keys
    for g in eng._groups:
        assert eng.backend.tuning(g.scratch) == KernelTuning(16, 3)
