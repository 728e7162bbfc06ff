"""What ``EmbeddingEngine.import_table`` writes, checked before anything is written: a
:class:`~embtrain.embedding.rowspace.TableState` (a checkpoint's, an export's, ``load``'s)
against the table's dim, dtype and optimizer slots, converted to the table's dtypes (a
checkpoint of another dtype is converted; float32 values are narrowed to nearest into a half
table). A refused import changes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from embtrain.embedding.halves import converted
from embtrain.embedding.optimizers import SlotSpec
from embtrain.embedding.rowspace import TableState

__all__ = ["ImportArrays", "import_arrays"]


class ImportArrays(NamedTuple):
    """The arrays to write: values, ``(slot index, array)`` for each slot given, update counts
    and ``last_step + 1`` (None: left as they are)."""

    values: np.ndarray
    slots: list[tuple[int, np.ndarray]]
    counts: np.ndarray | None
    last: np.ndarray | None


def import_arrays(name: str, state: TableState, keys: np.ndarray, dim: int, value_code: int,
                  slot_code: int, slot_specs: Sequence[SlotSpec]) -> ImportArrays:
    """``state``'s arrays for the ``keys.size`` rows of table ``name`` (``dim`` columns,
    values and slots stored as ``value_code``/``slot_code``, slots ``slot_specs`` in kernel
    order); raises ValueError naming the table and the array that does not fit."""
    source, source_state = getattr(state, "dtype", None), getattr(state, "state_dtype", None)
    values = converted(state.values, source, value_code, f"table {name!r}: values")
    if values.shape != (keys.size, dim):
        raise ValueError(f"table {name!r}: values shape {values.shape} != {(keys.size, dim)}")
    extra = set(state.slots) - {s.name for s in slot_specs}
    if extra:
        raise ValueError(f"table {name!r}: unknown slots {sorted(extra)}")
    slots = []
    for i, spec in enumerate(slot_specs):
        if spec.name not in state.slots:
            continue
        src = converted(state.slots[spec.name], source_state, slot_code,
                        f"table {name!r}: slot {spec.name!r}")
        want = (keys.size,) if spec.per_row else (keys.size, dim)
        if src.shape != want:
            raise ValueError(f"table {name!r}: slot {spec.name!r} shape {src.shape} != {want}")
        slots.append((i, src))
    limit = np.iinfo(np.int32).max
    counts = last = None
    if state.update_count is not None:
        counts = np.asarray(state.update_count, dtype=np.int64).reshape(-1)
        if counts.shape != (keys.size,):
            raise ValueError(f"table {name!r}: update_count shape {counts.shape} != "
                             f"{(keys.size,)}")
    if state.last_step is not None:
        last = np.asarray(state.last_step, dtype=np.int64).reshape(-1) + 1
        if last.shape != (keys.size,):
            raise ValueError(f"table {name!r}: last_step shape {last.shape} != {(keys.size,)}")
        if last.size and int(last.max()) > limit:
            raise ValueError(f"table {name!r}: last_step above {limit - 1} is not supported")
    return ImportArrays(values, slots, counts, last)
