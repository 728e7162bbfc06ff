"""The CUDA kernels on half tables (bfloat16 / float16 patterns in ``np.uint16`` arrays), under
numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``; scripts/test.sh's simulator line).

Forward: pooling a half table equals pooling its widened float32 values, bit for bit. Update,
every optimizer × {bf16, f16}: the half kernels compute in float32 exactly as the float32
kernels do on the widened state, then narrow; so the expected state is the float32 kernels'
result narrowed by the NumPy reference (:mod:`embtrain.embedding.reference_halves`) with the
same random bits (``round_bits_ref`` of seed, step, table id, global row, global column):
bit for bit, for stochastic rounding and round to nearest, optimizer state in float32 or in
the table's dtype. And the result is within one half ulp of the NumPy optimizer oracle.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embtrain.embedding.config import SparseOptimizerConfig
from embtrain.embedding.optimizers import hyperparams, kind_code, slot_specs
from embtrain.embedding.reference import apply_reference, init_slots, sum_duplicates
from embtrain.embedding.reference_halves import (
    narrow_nearest_ref,
    narrow_stochastic_ref,
    round_bits_ref,
    slot_column_ref,
    widen_ref,
)
from embtrain.kernels import available_backends, codes, get_backend
from embtrain.kernels.contract import GroupPlan, GroupTables, UpdateStep
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from embtrain.kernels.rules.halves import round_table_id

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.skipif("cuda" not in available_backends(), reason=(
        "no cuda backend in this run: scripts/test.sh runs these under NUMBA_ENABLE_CUDASIM=1")),
]

OPTIMIZERS = OPTIMIZER_NAMES  # every registered sparse optimizer
KINDS = [pytest.param(codes.VAL_BF16, id="bf16"), pytest.param(codes.VAL_F16, id="f16")]
DIM = 4
ROWS = (13, 9)  # tables "a" and "b"
NAMES = ("a", "b")
SEED = 2026
# (table id, row offset, row stride, first column) of each table in its full table: "b" is a
# shard (every other row from row 5, columns from 4) so global rows and columns are exercised
TABLE_ROUND = np.array([[round_table_id("a"), 0, 1, 0], [round_table_id("b"), 5, 2, 4]],
                       np.int64)
# features: (table, combiner, hotness, fixed bag size, weighted)
FEATURES = [(0, codes.COMB_SUM, 0, 0, True), (1, codes.COMB_MEAN, 0, 0, False),
            (0, codes.COMB_CONCAT, 2, 0, True), (1, codes.COMB_SUM, 0, 1, False)]
BATCH = 6


def _plan(value_code: int, slot_code: int, rounding: int) -> GroupPlan:
    widths = [DIM * (hot if comb == codes.COMB_CONCAT else 1) for _, comb, hot, _, _ in FEATURES]
    cols = np.concatenate([[0], np.cumsum(widths)[:-1]]).astype(np.int64)
    table_of = np.array([f[0] for f in FEATURES], np.int64)
    tf_idx = np.argsort(table_of, kind="stable").astype(np.int64)
    tf_ptr = np.concatenate([[0], np.cumsum(np.bincount(table_of, minlength=2))]).astype(np.int64)
    return GroupPlan(
        dim=DIM, width=int(sum(widths)),
        table_offset=np.array([0, ROWS[0]], np.int64), table_rows=np.array(ROWS, np.int64),
        feat_table=table_of, feat_col=cols, feat_width=np.array(widths, np.int64),
        feat_comb=np.array([f[1] for f in FEATURES], np.int64),
        feat_hot=np.array([f[2] for f in FEATURES], np.int64), tf_ptr=tf_ptr, tf_idx=tf_idx,
        value_code=value_code, slot_code=slot_code, rounding=rounding, round_seed=SEED,
        table_round=TABLE_ROUND,
    )  # fmt: skip


def _inputs(rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """Per feature: keys (duplicate-heavy), offsets, weights (or empty), fixed bag size."""
    out = []
    for t, _comb, hot, bag, weighted in FEATURES:
        lens = (np.full(BATCH, bag) if bag else
                rng.integers(0, (hot or 3) + 1, BATCH))
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        keys = rng.integers(0, min(ROWS[t], 5), int(offsets[-1])).astype(np.int64)
        keys[:1] = ROWS[t] - 1  # the table's last row
        w = rng.uniform(0.5, 1.5, keys.size).astype(np.float32) if weighted else np.zeros(0, np.float32)
        out.append((keys, offsets, w, bag))
    return out


class _Run:
    """A group's state and scratch on the cuda backend for one plan."""

    def __init__(self, plan: GroupPlan, values: np.ndarray, slots: list[np.ndarray],
                 meta: np.ndarray):
        self.be = get_backend("cuda")
        self.plan = plan
        xp = self.be.xp
        self.state = GroupTables(xp.asarray(values.copy()), [xp.asarray(s.copy()) for s in slots],
                                 xp.asarray(meta.copy()))
        self.scratch = self.be.new_scratch(plan)
        self.scratch.chunk = 3  # hot rows summed in several pieces

    def pack(self, inputs):
        xp = self.be.xp
        return self.be.pack_step(
            self.plan, BATCH, [xp.asarray(k) for k, _, _, _ in inputs],
            [xp.asarray(o) for _, o, _, _ in inputs], [xp.asarray(w) for _, _, w, _ in inputs],
            np.array([b for _, _, _, b in inputs], np.int64))

    def forward(self, inputs) -> np.ndarray:
        out = self.be.xp.full((BATCH, self.plan.width), np.nan, dtype=np.float32)
        err = self.be.forward_group(self.plan, self.state, self.pack(inputs), out, self.scratch)
        assert not err.any()
        return self.be.to_host(out)

    def backward(self, inputs, grads: np.ndarray, opt: SparseOptimizerConfig, step: int) -> None:
        update = UpdateStep(kind_code(opt), hyperparams(opt, step), step)
        assert not self.be.backward_group(self.plan, self.state, self.pack(inputs),
                                          self.be.xp.asarray(grads), update, self.scratch)

    def host(self) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        h = self.be.to_host
        return h(self.state.values), [h(s) for s in self.state.slots], h(self.state.meta)


def _initial_state(rng: np.random.Generator, opt: SparseOptimizerConfig
                   ) -> tuple[np.ndarray, list[np.ndarray]]:
    n = sum(ROWS)
    values = (rng.standard_normal((n, DIM)) * 0.5).astype(np.float32)
    slots = []
    for spec in slot_specs(opt):
        shape = (n, 1 if spec.per_row else DIM)
        jitter = np.abs(rng.standard_normal(shape)).astype(np.float32) * np.float32(0.01)
        slots.append((np.float32(spec.initial_value) + jitter).astype(np.float32))
    return values, slots


def _to_half(a: np.ndarray, code: int) -> np.ndarray:
    return a if code == codes.VAL_F32 else narrow_nearest_ref(a, code)


def _to_f32(a: np.ndarray, code: int) -> np.ndarray:
    return a if code == codes.VAL_F32 else widen_ref(a, code)


def _streams(plan: GroupPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group row: its table's id, its global row and its table's first global column."""
    t = np.repeat(np.arange(len(ROWS)), ROWS)
    local = np.arange(sum(ROWS)) - plan.table_offset[t]
    tr = plan.table_round[t]
    return tr[:, 0], tr[:, 1] + tr[:, 2] * local, tr[:, 3]


def _narrow_expected(x: np.ndarray, code: int, plan: GroupPlan, step: int,
                     slot: int | None) -> np.ndarray:
    """The reference narrowing of a group array ``x`` (values: ``slot`` None)."""
    if code == codes.VAL_F32:
        return x
    if plan.rounding == codes.ROUND_NEAREST:
        return narrow_nearest_ref(x, code)
    tid, grow, c0 = _streams(plan)
    cols = c0[:, None] + np.arange(x.shape[1])[None, :]
    if x.shape[1] == 1 and slot is not None:  # a row-wise slot: column 0 of the slot stream
        cols = np.zeros_like(cols)
    if slot is not None:
        cols = slot_column_ref(cols, slot)
    out = np.empty(x.shape, np.uint16)
    for r in range(x.shape[0]):  # one table id per row
        bits = round_bits_ref(SEED, step, int(tid[r]), np.full(x.shape[1], grow[r]), cols[r])
        out[r] = narrow_stochastic_ref(x[r], code, bits)
    return out


def _check_step(half: _Run, f32_plan: GroupPlan, inputs, grads, opt, step: int) -> None:
    """One update of ``half`` equals the float32 kernels' update of its widened state,
    narrowed by the reference (touched rows), and leaves untouched rows as they were."""
    plan = half.plan
    v0, s0, m0 = half.host()
    ref = _Run(f32_plan, _to_f32(v0, plan.value_code),
               [_to_f32(s, plan.slot_code) for s in s0], m0)
    half.backward(inputs, grads, opt, step)
    ref.backward(inputs, grads, opt, step)
    v1, s1, m1 = half.host()
    rv, rs, rm = ref.host()
    np.testing.assert_array_equal(m1, rm)
    touched = m1[:, 1] == step + 1
    assert touched.sum() >= 4
    want_v = _narrow_expected(rv, plan.value_code, plan, step, None)
    np.testing.assert_array_equal(v1[touched], want_v[touched])
    np.testing.assert_array_equal(v1[~touched], v0[~touched])
    for j, (got, want, before) in enumerate(zip(s1, rs, s0, strict=True)):
        want = _narrow_expected(want, plan.slot_code, plan, step, j)
        np.testing.assert_array_equal(got[touched], want[touched])
        np.testing.assert_array_equal(got[~touched], before[~touched])


def _oracle(opt, values: np.ndarray, slots: list[np.ndarray], inputs, grads, step: int):
    """The NumPy optimizer oracle on float32 copies (per table, summed duplicate gradients)."""
    values = values.copy()
    slots = [s.copy() for s in slots]
    names = [sp.name for sp in slot_specs(opt)]
    plan = _plan(codes.VAL_F32, codes.VAL_F32, codes.ROUND_NEAREST)
    for t in range(len(ROWS)):
        ks, gs = [], []
        for fi, (ft, comb, _hot, _, _) in enumerate(FEATURES):
            if ft != t:
                continue
            keys, offs, w, _ = inputs[fi]
            c0 = int(plan.feat_col[fi])
            for b in range(BATCH):
                s, e = int(offs[b]), int(offs[b + 1])
                ww = w[s:e] if w.size else np.ones(e - s, np.float32)
                scale = np.float32(1)
                if comb == codes.COMB_MEAN and e > s:
                    scale = np.float32(1) / ww.sum(dtype=np.float32)
                for j, p in enumerate(range(s, e)):
                    at = c0 + (j * DIM if comb == codes.COMB_CONCAT else 0)
                    ks.append(keys[p])
                    gs.append((ww[j] * scale) * grads[b, at : at + DIM])
        uk, ug = sum_duplicates(np.array(ks, np.int64), np.array(gs, np.float32))
        sl = slice(int(plan.table_offset[t]), int(plan.table_offset[t]) + ROWS[t])
        ts = init_slots(opt, ROWS[t], DIM)
        for name, arr in zip(names, slots, strict=True):
            ts[name] = arr[sl].reshape(ts[name].shape).copy()
        tv = values[sl]
        apply_reference(opt, tv, ts, uk, ug, step)
        values[sl] = tv
        for name, arr in zip(names, slots, strict=True):
            arr[sl] = ts[name].reshape(arr[sl].shape)
    return values, slots


def _config(opt: str) -> SparseOptimizerConfig:
    return SparseOptimizerConfig(opt, lr=0.05)


@pytest.mark.parametrize("kind", KINDS)
def test_forward_on_half_values_equals_widened_float32(kind):
    rng = np.random.default_rng(1)
    values, _ = _initial_state(rng, _config("sgd"))
    h = narrow_nearest_ref(values, kind)
    meta = np.zeros((sum(ROWS), 2), np.int32)
    inputs = _inputs(rng)
    got = _Run(_plan(kind, codes.VAL_F32, codes.ROUND_STOCHASTIC), h, [], meta).forward(inputs)
    want = _Run(_plan(codes.VAL_F32, codes.VAL_F32, codes.ROUND_STOCHASTIC), widen_ref(h, kind),
                [], meta).forward(inputs)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("rounding,state", [
    pytest.param(codes.ROUND_STOCHASTIC, "float32", id="stochastic-state_f32"),
    pytest.param(codes.ROUND_STOCHASTIC, "table", id="stochastic-state_half"),
    pytest.param(codes.ROUND_NEAREST, "table", id="nearest-state_half"),
])
def test_update_on_half_tables_equals_reference(kind, opt, rounding, state):
    cfg = _config(opt)
    rng = np.random.default_rng(10 * OPTIMIZERS.index(opt) + kind)
    scode = kind if state == "table" else codes.VAL_F32
    plan = _plan(kind, scode, rounding)
    f32_plan = _plan(codes.VAL_F32, codes.VAL_F32, rounding)
    values, slots = _initial_state(rng, cfg)
    meta = np.zeros((sum(ROWS), 2), np.int32)
    run = _Run(plan, _to_half(values, kind), [_to_half(s, scode) for s in slots], meta)
    width = plan.width
    # step 0: exact against the float32 kernels + reference narrowing, and within one half ulp
    # of the NumPy optimizer oracle
    inputs = _inputs(rng)
    grads = rng.standard_normal((BATCH, width)).astype(np.float32)
    v0, s0, _ = run.host()
    _check_step(run, f32_plan, inputs, grads, cfg, 0)
    want_v, want_s = _oracle(cfg, _to_f32(v0, kind), [_to_f32(s, scode) for s in s0],
                             inputs, grads, 0)
    v1, s1, m1 = run.host()
    touched = m1[:, 1] == 1
    rel = 2.0**-7 if kind == codes.VAL_BF16 else 2.0**-10
    np.testing.assert_allclose(widen_ref(v1, kind)[touched], want_v[touched], rtol=rel,
                               atol=1e-6)
    for got, want in zip(s1, want_s, strict=True):
        np.testing.assert_allclose(_to_f32(got, scode)[touched], want[touched],
                                   rtol=rel if scode != codes.VAL_F32 else 1e-5, atol=1e-6)
    # a later step on the narrowed state (adam: moments decayed over the skipped steps)
    _check_step(run, f32_plan, _inputs(rng),
                rng.standard_normal((BATCH, width)).astype(np.float32), cfg, 3)


def test_stochastic_rounding_depends_on_the_step_and_is_deterministic():
    """The same update twice gives the same bits; at another step other bits are drawn, so
    some element rounds the other way."""
    cfg = _config("sgd")
    rng = np.random.default_rng(7)
    values, _ = _initial_state(rng, cfg)
    h = narrow_nearest_ref(values, codes.VAL_BF16)
    meta = np.zeros((sum(ROWS), 2), np.int32)
    inputs = _inputs(rng)
    grads = (rng.standard_normal((BATCH, _plan(0, 0, 0).width)) * 1e-3).astype(np.float32)
    plan = _plan(codes.VAL_BF16, codes.VAL_F32, codes.ROUND_STOCHASTIC)
    results = {}
    for step, rep in [(0, 0), (0, 1), (1, 0)]:
        run = _Run(plan, h, [], meta)
        run.backward(inputs, grads, cfg, step)
        results[step, rep] = run.host()[0]
    np.testing.assert_array_equal(results[0, 0], results[0, 1])
    assert not np.array_equal(results[0, 0], results[1, 0])
    nearest = _Run(dataclasses.replace(plan, rounding=codes.ROUND_NEAREST), h, [], meta)
    nearest.backward(inputs, grads, cfg, 0)
    assert not np.array_equal(nearest.host()[0], results[0, 0])


@pytest.mark.parametrize("kind", KINDS)
def test_block_conversions_and_gather(kind):
    be = get_backend("cuda")
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((7, 5)) * 10.0 ** rng.uniform(-6, 5, (7, 5))).astype(np.float32)
    h = be.xp.zeros((7, 5), dtype=np.uint16)
    be.narrow_block(h, be.xp.asarray(x), kind)
    np.testing.assert_array_equal(be.to_host(h), narrow_nearest_ref(x, kind))
    w = be.xp.full((7, 5), np.nan, dtype=np.float32)
    be.widen_block(w, h, kind)
    np.testing.assert_array_equal(be.to_host(w), widen_ref(be.to_host(h), kind))
    rows = np.array([6, 0, 3, 3], np.int64)
    out = be.xp.full((4, 5), np.nan, dtype=np.float32)
    be.gather_widen(h, be.xp.asarray(rows), out, kind)
    np.testing.assert_array_equal(be.to_host(out), widen_ref(be.to_host(h)[rows], kind))
    a = be.xp.zeros(9, dtype=np.uint16)
    be.fill_u16(a, 0x3F80)
    np.testing.assert_array_equal(be.to_host(a), np.full(9, 0x3F80, np.uint16))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_engine_on_cuda_with_half_tables_equals_cpu(dtype):
    """The engine end to end on the cuda backend with half tables (float32 state on one,
    state in the table's dtype on the other): initial values, outputs and state after a few
    steps equal the CPU engine's (within one half ulp: the two backends sum a row's
    gradients in different orders), exports and imports in the stored form."""
    from embtrain.embedding.config import FeatureConfig, SparseInput, TableConfig
    from embtrain.embedding.engine import EmbeddingEngine
    from embtrain.embedding.halves import DTYPE_CODES

    code = DTYPE_CODES[dtype]
    tables = [TableConfig("t8", 30, 8, dtype=dtype),
              TableConfig("t4", 50, 4, dtype=dtype, optimizer_state="table")]
    feats = [FeatureConfig("u", "t8", "sum"), FeatureConfig("v", "t4", "mean", 3),
             FeatureConfig("w", "t4", "sqrtn")]
    cfg = SparseOptimizerConfig("adagrad", lr=0.05)
    eng = EmbeddingEngine(tables, feats, cfg, seed=3, backend="cuda")
    ref = EmbeddingEngine(tables, feats, cfg, seed=3, backend="cpu")
    be = eng.backend
    for name in ("t8", "t4"):
        np.testing.assert_array_equal(eng.export_table(name).values, ref.export_table(name).values)
    rng = np.random.default_rng(13)
    for step in range(3):
        batch = 8
        inputs = {
            "u": SparseInput.one_hot(rng.integers(0, 30, batch)),
            "v": SparseInput(rng.integers(0, 50, 3 * batch), np.arange(0, 3 * batch + 1, 3),
                             None, bag_size=3),
            "w": SparseInput(rng.integers(0, 50, 2 * batch), np.arange(0, 2 * batch + 1, 2),
                             rng.uniform(0.5, 1.5, 2 * batch).astype(np.float32)),
        }
        outs, want = eng.forward(inputs), ref.forward(inputs)
        for o, w in zip(outs, want, strict=True):
            np.testing.assert_allclose(be.to_host(o), w, rtol=1e-5, atol=1e-6)
        grads = [np.tanh(w) + 0.1 for w in want]
        eng.backward_update([be.xp.asarray(g) for g in grads], step)
        ref.backward_update(grads, step)
    rel = 2.0**-7 if code == codes.VAL_BF16 else 2.0**-10
    for name in ("t8", "t4"):
        a, b = eng.export_table(name), ref.export_table(name)
        assert a.values.dtype == np.uint16 and b.values.dtype == np.uint16
        np.testing.assert_allclose(widen_ref(a.values, code), widen_ref(b.values, code),
                                   rtol=rel, atol=1e-6)
        assert (a.values == b.values).mean() > 0.95
        for k in b.slots:
            got, exp = a.slots[k], b.slots[k]
            assert got.dtype == exp.dtype
            if exp.dtype == np.uint16:
                got, exp = widen_ref(got, code), widen_ref(exp, code)
            np.testing.assert_allclose(got, exp, rtol=rel, atol=1e-6)
        np.testing.assert_array_equal(a.update_count, b.update_count)
        # a CPU export imported on the device: the same rows read back, bit for bit
        eng.import_table(name, b)
        rows = np.arange(5)
        np.testing.assert_array_equal(eng.read_rows(name, rows), ref.read_rows(name, rows))
