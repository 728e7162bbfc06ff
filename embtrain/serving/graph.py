"""The module a SavedModel holds: raw column values in, each label's prediction out.

The outputs are predict's columns: ``probability`` and ``logit`` for a recipe with one
``data.label``; with ``data.labels``, ``<label>_probability`` and ``<label>_logit`` per bce
label and ``<label>_prediction`` per mse label (the head's output itself).

Everything between is TensorFlow ops over the module's own variables, so a serving system
needs TensorFlow only:

- dense features: the column cast to float32, NaN (a null) replaced by the feature's
  ``fill_null`` (0 when it has none), then its transform;
- categorical features: string ids hashed with xxHash64 (:func:`~embtrain.serving.tf_ops.xxh64`,
  the training hash); a static table's id taken modulo its rows (``out_of_range: modulo``) or,
  outside ``[0, rows)``, reading zeros; a dynamic table's key found in a hash table key → row,
  a key it does not hold reading what ``missing:`` says (zeros, or the initializer's value for
  that key); per-id weights; the combiner (an empty list pools to zeros; ``concat`` pads a short
  list with zeros and ignores ids past its hotness);
- the pooled vectors laid out as the engine lays them out, then the dense network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from embtrain.serving.tf_ops import initial_values, stored_values, xxh64

_TRANSFORMS = ("none", "log1p", "signed_log1p")


@dataclass(frozen=True)
class DenseInput:
    """One dense feature: its columns (each a ``[batch]`` input), null fill and transform."""

    name: str
    columns: tuple[str, ...]
    dtypes: tuple[str, ...]  # "int64" or "float32" per column
    fill_null: float | None
    transform: str


@dataclass(frozen=True)
class TableSpec:
    """One table as served: static ``rows`` (None: dynamic), and what a missing key reads."""

    name: str
    dim: int
    rows: int | None
    missing: str = "zeros"  # dynamic tables: zeros | initial
    init_kind: str = "uniform"
    init_param: float = 0.0
    base: int = 0  # the initializer's hash base for this table (seed and name)
    dtype: str = "float32"  # a half table's missing key reads its initial value so rounded


@dataclass(frozen=True)
class FeatureInput:
    """One categorical feature: where its ids come from and where its vector goes."""

    name: str
    column: str
    table: str
    is_list: bool  # inputs <column>_values and <column>_lengths; else <column> [batch]
    string_ids: bool
    id_dtype: str  # the input's dtype: "int64" or "string"
    weights: str | None
    combiner: str
    hotness: int | None  # None: variable
    modulo: bool
    group: int
    start: int
    width: int
    null: str = "error"  # the recipe's null: rule: error | skip | id
    null_id: int | str | None = None  # the id a null reads as (null == "id")

    @property
    def takes_nulls(self) -> bool:
        """Whether the signature has this feature's null inputs (its rule is skip or id)."""
        return self.null != "error"


@dataclass(frozen=True)
class ServingSpec:
    """Everything the graph needs besides the arrays."""

    dense: tuple[DenseInput, ...]
    features: tuple[FeatureInput, ...]
    tables: tuple[TableSpec, ...]
    group_widths: tuple[int | None, ...]
    num_dense: int
    #: ``data.labels`` as (name, loss) in recipe order; None: one ``data.label``
    labels: tuple[tuple[str, str], ...] | None = None

    def output_names(self) -> list[str]:
        """The signature's outputs, in order (as predict names its columns)."""
        if self.labels is None:
            return ["probability", "logit"]
        names: list[str] = []
        for name, loss in self.labels:
            names += ([f"{name}_probability", f"{name}_logit"] if loss == "bce"
                      else [f"{name}_prediction"])
        return names

    def input_specs(self) -> dict[str, tf.TensorSpec]:
        """The signature's inputs, by name."""
        specs: dict[str, tf.TensorSpec] = {}

        def add(name: str, shape: list[int | None], dtype: str) -> None:
            spec = tf.TensorSpec(shape, tf.as_dtype(dtype), name=name)
            if name in specs and specs[name] != spec:
                raise ValueError(f"column '{name}' is read as {specs[name]} and as {spec}")
            specs[name] = spec

        for d in self.dense:
            for column, dtype in zip(d.columns, d.dtypes, strict=True):
                add(column, [None], dtype)
        for f in self.features:
            if f.is_list:
                add(f"{f.column}_values", [None], f.id_dtype)
                add(f"{f.column}_lengths", [None], "int64")
                if f.takes_nulls:  # a null list; a null element of a list
                    add(f"{f.column}_null", [None], "bool")
                    add(f"{f.column}_values_null", [None], "bool")
                if f.weights:
                    add(f"{f.weights}_values", [None], "float32")
                    add(f"{f.weights}_lengths", [None], "int64")
            else:
                add(f.column, [None], f.id_dtype)
                if f.takes_nulls:  # a null id
                    add(f"{f.column}_null", [None], "bool")
                if f.weights:
                    add(f.weights, [None], "float32")
        return specs


def _transform(x: tf.Tensor, transform: str) -> tf.Tensor:
    if transform == "log1p":
        return tf.math.log1p(tf.maximum(x, 0.0))
    if transform == "signed_log1p":
        return tf.sign(x) * tf.math.log1p(tf.abs(x))
    return x


class ServingModule(tf.Module):
    """Tables, key → row hash tables, the dense network's variables and ``serve``."""

    def __init__(self, spec: ServingSpec, tables: dict[str, np.ndarray],
                 keys: dict[str, np.ndarray], network: Any, variables: list[tf.Variable]):
        super().__init__(name="embtrain_serving")
        self.spec = spec
        # each table's arrays are dropped from ``tables`` once its variable holds them, so
        # that at most one table is held twice (a table without rows keeps one row of zeros)
        self.tables = {}
        for i, t in enumerate(spec.tables):
            values = np.asarray(tables.pop(t.name), np.float32).reshape(-1, t.dim)
            if values.shape[0] == 0:
                values = np.zeros((1, t.dim), np.float32)
            self.tables[t.name] = tf.Variable(values, trainable=False, name=f"table_{i}")
            del values
        self.key_rows = {}
        for t in spec.tables:
            if t.rows is None:
                index = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=-1, name=f"keys_{t.name}")
                k = np.asarray(keys[t.name], np.int64)
                index.insert(tf.constant(k), tf.range(k.shape[0], dtype=tf.int64))
                self.key_rows[t.name] = index
        self.dense_variables = list(variables)
        self._network = network
        self._table_spec = {t.name: t for t in spec.tables}
        self.serve = tf.function(self._serve, input_signature=[spec.input_specs()],
                                 autograph=False)

    # ---------------------------------------------------------------- the graph
    def _batch(self, inputs: dict[str, tf.Tensor]) -> tf.Tensor:
        for d in self.spec.dense:
            return tf.shape(inputs[d.columns[0]], out_type=tf.int64)[0]
        f = self.spec.features[0]
        if f.is_list:
            return tf.shape(inputs[f"{f.column}_lengths"], out_type=tf.int64)[0]
        return tf.shape(inputs[f.column], out_type=tf.int64)[0]

    def _dense(self, inputs: dict[str, tf.Tensor], batch: tf.Tensor) -> tf.Tensor:
        parts = []
        for d in self.spec.dense:
            fill = tf.constant(0.0 if d.fill_null is None else d.fill_null, tf.float32)
            cols = []
            for column in d.columns:
                x = tf.cast(inputs[column], tf.float32)
                cols.append(tf.where(tf.math.is_nan(x), fill, x))
            parts.append(_transform(tf.stack(cols, axis=1), d.transform))
        if not parts:
            return tf.zeros(tf.stack([batch, 0]), tf.float32)
        return tf.concat(parts, axis=1)

    def _rows(self, f: FeatureInput, keys: tf.Tensor) -> tf.Tensor:
        """Each id's embedding ``[n, dim]``."""
        t = self._table_spec[f.table]
        values = self.tables[t.name]
        if t.rows is not None:  # static
            if f.modulo:
                return tf.gather(values, tf.math.floormod(keys, tf.constant(t.rows, tf.int64)))
            held = tf.logical_and(keys >= 0, keys < t.rows)
            found = keys
        else:
            found = self.key_rows[t.name].lookup(keys)
            held = found >= 0
        vectors = tf.gather(values, tf.where(held, found, tf.zeros_like(found)))
        vectors = vectors * tf.cast(held, tf.float32)[:, None]  # a missing id reads zeros
        if t.missing == "initial":
            start = stored_values(initial_values(keys, t.base, t.dim, t.init_kind,
                                                 t.init_param), t.dtype)
            vectors = tf.where(held[:, None], vectors, start)
        return vectors

    def _feature(self, f: FeatureInput, inputs: dict[str, tf.Tensor], batch: tf.Tensor
                 ) -> tf.Tensor:
        """The feature's pooled ``[batch, width]``."""
        if f.is_list:
            ids = inputs[f"{f.column}_values"]
            lengths = tf.cast(inputs[f"{f.column}_lengths"], tf.int64)
            w = inputs[f"{f.weights}_values"] if f.weights else None
        else:
            ids = inputs[f.column]
            lengths = tf.ones(tf.stack([batch]), tf.int64)
            w = inputs[f.weights] if f.weights else None
        weights = tf.ones(tf.shape(ids), tf.float32) if w is None else tf.cast(w, tf.float32)
        if f.takes_nulls:
            ids, lengths, weights = self._apply_null_rule(f, inputs, ids, lengths, weights, batch)
        keys = xxh64(ids) if f.string_ids else tf.cast(ids, tf.int64)
        vectors = self._rows(f, keys)
        dim = self._table_spec[f.table].dim
        segment = tf.repeat(tf.range(batch, dtype=tf.int64), lengths)
        if f.combiner == "concat":
            hot = int(f.hotness or 1)
            starts = tf.cumsum(lengths, exclusive=True)
            position = tf.range(tf.shape(keys, out_type=tf.int64)[0]) - tf.gather(starts, segment)
            keep = position < hot
            index = tf.stack([tf.boolean_mask(segment, keep), tf.boolean_mask(position, keep)], 1)
            placed = tf.scatter_nd(index, tf.boolean_mask(weights[:, None] * vectors, keep),
                                   tf.stack([batch, tf.constant(hot, tf.int64),
                                             tf.constant(dim, tf.int64)]))
            return tf.reshape(placed, tf.stack([batch, tf.constant(hot * dim, tf.int64)]))
        pooled = tf.math.unsorted_segment_sum(weights[:, None] * vectors, segment, batch)
        if f.combiner == "mean":
            total = tf.math.unsorted_segment_sum(weights, segment, batch)
        elif f.combiner == "sqrtn":
            total = tf.sqrt(tf.math.unsorted_segment_sum(weights * weights, segment, batch))
        else:
            return pooled
        scale = tf.where(total != 0, 1.0 / tf.where(total != 0, total, 1.0), 0.0)
        return pooled * scale[:, None]

    @staticmethod
    def _apply_null_rule(f: FeatureInput, inputs: dict[str, tf.Tensor], ids: tf.Tensor,
                         lengths: tf.Tensor, weights: tf.Tensor, batch: tf.Tensor
                         ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The recipe's ``null:`` rule, as training applies it (``data/nulls.py``), on the
        feature's ids, row lengths and weights: ``skip`` drops a null id (a null one-hot id
        leaves the row without one; a null list is empty); ``id`` reads a null id, and a null
        list, as the rule's id with weight 1. A null list's own ids and weights are ignored."""
        if f.is_list:
            element_null = tf.reshape(inputs[f"{f.column}_values_null"], [-1])
            row_null = tf.reshape(inputs[f"{f.column}_null"], [-1])
        else:
            element_null = tf.reshape(inputs[f"{f.column}_null"], [-1])
            row_null = tf.zeros(tf.stack([batch]), tf.bool)
        segment = tf.repeat(tf.range(batch, dtype=tf.int64), lengths)
        in_null_row = tf.gather(row_null, segment)
        keep = tf.logical_not(in_null_row)
        if f.null == "skip":
            keep = tf.logical_and(keep, tf.logical_not(element_null))
        counts = tf.math.unsorted_segment_sum(tf.cast(keep, tf.int64), segment, batch)
        ids, weights = tf.boolean_mask(ids, keep), tf.boolean_mask(weights, keep)
        if f.null == "skip":
            return ids, counts, weights
        fill = tf.constant(f.null_id, ids.dtype)
        ids = tf.where(tf.boolean_mask(element_null, keep), fill, ids)
        weights = tf.where(tf.boolean_mask(element_null, keep), 1.0, weights)
        # a null list becomes [id]: append one id to each null row (its own are dropped)
        extra = tf.cast(row_null, tf.int64)
        kept = tf.RaggedTensor.from_row_lengths(ids, counts)
        added = tf.RaggedTensor.from_row_lengths(tf.fill(tf.stack([tf.reduce_sum(extra)]), fill),
                                                 extra)
        ones = tf.RaggedTensor.from_row_lengths(tf.ones(tf.stack([tf.reduce_sum(extra)]),
                                                        tf.float32), extra)
        merged = tf.concat([kept, added], axis=1)
        merged_w = tf.concat([tf.RaggedTensor.from_row_lengths(weights, counts), ones], axis=1)
        return merged.flat_values, merged.row_lengths(), merged_w.flat_values

    def _groups(self, inputs: dict[str, tf.Tensor], batch: tf.Tensor) -> list[tf.Tensor]:
        by_group: dict[int, list[FeatureInput]] = {}
        for f in self.spec.features:
            by_group.setdefault(f.group, []).append(f)
        groups = []
        for g, width in enumerate(self.spec.group_widths):
            parts, at = [], 0
            for f in sorted(by_group.get(g, []), key=lambda f: f.start):
                if f.start > at:
                    parts.append(tf.zeros(tf.stack([batch, f.start - at]), tf.float32))
                parts.append(tf.ensure_shape(self._feature(f, inputs, batch), [None, f.width]))
                at = f.start + f.width
            if width is not None and width > at:
                parts.append(tf.zeros(tf.stack([batch, width - at]), tf.float32))
            group = (tf.concat(parts, axis=1) if parts else
                     tf.zeros(tf.stack([batch, 0]), tf.float32))
            groups.append(tf.ensure_shape(group, [None, width or 0]))
        return groups

    def _serve(self, inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        batch = self._batch(inputs)
        dense = tf.ensure_shape(self._dense(inputs, batch), [None, self.spec.num_dense])
        logits = self._network(dense, self._groups(inputs, batch))
        if self.spec.labels is None:
            logits = tf.reshape(logits, [-1])
            return {"probability": tf.sigmoid(logits), "logit": logits}
        heads = tf.reshape(tf.cast(logits, tf.float32), [-1, len(self.spec.labels)])
        out: dict[str, tf.Tensor] = {}
        for t, (name, loss) in enumerate(self.spec.labels):
            if loss == "bce":
                out[f"{name}_probability"] = tf.sigmoid(heads[:, t])
                out[f"{name}_logit"] = heads[:, t]
            else:
                out[f"{name}_prediction"] = heads[:, t]
        return out
