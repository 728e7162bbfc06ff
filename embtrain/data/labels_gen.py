"""gen-data for a recipe with several labels (``data.labels``): the extra label columns.

The first label is gen-data's ground-truth click, written under the first label's column.
Every further ``bce`` label ``k`` is a *conversion* of that click: ``click × Bernoulli(q)``,
where ``q = 0.2 + 0.6·u`` and ``u`` in [0, 1) is a hash of (``k``, the row's id of the first
categorical feature), so the tasks share a signal and differ by id. Every ``mse`` label is
``2·click + 0.5·N(0, 1)``-shaped: ``click · (1 + 4u) + N(0, 0.5)``. Deterministic for a seed;
the same arguments write the same files.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from embtrain.data.kernels import hash_string_array
from embtrain.kernels.array_hashing import finalize64
from embtrain.kernels.rules.hashing import GOLDEN
from embtrain.recipe.models import Recipe


def _unit(keys: np.ndarray, k: int) -> np.ndarray:
    """A uniform [0, 1) value per int64 key and label index (splitmix64)."""
    x = finalize64(keys.astype(np.uint64) ^ np.uint64((k * int(GOLDEN)) % 2**64))
    return (x >> np.uint64(11)).astype(np.float64) / float(2**53)


def _keys(table: pa.Table, recipe: Recipe) -> np.ndarray:
    """Per row the int64 key of the first categorical feature's first id (0 without one)."""
    for f in recipe.categorical_features:
        if f.column not in table.column_names:
            continue
        col = table.column(f.column).combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            col = pc.list_element(col, 0)
        if f.ids == "string":
            return np.asarray(hash_string_array(col.fill_null("")), dtype=np.int64)
        return np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.zeros(table.num_rows, dtype=np.int64)


def add_labels(paths: list[str], recipe: Recipe, seed: int) -> None:
    """Rewrite gen-data's Parquet ``paths``: the click under the first label's column, and
    the further labels of ``data.labels`` derived from it (see the module docstring)."""
    if recipe.data.labels is None:
        return
    specs = recipe.data.label_specs()
    source = recipe.data.label
    for index, path in enumerate(paths):
        table = pq.read_table(path)
        click = table.column(source).to_numpy(zero_copy_only=False).astype(np.float64)
        keys = _keys(table, recipe)
        rng = np.random.default_rng((seed, 28, index))
        columns = {specs[0].column: click}
        for k, spec in enumerate(specs[1:], start=1):
            u = _unit(keys, k)
            if spec.loss == "bce":
                columns[spec.column] = click * (rng.random(len(click)) < 0.2 + 0.6 * u)
            else:
                columns[spec.column] = click * (1 + 4 * u) + rng.normal(0, 0.5, len(click))
        label_type = table.schema.field(source).type
        if specs[0].column != source:
            table = table.drop_columns([source])
        for spec in specs:
            kind = pa.float32() if spec.loss == "mse" else label_type
            array = pa.array(columns[spec.column]).cast(kind)
            if spec.column in table.column_names:
                i = table.column_names.index(spec.column)
                table = table.set_column(i, spec.column, array)
            else:
                table = table.append_column(spec.column, array)
        pq.write_table(table, path, compression="snappy")
