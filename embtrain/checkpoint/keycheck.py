"""The keys of an export against the tables they would load into (`load` and `load --check`).

A dynamic table's keys are arbitrary 64-bit ids; a static table (in memory, or tiered without a
key directory) holds rows ``0..rows-1``. Loading the first into the second must be refused
before anything is imported, by the same check whether the user asked `load --check` or `load`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embtrain.checkpoint.bundle import Bundle
from embtrain.checkpoint.layout import array_format, iter_table_chunks, read_table


def _key_range(bundle: Bundle, name: str) -> tuple[int, int] | None:
    """``(min, max)`` of table ``name``'s keys in ``bundle`` (None: no keys); keys only read."""
    lo, hi = None, None
    if array_format(bundle) == "parquet":
        parts: Any = [read_table(bundle, name, verify=True)]
    else:
        parts = iter_table_chunks(bundle, name, members=["keys"], verify=True)
    for part in parts:
        keys = np.asarray(part.keys)
        if keys.size:
            lo = int(keys.min()) if lo is None else min(lo, int(keys.min()))
            hi = int(keys.max()) if hi is None else max(hi, int(keys.max()))
    return None if lo is None or hi is None else (lo, hi)


def check_keys(bundle: Bundle, recipe: Any) -> None:
    """Refuse (one line, exit 2) an export whose keys a static table of ``recipe`` cannot hold:
    the line the import itself would give, before anything is imported."""
    from embtrain.checkpoint.manager import _key_error

    tables = bundle.manifest.get("tables", {})
    for t in recipe.tables:
        meta = tables.get(t.name)
        if meta is None or t.is_dynamic or not meta.get("dynamic"):
            continue  # into a dynamic table: any key; static into static: rows compared
        found = _key_range(bundle, t.name)
        if found is None:
            continue
        lo, hi = found
        rows = int(t.capacity)
        if lo < 0 or hi >= rows:
            raise _key_error(bundle, t.name, lo if lo < 0 else hi, rows)
