"""20 training steps through embtrain (engine + dense model) equal a plain TensorFlow program.

The reference keeps every table as a ``tf.Variable``, pools with
``tf.nn.embedding_lookup_sparse`` (``tf.gather`` for concat), takes the table gradients
from the tape (``IndexedSlices``), sums duplicate indices like ``tf.compat.v1`` optimizers
do, and applies TensorFlow's own sparse ops where they exist (``ResourceSparseApplyAdagradV2``,
``ResourceSparseApplyFtrlV2``, ``scatter_sub``); the update rules without a TF op
(rowwise_adagrad, lazy_adam, adam) are written with TF scatter/gather ops. Same initial
values (exported from the engine), same dense model weights (same seed), same batches.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from embtrain.data.batch import Batch  # noqa: E402
from embtrain.embedding.config import SparseInput  # noqa: E402
from embtrain.plan import Topology, make_plan  # noqa: E402
from embtrain.recipe import parse_recipe_text  # noqa: E402
from embtrain.train.builder import build_trainer  # noqa: E402

BATCH, STEPS, HOT = 64, 20, 3

RECIPE = """
version: 1
data: {{train: unused/*.parquet, batch_size: {batch}}}
features:
  - {{kind: dense, name: num, columns: [a, b, c]}}
  - {{kind: categorical, name: one, column: one, table: t_small, combiner: sum}}
  - {{kind: categorical, name: bag_mean, column: bm, table: t_big, hotness: variable, combiner: mean}}
  - {{kind: categorical, name: bag_sqrtn, column: bs, table: t_big, hotness: variable, combiner: sqrtn, weights: w}}
  - {{kind: categorical, name: cat, column: ct, table: t_mid, hotness: {hot}, combiner: concat}}
  - {{kind: categorical, name: wsum, column: ws, table: t_small, hotness: variable, combiner: sum, weights: w2}}
tables:
  - {{name: t_small, dim: 4, rows: 30}}
  - {{name: t_big, dim: 8, rows: 200}}
  - {{name: t_mid, dim: 4, rows: 50, initializer: {{type: normal, std: 0.1}}}}
optimizer:
  sparse: {sparse}
  dense: {{type: adam, lr: 0.01}}
model: {{type: dcn_v2, cross_layers: 1, deep: [16]}}
train: {{steps: {steps}, seed: 3}}
"""

OPTIMIZERS = {
    "sgd": "{type: sgd, lr: 0.5}",
    "adagrad": "{type: adagrad, lr: 0.3, initial_accumulator_value: 0.1}",
    "rowwise_adagrad": "{type: rowwise_adagrad, lr: 0.3}",
    "adam": "{type: adam, lr: 0.05}",
    "lazy_adam": "{type: lazy_adam, lr: 0.05}",
    "ftrl": "{type: ftrl, lr: 0.3, l1: 0.001, l2: 0.01, l2_shrinkage: 0.001}",
}


def make_batches(rng: np.random.Generator, recipe) -> list[dict]:
    rows = {t.name: t.rows for t in recipe.tables}
    batches = []
    for _ in range(STEPS):
        sparse: dict[str, SparseInput] = {}
        for f in recipe.categorical_features:
            n = rows[f.table]
            if f.hotness == "variable":
                lengths = rng.integers(1, 6, BATCH)  # no empty bags: TF's lookup_sparse drops them
            else:
                lengths = np.full(BATCH, int(f.hotness))
            offsets = np.zeros(BATCH + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            # power-law-ish keys with many duplicates
            keys = np.minimum((rng.pareto(1.2, offsets[-1]) * 3).astype(np.int64), n - 1)
            weights = rng.uniform(0.2, 2.0, offsets[-1]).astype(np.float32) if f.weights else None
            sparse[f.name] = SparseInput(keys, offsets, weights)
        dense = rng.normal(size=(BATCH, 3)).astype(np.float32)
        labels = (rng.random(BATCH) < 0.3).astype(np.float32)
        batches.append({"sparse": sparse, "dense": dense, "labels": labels})
    return batches


def build(recipe):
    """The trainer `embtrain run` builds (one process), its embedding, model and slots."""
    plan = make_plan(recipe, Topology(1, None, 64 * 2**30, 2**40))
    trainer = build_trainer(recipe, plan)
    return trainer, trainer.embedding, trainer.model, trainer.model.slots


class TFReference:
    """The plain-TensorFlow program: tf.Variable tables, lookup_sparse, TF sparse updates."""

    def __init__(self, recipe, engine, model, slots):
        self.recipe, self.model, self.slots = recipe, model, slots
        self.opt = recipe.optimizer.sparse
        self.tables = {name: tf.Variable(engine.export_table(name).values) for name in engine.table_names}
        dims = {t.name: t.dim for t in recipe.tables}
        self.slot = {}
        for name, var in self.tables.items():
            shape = (var.shape[0],) if self.opt.type == "rowwise_adagrad" else tuple(var.shape)
            if self.opt.type in ("adagrad", "rowwise_adagrad", "ftrl"):
                self.slot[(name, "acc")] = tf.Variable(tf.fill(shape, self.opt.initial_accumulator_value))
            if self.opt.type == "ftrl":
                self.slot[(name, "linear")] = tf.Variable(tf.zeros(shape))
            if self.opt.type in ("adam", "lazy_adam"):
                self.slot[(name, "m")] = tf.Variable(tf.zeros(shape))
                self.slot[(name, "v")] = tf.Variable(tf.zeros(shape))
                self.slot[(name, "last")] = np.full(var.shape[0], -1, np.int64)
        self.dims = dims
        self.features = {f.name: f for f in recipe.categorical_features}

    def lookup(self, name: str, inp: SparseInput) -> tf.Tensor:
        f = self.features[name]
        table = self.tables[f.table]
        if f.combiner == "concat":
            return tf.reshape(tf.gather(table, inp.keys.reshape(BATCH, -1)), (BATCH, -1))
        lengths = np.diff(inp.offsets)
        rows = np.repeat(np.arange(BATCH), lengths)
        cols = np.arange(inp.keys.shape[0]) - np.repeat(inp.offsets[:-1], lengths)
        idx = np.stack([rows, cols], 1).astype(np.int64)
        shape = (BATCH, int(lengths.max()))
        sp_ids = tf.SparseTensor(idx, inp.keys, shape)
        sp_w = None if inp.weights is None else tf.SparseTensor(idx, inp.weights, shape)
        return tf.nn.embedding_lookup_sparse(table, sp_ids, sp_w, combiner=f.combiner)

    def step(self, batch: dict, step: int) -> float:
        with tf.GradientTape() as tape:
            per_group: dict[int, list[tuple[int, tf.Tensor]]] = {}
            for slot in self.slots:
                per_group.setdefault(slot.group, []).append((slot.start, self.lookup(slot.name, batch["sparse"][slot.name])))
            groups = [tf.concat([t for _, t in sorted(per_group[g], key=lambda x: x[0])], axis=1)
                      for g in sorted(per_group)]
            logits = self.model.network(tf.constant(batch["dense"]), groups)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.constant(batch["labels"]), logits=logits)) * (1.0 / BATCH)
        names = list(self.tables)
        variables = [self.tables[n] for n in names] + list(self.model.trainable_variables)
        grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        dense_grads = grads[len(names):]
        self.model.optimizer.apply_gradients(zip(dense_grads, self.model.trainable_variables, strict=True))
        for name, grad in zip(names, grads[: len(names)], strict=True):
            if not isinstance(grad, tf.IndexedSlices):
                grad = tf.IndexedSlices(grad, tf.range(tf.shape(grad)[0]))
            unique, pos = tf.unique(grad.indices)
            summed = tf.math.unsorted_segment_sum(grad.values, pos, tf.shape(unique)[0])
            self.apply(name, unique, summed, step)
        return float(loss)

    def apply(self, name: str, idx: tf.Tensor, g: tf.Tensor, step: int) -> None:
        o, var = self.opt, self.tables[name]
        lr = tf.constant(o.lr, tf.float32)
        if o.type == "sgd":
            var.scatter_sub(tf.IndexedSlices(g * lr, idx))
        elif o.type == "adagrad":
            tf.raw_ops.ResourceSparseApplyAdagradV2(
                var=var.handle, accum=self.slot[(name, "acc")].handle, lr=lr,
                epsilon=tf.constant(o.epsilon, tf.float32), grad=g, indices=idx)
        elif o.type == "ftrl":
            tf.raw_ops.ResourceSparseApplyFtrlV2(
                var=var.handle, accum=self.slot[(name, "acc")].handle,
                linear=self.slot[(name, "linear")].handle, grad=g, indices=idx, lr=lr,
                l1=tf.constant(o.l1, tf.float32), l2=tf.constant(o.l2, tf.float32),
                l2_shrinkage=tf.constant(o.l2_shrinkage, tf.float32),
                lr_power=tf.constant(o.learning_rate_power, tf.float32))
        elif o.type == "rowwise_adagrad":
            acc_var = self.slot[(name, "acc")]
            acc = tf.gather(acc_var, idx) + tf.reduce_mean(g * g, axis=1)
            acc_var.scatter_update(tf.IndexedSlices(acc, idx))
            var.scatter_sub(tf.IndexedSlices(g * lr / (tf.sqrt(acc)[:, None] + o.epsilon), idx))
        else:  # adam, lazy_adam
            m_var, v_var = self.slot[(name, "m")], self.slot[(name, "v")]
            m, v = tf.gather(m_var, idx), tf.gather(v_var, idx)
            if o.type == "adam":
                last = self.slot[(name, "last")]
                gap = (step - last[idx.numpy()] - 1).astype(np.float32)
                m = m * tf.constant(np.power(np.float32(o.beta1), gap))[:, None]
                v = v * tf.constant(np.power(np.float32(o.beta2), gap))[:, None]
                last[idx.numpy()] = step
            m = o.beta1 * m + (1 - o.beta1) * g
            v = o.beta2 * v + (1 - o.beta2) * g * g
            t = step + 1
            lr_t = o.lr * np.sqrt(1 - o.beta2**t) / (1 - o.beta1**t)
            m_var.scatter_update(tf.IndexedSlices(m, idx))
            v_var.scatter_update(tf.IndexedSlices(v, idx))
            var.scatter_sub(tf.IndexedSlices(lr_t * m / (tf.sqrt(v) + o.epsilon), idx))


# Adam divides by sqrt(v) + 1e-8: for a row whose summed gradients nearly cancel, float32
# rounding of the dense network (a different summation order than TensorFlow's) moves the
# update by ~1e-6 after 20 steps. Every other optimizer stays within 1e-6.
TABLE_ATOL = {"adam": 4e-6, "lazy_adam": 4e-6}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_twenty_steps_equal_plain_tensorflow(optimizer: str) -> None:
    recipe = parse_recipe_text(RECIPE.format(batch=BATCH, hot=HOT, sparse=OPTIMIZERS[optimizer], steps=STEPS))
    batches = make_batches(np.random.default_rng(1234), recipe)
    trainer, engine, model, slots = build(recipe)
    _, _, ref_model, ref_slots = build(recipe)
    assert slots == ref_slots
    reference = TFReference(recipe, engine, ref_model, ref_slots)
    initial = {name: engine.export_table(name).values for name in engine.table_names}

    ours, theirs = [], []
    for step, batch in enumerate(batches):
        loss = trainer.step(Batch(BATCH, batch["dense"], batch["labels"], batch["sparse"]), step)
        ours.append(loss)
        theirs.append(reference.step(batch, step))

    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert abs(ours[-1] - ours[0]) > 1e-4, "training must move the loss"
    for name in engine.table_names:
        state = engine.export_table(name)
        np.testing.assert_allclose(state.values, reference.tables[name].numpy(), rtol=1e-5,
                                   atol=TABLE_ATOL.get(optimizer, 1e-6), err_msg=f"table {name}")
        assert not np.array_equal(state.values, initial[name]), f"table {name} was never updated"
    for ours_w, ref_w in zip(model.get_weights(), ref_model.get_weights(), strict=True):
        np.testing.assert_allclose(ours_w, ref_w, rtol=1e-5, atol=1e-6)
