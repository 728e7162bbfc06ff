"""The built-in ``mmoe`` on two labels against a plain TensorFlow/Keras MMoE on the same batches.

    python benchmarks/mmoe_reference.py [--rows 100000] [--epochs 2]

Data: ``gen-data`` rows for a quickstart-shaped recipe (4 dense columns, user/item/category
ids) with ``data.labels: [label, purchase]``: gen-data writes the click and derives the
purchase from it (a click kept with a probability set by the user id, see
:mod:`embtrain.data.labels_gen`), so the two tasks share a signal and differ. embtrain trains ``model: {type: mmoe, experts: 4, expert: [32], tower: [16]}`` with
``data.labels: [label, purchase]`` (sparse Adagrad, dense Adam). The reference is the same
architecture in Keras (``keras.layers.Embedding`` tables updated by Keras' Adagrad through
their IndexedSlices gradients, the network by Adam) fed the very batches embtrain's reader
yields (same shuffle). Prints each label's eval AUC for both and their difference, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

RECIPE = """
version: 1
name: mmoe_reference
data:
  train: {data}/train/*.parquet
  eval: {data}/eval/*.parquet
  labels: [label, purchase]
  batch_size: 1024
features:
  - {{kind: dense, name: numeric, columns: [I1, I2, I3, I4], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
  - {{kind: categorical, name: category, column: category, table: category}}
tables:
  - {{name: user, dim: 16, rows: 300}}
  - {{name: item, dim: 16, rows: 1000}}
  - {{name: category, dim: 16, rows: 100}}
optimizer:
  sparse: {{type: adagrad, lr: 0.1}}
  dense: {{type: adam, lr: 0.003}}
model: {{type: mmoe, experts: 4, expert: [32], tower: [16]}}
train: {{epochs: {epochs}, eval_at_end: true, log_every: 100, seed: 0}}
"""


def make_data(root: Path, rows: int) -> None:
    """gen-data for the two-label recipe (the purchase label is derived from the click, see
    :mod:`embtrain.data.labels_gen`)."""
    import embtrain.api as et

    et.gen_data(_recipe(root, 1), root, rows=rows, eval_rows=rows // 5, files=2, seed=7)


def _recipe(root: Path, epochs: int) -> dict:
    import yaml

    return yaml.safe_load(RECIPE.format(data=root, epochs=epochs))


def reference(recipe, epochs: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import keras
    import tensorflow as tf

    from embtrain.data import BatchReader
    from embtrain.metrics import auc

    keras.utils.set_random_seed(0)
    tables = {t.name: keras.layers.Embedding(t.rows, t.dim, name=t.name) for t in recipe.tables}
    feats = [(f.name, f.table) for f in recipe.categorical_features]
    cfg = recipe.model
    experts = [keras.Sequential([keras.layers.Dense(u, activation="relu") for u in cfg.expert])
               for _ in range(cfg.experts)]
    gates = [keras.layers.Dense(cfg.experts) for _ in range(2)]
    towers = [keras.Sequential([keras.layers.Dense(u, activation="relu") for u in cfg.tower]
                               + [keras.layers.Dense(1)]) for _ in range(2)]

    def forward(dense: tf.Tensor, ids: dict[str, tf.Tensor]) -> tf.Tensor:
        x = tf.concat([dense] + [tables[t](ids[n]) for n, t in feats], axis=1)
        stacked = tf.stack([e(x) for e in experts], axis=1)
        out = []
        for gate, tower in zip(gates, towers, strict=True):
            g = tf.nn.softmax(gate(x), axis=-1)
            out.append(tower(tf.reduce_sum(stacked * g[:, :, None], axis=1))[:, 0])
        return tf.stack(out, axis=1)

    sparse_opt = keras.optimizers.Adagrad(learning_rate=recipe.optimizer.sparse.lr,
                                          initial_accumulator_value=0.1, epsilon=1e-7)
    dense_opt = keras.optimizers.Adam(learning_rate=recipe.optimizer.dense.lr)

    def ids_of(batch) -> dict[str, tf.Tensor]:  # type: ignore[no-untyped-def]
        return {n: tf.constant(batch.sparse[n].keys) for n, _ in feats}

    first = next(iter(BatchReader(recipe, "train", prefetch=0)))
    forward(tf.constant(first.dense), ids_of(first))  # build every layer
    emb_vars = [t.embeddings for t in tables.values()]
    net_vars = [v for m in (*experts, *gates, *towers) for v in m.trainable_variables]

    @tf.function(reduce_retracing=True)
    def step(dense: tf.Tensor, ids: dict[str, tf.Tensor], y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = forward(dense, ids)
            loss = tf.reduce_mean(tf.reduce_sum(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits), axis=1))
        grads = tape.gradient(loss, emb_vars + net_vars)
        sparse_opt.apply_gradients(zip(grads[:len(emb_vars)], emb_vars, strict=True))
        dense_opt.apply_gradients(zip(grads[len(emb_vars):], net_vars, strict=True))
        return loss

    reader = BatchReader(recipe, "train", prefetch=0)
    for _ in range(epochs):
        for batch in reader:
            step(tf.constant(batch.dense), ids_of(batch), tf.constant(batch.label))
    ys, ps = [], []
    for batch in BatchReader(recipe, "eval", prefetch=0):
        ys.append(batch.label)
        ps.append(tf.sigmoid(forward(tf.constant(batch.dense), ids_of(batch))).numpy())
    y, p = np.concatenate(ys), np.concatenate(ps)
    return {"label": auc(y[:, 0], p[:, 0]), "purchase": auc(y[:, 1], p[:, 1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    import embtrain.api as et

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_data(root / "data", args.rows)
        recipe = et.load_recipe(_recipe(root / "data", args.epochs))
        start = time.perf_counter()
        summary = et.run(recipe, run_dir=root / "run")
        ours = {k: v["auc"] for k, v in summary.last_eval.labels.items()}
        seconds = time.perf_counter() - start
        ref = reference(recipe, args.epochs)
    out = {"rows": args.rows, "epochs": args.epochs, "embtrain_auc": ours, "reference_auc": ref,
           "difference": {k: round(ours[k] - ref[k], 4) for k in ours},
           "embtrain_seconds": round(seconds, 1)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
