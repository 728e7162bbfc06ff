"""Whether an export's values fit the half type a recipe's table converts them to as it loads.

float16's largest finite value is 65504: a float32 (or bfloat16) value beyond it loads as
``inf``, and the run then stops at its first step. bfloat16 has float32's range, so nothing
loads as ``inf`` there (it only rounds)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from embtrain.checkpoint.layout import (
    TableData,
    array_format,
    iter_parquet_chunks,
    iter_table_chunks,
)

#: float16's largest finite value.
FLOAT16_MAX = float(np.finfo(np.float16).max)


def as_float32(array: np.ndarray, dtype: str) -> np.ndarray:
    """A table's stored array (float32, or a half type stored as uint16 patterns) as float32."""
    if dtype == "float32":
        return np.asarray(array, np.float32)
    bits = np.asarray(array).view(np.uint16)
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def _chunks(bundle: Any, name: str) -> Iterator[TableData]:
    if array_format(bundle) == "parquet":
        return iter_parquet_chunks(bundle, name)
    return iter_table_chunks(bundle, name, verify=True)


def largest_magnitude(bundle: Any, name: str, state: bool) -> float:
    """The largest finite ``|value|`` of table ``name``'s values (``state``: of its optimizer
    slots), read chunk by chunk."""
    largest = 0.0
    for data in _chunks(bundle, name):
        dtype = data.state_dtype if state else data.dtype
        for array in (data.slots.values() if state else [data.values]):
            if np.size(array):
                values = np.abs(as_float32(array, dtype))
                finite = values[np.isfinite(values)]
                if finite.size:
                    largest = max(largest, float(finite.max()))
    return largest


def float16_overflows(bundle: Any, recipe: Any) -> list[str]:
    """One line per table of ``recipe`` that converts to float16 as it loads and holds a value
    beyond float16's range (empty when every value fits)."""
    lines = []
    tables = bundle.manifest.get("tables", {})
    for t in recipe.tables:
        meta = tables.get(t.name)
        if meta is None:
            continue
        for state, now, then in ((False, t.dtype, meta.get("dtype", "float32")),
                                 (True, t.state_dtype, meta.get("state_dtype", "float32"))):
            if now != "float16" or then == "float16" or (state and not meta.get("slots")):
                continue
            largest = largest_magnitude(bundle, t.name, state)
            if largest > FLOAT16_MAX:
                what = "optimizer state" if state else "values"
                lines.append(
                    f"table {t.name}: {what} up to {largest:.6g} in the export, beyond float16's "
                    f"range (largest {FLOAT16_MAX:.0f}): they would load as inf; keep the "
                    "table float32 or make it bfloat16 (float32's range)")
    return lines
