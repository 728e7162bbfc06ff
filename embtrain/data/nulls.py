"""A categorical feature's ``null:`` rule, applied to Arrow arrays before conversion.

``skip``: a null id is no id (a null list is an empty list; a null one-hot id makes the row's
bag empty, so the feature reads zeros there); ``id``: a null id, and a null list, read as the
rule's id. An id the rule supplies weighs 1; the weight of an id it drops is dropped with it.
After :func:`apply_null_rule` the ids hold no null, so the conversion that follows is the
one every feature takes. Vectorised: pyarrow compute and NumPy, no loop per row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embtrain.errors import DataError


def is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _valid(array: pa.Array) -> np.ndarray:
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _as_large_list(array: pa.Array) -> pa.Array:
    if pa.types.is_large_list(array.type):
        return array
    return array.cast(pa.large_list(array.type.value_type))


def _parts(array: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Values and int64 offsets (from 0) of a large-list array without null lists."""
    offsets = np.asarray(array.offsets, dtype=np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    return array.values.slice(start, stop - start), offsets - start if start else offsets


def _from_parts(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)


def _fill(array: pa.Array, value: int | str, column: str, owner: str, path: str) -> pa.Array:
    try:
        return pc.fill_null(array, pa.scalar(value, array.type))
    except (pa.ArrowInvalid, OverflowError):
        raise DataError(f"{path}: column '{column}' ({owner}): null: id {value!r} does not fit "
                        f"the column's type {array.type}") from None


def apply_null_rule(ids: pa.Array, weights: pa.Array | None, rule: str, value: int | str | None,
                    column: str, owner: str, path: str) -> tuple[pa.Array, pa.Array | None]:
    """``ids`` (and ``weights``, shaped like them) with the ``skip`` or ``id`` rule applied.

    A one-hot (scalar) column under ``skip`` becomes a list column of 0 or 1 ids per row.
    Weights that do not line up with the ids are left as they are (the conversion names the
    mismatch); null weights at rows the rule does not touch stay nulls (an error there).
    """
    if rule not in ("skip", "id"):
        return ids, weights
    skip = rule == "skip"
    if not is_list(ids.type):
        if not ids.null_count:
            if skip:  # still a list feature: every row holds its one id
                offsets = np.arange(len(ids) + 1, dtype=np.int64)
                ids = _from_parts(offsets, ids)
                weights = None if weights is None else _from_parts(offsets, weights)
            return ids, weights
        valid = _valid(ids)
        if not skip:
            filled = _fill(ids, value, column, owner, path)  # type: ignore[arg-type]
            if weights is not None and not is_list(weights.type):
                weights = pc.if_else(pa.array(~valid), pa.scalar(1, weights.type), weights)
            return filled, weights
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(valid, out=offsets[1:])
        mask = pa.array(valid)
        ids = _from_parts(offsets, ids.filter(mask))
        if weights is not None and not is_list(weights.type):
            weights = _from_parts(offsets, weights.filter(mask))
        return ids, weights

    ids = _as_large_list(ids)
    w_list = weights is not None and is_list(weights.type)
    if w_list:
        weights = _as_large_list(weights)  # type: ignore[arg-type]
    if ids.null_count:  # null lists: empty, or the rule's id
        null_rows = ids.is_null()
        if skip:
            ids = pc.if_else(null_rows, pa.scalar([], ids.type), ids)
        else:
            try:
                one = pa.scalar([value], ids.type)
            except (pa.ArrowInvalid, OverflowError):
                raise DataError(f"{path}: column '{column}' ({owner}): null: id {value!r} does "
                                f"not fit the column's type {ids.type.value_type}") from None
            ids = pc.if_else(null_rows, one, ids)
        if w_list:
            w_fill = pa.scalar([] if skip else [1], weights.type)  # type: ignore[union-attr]
            weights = pc.if_else(null_rows, w_fill, weights)
    values, offsets = _parts(ids)
    if not values.null_count:
        return ids, weights
    w_values = None
    if w_list and not weights.null_count:  # type: ignore[union-attr]
        w_vals, w_offsets = _parts(weights)
        if np.array_equal(w_offsets, offsets):
            w_values = w_vals
    keep = _valid(values)
    if skip:
        cum = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(keep, out=cum[1:])
        new_offsets = cum[offsets]
        mask = pa.array(keep)
        ids = _from_parts(new_offsets, values.filter(mask))
        if w_values is not None:
            weights = _from_parts(new_offsets, w_values.filter(mask))
        return ids, weights
    ids = _from_parts(offsets, _fill(values, value, column, owner, path))  # type: ignore[arg-type]
    if w_values is not None:
        weights = _from_parts(offsets, pc.if_else(pa.array(~keep),
                                                  pa.scalar(1, w_values.type), w_values))
    return ids, weights
