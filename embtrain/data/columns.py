"""From Arrow columns to NumPy: schema checks and conversion of one piece of a Parquet file.

Everything here is vectorised (pyarrow compute, NumPy, the numba kernels of
:mod:`embtrain.data.kernels`); no Python loop runs per row. Errors are :class:`DataError`
naming the file, the column and, where it helps, the row (0-based, within the file).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from embtrain.data.kernels import (
    copy_ids,
    csr_take_offsets,
    csr_take_values,
    dense_column,
    hash_string_array,
)
from embtrain.data.memory import concatenate, empty
from embtrain.data.nulls import apply_null_rule
from embtrain.errors import DataError
from embtrain.recipe.models import CategoricalFeature, Recipe

# ---------------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class DenseSpec:
    """One dense feature: its columns, transform and null fill."""

    name: str
    columns: tuple[str, ...]
    transform: str
    fill_null: float | None


@dataclass(frozen=True)
class SparseSpec:
    """One categorical feature as the reader needs it."""

    name: str
    column: str
    table: str
    hotness: int | None  # None: variable
    string_ids: bool
    weights: str | None
    rows: int | None  # static table rows; None: dynamic (any int64)
    modulo: bool  # static: ids taken modulo rows instead of checked
    null: str = "error"  # error | skip | id
    null_id: int | str | None = None  # the id a null reads as (null == "id")

    @property
    def ragged(self) -> bool:
        """Read as CSR lists: list columns, and one-hot columns whose nulls are skipped."""
        return self.hotness != 1 or self.null == "skip"


@dataclass(frozen=True)
class ReadSpec:
    """Everything the reader takes from a recipe: dense, label, categorical and declared columns."""

    dense: tuple[DenseSpec, ...]
    sparse: tuple[SparseSpec, ...]
    label: str  # the first label's column
    declared: tuple[tuple[str, str], ...]
    labelled: bool = True  # False: the label column is not read (every label 0; predict)
    labels: tuple[tuple[str, str], ...] = ()  # (column, loss) of every label; () = (label, bce)

    @property
    def label_columns(self) -> tuple[tuple[str, str], ...]:
        """(column, loss) of every label, in recipe order."""
        if not self.labelled:
            return ()
        return self.labels or ((self.label, "bce"),)

    @property
    def n_dense(self) -> int:
        return sum(len(d.columns) for d in self.dense)

    @property
    def onehot(self) -> tuple[SparseSpec, ...]:
        """Features with exactly one id per row (hotness 1, nulls not skipped), in recipe order."""
        return tuple(s for s in self.sparse if not s.ragged)

    @property
    def lists(self) -> tuple[SparseSpec, ...]:
        """Features with lists of ids (hotness N or variable, or null: skip), in recipe order."""
        return tuple(s for s in self.sparse if s.ragged)

    @property
    def columns(self) -> list[str]:
        """Columns to read, each once, in a stable order."""
        names = [c for d in self.dense for c in d.columns] + [c for c, _ in self.label_columns]
        for s in self.sparse:
            names.append(s.column)
            if s.weights:
                names.append(s.weights)
        return list(dict.fromkeys(names))


def _sparse_spec(feature: CategoricalFeature, recipe: Recipe) -> SparseSpec:
    table = recipe.table(feature.table)
    static = not table.is_dynamic
    return SparseSpec(
        name=feature.name, column=feature.column, table=table.name,
        hotness=None if feature.hotness == "variable" else int(feature.hotness),
        string_ids=feature.ids == "string", weights=feature.weights,
        rows=int(table.rows or 0) if static else None,
        modulo=static and feature.out_of_range == "modulo",
        null=feature.null if isinstance(feature.null, str) else "id",
        null_id=None if isinstance(feature.null, str) else feature.null.id)


def read_spec(recipe: Recipe) -> ReadSpec:
    """The reader's view of a validated recipe."""
    dense = tuple(DenseSpec(f.name, tuple(f.columns), f.transform, f.fill_null)
                  for f in recipe.dense_features)
    sparse = tuple(_sparse_spec(f, recipe) for f in recipe.categorical_features)
    declared = tuple(sorted((recipe.data.columns or {}).items()))
    labels = tuple((lab.column, lab.loss) for lab in recipe.data.label_specs())
    return ReadSpec(dense, sparse, labels[0][0], declared, labels=(
                    labels if recipe.data.labels is not None else ()))


# ------------------------------------------------------------------------------- chunks

_ARANGE = np.arange(1 << 16, dtype=np.int64)
_ARANGE.flags.writeable = False


def one_hot_offsets(n: int) -> np.ndarray:
    """``arange(n + 1)`` as int64, a read-only view of a shared array."""
    global _ARANGE
    if n + 1 > _ARANGE.shape[0]:
        grown = np.arange(max(n + 1, 2 * _ARANGE.shape[0]), dtype=np.int64)
        grown.flags.writeable = False
        _ARANGE = grown
    return _ARANGE[:n + 1]


@dataclass(frozen=True)
class Ragged:
    """One list feature's ids for ``n`` rows as CSR (int64 keys and offsets, float32 weights)."""

    keys: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray | None

    def slice(self, start: int, stop: int) -> Ragged:
        o = self.offsets[start:stop + 1]
        a, b = int(o[0]), int(o[-1])
        w = None if self.weights is None else self.weights[a:b]
        return Ragged(self.keys[a:b], o - a if a else o, w)

    def take(self, rows: np.ndarray) -> Ragged:
        offsets = empty(rows.shape[0] + 1, np.int64)
        nnz = int(csr_take_offsets(self.offsets, rows, offsets))
        keys = empty(nnz, np.int64)
        csr_take_values(self.keys, self.offsets, rows, offsets, keys)
        weights = None
        if self.weights is not None:
            weights = empty(nnz, np.float32)
            csr_take_values(self.weights, self.offsets, rows, offsets, weights)
        return Ragged(keys, offsets, weights)

    @staticmethod
    def concat(parts: list[Ragged]) -> Ragged:
        if len(parts) == 1:
            return parts[0]
        keys = concatenate([p.keys for p in parts])
        weights = (None if parts[0].weights is None
                   else concatenate([p.weights for p in parts]))  # type: ignore[misc]
        shifts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        offsets = concatenate([parts[0].offsets] + [
            p.offsets[1:] + s for p, s in zip(parts[1:], shifts[1:], strict=True)])
        return Ragged(keys, offsets, weights)


@dataclass(frozen=True)
class Chunk:
    """Converted rows, column-major for ids.

    ``dense`` float32[rows, n_dense]; ``label`` float32[rows] (``[rows, labels]`` with
    several labels); ``onehot`` int64[n_onehot, rows]
    (row ``f`` holds the ids of the spec's ``f``-th one-hot feature); ``onehot_weights`` float32
    per one-hot feature that has weights; ``ragged`` per list feature.
    """

    rows: int
    dense: np.ndarray
    label: np.ndarray
    onehot: np.ndarray
    onehot_weights: dict[str, np.ndarray]
    ragged: dict[str, Ragged]

    def slice(self, start: int, stop: int) -> Chunk:
        """Rows ``start:stop`` (views)."""
        return Chunk(stop - start, self.dense[start:stop], self.label[start:stop],
                     self.onehot[:, start:stop],
                     {k: w[start:stop] for k, w in self.onehot_weights.items()},
                     {k: r.slice(start, stop) for k, r in self.ragged.items()})

    @staticmethod
    def concat(chunks: list[Chunk]) -> Chunk:
        """Rows of several chunks, one after the other."""
        if len(chunks) == 1:
            return chunks[0]
        first = chunks[0]
        return Chunk(sum(c.rows for c in chunks), concatenate([c.dense for c in chunks]),
                     concatenate([c.label for c in chunks]),
                     concatenate([c.onehot for c in chunks], axis=1),
                     {k: concatenate([c.onehot_weights[k] for c in chunks])
                      for k in first.onehot_weights},
                     {k: Ragged.concat([c.ragged[k] for c in chunks]) for k in first.ragged})


# ------------------------------------------------------------------------------ schemas


def _list_value_type(t: pa.DataType) -> pa.DataType | None:
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return t.value_type
    if hasattr(pa.types, "is_list_view") and (pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        return t.value_type
    return None


def _plain(t: pa.DataType) -> pa.DataType:
    """The type with dictionary encoding removed (also inside a list)."""
    if pa.types.is_dictionary(t):
        return t.value_type
    inner = _list_value_type(t)
    if inner is not None and pa.types.is_dictionary(inner):
        return pa.large_list(inner.value_type)
    return t


def _decoded(array: pa.Array) -> pa.Array:
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


_DECLARED = {
    "float": lambda t: pa.types.is_floating(t),
    "int": lambda t: pa.types.is_integer(t),
    "string": _is_string,
    "list<int>": lambda t: (v := _list_value_type(t)) is not None and pa.types.is_integer(v),
    "list<float>": lambda t: (v := _list_value_type(t)) is not None and pa.types.is_floating(v),
    "list<string>": lambda t: (v := _list_value_type(t)) is not None and _is_string(v),
}


def check_schema(spec: ReadSpec, schema: pa.Schema, path: str) -> None:
    """Raise :class:`DataError` if a column the recipe reads is missing or of the wrong type."""
    problems = schema_problems(spec, schema, path)
    if problems:
        raise DataError(problems[0])


def schema_problems(spec: ReadSpec, schema: pa.Schema, path: str) -> list[str]:
    """Every missing or wrongly typed column the recipe reads, one line each, in recipe order."""
    names = set(schema.names)
    out: list[str] = []
    missing: dict[str, str] = {}  # column -> what reads it: one line for them all

    def field_type(column: str, owner: str) -> pa.DataType | None:
        if column not in names:
            missing.setdefault(column, owner)
            return None
        if schema.names.count(column) > 1:  # said once below
            return None
        return _plain(schema.field(column).type)

    for d in spec.dense:
        for col in d.columns:
            t = field_type(col, f"feature '{d.name}'")
            if t is not None and not _is_number(t):
                out.append(f"{path}: column '{col}' (feature '{d.name}'): type {t}, "
                           "expected a float or integer column")
    for column, _ in spec.label_columns:
        t = field_type(column, "label")
        if t is not None and not (_is_number(t) or pa.types.is_boolean(t)):
            out.append(f"{path}: column '{column}' (label): type {t}, expected a number or bool")
    for s in spec.sparse:
        owner = f"feature '{s.name}'"
        t = field_type(s.column, owner)
        if t is None:
            continue
        value_ok = _is_string if s.string_ids else pa.types.is_integer
        one, many = ("a string", "strings") if s.string_ids else ("an integer", "integers")
        inner = _list_value_type(t)
        scalar_ok = s.hotness == 1 and value_ok(t)
        if not scalar_ok and not (inner is not None and value_ok(inner)):
            expect = f"{one} column or a list of {many}" if s.hotness == 1 else f"a list of {many}"
            out.append(f"{path}: column '{s.column}' ({owner}): type {t}, expected {expect} "
                       f"(ids: {'string' if s.string_ids else 'int'}, "
                       f"hotness: {s.hotness or 'variable'})")
            continue
        if s.weights:
            wt = field_type(s.weights, f"weights of feature '{s.name}'")
            if wt is None:
                continue
            w_inner = _list_value_type(wt)
            ok = (_is_number(wt) if inner is None else (w_inner is not None and _is_number(w_inner)))
            if not ok:
                shape = "a number column" if inner is None else "a list of numbers"
                out.append(f"{path}: column '{s.weights}' (weights of feature '{s.name}'): "
                           f"type {wt}, expected {shape} shaped like column '{s.column}'")
    for col, declared in spec.declared:
        t = field_type(col, "data.columns")
        if t is not None and not _DECLARED[declared](t):
            out.append(f"{path}: column '{col}': type {t}, but data.columns declares {declared}")
    if missing:
        out.insert(0, missing_line(path, missing, schema.names))
    twice = [c for c in dict.fromkeys(spec.columns) if schema.names.count(c) > 1]
    if twice:  # a reader would take one of them silently
        out.insert(0, f"{path}: column '{twice[0]}' appears {schema.names.count(twice[0])} "
                      "times in the file (columns "
                      + ", ".join(str(i + 1) for i, n in enumerate(schema.names) if n == twice[0])
                      + "); rename all but one")
    return list(dict.fromkeys(out))


_SHOWN_NAMES = 60


def missing_line(path: str, missing: dict[str, str], names: list[str]) -> str:
    """One line for every column the recipe reads that the file lacks, with the file's own
    column names (quoted as Python would, so that stray quotes or spaces show)."""
    listed = ", ".join(f"'{c}' ({owner})" for c, owner in missing.items())
    what = (f"column {listed} is missing" if len(missing) == 1
            else f"{len(missing)} columns are missing: {listed}")
    shown = ", ".join(repr(n) for n in names[:_SHOWN_NAMES])
    if len(names) > _SHOWN_NAMES:
        shown += f", … ({len(names) - _SHOWN_NAMES} more)"
    return f"{path}: {what} (file has {len(names)} columns: {shown})"


def value_problems(table: pa.Table, spec: ReadSpec, path: str) -> list[str]:
    """Every feature and label of ``table`` whose values the reader refuses (nulls, NaN, list
    shapes, ids outside a static table, labels outside [0, 1]): the first row of each, one
    line per column; columns with a wrong type are left to :func:`schema_problems`."""
    out: list[str] = []
    n = table.num_rows
    bad_schema = schema_problems(spec, table.schema, path)

    present = set(table.column_names)

    def fine(*columns: str) -> bool:
        return all(c in present for c in columns) and not any(
            f"column '{c}'" in line for line in bad_schema for c in columns)

    for d in spec.dense:
        cols = tuple(c for c in d.columns if fine(c))
        if cols:
            try:
                _dense_block(table, DenseSpec(d.name, cols, d.transform, d.fill_null),
                             empty((n, len(cols)), np.float32), 0, path, 0)
            except DataError as exc:
                out.append(str(exc))
    for column, loss in spec.label_columns:
        if fine(column):
            try:
                _label(table, column, path, 0, loss)
            except DataError as exc:
                out.append(str(exc))
    for s in spec.sparse:
        if fine(s.column, *([s.weights] if s.weights else [])):
            try:
                _ids(table, s, path, 0, None)
            except DataError as exc:
                out.append(str(exc))
    return out


# ---------------------------------------------------------------------------- conversion

_DENSE_BLOCK = 16_384
_NO_BITMAP = np.zeros(1, dtype=np.uint8)


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def _null_row(array: pa.Array) -> int:
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return _first(~valid)


def _column(table: pa.Table, name: str) -> pa.Array:
    """A column as one Arrow array (no copy when it has one chunk)."""
    chunked = table.column(name)
    return _decoded(chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks())


def _numeric_values(array: pa.Array) -> np.ndarray:
    """The values buffer of a primitive numeric array as NumPy (nulls hold arbitrary values)."""
    if pa.types.is_float16(array.type):
        array = array.cast(pa.float32())
    dtype = np.dtype(array.type.to_pandas_dtype())
    buf = array.buffers()[1]
    if buf is None or len(array) == 0:
        return np.zeros(0, dtype)
    return np.frombuffer(buf, dtype=dtype, count=len(array) + array.offset)[array.offset:]


def _dense_block(table: pa.Table, d: DenseSpec, out: np.ndarray, j0: int, path: str,
                 base: int) -> None:
    n = table.num_rows
    fill = 0.0 if d.fill_null is None else float(d.fill_null)
    for j, col in enumerate(d.columns):
        array = _column(table, col)
        values = _numeric_values(array)
        bitmap_buf = array.buffers()[0] if array.null_count else None
        bitmap = _NO_BITMAP if bitmap_buf is None else np.frombuffer(bitmap_buf, dtype=np.uint8)
        for s in range(0, n, _DENSE_BLOCK):
            row, kind = dense_column(values, bitmap, array.offset, bitmap_buf is not None, fill,
                                     d.fill_null is not None, out, j0 + j, s,
                                     min(n, s + _DENSE_BLOCK))
            if row >= 0:
                what = "null" if kind == 1 else "NaN"
                raise DataError(f"{path}: column '{col}' (feature '{d.name}'): {what} at row "
                                f"{base + row} and the feature has no fill_null")
    if n:  # an infinity (or a float64 past float32's range), after every column is written
        _infinities(out[:n, j0:j0 + len(d.columns)], d, path, base)


def _infinities(block: np.ndarray, d: DenseSpec, path: str, base: int) -> None:
    """Treat an infinite value of ``block`` (a feature's columns) like NaN: ``fill_null``
    replaces it, else one line with its row (a float64 beyond float32's range is one too).
    The block holds no NaN here, so its extremes tell (two reductions, ~1.4 ns a value)."""
    if np.isfinite(block.max()) and np.isfinite(block.min()):
        return
    infinite = np.isinf(block)
    if d.fill_null is not None:
        block[infinite] = float(d.fill_null)
        return
    row = int(np.flatnonzero(infinite.any(axis=1))[0])
    j = int(np.flatnonzero(infinite[row])[0])
    raise DataError(f"{path}: column '{d.columns[j]}' (feature '{d.name}'): {block[row, j]} at "
                    f"row {base + row} (infinite, or beyond float32's range) and the feature "
                    "has no fill_null")


def apply_transform(x: np.ndarray, transform: str) -> None:
    """In place: ``log1p``: log(1 + max(x, 0)); ``signed_log1p``: sign(x)·log(1 + |x|)."""
    if transform == "log1p":
        np.maximum(x, 0, out=x)
        np.log1p(x, out=x)
    elif transform == "signed_log1p":
        sign = np.sign(x)
        np.abs(x, out=x)
        np.log1p(x, out=x)
        np.multiply(x, sign, out=x)


def _transform_dense(dense: np.ndarray, spec: ReadSpec) -> None:
    transforms = {d.transform for d in spec.dense}
    if len(transforms) == 1:  # one vectorised pass over the whole (contiguous) matrix
        apply_transform(dense, transforms.pop())
        return
    j = 0
    for d in spec.dense:
        apply_transform(dense[:, j:j + len(d.columns)], d.transform)
        j += len(d.columns)


def _labels(table: pa.Table, spec: ReadSpec, path: str, base: int) -> np.ndarray:
    """float32[rows] for one label, float32[rows, labels] for several."""
    if not spec.labelled:  # predict on unlabelled rows: every label 0
        out = empty((table.num_rows, len(spec.labels)) if spec.labels else table.num_rows,
                    np.float32)
        out[...] = 0
        return out
    if not spec.labels:
        return _label(table, spec.label, path, base)
    out = empty((table.num_rows, len(spec.labels)), np.float32)
    for j, (column, loss) in enumerate(spec.labels):
        out[:, j] = _label(table, column, path, base, loss)
    return out


def _label(table: pa.Table, column: str, path: str, base: int, loss: str = "bce") -> np.ndarray:
    array = _column(table, column)
    if array.null_count:
        raise DataError(f"{path}: column '{column}' (label): null at row {base + _null_row(array)}")
    y = empty(len(array), np.float32)
    y[:] = array.to_numpy(zero_copy_only=False)
    nan = np.isnan(y)
    if nan.any():
        raise DataError(f"{path}: column '{column}' (label): NaN at row {base + _first(nan)}")
    if loss == "mse":
        infinite = ~np.isfinite(y)
        if infinite.any():
            raise DataError(f"{path}: column '{column}' (label): {float(y[_first(infinite)])} at "
                            f"row {base + _first(infinite)}")
        return y
    outside = (y < 0) | (y > 1)
    if outside.any():
        at = _first(outside)
        value = y[at]
        shown = int(value) if float(value).is_integer() else float(value)
        raise DataError(f"{path}: column '{column}' (label): value {shown} at row {base + at} is "
                        f"outside [0, 1] (a label is a click 0/1 or a probability)")
    return y


_NULL_HINT = "; set null: skip or null: {id: VALUE} on the feature to read it"


def _flatten(array: pa.Array, column: str, owner: str, path: str, base: int, hint: str = ""
             ) -> tuple[pa.Array, np.ndarray | None]:
    """Values and int64 offsets (None for a scalar column) of a possibly list-typed array.

    ``hint`` ends the message of a null (ids: what the feature's ``null:`` rule offers)."""
    if array.null_count:
        what = "null list" if _list_value_type(array.type) is not None else "null id"
        raise DataError(f"{path}: column '{column}' ({owner}): {what} at row "
                        f"{base + _null_row(array)}{hint}")
    if _list_value_type(array.type) is None:
        return array, None
    n = len(array)
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        values = array.flatten()
        offsets = np.arange(0, n * size + 1, size, dtype=np.int64)
    else:
        if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
            array = array.cast(pa.large_list(array.type.value_type))
        offsets = np.asarray(array.offsets, dtype=np.int64)
        start, stop = int(offsets[0]), int(offsets[-1])
        values = array.values.slice(start, stop - start)
        if start:
            offsets = offsets - start
    values = _decoded(values)
    if values.null_count:
        at = _null_row(values)
        row = int(np.searchsorted(offsets, at, side="right")) - 1
        raise DataError(f"{path}: column '{column}' ({owner}): null list element at row "
                        f"{base + row}{hint}")
    return values, offsets


def _readonly_int64(a: np.ndarray) -> np.ndarray:
    """A read-only contiguous int64 view (one compiled kernel signature for every id source)."""
    a = np.ascontiguousarray(a, dtype=np.int64).view()
    a.flags.writeable = False
    return a


def _keys_into(values: pa.Array, s: SparseSpec, out: np.ndarray, path: str) -> None:
    """Hash or cast ``values`` into ``out`` (int64), checking or folding static tables' range."""
    owner = f"feature '{s.name}'"
    if s.string_ids:
        raw = hash_string_array(values)
    else:
        raw = _numeric_values(values)
        if raw.dtype == np.uint64 and raw.size and int(raw.max()) > np.iinfo(np.int64).max:
            at = _first(raw > np.iinfo(np.int64).max)
            raise DataError(f"{path}: column '{s.column}' ({owner}): id {int(raw[at])} "
                            "does not fit in int64")
    mode = 0 if s.rows is None else (2 if s.modulo else 1)
    raw = _readonly_int64(raw)
    bad = copy_ids(raw, out, s.rows or 1, mode)
    if bad >= 0:
        shown = (f"id {values[bad].as_py()!r} (hashed to {int(raw[bad])})" if s.string_ids
                 else f"id {int(raw[bad])}")
        raise DataError(f"{path}: column '{s.column}' ({owner}): {shown} outside table "
                        f"'{s.table}' rows [0, {s.rows}); set out_of_range: modulo on the "
                        "feature or give the table a dynamic block")


def _ids(table: pa.Table, s: SparseSpec, path: str, base: int, out: np.ndarray | None
         ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(keys, offsets or None for one id per row, weights) of one feature; one-hot keys go to ``out``."""
    owner = f"feature '{s.name}'"
    array = _column(table, s.column)
    w_array = _column(table, s.weights) if s.weights else None
    array, w_array = apply_null_rule(array, w_array, s.null, s.null_id, s.column, owner, path)
    values, offsets = _flatten(array, s.column, owner, path, base,
                               _NULL_HINT if s.null == "error" else "")
    if offsets is not None:
        lengths = np.diff(offsets)
        if s.hotness == 1:
            bad = lengths > 1 if s.null == "skip" else lengths != 1
            if bad.any():
                r = _first(bad)
                n = int(lengths[r])
                fix = ("; set hotness: variable for a list of ids" if n > 1 else
                       "; set null: skip to read an empty list as no id")
                raise DataError(f"{path}: column '{s.column}' ({owner}): row {base + r} has "
                                f"{n} ids, hotness 1 needs exactly one{fix}")
            if s.null != "skip":
                offsets = None
        elif s.hotness is not None and lengths.size and int(lengths.max()) > s.hotness:
            r = _first(lengths > s.hotness)
            raise DataError(f"{path}: column '{s.column}' ({owner}): row {base + r} has "
                            f"{int(lengths[r])} ids, more than hotness {s.hotness}")
    keys = out if out is not None else empty(len(values), np.int64)
    _keys_into(values, s, keys, path)
    weights = None
    if s.weights:
        w_owner = f"weights of feature '{s.name}'"
        assert w_array is not None
        w_values, w_offsets = _flatten(w_array, s.weights, w_owner, path, base)
        ids_offsets = offsets
        if ids_offsets is None and w_offsets is not None:
            ids_offsets = one_hot_offsets(len(values))
        if w_offsets is not None and not np.array_equal(w_offsets, ids_offsets):
            r = _first(np.diff(w_offsets) != np.diff(ids_offsets))  # type: ignore[arg-type]
            raise DataError(f"{path}: column '{s.weights}' ({w_owner}): row {base + r} has "
                            f"{int(w_offsets[r + 1] - w_offsets[r])} weights but "
                            f"{int(ids_offsets[r + 1] - ids_offsets[r])} ids in column "  # type: ignore[index]
                            f"'{s.column}'")
        weights = w_values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return keys, offsets, weights


def convert(table: pa.Table, spec: ReadSpec, path: str, base: int) -> Chunk:
    """Convert rows of ``path`` (first row = file row ``base``) into a :class:`Chunk`."""
    n = table.num_rows
    dense = empty((n, spec.n_dense), np.float32)
    j = 0
    for d in spec.dense:
        _dense_block(table, d, dense, j, path, base)
        j += len(d.columns)
    _transform_dense(dense, spec)
    label = _labels(table, spec, path, base)
    onehot = empty((len(spec.onehot), n), np.int64)
    onehot_weights: dict[str, np.ndarray] = {}
    for f, s in enumerate(spec.onehot):
        _, _, w = _ids(table, s, path, base, onehot[f])
        if w is not None:
            onehot_weights[s.name] = w
    ragged: dict[str, Ragged] = {}
    for s in spec.lists:
        keys, offsets, w = _ids(table, s, path, base, None)
        assert offsets is not None
        ragged[s.name] = Ragged(keys, offsets, w)
    return Chunk(n, dense, label, onehot, onehot_weights, ragged)
