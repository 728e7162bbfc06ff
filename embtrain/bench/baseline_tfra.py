"""The ``tfra`` baseline: every table a TensorFlow Recommenders-Addons ``dynamic_embedding``
variable, run as a child process with the TFRA environment's Python::

    .venv-tfra/bin/python -P embtrain/bench/baseline_tfra.py SPEC.json

TFRA 0.8.1 needs TensorFlow <= 2.16 (and, on CPU, the full ``tensorflow`` wheel), so it
cannot live in embtrain's environment: ``bash scripts/bootstrap.sh --tfra`` makes
``.venv-tfra``. This file therefore imports only the standard library, numpy and its sibling
:mod:`measure` (which needs no more) at module level (TensorFlow and TFRA inside :func:`run`);
the runner resolves the model into the spec (tables, inputs, MLP, learning rate).

The program, the best TFRA one we found for the synthetic models on CPU:

* One ``de.get_variable`` per table (int64 keys, float32 values of the table's dim, default
  CPU cuckoo hash table pre-sized to the table's rows, new keys initialised U[-0.05, 0.05)
  like the native-tf baseline). Every table is dynamic: that is what TFRA does.
* Lookup: the ids of all inputs of a table are concatenated, made unique and looked up once
  with ``de.embedding_lookup`` (what ``de.embedding_lookup_unique`` does, which cannot run
  inside a ``tf.function``; one trainable shadow per table), gathered back per input and
  summed over the hotness axis.
* Sparse update: ``tf.compat.v1.train`` GradientDescent / Adagrad / Adam (the native-tf
  baseline's settings) wrapped in ``de.DynamicEmbeddingOptimizer``; the update inserts the
  new keys and their slots into the hash tables.
* The MLP (plain ``tf.Variable`` layers, ReLU, a 1-unit output, sigmoid cross-entropy) with
  the same kind of optimizer, so the whole step can be compared too.

Measured as every baseline is (:func:`measure.measure_steps`): ``fused`` (one ``tf.function``
per training step), ``timed`` (phases: the lookup under an eager tape; the dense forward,
backward and update; the embedding backward and sparse update) and ``embedding_only`` (lookup
+ backward from the last dense gradients + sparse update as one ``tf.function``: the
embedding part the bench compares).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

if __package__:
    from embtrain.bench import measure
else:  # started with -P by another environment's Python: this directory's modules by name
    sys.path.append(str(Path(__file__).resolve().parent))
    import measure

PHASES = measure.PHASES
OPTIMIZERS = ("sgd", "adagrad", "adam")
INIT_SCALE = 0.05
SPEC_FIELDS = ("side", "batch", "optimizer", "steps", "warmup", "seed", "batches_dir", "out",
               "tables", "inputs", "numerical", "mlp", "learning_rate")


# ------------------------------------------------------------------------------- spec


def check_spec(spec: dict[str, Any]) -> None:
    """Raise ValueError with one line when the spec cannot be run."""
    missing = [f for f in SPEC_FIELDS if f not in spec]
    if missing:
        raise ValueError(f"spec: missing {', '.join(missing)}")
    if spec["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"spec: optimizer {spec['optimizer']!r} is not one of "
                         f"{', '.join(OPTIMIZERS)}")
    if not spec["tables"] or not spec["inputs"]:
        raise ValueError("spec: no tables or no inputs")
    names = {t["name"] for t in spec["tables"]}
    for i in spec["inputs"]:
        if i["table"] not in names:
            raise ValueError(f"spec: input {i['name']} reads unknown table {i['table']!r}")
    for key in ("batch", "steps"):
        if int(spec[key]) < 1:
            raise ValueError(f"spec: {key} must be at least 1")
    if int(spec["warmup"]) < 0:
        raise ValueError("spec: warmup must be at least 0")


def load_batches(directory: Path, inputs: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """What ``bench.inputs.Batches.save`` wrote: ids per input, dense, labels."""
    meta = json.loads((directory / "meta.json").read_text())
    if int(meta["inputs"]) != inputs:
        raise ValueError(f"batches: {meta['inputs']} inputs written, the model has {inputs}")
    ids = [np.load(directory / f"ids_{i}.npy") for i in range(inputs)]
    return ids, np.load(directory / "dense.npy"), np.load(directory / "labels.npy")


# ------------------------------------------------------------------------------ model


class TFRAModel:
    """Dynamic-embedding tables, MLP and optimizers, with the fused and the phased steps."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import tensorflow as tf
        import tensorflow_recommenders_addons as tfra

        de = tfra.dynamic_embedding
        self.tf, self.de = tf, de
        seed = int(spec["seed"])
        tf.random.set_seed(seed)
        self.inputs = spec["inputs"]
        self.tables: dict[str, Any] = {}
        self.dims: dict[str, int] = {}
        for i, t in enumerate(spec["tables"]):
            self.dims[t["name"]] = int(t["dim"])
            self.tables[t["name"]] = de.get_variable(
                f"tfra_{t['name']}", key_dtype=tf.int64, value_dtype=tf.float32,
                dim=int(t["dim"]), init_size=int(t["rows"]),
                initializer=tf.random_uniform_initializer(-INIT_SCALE, INIT_SCALE, seed=seed + i))
        # the inputs of each table, in order: one lookup per table
        self.by_table: dict[str, list[int]] = {}
        for n, i in enumerate(self.inputs):
            self.by_table.setdefault(i["table"], []).append(n)
        width = sum(int(i["dim"]) for i in self.inputs) + int(spec["numerical"])
        sizes = [*map(int, spec["mlp"]), 1]
        rng = np.random.default_rng(seed)
        self.dense_vars: list[Any] = []
        for fan_in, fan_out in zip([width, *sizes[:-1]], sizes, strict=True):
            limit = float(np.sqrt(6.0 / (fan_in + fan_out)))  # Glorot uniform, as Keras' Dense
            self.dense_vars.append(tf.Variable(
                rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)))
            self.dense_vars.append(tf.Variable(np.zeros(fan_out, np.float32)))
        self.sparse_opt = de.DynamicEmbeddingOptimizer(self._optimizer(spec))
        self.dense_opt = self._optimizer(spec)
        self.step = tf.function(self._step)
        self.emb_forward = tf.function(self._emb_forward)
        self.dense_step = tf.function(self._dense_step)
        # the gradients' first dimension (unique keys) changes from batch to batch
        self.apply_sparse = tf.function(self._apply_sparse, reduce_retracing=True)
        self.emb_step = tf.function(self._emb_step)

    def _optimizer(self, spec: dict[str, Any]) -> Any:
        v1, lr, kind = self.tf.compat.v1.train, float(spec["learning_rate"]), spec["optimizer"]
        if kind == "sgd":
            return v1.GradientDescentOptimizer(lr)
        if kind == "adagrad":
            return v1.AdagradOptimizer(lr, initial_accumulator_value=0.1)
        return v1.AdamOptimizer(lr, beta1=0.9, beta2=0.999, epsilon=1e-7)

    @staticmethod
    def _lookup_name(table: str) -> str:
        return f"lookup_{table}"

    def shadows(self) -> list[Any]:
        """The trainable shadow of each table's lookup (exists after the first trace)."""
        return [self.tables[t].get_trainable_by_name(self._lookup_name(t)) for t in self.by_table]

    # ---------------------------------------------------------------- building blocks

    def _emb_forward(self, ids: list[Any]) -> list[Any]:
        tf = self.tf
        pooled: list[Any] = [None] * len(self.inputs)
        for table, members in self.by_table.items():
            flat = [tf.reshape(ids[n], [-1]) for n in members]
            keys = flat[0] if len(flat) == 1 else tf.concat(flat, 0)
            # de.embedding_lookup_unique's steps (it cannot run inside a tf.function)
            unique, index = tf.unique(keys)
            rows = tf.gather(self.de.embedding_lookup(self.tables[table], unique,
                                                      name=self._lookup_name(table)), index)
            parts = tf.split(rows, [tf.size(f) for f in flat]) if len(flat) > 1 else [rows]
            for n, part in zip(members, parts, strict=True):
                hot = int(self.inputs[n]["hotness"])
                dim = self.dims[table]
                pooled[n] = (part if hot == 1 else
                             tf.reduce_sum(tf.reshape(part, [-1, hot, dim]), axis=1))
        return pooled

    def _logits(self, pooled: list[Any], dense: Any) -> Any:
        tf = self.tf
        x = tf.concat([*pooled, dense], axis=1)
        n = len(self.dense_vars) // 2
        for k in range(n):
            x = tf.matmul(x, self.dense_vars[2 * k]) + self.dense_vars[2 * k + 1]
            if k < n - 1:
                x = tf.nn.relu(x)
        return x[:, 0]

    def _loss(self, labels: Any, logits: Any) -> Any:
        tf = self.tf
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))

    # ---------------------------------------------------------------------- steps

    def _step(self, ids: list[Any], dense: Any, labels: Any) -> Any:
        tf = self.tf
        with tf.GradientTape() as tape:
            loss = self._loss(labels, self._logits(self._emb_forward(ids), dense))
        shadows = self.shadows()
        grads = tape.gradient(loss, [*shadows, *self.dense_vars])
        n = len(shadows)
        self.dense_opt.apply_gradients(zip(grads[n:], self.dense_vars, strict=True))
        self.sparse_opt.apply_gradients(zip(grads[:n], shadows, strict=True))
        return loss

    def _dense_step(self, pooled: list[Any], dense: Any, labels: Any) -> tuple[Any, list[Any]]:
        tf = self.tf
        with tf.GradientTape() as tape:
            tape.watch(pooled)
            loss = self._loss(labels, self._logits(pooled, dense))
        grads = tape.gradient(loss, [*pooled, *self.dense_vars])
        n = len(pooled)
        self.dense_opt.apply_gradients(zip(grads[n:], self.dense_vars, strict=True))
        return loss, grads[:n]

    def _apply_sparse(self, grads: list[Any]) -> None:
        self.sparse_opt.apply_gradients(zip(grads, self.shadows(), strict=True))

    def _emb_step(self, ids: list[Any], upstream: list[Any]) -> list[Any]:
        """Lookup, the tape's backward from the given d(loss)/d(pooled), sparse update."""
        tf = self.tf
        with tf.GradientTape() as tape:
            pooled = self._emb_forward(ids)
        shadows = self.shadows()
        grads = tape.gradient(pooled, shadows, output_gradients=upstream)
        self.sparse_opt.apply_gradients(zip(grads, shadows, strict=True))
        return pooled

    def phased_step(self, ids: list[Any], dense: Any, labels: Any
                    ) -> tuple[float, dict[str, float], list[Any]]:
        """One training step in three timed phases: lookup (recorded by an eager tape), the
        dense part, the embedding backward + sparse update."""
        tf = self.tf
        t0 = time.perf_counter()
        with tf.GradientTape() as tape:
            pooled = self.emb_forward(ids)
        t1 = time.perf_counter()
        loss, grads = self.dense_step(pooled, dense, labels)
        loss = float(loss)
        t2 = time.perf_counter()
        sparse = tape.gradient(pooled, self.shadows(), output_gradients=grads)
        self.apply_sparse(sparse)
        t3 = time.perf_counter()
        return loss, {"embedding_forward": t1 - t0, "dense": t2 - t1,
                      "embedding_update": t3 - t2, "communication": 0.0}, grads

    def live_keys(self) -> dict[str, int]:
        """Keys each hash table holds."""
        return {name: int(var.size()) for name, var in self.tables.items()}


# -------------------------------------------------------------------------------- run


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the model, run warm-up + timed steps three ways, return the side's report."""
    check_spec(spec)
    import tensorflow as tf

    ids, dense, labels = load_batches(Path(spec["batches_dir"]), len(spec["inputs"]))
    count = dense.shape[0]

    def inputs(k: int) -> tuple[list[Any], Any, Any]:
        return ([tf.convert_to_tensor(x[k]) for x in ids], tf.convert_to_tensor(dense[k]),
                tf.convert_to_tensor(labels[k]))

    def fed() -> Iterable[np.ndarray]:
        for k in range(count):
            x, d, y = inputs(k)
            yield from (t.numpy() for t in x)
            yield from (d.numpy(), y.numpy())

    batch_digest = measure.digest(fed())
    started = time.perf_counter()
    model = TFRAModel(spec)
    build_seconds = time.perf_counter() - started
    measured = measure.measure_steps(
        "tfra", inputs, count, int(spec["warmup"]), int(spec["steps"]), model.step,
        model.phased_step, lambda x, _dense, grads: model.emb_step(x, grads))
    import tensorflow_recommenders_addons as tfra

    return {
        "side": spec["side"],
        "build_seconds": build_seconds,
        "batch_digest": batch_digest,
        "live_keys": model.live_keys(),
        "versions": {"tensorflow": tf.__version__, "tfra": tfra.__version__,
                     "python": sys.version.split()[0]},
        "batch_bytes": sum(a.nbytes for a in ids) + dense.nbytes + labels.nbytes,
        **measured,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``baseline_tfra.py SPEC.json``; writes the report to ``spec['out']``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return measure.child_main("baseline_tfra", sys.argv[1:] if argv is None else argv,
                              check_spec, run, "baseline_tfra.py SPEC.json")


if __name__ == "__main__":
    sys.exit(main())
