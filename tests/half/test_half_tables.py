"""Half-precision tables (float16 / bfloat16 held as uint16 patterns) in the CPU kernels and the
engine, against NumPy references that narrow the same way.

* forward: pooling a half table equals pooling its widened values in float32, bit for bit;
* update, every optimizer × {bfloat16, float16} × {nearest, stochastic} × optimizer state
  {float32, table}: the half kernel equals the float32 kernel run on the widened state with
  each touched element narrowed by the NumPy rules (:mod:`embtrain.embedding.reference_halves`)
  and the same random source, bit for bit; and it stays within one half ulp of the NumPy
  optimizer oracle (:mod:`embtrain.embedding.reference`);
* the engine: allocation in the table's dtype, reads widened, export in the stored form,
  import narrowing float32 values; stochastic rounding is unbiased over many steps.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from embtrain.embedding.config import (
    FeatureConfig,
    InitializerConfig,
    ShardPlacement,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.engine import EmbeddingEngine, _Group
from embtrain.embedding.halves import DTYPE_CODES
from embtrain.embedding.kernel_inputs import frozen
from embtrain.embedding.optimizers import hyperparams, kind_code, slot_specs
from embtrain.embedding.reference import (
    apply_reference,
    init_reference,
    init_slots,
    narrow_update_reference,
    sum_duplicates,
    table_key_grads,
)
from embtrain.embedding.reference_halves import narrow_nearest_ref, widen_ref
from embtrain.kernels import get_backend
from embtrain.kernels.contract import GroupTables, UpdateStep
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from embtrain.kernels.rules.halves import round_table_id
from embtrain.recipe.kinds import HALF_TABLE_DTYPES

OPTIMIZERS = OPTIMIZER_NAMES  # every registered sparse optimizer
HALVES = HALF_TABLE_DTYPES
SEED = 17


def _tables(dtype: str, rounding: str = "stochastic", state: str = "float32") -> list[TableConfig]:
    # "b" is a row shard (every 3rd row from 1) and a column shard (columns 2.. of 12)
    return [TableConfig("a", 13, 8, dtype=dtype, rounding=rounding, optimizer_state=state),
            TableConfig("b", 9, 8, dtype=dtype, rounding=rounding, optimizer_state=state,
                        placement=ShardPlacement(1, 3, 2, 12))]


FEATURES = [FeatureConfig("a_sum", "a", "sum"), FeatureConfig("a_mean", "a", "mean"),
            FeatureConfig("b_one", "b", "sum", 1), FeatureConfig("b_cat", "b", "concat", 2)]


def _inputs(rng: np.random.Generator, batch: int, cover: bool) -> list[SparseInput]:
    """Inputs of FEATURES; ``cover``: every row of both tables is read (dense Adam's untouched
    rows do not decay then, so the oracle's arithmetic is the kernel's)."""
    rows = {"a": 13, "b": 9}
    out = []
    for f in FEATURES:
        n = rows[f.table]
        lens = (np.full(batch, f.hotness) if f.hotness else rng.integers(0, 4, batch))
        if f.combiner == "concat":
            lens = rng.integers(0, 3, batch)
        offs = np.zeros(batch + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        keys = rng.integers(0, n, int(offs[-1])).astype(np.int64)
        if cover and f.name in ("a_sum", "b_one"):
            keys[:n] = np.arange(n)  # batch >= rows: every row once at least
        w = rng.uniform(0.5, 2.0, keys.size).astype(np.float32) if f.name == "a_mean" else None
        out.append(SparseInput(keys, offs, w, bag_size=int(f.hotness or 0)
                               if f.combiner != "concat" else 0))
    return out


def _group(dtype: str, rounding: str, state: str, opt: SparseOptimizerConfig,
           values: np.ndarray, slots: list[np.ndarray]):
    """A fused group of the two tables holding ``values`` / ``slots`` (float32), stored in
    ``dtype`` (narrowed to nearest) and ``state``."""
    be = get_backend("cpu")
    g = _Group(0, 8, dtype, _tables(dtype, rounding, state), FEATURES, None, SEED)
    code = DTYPE_CODES[dtype]
    v = values if code == 0 else narrow_nearest_ref(values, code)
    scode = g.plan.slot_code
    s = [x if scode == 0 else narrow_nearest_ref(x, scode) for x in slots]
    return be, g, GroupTables(v.copy(), [x.copy() for x in s], np.zeros((values.shape[0], 2),
                                                                       np.int32))


def _pack(be, g, inputs, batch):
    """The step's inputs read-only, as the engine hands them over (the kernels' compiled
    types: no specialisation of the tests' own)."""
    return be.pack_step(g.plan, batch, [frozen(i.keys) for i in inputs],
                        [frozen(i.offsets) for i in inputs],
                        [frozen(np.empty(0, np.float32) if i.weights is None else i.weights)
                         for i in inputs],
                        np.array([i.bag_size for i in inputs], np.int64))


def _state(rng: np.random.Generator, opt: SparseOptimizerConfig):
    values = rng.standard_normal((22, 8)).astype(np.float32)
    slots = [np.full((22, 1 if s.per_row else 8), s.initial_value, np.float32)
             + (rng.uniform(0, 0.5, (22, 1 if s.per_row else 8)).astype(np.float32)
                if s.initial_value > 0 else 0)
             for s in slot_specs(opt)]
    return values, slots


@pytest.mark.parametrize("dtype", HALVES)
def test_pooling_a_half_table_equals_pooling_its_float32_values(dtype: str) -> None:
    rng = np.random.default_rng(1)
    opt = SparseOptimizerConfig("sgd")
    values, slots = _state(rng, opt)
    be, g, half = _group(dtype, "nearest", "float32", opt, values, slots)
    _, g32, f32 = _group("float32", "stochastic", "float32", opt,
                         widen_ref(half.values, DTYPE_CODES[dtype]), slots)
    inputs = _inputs(rng, 20, cover=False)
    out = np.full((20, g.plan.width), np.nan, np.float32)
    want = np.full_like(out, np.nan)
    assert not be.forward_group(g.plan, half, _pack(be, g, inputs, 20), out,
                                be.new_scratch(g.plan)).any()
    be.forward_group(g32.plan, f32, _pack(be, g32, inputs, 20), want, be.new_scratch(g32.plan))
    np.testing.assert_array_equal(out, want)


def _touched(meta: np.ndarray) -> np.ndarray:
    return np.flatnonzero(meta[:, 0] > 0)


@pytest.mark.parametrize("state", ["float32", "table"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("opt_kind", OPTIMIZERS)
def test_half_update_is_the_float32_update_narrowed(opt_kind: str, dtype: str, rounding: str,
                                                    state: str) -> None:
    """Two steps; after each, every element equals the float32 kernel's result on the widened
    state, narrowed by the NumPy rules with the same random bits; within one half ulp of the
    NumPy optimizer oracle after the first."""
    rng = np.random.default_rng(zlib.crc32(f"{opt_kind}/{dtype}/{rounding}/{state}".encode()))
    opt = SparseOptimizerConfig(opt_kind, lr=0.05)
    values, slots = _state(rng, opt)
    be, g, half = _group(dtype, rounding, state, opt, values, slots)
    code, scode = DTYPE_CODES[dtype], g.plan.slot_code
    scratch = be.new_scratch(g.plan)
    batch = 24
    for step in (0, 3):
        inputs = _inputs(rng, batch, cover=True)
        grads = rng.standard_normal((batch, g.plan.width)).astype(np.float32)
        # the float32 kernel on the widened state
        wide_v = widen_ref(half.values, code)
        wide_s = [x.copy() if scode == 0 else widen_ref(x, scode) for x in half.slots]
        _, g32, f32 = _group("float32", "stochastic", "float32", opt, wide_v, wide_s)
        f32.meta[:] = half.meta
        update = UpdateStep(kind_code(opt), hyperparams(opt, step), step)
        out = np.empty((batch, g.plan.width), np.float32)
        be.forward_group(g.plan, half, _pack(be, g, inputs, batch), out, scratch)
        assert not be.backward_group(g.plan, half, _pack(be, g, inputs, batch), frozen(grads),
                                     update, scratch)
        s32 = be.new_scratch(g32.plan)
        be.forward_group(g32.plan, f32, _pack(be, g32, inputs, batch), out, s32)
        be.backward_group(g32.plan, f32, _pack(be, g32, inputs, batch), frozen(grads), update, s32)
        np.testing.assert_array_equal(half.meta, f32.meta)
        touched = _touched(half.meta)
        assert touched.size == 22
        want_v, want_s = narrow_update_reference(
            g.plan, f32.values, f32.slots, wide_v, wide_s, touched, step)
        np.testing.assert_array_equal(half.values, want_v)
        for got, want in zip(half.slots, want_s, strict=True):
            np.testing.assert_array_equal(got, want)
        if step == 0:
            _close_to_oracle(g, opt, inputs, grads, wide_v, wide_s, half, code, scode, step)


def _close_to_oracle(g, opt, inputs, grads, wide_v, wide_s, half, code, scode, step) -> None:
    """The half result is within one half ulp (of the larger of the two) of the NumPy oracle."""
    per_feature = {}
    for fi, f in enumerate(FEATURES):
        c0 = int(g.plan.feat_col[fi])
        per_feature[f.name] = grads[:, c0 : c0 + int(g.plan.feat_width[fi])]
    names = {f.name: inp for f, inp in zip(FEATURES, inputs, strict=True)}
    values = wide_v.copy()
    slots = [s.copy() for s in wide_s]
    slot_names = [s.name for s in slot_specs(opt)]
    for ti, t in enumerate(g.tables):
        off, n = int(g.plan.table_offset[ti]), int(g.plan.table_rows[ti])
        keys, kg = table_key_grads(FEATURES, names, per_feature, t.name, 8)
        uk, ug = sum_duplicates(keys, kg)
        tv = values[off : off + n]
        ts = init_slots(opt, n, 8)
        for name, arr in zip(slot_names, slots, strict=True):
            ts[name] = arr[off : off + n].reshape(ts[name].shape).copy()
        apply_reference(opt, tv, ts, uk, ug, step)
        for name, arr in zip(slot_names, slots, strict=True):
            arr[off : off + n] = ts[name].reshape(arr[off : off + n].shape)
    ulp = 2.0 ** (-7 if code == 1 else -10)
    got = half.values if code == 0 else widen_ref(half.values, code)
    tol = ulp * np.maximum(np.abs(got), np.abs(values)) + 1e-6
    assert (np.abs(got - values) <= tol).all()


def test_stochastic_rounding_is_unbiased_where_nearest_stalls() -> None:
    """SGD with a constant gradient far below half an ulp: round-to-nearest never moves the
    value, stochastic rounding follows the float32 trajectory on average."""
    tables = {r: [TableConfig("t", 64, 4, InitializerConfig("constant", value=1.0),
                              dtype="bfloat16", rounding=r)] for r in ("nearest", "stochastic")}
    feats = [FeatureConfig("f", "t", "sum", 1)]
    opt = SparseOptimizerConfig("sgd", lr=1.0)
    keys = SparseInput.one_hot(np.arange(64, dtype=np.int64))
    got = {}
    for r, ts in tables.items():
        eng = EmbeddingEngine(ts, feats, opt, seed=3)
        for step in range(100):
            out = eng.forward({"f": keys})
            eng.backward_update([np.full_like(out[0], 1e-3)], step)
        got[r] = eng.read_rows("t", np.arange(64))
    np.testing.assert_array_equal(got["nearest"], 1.0)  # 1e-3 < half an ulp of 1.0 (2^-8)
    mean = float(got["stochastic"].mean())
    assert abs(mean - 0.9) < 0.01, mean  # float32: 1 - 100 × 1e-3


def test_engine_allocates_initialises_exports_and_imports_in_the_table_dtype() -> None:
    opt = SparseOptimizerConfig("adagrad", lr=0.1)
    t = TableConfig("t", 30, 8, InitializerConfig("normal", std=0.3), dtype="float16",
                    optimizer_state="table")
    eng = EmbeddingEngine([t], [FeatureConfig("f", "t", "sum")], opt, seed=4)
    init = init_reference(t.initializer, 4, "t", np.arange(30), 8)
    np.testing.assert_array_equal(eng.read_rows("t", np.arange(30)),
                                  widen_ref(narrow_nearest_ref(init, 2), 2))
    state = eng.export_table("t")
    assert state.values.dtype == np.uint16 and state.dtype == "float16"
    assert state.slots["accumulator"].dtype == np.uint16 and state.state_dtype == "float16"
    np.testing.assert_array_equal(state.values, narrow_nearest_ref(init, 2))
    # float32 values are narrowed on import; patterns are taken as they are
    state.values = init * 2
    eng.import_table("t", state)
    np.testing.assert_array_equal(eng.export_table("t").values, narrow_nearest_ref(init * 2, 2))
    assert round_table_id("t") == round_table_id("t") != round_table_id("u")


def test_import_converts_between_dtypes() -> None:
    """float16 patterns into a bfloat16 table are widened, then narrowed to nearest; a
    float32 table takes a half table's patterns widened exactly; the checkpoint importer
    widens patterns of another dtype before any engine sees them."""
    from embtrain.checkpoint.layout import TableData
    from embtrain.checkpoint.manager import _in_table_dtype

    opt = SparseOptimizerConfig("sgd")
    feats = [FeatureConfig("f", "t", "sum")]
    f16 = EmbeddingEngine([TableConfig("t", 20, 4, dtype="float16")], feats, opt, seed=1)
    bf16 = EmbeddingEngine([TableConfig("t", 20, 4, dtype="bfloat16")], feats, opt, seed=2)
    f32 = EmbeddingEngine([TableConfig("t", 20, 4)], feats, opt, seed=3)
    state = f16.export_table("t")
    wide = widen_ref(state.values, 2)
    bf16.import_table("t", state)
    np.testing.assert_array_equal(bf16.export_table("t").values, narrow_nearest_ref(wide, 1))
    f32.import_table("t", state)
    np.testing.assert_array_equal(f32.export_table("t").values, wide)
    data = TableData.from_state(state)
    assert data.dtype == "float16"
    moved = _in_table_dtype(bf16, "t", data)
    assert moved.dtype == "float32" and moved.values.dtype == np.float32
    np.testing.assert_array_equal(moved.values, wide)
    assert _in_table_dtype(f16, "t", data) is data
