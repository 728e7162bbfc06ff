"""The ``native-tf`` baseline: the best plain TensorFlow program for a synthetic model.

* One ``tf.Variable`` per table (same shapes as embtrain's, initialised U[-0.05, 0.05) like
  Keras' ``Embedding``), built one table at a time from a callable so that no second copy of
  a table is ever alive.
* Lookup: ``tf.gather`` on the fixed-hotness ``[batch, hotness]`` ids and ``reduce_sum`` over
  the hotness axis (one-hot inputs: a plain gather). Measured on the tiny model at batch
  65536 on the 2-core machine, this is ~1.5× faster than ``tf.nn.embedding_lookup_sparse``
  (whose unique + segment-sum forward does not pay back).
* The MLP: ``keras.layers.Dense`` layers (ReLU, then a 1-unit output), sigmoid
  cross-entropy from logits, mean over the batch, with the Keras optimizer of the same kind.
* Sparse update: the tape's ``IndexedSlices`` on each table go to the TF1 optimizer
  (``tf.compat.v1.train.GradientDescentOptimizer`` / ``AdagradOptimizer`` /
  ``AdamOptimizer``): duplicate ids are summed (``unique`` + ``unsorted_segment_sum``) and
  the fused ``ResourceSparseApply*`` kernels touch only those rows (Adam, as TF defines it,
  decays its moments over the whole table every step).

The timed *step* is one ``tf.function`` doing all of it. A second, phased set of functions
(embedding forward; dense forward + backward + dense update; embedding backward + update,
building the same ``IndexedSlices`` the tape builds) gives the breakdown. A third function
runs the embedding part alone, fused (forward, the tape's backward from a given gradient of
the pooled outputs, sparse update): TF overlaps those ops better than the phased run does,
so the bench takes the faster of the two as the baseline's embedding time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from embtrain.bench.synthetic import LEARNING_RATES, InputSpec, TableSpec

INIT_SCALE = 0.05


def _sparse_optimizer(kind: str) -> Any:
    lr = LEARNING_RATES[kind]
    v1 = tf.compat.v1.train
    if kind == "sgd":
        return v1.GradientDescentOptimizer(lr)
    if kind == "adagrad":
        return v1.AdagradOptimizer(lr, initial_accumulator_value=0.1)
    if kind == "adam":
        return v1.AdamOptimizer(lr, beta1=0.9, beta2=0.999, epsilon=1e-7)
    raise ValueError(f"unknown optimizer {kind!r}")


def _dense_optimizer(kind: str) -> keras.optimizers.Optimizer:
    lr = LEARNING_RATES[kind]
    if kind == "sgd":
        return keras.optimizers.SGD(learning_rate=lr)
    if kind == "adagrad":
        return keras.optimizers.Adagrad(
            learning_rate=lr, initial_accumulator_value=0.1, epsilon=1e-7
        )
    return keras.optimizers.Adam(learning_rate=lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7)


class NativeTF:
    """Tables, MLP and optimizers of the baseline, with the fused and the phased step."""

    def __init__(
        self,
        tables: Sequence[TableSpec],
        inputs: Sequence[InputSpec],
        numerical: int,
        mlp: Sequence[int],
        optimizer: str,
        seed: int = 0,
        interact_stride: int | None = None,
    ):
        tf.random.set_seed(seed)
        self.inputs = list(inputs)
        self.tables: list[tf.Variable] = []
        for i, t in enumerate(tables):
            self.tables.append(
                tf.Variable(
                    lambda t=t, i=i: tf.random.stateless_uniform(
                        [t.rows, t.dim], seed=[seed, i], minval=-INIT_SCALE, maxval=INIT_SCALE
                    ),
                    name=t.name,
                    dtype=tf.float32,
                    shape=[t.rows, t.dim],
                )
            )
        index = {t.name: i for i, t in enumerate(tables)}
        self.table_of = [index[s.table] for s in self.inputs]
        width = sum(s.dim for s in self.inputs)
        self.interact = None
        if interact_stride is not None:
            self.interact = keras.layers.AveragePooling1D(
                interact_stride, padding="same", data_format="channels_first"
            )
            width = -(-width // interact_stride)
        layers: list[keras.layers.Layer] = [keras.layers.Dense(n, activation="relu") for n in mlp]
        layers.append(keras.layers.Dense(1))
        self.mlp = keras.Sequential(layers)
        self.mlp.build((None, width + numerical))
        self.dense_vars = list(self.mlp.trainable_variables)
        self.dense_opt = _dense_optimizer(optimizer)
        self.dense_opt.build(self.dense_vars)
        self.sparse_opt = _sparse_optimizer(optimizer)
        self.step = tf.function(self._step)
        self.emb_forward = tf.function(self._emb_forward)
        self.dense_step = tf.function(self._dense_step)
        self.emb_update = tf.function(self._emb_update)
        self.emb_step = tf.function(self._emb_step)

    # ----------------------------------------------------------------- building blocks

    def _emb_forward(self, ids: list[tf.Tensor]) -> list[tf.Tensor]:
        out = []
        for spec, t, x in zip(self.inputs, self.table_of, ids, strict=True):
            table = self.tables[t]
            if spec.hotness == 1:
                out.append(tf.gather(table, tf.reshape(x, [-1])))
            else:
                out.append(tf.reduce_sum(tf.gather(table, x), axis=1))
        return out

    def _logits(self, pooled: list[tf.Tensor], dense: tf.Tensor) -> tf.Tensor:
        x = tf.concat(pooled, axis=1)
        if self.interact is not None:
            x = tf.squeeze(self.interact(tf.expand_dims(x, axis=0)), axis=0)
        return self.mlp(tf.concat([x, dense], axis=1))[:, 0]

    @staticmethod
    def _loss(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))

    # ----------------------------------------------------------------------- fused step

    def _step(self, ids: list[tf.Tensor], dense: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = self._loss(labels, self._logits(self._emb_forward(ids), dense))
        grads = tape.gradient(loss, [*self.tables, *self.dense_vars])
        n = len(self.tables)
        self.dense_opt.apply_gradients(zip(grads[n:], self.dense_vars, strict=True))
        self.sparse_opt.apply_gradients(zip(grads[:n], self.tables, strict=True))
        return loss

    # ------------------------------------------------------------------- phased steps

    def _dense_step(
        self, pooled: list[tf.Tensor], dense: tf.Tensor, labels: tf.Tensor
    ) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            tape.watch(pooled)
            loss = self._loss(labels, self._logits(pooled, dense))
        grads = tape.gradient(loss, [*pooled, *self.dense_vars])
        n = len(pooled)
        self.dense_opt.apply_gradients(zip(grads[n:], self.dense_vars, strict=True))
        return loss, grads[:n]

    def _emb_step(self, ids: list[tf.Tensor], upstream: list[tf.Tensor]) -> list[tf.Tensor]:
        """The embedding part alone, fused: forward, the tape's backward from the given
        d(loss)/d(pooled), and the sparse update (the pooled outputs are returned so that
        the forward is not pruned: a sum's gradient does not need it)."""
        with tf.GradientTape() as tape:
            pooled = self._emb_forward(ids)
        grads = tape.gradient(pooled, self.tables, output_gradients=upstream)
        self.sparse_opt.apply_gradients(zip(grads, self.tables, strict=True))
        return pooled

    def _emb_update(self, ids: list[tf.Tensor], grads: list[tf.Tensor]) -> None:
        # What the tape produces for gather + reduce_sum: each id's row gets its sample's
        # pooled gradient; several inputs of one table are concatenated, as the tape does.
        per_table: dict[int, list[tuple[tf.Tensor, tf.Tensor]]] = {}
        for spec, t, x, g in zip(self.inputs, self.table_of, ids, grads, strict=True):
            if spec.hotness == 1:
                values = g
            else:
                values = tf.reshape(
                    tf.broadcast_to(g[:, None, :], [tf.shape(g)[0], spec.hotness, spec.dim]),
                    [-1, spec.dim],
                )
            per_table.setdefault(t, []).append((tf.reshape(x, [-1]), values))
        pairs = []
        for t, parts in per_table.items():
            table = self.tables[t]
            indices = parts[0][0] if len(parts) == 1 else tf.concat([p[0] for p in parts], 0)
            values = parts[0][1] if len(parts) == 1 else tf.concat([p[1] for p in parts], 0)
            pairs.append(
                (tf.IndexedSlices(values, indices, tf.shape(table, out_type=tf.int64)), table)
            )
        self.sparse_opt.apply_gradients(pairs)

    def phased_step(self, ids: list[tf.Tensor], dense: tf.Tensor, labels: tf.Tensor
                    ) -> tuple[float, dict[str, float], list[tf.Tensor]]:
        """One step in three timed phases: lookup, the dense part, embedding backward + update;
        the loss, the phases' seconds and d(loss)/d(pooled)."""
        t0 = time.perf_counter()
        pooled = self.emb_forward(ids)
        t1 = time.perf_counter()
        loss, grads = self.dense_step(pooled, dense, labels)
        t2 = time.perf_counter()
        self.emb_update(ids, grads)
        t3 = time.perf_counter()
        return float(loss), {"embedding_forward": t1 - t0, "dense": t2 - t1,
                             "embedding_update": t3 - t2, "communication": 0.0}, grads

    # ------------------------------------------------------------------------ inputs

    @staticmethod
    def to_tensors(
        ids: Sequence[np.ndarray], dense: np.ndarray, labels: np.ndarray
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        """The batch as tensors (what a TF input pipeline would hand the step)."""
        return (
            [tf.convert_to_tensor(x) for x in ids],
            tf.convert_to_tensor(dense),
            tf.convert_to_tensor(labels),
        )
