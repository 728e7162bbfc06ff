"""Tests for embtrain.models: every recipe model type, the train step, checkpoint state, metrics."""

from __future__ import annotations

from itertools import combinations_with_replacement
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from embtrain.models import DenseModel, FeatureSlot, auc, build_model, logloss
from embtrain.models.buffers import aligned_empty, is_aligned
from tests.support.models import (
    NUM_DENSE,
    SLOTS,
    TYPES,
    VARIANTS,
    WIDTHS,
    batch,
    model_config,
    optimizer_config,
)

SGD = optimizer_config(type="sgd", lr=0.05)


def reference_loss(model: DenseModel, dense: np.ndarray, groups: list[tf.Tensor],
                   labels: np.ndarray) -> tf.Tensor:
    """Mean logistic loss written independently of the model's own loss code (eager)."""
    logits = model.network(tf.constant(dense), groups)
    return tf.reduce_mean(tf.math.softplus(logits) - tf.constant(labels) * logits)


# ---------------------------------------------------------------------- building


@pytest.mark.parametrize("kind", TYPES + list(VARIANTS))
def test_build_shapes_and_determinism(kind: str) -> None:
    dense, groups, _ = batch(16)
    a = build_model(model_config(kind), NUM_DENSE, SLOTS, seed=7)
    tf.random.uniform((3,))  # global RNG state must not matter
    np.random.seed(123)
    b = build_model(model_config(kind), NUM_DENSE, SLOTS, seed=7)
    c = build_model(model_config(kind), NUM_DENSE, SLOTS, seed=8)

    probs = a.predict(dense, groups)
    assert probs.shape == (16,) and probs.dtype == np.float32
    assert np.all((probs > 0) & (probs < 1))
    eager = tf.sigmoid(a.network(tf.constant(dense), [tf.constant(g) for g in groups])).numpy()
    np.testing.assert_allclose(probs, eager, rtol=1e-6, atol=1e-7)

    assert a.weight_names() == b.weight_names()
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)
    out_b = b.network(tf.constant(dense), [tf.constant(g) for g in groups]).numpy()
    out_a = a.network(tf.constant(dense), [tf.constant(g) for g in groups]).numpy()
    np.testing.assert_array_equal(out_a, out_b)
    assert any(not np.array_equal(wa, wc) for wa, wc in zip(a.get_weights(), c.get_weights(), strict=True))
    out_c = c.network(tf.constant(dense), [tf.constant(g) for g in groups]).numpy()
    assert not np.allclose(out_a, out_c)


def test_layer_shapes_follow_the_recipe() -> None:
    mlp = build_model(model_config("mlp"), NUM_DENSE, SLOTS, 0)
    shapes = [w.shape for w in mlp.get_weights()]
    assert shapes == [(3 + 24, 16), (16,), (16, 8), (8,), (8, 1), (1,)]
    # DLRM: a trailing 1 in `top` is the output layer, not an extra hidden layer.
    dlrm = build_model(model_config("dlrm"), NUM_DENSE, SLOTS, 0)
    names = dlrm.weight_names()
    assert [n.split(":")[0] for n in names] == [
        "dlrm/bottom/0/kernel", "dlrm/bottom/0/bias", "dlrm/bottom/1/kernel", "dlrm/bottom/1/bias",
        "dlrm/top/0/kernel", "dlrm/top/0/bias", "dlrm/out/kernel", "dlrm/out/bias"]
    # 1 bottom vector + 4 one-hot fields + 2 fields of the concat list = 7 vectors, 21 pairs.
    assert dlrm.get_weights()[4].shape == (4 + 21, 16)
    low = build_model(model_config("dcn_v2", low_rank=2, structure="stacked"), NUM_DENSE, SLOTS, 0)
    assert [w.shape for w in low.get_weights()[:3]] == [(27, 2), (2, 27), (27,)]
    assert low.get_weights()[-2].shape == (16, 1)


def test_invalid_configurations_are_reported() -> None:
    with pytest.raises(ValueError, match="bottom MLP's last layer"):
        build_model(model_config("dlrm", bottom=[8, 5]), NUM_DENSE, SLOTS, 0)
    mixed = [FeatureSlot("a", 0, 0, 4, 4), FeatureSlot("b", 1, 0, 8, 8)]
    with pytest.raises(ValueError, match="same dim"):
        build_model(model_config("deepfm"), NUM_DENSE, mixed, 0)
    with pytest.raises(ValueError, match="wide_features"):
        build_model(model_config("wide_deep", wide_features=["nope"]), NUM_DENSE, SLOTS, 0)
    with pytest.raises(ValueError, match="overlap"):
        build_model(model_config("mlp"), 0, [FeatureSlot("a", 0, 0, 4, 4), FeatureSlot("b", 0, 2, 4, 4)], 0)
    with pytest.raises(ValueError, match="multiple of dim"):
        FeatureSlot("a", 0, 0, 6, 4)
    model = build_model(model_config("mlp"), NUM_DENSE, SLOTS, 0)
    dense, groups, labels = batch(4)
    with pytest.raises(RuntimeError, match="make_optimizer"):
        model.train_step(dense, groups, labels)
    model.make_optimizer(SGD)
    with pytest.raises(ValueError, match="group 1"):
        model.train_step(dense, [groups[0], groups[1][:, :8]], labels)
    with pytest.raises(ValueError, match="not both"):
        model.train_step(dense, groups, labels, global_batch_size=8, loss_scale=0.1)


# --------------------------------------------------------------------- gradients


@pytest.mark.parametrize("kind", TYPES + list(VARIANTS))
def test_gradients_and_global_batch_convention(kind: str) -> None:
    n = 24
    dense, groups, labels = batch(n, seed=1)
    model = build_model(model_config(kind), NUM_DENSE, SLOTS, seed=3)
    model.make_optimizer(SGD)

    # Independent eager GradientTape on the same loss.
    g_t = [tf.constant(g) for g in groups]
    with tf.GradientTape() as tape:
        tape.watch(g_t)
        ref = reference_loss(model, dense, g_t, labels)
    ref_group = tape.gradient(ref, g_t)
    with tf.GradientTape() as tape:
        ref2 = reference_loss(model, dense, g_t, labels)
    ref_dense = tape.gradient(ref2, model.trainable_variables)

    loss, group_grads, dense_grads = model.gradients(dense, groups, labels)
    assert loss == pytest.approx(float(ref), rel=1e-5)
    for got, want, w in zip(group_grads, ref_group, WIDTHS, strict=True):
        assert got.shape == (n, w) and got.dtype == np.float32
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
    for got, want in zip(dense_grads, ref_dense, strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)

    # Directional finite difference of the loss along a random unit direction.
    rng = np.random.default_rng(2)
    direction = [rng.standard_normal(g.shape).astype(np.float32) for g in groups]
    norm = np.sqrt(sum(float((d**2).sum()) for d in direction))
    direction = [(d / norm).astype(np.float32) for d in direction]
    eps = 5e-4  # small enough that no ReLU kink lies within ±eps of these weights

    def loss_at(t: float) -> float:
        moved = [tf.constant(g + t * d) for g, d in zip(groups, direction, strict=True)]
        return float(reference_loss(model, dense, moved, labels))

    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    analytic = sum(float((g * d).sum()) for g, d in zip(group_grads, direction, strict=True))
    assert numeric == pytest.approx(analytic, rel=2e-2, abs=2e-4)

    # Global-batch convention: two halves with global_batch_size=n add up to the whole batch.
    h = n // 2
    halves = [
        model.gradients(dense[s], [g[s] for g in groups], labels[s], global_batch_size=n)
        for s in (slice(0, h), slice(h, n))
    ]
    assert halves[0][0] + halves[1][0] == pytest.approx(loss, rel=1e-5)
    for g in range(len(WIDTHS)):
        np.testing.assert_allclose(np.concatenate([halves[0][1][g], halves[1][1][g]]),
                                   group_grads[g], rtol=1e-5, atol=1e-7)
    for i in range(len(dense_grads)):
        np.testing.assert_allclose(halves[0][2][i] + halves[1][2][i], dense_grads[i],
                                   rtol=1e-4, atol=1e-6)
    # A smaller batch and another global size do not retrace.
    model.gradients(dense[:5], [g[:5] for g in groups], labels[:5], global_batch_size=7)
    assert model._grad_fn.experimental_get_tracing_count() == 1

    # train_step returns the same group gradients, computed before the update.
    before = model.get_weights()
    step_loss, step_grads = model.train_step(dense, groups, labels)
    assert step_loss == pytest.approx(loss, rel=1e-6)
    for got, want in zip(step_grads, group_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    for w0, w1, g in zip(before, model.get_weights(), dense_grads, strict=True):
        np.testing.assert_allclose(w1, w0 - 0.05 * g, rtol=1e-5, atol=1e-6)


def test_zero_copy_inputs_hook_and_no_retrace() -> None:
    dense, groups, labels = batch(32, seed=4)
    model = build_model(model_config("mlp"), NUM_DENSE, SLOTS, 0)
    model.make_optimizer(SGD)

    # Aligned arrays are borrowed (DLPack), unaligned ones copied: same results, inputs intact.
    aligned = [aligned_empty(g.shape) for g in groups]
    unaligned = [np.empty(g.size + 1, np.float32)[1:].reshape(g.shape) for g in groups]
    for a, u, g in zip(aligned, unaligned, groups, strict=True):
        a[...] = g
        u[...] = g
    assert all(is_aligned(a) for a in aligned) and not any(is_aligned(u) for u in unaligned)
    want = model.gradients(dense, groups, labels)
    for inputs in (aligned, unaligned, [tf.constant(g) for g in groups]):
        got = model.gradients(dense, inputs, labels)
        for x, z in zip(got[1] + got[2], want[1] + want[2], strict=True):
            np.testing.assert_array_equal(x, z)
    model.train_step(dense, aligned, labels)
    for a, g in zip(aligned, groups, strict=True):
        np.testing.assert_array_equal(a, g)
    seen: list[list[Any]] = []

    def zero(grads: list[Any]) -> list[Any]:
        seen.append(grads)
        return [tf.zeros_like(g) for g in grads]

    before = model.get_weights()
    model.train_step(dense, groups, labels, allreduce_dense_grads=zero)
    assert len(seen[0]) == len(model.trainable_variables)
    assert all(isinstance(g, tf.Tensor) for g in seen[0])
    for w0, w1 in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(w0, w1)

    # Doubling the gradients in the hook = twice the SGD step.
    _, _, dense_grads = model.gradients(dense, groups, labels)
    model.train_step(dense, groups, labels, allreduce_dense_grads=lambda gs: [2 * g for g in gs])
    for w0, w1, g in zip(before, model.get_weights(), dense_grads, strict=True):
        np.testing.assert_allclose(w1, w0 - 0.1 * g, rtol=1e-5, atol=1e-6)

    for n in (32, 17, 32, 5):
        model.train_step(dense[:n], [g[:n] for g in groups], labels[:n])
        model.predict(dense[:n], [g[:n] for g in groups])
    assert model._step_fn.experimental_get_tracing_count() == 1
    assert model._predict_fn.experimental_get_tracing_count() == 1


def test_no_dense_features() -> None:
    dense, groups, labels = batch(8, num_dense=0)
    for kind in ("dlrm", "mlp"):
        model = build_model(model_config(kind), 0, SLOTS, 0)
        model.make_optimizer(SGD)
        loss, grads = model.train_step(dense, groups, labels)
        assert np.isfinite(loss) and [g.shape for g in grads] == [(8, 12), (8, 12)]


# ------------------------------------------------------------------------ DLRM


def numpy_dot_interaction(bottom: np.ndarray | None, groups: list[np.ndarray], self_interaction: bool
                          ) -> np.ndarray:
    vectors = [] if bottom is None else [bottom]
    for s in SLOTS:
        cols = groups[s.group][:, s.start:s.end]
        vectors += [cols[:, k * s.dim:(k + 1) * s.dim] for k in range(s.fields)]
    pairs = [(i, j) for i, j in combinations_with_replacement(range(len(vectors)), 2)
             if self_interaction or i < j]
    dots = np.stack([(vectors[i] * vectors[j]).sum(axis=1) for i, j in pairs], axis=1)
    return dots if bottom is None else np.concatenate([bottom, dots], axis=1)


@pytest.mark.parametrize(("num_dense", "self_interaction"), [(3, False), (3, True), (0, False)])
def test_dlrm_dot_interaction_matches_numpy(num_dense: int, self_interaction: bool) -> None:
    dense, groups, _ = batch(5, seed=9, num_dense=num_dense)
    model = build_model(model_config("dlrm", self_interaction=self_interaction), num_dense, SLOTS, 0)
    bottom = None
    if num_dense:
        w = model.get_weights()
        bottom = np.maximum(np.maximum(dense @ w[0] + w[1], 0) @ w[2] + w[3], 0)
    got = model.network.interaction(tf.constant(dense), [tf.constant(g) for g in groups])
    got = tf.concat(got, axis=1).numpy() if isinstance(got, list) else got.numpy()
    want = numpy_dot_interaction(bottom, groups, self_interaction)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- learning


@pytest.mark.parametrize("kind", TYPES)
def test_learns_a_synthetic_problem(kind: str) -> None:
    rng = np.random.default_rng(5)
    n, bs = 2048, 256
    dense = rng.standard_normal((n, NUM_DENSE), dtype=np.float32)
    groups = [0.5 * rng.standard_normal((n, w), dtype=np.float32) for w in WIDTHS]
    # Labels: a known function of the embeddings (a pairwise interaction plus a linear part).
    score = ((groups[0][:, 0:4] * groups[1][:, 8:12]).sum(axis=1) + groups[0][:, 5]
             - groups[1][:, 2] + 0.5 * dense[:, 0])
    labels = (score > np.median(score)).astype(np.float32)
    model = build_model(model_config(kind), NUM_DENSE, SLOTS, seed=11)
    model.make_optimizer(optimizer_config(type="adam", lr=0.01))
    initial = logloss(labels, model.predict(dense, groups))
    for step in range(200):
        s = slice((step % (n // bs)) * bs, (step % (n // bs) + 1) * bs)
        loss, _ = model.train_step(dense[s], [g[s] for g in groups], labels[s])
        assert np.isfinite(loss)
    probs = model.predict(dense, groups)
    final = logloss(labels, probs)
    assert final < 0.9 * initial, (initial, final)
    assert final < 0.6 and auc(labels, probs) > 0.8, (final, auc(labels, probs))


# ------------------------------------------------------------- checkpoint state


@pytest.mark.parametrize("opt", [
    {"type": "sgd", "lr": 0.05, "momentum": 0.9},
    {"type": "adam", "lr": 0.01},
    {"type": "adagrad", "lr": 0.05},
])
def test_weights_and_optimizer_state_round_trip(opt: dict[str, Any]) -> None:
    data = [batch(16, seed=100 + i) for i in range(10)]
    kind = "deepfm" if opt["type"] == "adam" else "mlp"
    a = build_model(model_config(kind), NUM_DENSE, SLOTS, seed=1)
    a.make_optimizer(optimizer_config(**opt))
    for d, g, y in data[:5]:
        a.train_step(d, g, y)
    weights, state = a.get_weights(), a.optimizer_state()
    assert a.optimizer_state_names()[0] == "iteration" and int(state[0]) == 5
    assert len(state) > 1
    grads_a = [a.train_step(d, g, y)[1] for d, g, y in data[5:]]

    b = build_model(model_config(kind), NUM_DENSE, SLOTS, seed=2)  # other init, overwritten
    b.make_optimizer(optimizer_config(**opt))
    b.set_weights(weights)
    b.load_optimizer_state(state)
    grads_b = [b.train_step(d, g, y)[1] for d, g, y in data[5:]]
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)
    for sa, sb in zip(a.optimizer_state(), b.optimizer_state(), strict=True):
        np.testing.assert_array_equal(sa, sb)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        for x, z in zip(ga, gb, strict=True):
            np.testing.assert_array_equal(x, z)
    with pytest.raises(ValueError, match="shape"):
        b.set_weights([w.T if w.ndim == 2 else w for w in weights])
    with pytest.raises(ValueError, match="expected"):
        b.load_optimizer_state(state[:-1])


# ----------------------------------------------------------------------- metrics


def brute_force_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_brute_force_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    labels = (rng.random(n) < 0.3).astype(np.float32)
    labels[0], labels[1] = 0, 1
    scores = np.round(rng.random(n) + 0.3 * labels, 1)  # many ties
    assert auc(labels, scores) == pytest.approx(brute_force_auc(labels, scores), abs=1e-12)


def test_auc_edge_cases_and_keras() -> None:
    assert auc([0, 1], [0.2, 0.8]) == 1.0
    assert auc([0, 1], [0.8, 0.2]) == 0.0
    assert auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
    assert np.isnan(auc([1, 1], [0.1, 0.2]))
    rng = np.random.default_rng(0)
    labels = (rng.random(5000) < 0.3).astype(np.float32)
    scores = 1 / (1 + np.exp(-(rng.standard_normal(5000) + labels)))
    metric = tf.keras.metrics.AUC(num_thresholds=10000)
    metric.update_state(labels, scores)
    assert auc(labels, scores) == pytest.approx(float(metric.result()), abs=2e-3)


def test_logloss() -> None:
    labels = np.array([1, 0, 1, 0], np.float32)
    probs = np.array([0.9, 0.2, 0.6, 0.5])
    want = -np.mean([np.log(0.9), np.log(0.8), np.log(0.6), np.log(0.5)])
    assert logloss(labels, probs) == pytest.approx(want, rel=1e-12)
    assert logloss([1, 0], [0.0, 1.0]) == pytest.approx(-np.log(1e-7), rel=1e-6)
    bce = tf.keras.losses.BinaryCrossentropy()(labels, probs.astype(np.float32))
    assert logloss(labels, probs) == pytest.approx(float(bce), rel=1e-5)


def test_feature_slots_follow_engine_columns_so_each_group_is_one_run():
    from embtrain.bench.synthetic import build_recipe, load_model
    from embtrain.embedding import EmbeddingEngine
    from embtrain.embedding.from_recipe import (
        feature_configs,
        sparse_optimizer_config,
        table_configs,
    )
    from embtrain.models.slots import feature_slots, merge_runs

    # DE tiny: dim-8 and dim-16 tables interleaved in recipe order, shrunk to a few rows
    recipe = build_recipe(load_model("tiny"), scale=1e-5)
    engine = EmbeddingEngine(table_configs(recipe), feature_configs(recipe),
                             sparse_optimizer_config(recipe.optimizer.sparse), seed=0)
    assert len(engine.groups) == 2
    slots = feature_slots(recipe, engine.layout)
    assert sorted(s.name for s in slots) == sorted(f.name for f in recipe.categorical_features)
    for s in slots:
        assert (s.group, s.start, s.width) == tuple(engine.layout[s.name])
    runs = merge_runs(slots)
    assert [r.group for r in runs] == [0, 1]
    assert [r.width for r in runs] == [g.width for g in engine.groups]
