"""Fused sparse optimizers against TensorFlow's own ops and NumPy oracles, over several steps."""

from __future__ import annotations

import numpy as np
import pytest

from embtrain.embedding import (
    EmbeddingEngine,
    FeatureConfig,
    InitializerConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.bench_engine import PowerLaw
from embtrain.embedding.reference import (
    apply_reference,
    init_slots,
    sum_duplicates,
    table_key_grads,
)
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES

RTOL, ATOL = 1e-5, 1e-6
STEPS = 4

TABLES = [
    TableConfig("a", 300, 8),
    TableConfig("b", 40, 16, InitializerConfig("normal", std=0.1)),
    TableConfig("c", 700, 16),
    TableConfig("d", 90, 6),
]
FEATURES = [
    FeatureConfig("a1", "a", "sum", 1),
    FeatureConfig("a10", "a", "sum", 10),
    FeatureConfig("b_mean", "b", "mean"),
    FeatureConfig("c_sqrtn", "c", "sqrtn"),
    FeatureConfig("c_w", "c", "sum"),
    FeatureConfig("d_cat", "d", "concat", 2),
    FeatureConfig("b1", "b", "mean", 1),
]
BATCH = 29

OPTIMIZERS = {
    "sgd": SparseOptimizerConfig("sgd", lr=0.5),
    "adagrad": SparseOptimizerConfig("adagrad", lr=0.1),
    "adagrad_acc0.5": SparseOptimizerConfig(
        "adagrad", lr=0.3, initial_accumulator_value=0.5, epsilon=1e-3
    ),
    "rowwise_adagrad": SparseOptimizerConfig("rowwise_adagrad", lr=0.1),
    "adam": SparseOptimizerConfig("adam", lr=0.01),
    "adam_b2": SparseOptimizerConfig("adam", lr=0.05, beta1=0.8, beta2=0.99, epsilon=1e-3),
    "lazy_adam": SparseOptimizerConfig("lazy_adam", lr=0.01),
    "ftrl": SparseOptimizerConfig("ftrl", lr=0.1),
    "ftrl_reg": SparseOptimizerConfig(
        "ftrl",
        lr=0.2,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.02,
        l2_shrinkage_regularization_strength=0.03,
    ),
    "ftrl_power": SparseOptimizerConfig(
        "ftrl",
        lr=0.05,
        learning_rate_power=-0.7,
        initial_accumulator_value=0.3,
        l1_regularization_strength=0.001,
        beta=0.1,
    ),
    "sgd_momentum": SparseOptimizerConfig("sgd_momentum", lr=0.1),
    "sgd_momentum_0.5": SparseOptimizerConfig("sgd_momentum", lr=0.2, options=(("momentum", 0.5),)),
}
# every registered optimizer, at its defaults, whether or not a config above names it
OPTIMIZERS.update({n: SparseOptimizerConfig(n, lr=0.1) for n in OPTIMIZER_NAMES if n not in OPTIMIZERS})


def step_inputs(rng: np.random.Generator) -> dict[str, SparseInput]:
    out = {}
    rows = {t.name: t.rows for t in TABLES}
    for f in FEATURES:
        if f.hotness is not None and f.combiner != "concat":
            lens = np.full(BATCH, f.hotness)
        else:
            lens = rng.integers(0, (f.hotness or 5) + 1, BATCH)
        offsets = np.zeros(BATCH + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        keys = PowerLaw(rows[f.table], 1.05).sample(rng, int(offsets[-1]))
        w = None
        if f.name in ("a1", "b_mean", "c_w", "d_cat", "c_sqrtn", "b1"):
            w = rng.uniform(0.2, 1.5, keys.size).astype(np.float32)
        out[f.name] = SparseInput(keys, offsets, w)
    return out


def run_steps(cfg: SparseOptimizerConfig, seed: int, check) -> None:
    """Train the engine STEPS steps; after each, ``check(step, engine, table, uniq, summed)``."""
    rng = np.random.default_rng(seed)
    eng = EmbeddingEngine(TABLES, FEATURES, cfg, seed=seed)
    for step in range(STEPS):
        inputs = step_inputs(rng)
        outs = eng.forward(inputs)
        grads = [(0.1 * rng.standard_normal(o.shape)).astype(np.float32) for o in outs]
        by_f = {f: grads[g][:, c : c + w] for f, (g, c, w) in eng.layout.items()}
        eng.backward_update(grads, step)
        for t in TABLES:
            keys, g = table_key_grads(FEATURES, inputs, by_f, t.name, t.dim)
            uniq, summed = sum_duplicates(keys, g)
            check(step, eng, t, uniq, summed)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_numpy_oracle(name, seed):
    cfg = OPTIMIZERS[name]
    ref: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}

    def check(step, eng, t, uniq, summed):
        if t.name not in ref:
            init = eng.export_table(t.name)  # values before any update = initial values
            values = EmbeddingEngine([t], [], cfg, seed=seed).export_table(t.name).values
            np.testing.assert_array_equal(values[~np.isin(np.arange(t.rows), uniq)],
                                          init.values[~np.isin(np.arange(t.rows), uniq)])  # fmt: skip
            ref[t.name] = (values, init_slots(cfg, t.rows, t.dim))
        values, slots = ref[t.name]
        apply_reference(cfg, values, slots, uniq, summed, step)
        state = eng.export_table(t.name)
        msg = f"{name} step {step} table {t.name}"
        np.testing.assert_allclose(state.values, values, rtol=RTOL, atol=ATOL, err_msg=msg)
        assert set(state.slots) == set(slots)
        for s, arr in slots.items():
            got = state.slots[s]
            if cfg.kind == "adam":  # moments of untouched rows decay lazily, at their next touch
                got, arr = got[uniq], arr[uniq]
            np.testing.assert_allclose(got, arr, rtol=RTOL, atol=ATOL, err_msg=f"{msg} slot {s}")

    run_steps(cfg, seed, check)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "name", ["sgd", "adagrad", "adagrad_acc0.5", "ftrl", "ftrl_reg", "ftrl_power"]
)
def test_optimizer_matches_tensorflow_op(name, seed):
    tf = pytest.importorskip("tensorflow")
    cfg = OPTIMIZERS[name]
    f32 = np.float32
    tvars: dict[str, dict[str, object]] = {}

    def check(step, eng, t, uniq, summed):
        if t.name not in tvars:
            values = EmbeddingEngine([t], [], cfg, seed=seed).export_table(t.name).values
            tvars[t.name] = {"var": tf.Variable(values)}
            for s, arr in init_slots(cfg, t.rows, t.dim).items():
                tvars[t.name][s] = tf.Variable(arr)
        v = tvars[t.name]
        # Like tf.compat.v1 optimizers: sum duplicate indices, then the sparse op.
        keys, g = table_key_grads(FEATURES, inputs_of[step], by_f_of[step], t.name, t.dim)
        ids, idx = tf.unique(tf.constant(keys))
        grad = tf.math.unsorted_segment_sum(tf.constant(g), idx, tf.size(ids))
        lr = tf.constant(f32(cfg.lr))
        if cfg.kind == "sgd":
            tf.raw_ops.ResourceScatterAdd(resource=v["var"].handle, indices=ids, updates=-grad * lr)
        elif cfg.kind == "adagrad":
            tf.raw_ops.ResourceSparseApplyAdagradV2(
                var=v["var"].handle,
                accum=v["accumulator"].handle,
                lr=lr,
                epsilon=tf.constant(f32(cfg.epsilon)),
                grad=grad,
                indices=ids,
            )
        else:
            l2 = tf.constant(f32(cfg.l2_regularization_strength)) + tf.constant(f32(cfg.beta)) / (
                tf.constant(f32(2.0)) * lr
            )
            tf.raw_ops.ResourceSparseApplyFtrlV2(
                var=v["var"].handle,
                accum=v["accumulator"].handle,
                linear=v["linear"].handle,
                grad=grad,
                indices=ids,
                lr=lr,
                l1=tf.constant(f32(cfg.l1_regularization_strength)),
                l2=l2,
                l2_shrinkage=tf.constant(f32(cfg.l2_shrinkage_regularization_strength)),
                lr_power=tf.constant(f32(cfg.learning_rate_power)),
            )
        state = eng.export_table(t.name)
        msg = f"{name} step {step} table {t.name}"
        np.testing.assert_allclose(
            state.values, v["var"].numpy(), rtol=RTOL, atol=ATOL, err_msg=msg
        )
        for s in eng.slot_names:
            np.testing.assert_allclose(
                state.slots[s], v[s].numpy(), rtol=RTOL, atol=ATOL, err_msg=f"{msg} slot {s}"
            )

    # Record each step's inputs and gradients so the TF side sees exactly the same batch.
    inputs_of: dict[int, dict[str, SparseInput]] = {}
    by_f_of: dict[int, dict[str, np.ndarray]] = {}
    rng = np.random.default_rng(seed)
    eng = EmbeddingEngine(TABLES, FEATURES, cfg, seed=seed)
    for step in range(STEPS):
        inputs_of[step] = step_inputs(rng)
        outs = eng.forward(inputs_of[step])
        grads = [(0.1 * rng.standard_normal(o.shape)).astype(np.float32) for o in outs]
        by_f_of[step] = {f: grads[g][:, c : c + w] for f, (g, c, w) in eng.layout.items()}
        eng.backward_update(grads, step)
        for t in TABLES:
            check(step, eng, t, None, None)


def test_adam_moments_equal_dense_adam_after_skipped_steps():
    """A row touched at steps 0 and 3 only: its m, v equal dense Adam's at step 3."""
    cfg = SparseOptimizerConfig("adam", lr=0.01)
    t = TableConfig("t", 4, 8)
    eng = EmbeddingEngine([t], [FeatureConfig("f", "t", "sum", 1)], cfg, seed=0)
    rng = np.random.default_rng(0)
    m = np.zeros((4, 8), np.float32)
    v = np.zeros((4, 8), np.float32)
    b1, b2 = np.float32(0.9), np.float32(0.999)
    for step, key in enumerate([0, 1, 1, 0]):
        g = rng.standard_normal((1, 8)).astype(np.float32)
        eng.forward({"f": SparseInput.one_hot(np.array([key]))})
        eng.backward_update([g], step)
        full = np.zeros((4, 8), np.float32)
        full[key] = g[0]
        m = b1 * m + (np.float32(1) - b1) * full
        v = b2 * v + (np.float32(1) - b2) * full * full
    s = eng.export_table("t")
    np.testing.assert_allclose(s.slots["m"][0], m[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(s.slots["v"][0], v[0], rtol=RTOL, atol=ATOL)
    assert s.update_count.tolist() == [2, 2, 0, 0]
    assert s.last_step.tolist() == [3, 2, -1, -1]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", ["sgd_momentum", "sgd_momentum_0.5"])
def test_sgd_momentum_matches_tensorflow_op(name, seed):
    """``sgd_momentum`` == ``ResourceSparseApplyMomentum`` (duplicates summed first)."""
    tf = pytest.importorskip("tensorflow")
    cfg = OPTIMIZERS[name]
    mu = np.float32(dict(cfg.options).get("momentum", 0.9))
    rng = np.random.default_rng(seed)
    eng = EmbeddingEngine(TABLES, FEATURES, cfg, seed=seed)
    tvars = {t.name: (tf.Variable(eng.export_table(t.name).values),
                      tf.Variable(np.zeros((t.rows, t.dim), np.float32))) for t in TABLES}
    for step in range(STEPS):
        inputs = step_inputs(rng)
        outs = eng.forward(inputs)
        grads = [(0.1 * rng.standard_normal(o.shape)).astype(np.float32) for o in outs]
        by_f = {f: grads[g][:, c : c + w] for f, (g, c, w) in eng.layout.items()}
        eng.backward_update(grads, step)
        for t in TABLES:
            keys, g = table_key_grads(FEATURES, inputs, by_f, t.name, t.dim)
            ids, idx = tf.unique(tf.constant(keys))
            grad = tf.math.unsorted_segment_sum(tf.constant(g), idx, tf.size(ids))
            var, accum = tvars[t.name]
            tf.raw_ops.ResourceSparseApplyMomentum(
                var=var.handle, accum=accum.handle, lr=tf.constant(np.float32(cfg.lr)),
                grad=grad, indices=ids, momentum=tf.constant(mu), use_nesterov=False)
            state = eng.export_table(t.name)
            msg = f"{name} step {step} table {t.name}"
            np.testing.assert_allclose(state.values, var.numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=msg)
            np.testing.assert_allclose(state.slots["momentum"], accum.numpy(), rtol=RTOL,
                                       atol=ATOL, err_msg=msg)
