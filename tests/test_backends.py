"""Every kernel backend against NumPy oracles and against the CPU backend, through the
backend contract (:mod:`embtrain.kernels.contract`), on small fresh random inputs.

Parametrised over :func:`embtrain.kernels.available_backends`: the main test run checks
``cpu``; the simulator run (``NUMBA_ENABLE_CUDASIM=1``, its own pytest invocation in
``scripts/test.sh``) checks ``cuda`` too, thread by thread on the CPU. Shapes stay tiny (the
simulator runs one Python thread per CUDA thread). Outputs are poisoned with NaN before each
launch, ids sit at the table edges, bags are empty, one-hot, fixed and variable, keys are
duplicate-heavy (power law).
"""

from __future__ import annotations

import numpy as np
import pytest

from embtrain.embedding.bench_engine import PowerLaw
from embtrain.embedding.config import (
    FeatureConfig,
    InitializerConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.engine import EmbeddingEngine, _Group
from embtrain.embedding.initializers import initializer_code, table_base
from embtrain.embedding.optimizers import hyperparams, kind_code, slot_specs
from embtrain.embedding.reference import (
    apply_reference,
    init_reference,
    init_slots,
    pool_reference,
    sum_duplicates,
    table_key_grads,
)
from embtrain.kernels import available_backends, codes, default_backend, get_backend
from embtrain.kernels.contract import GroupTables, UpdateStep
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES

BACKENDS = available_backends()
# Without CUDA (or the simulator) there is no second backend: one case that says so.
OTHER_BACKENDS = [b for b in BACKENDS if b != "cpu"] or [
    pytest.param("cuda", marks=pytest.mark.skip(
        reason="no cuda backend in this run: no GPU with CuPy, and NUMBA_ENABLE_CUDASIM is not "
               "set (scripts/test.sh runs these under the simulator in its own invocation)"))]
OPTIMIZERS = OPTIMIZER_NAMES  # every registered sparse optimizer
RTOL = 1e-5

# (numpy's uint64 scalars warn on the hash's intended wrap-around under the simulator)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


def _tables(dim: int) -> list[TableConfig]:
    return [
        TableConfig("a", 41, dim),
        TableConfig("b", 7, dim, InitializerConfig("normal", std=0.3)),
        TableConfig("c", 23, dim, InitializerConfig("truncated_normal", std=0.5)),
    ]


FEATURES = [
    FeatureConfig("a_sum", "a", "sum"),
    FeatureConfig("a_mean_w", "a", "mean"),
    FeatureConfig("b_sqrtn_w", "b", "sqrtn"),
    FeatureConfig("b_one_hot", "b", "sum", 1),
    FeatureConfig("c_concat_w", "c", "concat", 3),
    FeatureConfig("c_fixed", "c", "mean", 2),
]
WEIGHTED = {"a_mean_w", "b_sqrtn_w", "c_concat_w"}


def _inputs(rng: np.random.Generator, tables: list[TableConfig], batch: int) -> dict:
    """Bags of every kind for FEATURES: variable (with empty bags), one-hot, fixed, concat
    (up to hotness), power-law keys with the first and last row of each table."""
    rows = {t.name: t.rows for t in tables}
    out = {}
    for f in FEATURES:
        n = rows[f.table]
        if f.combiner == "concat":
            lens, bag = rng.integers(0, f.hotness + 1, batch), 0
        elif f.hotness:
            lens, bag = np.full(batch, f.hotness), f.hotness
        else:
            lens, bag = rng.integers(0, 5, batch), 0
            lens[:2] = 0  # empty bags
        offsets = np.zeros(batch + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        nnz = int(offsets[-1])
        keys = PowerLaw(n, 1.2).sample(rng, nnz).astype(np.int64)
        keys[: min(nnz, 2)] = [0, n - 1][: min(nnz, 2)]  # the table's edges
        w = rng.uniform(0.1, 2.0, nnz).astype(np.float32) if f.name in WEIGHTED else None
        out[f.name] = SparseInput(keys, offsets, w, bag_size=bag)
    return out


class _Setup:
    """A fused group of the three tables on one backend: plan, state and inputs."""

    def __init__(self, backend: str, dim: int, opt: SparseOptimizerConfig, seed: int, batch: int):
        be = get_backend(backend)
        self.be = be
        self.tables = _tables(dim)
        self.group = _Group(0, dim, "float32", self.tables, FEATURES)
        self.plan = self.group.plan
        rng = np.random.default_rng(seed)
        host = np.concatenate(
            [rng.standard_normal((t.rows, dim)).astype(np.float32) for t in self.tables]
        )
        self.host_values = host
        self.opt = opt
        specs = slot_specs(opt)
        self.host_slots = [
            np.full((host.shape[0], 1 if s.per_row else dim), s.initial_value, np.float32)
            for s in specs
        ]
        self.state = GroupTables(
            be.xp.asarray(host.copy()),
            [be.xp.asarray(s.copy()) for s in self.host_slots],
            be.xp.asarray(np.zeros((host.shape[0], 2), np.int32)),
        )
        self.scratch = be.new_scratch(self.plan)
        if hasattr(self.scratch, "chunk"):
            self.scratch.chunk = 3  # hot rows summed in several pieces
        self.inputs = _inputs(rng, self.tables, batch)
        self.batch = batch

    def step(self):
        """Pack this setup's inputs for the backend."""
        xp, fz = self.be.xp, self._frozen
        no_w = xp.empty(0, np.float32)
        ins = [self.inputs[f.name] for f in FEATURES]
        return self.be.pack_step(
            self.plan,
            self.batch,
            [fz(xp.asarray(i.keys)) for i in ins],
            [fz(xp.asarray(i.offsets)) for i in ins],
            [fz(no_w if i.weights is None else xp.asarray(i.weights)) for i in ins],
            np.array([i.bag_size for i in ins], np.int64),
        )

    def _frozen(self, a):
        """As the engine hands inputs over (read-only on the CPU: the kernels' compiled types,
        no specialisation of the tests' own)."""
        return self.be.kernel_input(a)

    def forward(self) -> tuple[np.ndarray, np.ndarray]:
        out = self.be.xp.full((self.batch, self.plan.width), np.nan, dtype=np.float32)
        err = self.be.forward_group(self.plan, self.state, self.step(), out, self.scratch)
        return self.be.to_host(out), err

    def backward(self, grads: np.ndarray, step: int) -> bool:
        update = UpdateStep(kind_code(self.opt), hyperparams(self.opt, step), step)
        return self.be.backward_group(
            self.plan, self.state, self.step(), self._frozen(self.be.xp.asarray(grads)), update,
            self.scratch,
        )

    def table_slice(self, name: str) -> slice:
        ti = [t.name for t in self.tables].index(name)
        off = int(self.plan.table_offset[ti])
        return slice(off, off + int(self.plan.table_rows[ti]))


def _oracle_forward(s: _Setup) -> np.ndarray:
    cols = []
    for f in FEATURES:
        cols.append(pool_reference(s.host_values[s.table_slice(f.table)], f, s.inputs[f.name]))
    return np.concatenate(cols, axis=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("init", ["uniform", "normal", "truncated_normal", "constant", "zeros"])
def test_init_kernels_match_oracle_and_cpu_bit_for_bit(backend, init):
    be, cpu = get_backend(backend), get_backend("cpu")
    cfg = InitializerConfig(init, scale=0.2, std=0.7, value=1.5)
    kind, param = initializer_code(cfg)
    base = table_base(11, "tbl")
    out = be.xp.full((37, 5), np.nan, dtype=np.float32)
    be.init_range(out, np.int64(1000), base, kind, param)
    want = init_reference(cfg, 11, "tbl", np.arange(1000, 1037), 5)
    ref = np.full((37, 5), np.nan, np.float32)
    cpu.init_range(ref, np.int64(1000), base, kind, param)
    np.testing.assert_array_equal(be.to_host(out), ref)
    np.testing.assert_allclose(be.to_host(out), want, rtol=RTOL, atol=1e-7)
    rows = np.array([0, 5, 2**40 + 3, 7, 7, 123456789], np.int64)
    out = be.xp.full((rows.size, 5), np.nan, dtype=np.float32)
    be.init_rows(out, be.xp.asarray(rows), base, kind, param)
    ref = np.full((rows.size, 5), np.nan, np.float32)
    cpu.init_rows(ref, rows, base, kind, param)
    np.testing.assert_array_equal(be.to_host(out), ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dim", [8, 5])
def test_forward_matches_oracle_and_cpu(backend, seed, dim):
    opt = SparseOptimizerConfig("sgd")
    s = _Setup(backend, dim, opt, seed, batch=12)
    out, err = s.forward()
    assert not err.any()
    assert not np.isnan(out).any(), "every output element is written"
    np.testing.assert_allclose(out, _oracle_forward(s), rtol=RTOL, atol=1e-6)
    c = _Setup("cpu", dim, opt, seed, batch=12)
    ref, _ = c.forward()
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [-1, 41, 2**40])
def test_forward_flags_keys_out_of_range(backend, bad):
    s = _Setup(backend, 4, SparseOptimizerConfig("sgd"), 3, batch=6)
    a = s.inputs["a_sum"]
    a.keys[int(a.offsets[-1]) - 1] = bad
    _, err = s.forward()
    fi = [f.name for f in FEATURES].index("a_sum")
    assert err[fi, codes.BAD_KEY] == 1
    assert err[np.arange(len(FEATURES)) != fi].sum() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_flags_malformed_bags(backend):
    s = _Setup(backend, 4, SparseOptimizerConfig("sgd"), 4, batch=6)
    s.inputs["c_concat_w"] = SparseInput(
        np.zeros(8, np.int64), np.array([0, 4, 4, 4, 4, 4, 8]), None
    )  # bags of 4 keys, hotness 3
    _, err = s.forward()
    fi = [f.name for f in FEATURES].index("c_concat_w")
    assert err[fi, codes.BAD_OFFSETS] == 1 and err[fi, codes.BAD_KEY] == 0
    m = s.inputs["a_sum"]
    m.offsets[3] = m.offsets[4] + 1  # decreasing
    _, err = s.forward()
    assert err[[f.name for f in FEATURES].index("a_sum"), codes.BAD_OFFSETS] == 1


def _oracle_update(s: _Setup, grads: np.ndarray, step: int) -> tuple[np.ndarray, list]:
    """Values and slots after one update from the setup's host state (fresh rows)."""
    values = s.host_values.copy()
    slot_names = [sp.name for sp in slot_specs(s.opt)]
    slots = [x.copy() for x in s.host_slots]
    dim = s.plan.dim
    per_feature = {}
    for fi, f in enumerate(FEATURES):
        c0 = int(s.plan.feat_col[fi])
        per_feature[f.name] = grads[:, c0 : c0 + int(s.plan.feat_width[fi])]
    for t in s.tables:
        sl = s.table_slice(t.name)
        keys, g = table_key_grads(FEATURES, s.inputs, per_feature, t.name, dim)
        if keys.size == 0:
            continue
        uk, ug = sum_duplicates(keys, g)
        tv = values[sl]
        ts = init_slots(s.opt, t.rows, dim)
        for name, arr in zip(slot_names, slots, strict=True):
            ts[name] = arr[sl].reshape(ts[name].shape).copy()
        apply_reference(s.opt, tv, ts, uk, ug, step)
        values[sl] = tv
        for name, arr in zip(slot_names, slots, strict=True):
            arr[sl] = ts[name].reshape(arr[sl].shape)
    return values, slots


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_backward_update_matches_oracle_and_cpu(backend, opt):
    cfg = SparseOptimizerConfig(opt, lr=0.1)
    s = _Setup(backend, 8, cfg, 5, batch=10)
    c = _Setup("cpu", 8, cfg, 5, batch=10)
    grads = np.random.default_rng(6).standard_normal((10, s.plan.width)).astype(np.float32)
    for setup in (s, c):
        setup.forward()
        assert not setup.backward(grads, 0)
    want_v, want_s = _oracle_update(s, grads, 0)
    got_v = s.be.to_host(s.state.values)
    np.testing.assert_allclose(got_v, want_v, rtol=RTOL, atol=1e-6)
    for got, want in zip(s.state.slots, want_s, strict=True):
        np.testing.assert_allclose(s.be.to_host(got), want, rtol=RTOL, atol=1e-6)
    meta = s.be.to_host(s.state.meta)
    touched = np.zeros(meta.shape[0], bool)
    for f in FEATURES:
        touched[s.table_slice(f.table).start + s.inputs[f.name].keys] = True
    np.testing.assert_array_equal(meta[touched], [[1, 1]] * int(touched.sum()))
    np.testing.assert_array_equal(meta[~touched], 0)
    np.testing.assert_array_equal(got_v[~touched], s.host_values[~touched])
    # a second step, later (adam decays the moments of the skipped steps): same as the CPU
    grads2 = np.random.default_rng(7).standard_normal(grads.shape).astype(np.float32)
    for setup in (s, c):
        setup.inputs = _inputs(np.random.default_rng(8), setup.tables, 10)
        setup.forward()
        assert not setup.backward(grads2, 3)
    np.testing.assert_allclose(
        s.be.to_host(s.state.values), c.be.to_host(c.state.values), rtol=RTOL, atol=1e-6
    )
    for got, want in zip(s.state.slots, c.state.slots, strict=True):
        np.testing.assert_allclose(s.be.to_host(got), c.be.to_host(want), rtol=RTOL, atol=1e-6)
    np.testing.assert_array_equal(s.be.to_host(s.state.meta), c.be.to_host(c.state.meta))


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_duplicate_heavy_batch(backend):
    """Every key of every feature on two rows: long segments, one sum each."""
    cfg = SparseOptimizerConfig("adagrad", lr=0.1)
    s = _Setup(backend, 4, cfg, 9, batch=16)
    for name, inp in s.inputs.items():
        t = next(f.table for f in FEATURES if f.name == name)
        inp.keys[:] = np.where(np.arange(inp.keys.size) % 3 == 0, 1, s.table_slice(t).stop - s.table_slice(t).start - 1)
    grads = np.random.default_rng(10).standard_normal((16, s.plan.width)).astype(np.float32)
    s.forward()
    assert not s.backward(grads, 0)
    want_v, _ = _oracle_update(s, grads, 0)
    np.testing.assert_allclose(s.be.to_host(s.state.values), want_v, rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_reports_keys_changed_after_forward(backend):
    cfg = SparseOptimizerConfig("sgd", lr=0.1)
    s = _Setup(backend, 4, cfg, 11, batch=8)
    s.forward()
    s.inputs["b_one_hot"].keys[2] = 10**6
    grads = np.ones((8, s.plan.width), np.float32)
    assert s.backward(grads, 0)
    assert np.isfinite(s.be.to_host(s.state.values)).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_and_fill(backend):
    be = get_backend(backend)
    rng = np.random.default_rng(12)
    src = rng.standard_normal((20, 3)).astype(np.float32)
    rows = rng.integers(0, 20, 9)
    out = be.xp.full((9, 3), np.nan, dtype=np.float32)
    be.gather_rows(be.xp.asarray(src), be.xp.asarray(rows), out)
    np.testing.assert_array_equal(be.to_host(out), src[rows])
    for fill, dtype, v in [(be.fill_f32, np.float32, 2.5), (be.fill_i32, np.int32, -3),
                           (be.fill_i64, np.int64, 2**40)]:  # fmt: skip
        a = be.xp.zeros(11, dtype=dtype)
        fill(a, v)
        np.testing.assert_array_equal(be.to_host(a), np.full(11, v, dtype))


def _engine_inputs(rng: np.random.Generator, batch: int) -> dict[str, SparseInput]:
    return {
        "u": SparseInput.one_hot(rng.integers(0, 30, batch)),
        "v": SparseInput(
            rng.integers(0, 50, 3 * batch), np.arange(0, 3 * batch + 1, 3), None, bag_size=3
        ),
        "w": SparseInput(
            rng.integers(0, 50, 2 * batch),
            np.arange(0, 2 * batch + 1, 2),
            rng.uniform(0.5, 1.5, 2 * batch).astype(np.float32),
        ),
    }


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
@pytest.mark.parametrize("opt", ["adagrad", "adam"])
def test_engine_end_to_end_equals_cpu(backend, opt):
    """forward, backward_update, export/import on the backend == the CPU engine."""
    tables = [TableConfig("t8", 30, 8), TableConfig("t4", 50, 4)]
    feats = [
        FeatureConfig("u", "t8", "sum"),
        FeatureConfig("v", "t4", "mean", 3),
        FeatureConfig("w", "t4", "sqrtn"),
    ]
    cfg = SparseOptimizerConfig(opt, lr=0.05)
    eng = EmbeddingEngine(tables, feats, cfg, seed=3, backend=backend)
    ref = EmbeddingEngine(tables, feats, cfg, seed=3, backend="cpu")
    be = eng.backend
    for name in ("t8", "t4"):  # initialised on the device == on the CPU, bit for bit
        np.testing.assert_array_equal(eng.export_table(name).values, ref.export_table(name).values)
    rng = np.random.default_rng(13)
    for step in range(3):
        inputs = _engine_inputs(rng, 8)
        outs = eng.forward(inputs)
        want = ref.forward(inputs)
        for o, w in zip(outs, want, strict=True):
            np.testing.assert_allclose(be.to_host(o), w, rtol=RTOL, atol=1e-6)
        grads = [np.tanh(w) + 0.1 for w in want]
        eng.backward_update([be.xp.asarray(g) for g in grads], step)
        ref.backward_update(grads, step)
    for name in ("t8", "t4"):
        a, b = eng.export_table(name), ref.export_table(name)
        assert isinstance(a.values, np.ndarray)
        np.testing.assert_allclose(a.values, b.values, rtol=RTOL, atol=1e-6)
        for k in b.slots:
            np.testing.assert_allclose(a.slots[k], b.slots[k], rtol=RTOL, atol=1e-6)
        np.testing.assert_array_equal(a.update_count, b.update_count)
        np.testing.assert_array_equal(a.last_step, b.last_step)
    # import a CPU checkpoint into the device engine: equal state, then equal steps
    for name in ("t8", "t4"):
        eng.import_table(name, ref.export_table(name))
        np.testing.assert_array_equal(eng.read_rows(name, np.arange(5)), ref.read_rows(name, np.arange(5)))
    inputs = _engine_inputs(rng, 8)
    for o, w in zip(eng.forward(inputs), ref.forward(inputs), strict=True):
        np.testing.assert_allclose(be.to_host(o), w, rtol=RTOL, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(default_backend() != "cuda", reason="needs a GPU, numba-cuda and CuPy")
def test_outputs_and_gradients_cross_to_torch_through_dlpack_without_copies():
    """On a real GPU: pooled outputs are CuPy arrays PyTorch (and TensorFlow) can take over
    through DLPack at the same address, and gradients come back the same way."""
    torch = pytest.importorskip("torch")
    tables = [TableConfig("t8", 30, 8), TableConfig("t4", 50, 4)]
    feats = [FeatureConfig("u", "t8", "sum"), FeatureConfig("v", "t4", "mean", 3),
             FeatureConfig("w", "t4", "sqrtn")]  # fmt: skip
    eng = EmbeddingEngine(tables, feats, SparseOptimizerConfig("adagrad"), 0, backend="cuda")
    xp = eng.backend.xp
    outs = eng.forward(_engine_inputs(np.random.default_rng(0), 16))
    for o in outs:
        t = torch.from_dlpack(o)
        assert t.is_cuda and t.data_ptr() == o.data.ptr
    grads = [torch.full(tuple(o.shape), 0.5, device="cuda") for o in outs]
    back = [xp.from_dlpack(g) for g in grads]
    assert all(b.data.ptr == g.data_ptr() for b, g in zip(back, grads, strict=True))
    before = eng.export_table("t8").values
    eng.backward_update(back, 0)
    assert not np.array_equal(eng.export_table("t8").values, before)
