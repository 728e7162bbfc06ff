"""A table's row space: where the rows of its keys live, behind one interface.

The engine packs tables into fused groups (one ``values`` / slots / ``meta`` array set per
group) and runs the fused forward and backward over *rows* of those arrays. Which row a key
reads, and what happens to rows around a step, is the table's row space:

=====================  ==============================================================
:class:`StaticRows`    rows ``0..rows-1`` of the table: a key is its row (``rows_static``)
:class:`HashRows`      a dynamic hash table in memory (``rows_hash``)
:class:`CachedRows`    a static table's cache rows in front of a row store (``rows_cache``)
:class:`DirectoryRows` a dynamic table's cache over a store, with a key directory
                       (``rows_directory``)
=====================  ==============================================================

Per step, for the keyed kinds (:mod:`embtrain.embedding.keyed` runs them fused, one
lookup for all tables of a group): ``resolve`` (keys → rows, placing the missed keys),
``write_back`` (evicted cache rows to the store), ``read_in`` (new rows from the store or
their initializer), and after the update ``expire`` (TTL); ``prefetch`` starts reading what
the next batch will miss. Checkpoints go through ``export_*`` / ``import_rows``; each space
reports its ``metrics()``.

A row space sees its table's rows of the group arrays through :meth:`TableRows.bind`
(called again when the group is rebuilt with more scratch rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from embtrain.embedding.config import TableConfig
from embtrain.embedding.dynamic import DynamicTable
from embtrain.embedding.halves import DTYPE_CODES
from embtrain.embedding.optimizers import SlotSpec
from embtrain.errors import DataError
from embtrain.kernels import KernelBackend
from embtrain.kernels import dynamic as kd

__all__ = ["GroupArrays", "KeyOutOfRangeError", "RowContext", "TableRows", "TableState",
           "chunk_bounds"]

_NO_ROWS = np.empty((0, 1), dtype=np.float32)  # an optimizer slot the optimizer lacks

class KeyOutOfRangeError(DataError, ValueError):
    """A key of a static table is outside ``[0, rows)``; names the feature and the value."""

    def __init__(self, feature: str, value: int, table: str | None = None, rows: int | None = None):
        self.feature = feature
        self.value = int(value)
        self.table = table
        self.rows = rows
        where = f" of table {table!r} (rows 0..{rows - 1})" if table is not None and rows else ""
        super().__init__(f"feature {feature!r}: key {self.value} is out of range{where}")


@dataclass
class TableState:
    """A table's full state, for checkpoints: keys (row ids of a static table, the live keys
    of a dynamic one, ascending), values, slots, metadata and a dynamic table's admission
    state (``extra``)."""

    keys: np.ndarray
    values: np.ndarray
    slots: dict[str, np.ndarray] = field(default_factory=dict)
    update_count: np.ndarray | None = None
    last_step: np.ndarray | None = None
    # dynamic tables: what admission remembers (see DynamicTable.admission_state)
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    # the stored form of values and slots: float32, or a half table's 16-bit patterns
    # (np.uint16) of this dtype (embtrain.embedding.halves)
    dtype: str = "float32"
    state_dtype: str = "float32"


class GroupArrays(Protocol):
    """The fused group's arrays a row space reads and writes (the engine's group)."""

    dim: int
    values: np.ndarray
    slots: list[np.ndarray]
    meta: np.ndarray
    table_offset: np.ndarray
    epoch: int


@dataclass(frozen=True)
class RowContext:
    """What every row space of an engine shares: the backend, the seed and the optimizer's
    slots."""

    backend: KernelBackend
    seed: int
    slot_specs: tuple[SlotSpec, ...]


class TableRows:
    """The row space of one table (base of every kind; see the module docstring)."""

    keyed = False  # whether keys go through the key → row phase
    reads_ahead = False  # whether :meth:`prefetch` starts reads (a store that reads ahead)

    def __init__(self, table: TableConfig, ctx: RowContext):
        self.table = table
        self.ctx = ctx
        self.g: GroupArrays = None  # type: ignore[assignment]  # set by bind
        self.ti = 0
        self.offset = 0

    def bind(self, group: GroupArrays, ti: int) -> None:
        """Rows of this table: ``group``'s arrays from its ``table_offset[ti]``."""
        self.g, self.ti, self.offset = group, ti, int(group.table_offset[ti])

    @property
    def region_rows(self) -> int:
        """Rows the table holds in its group (without scratch rows)."""
        return self.table.rows

    # ------------------------------------------------------------------ per step

    def prefetch(self, keys: list[np.ndarray]) -> None:
        """Start reading the rows the next batch's ``keys`` will miss (tiered tables)."""

    def expire(self, step: int) -> None:
        """TTL at the step boundary after training step ``step`` (dynamic tables)."""

    def metrics(self) -> dict[str, dict[str, float]]:
        """``{"dynamic": ...}`` and/or ``{"tier": ...}`` counters of this table."""
        return {}

    def hash_table(self) -> DynamicTable | None:
        """The key → row table (a directory's for a dynamic table behind a cache, the cache's
        for a tiered static one); None for static rows."""
        return None

    # ------------------------------------------------------------------ export / import

    def streams(self) -> bool:
        """Whether export should go chunk by chunk (a tiered table: rows mostly in a store)."""
        return False

    def export_rows(self) -> int:
        """How many rows :meth:`export_table` returns."""
        raise NotImplementedError

    def export_keys(self) -> np.ndarray:
        """The keys :meth:`export_table` returns, ascending (no row is read)."""
        return np.arange(self.export_rows(), dtype=np.int64)

    def export_extra(self) -> dict[str, np.ndarray]:
        """A dynamic table's admission state (empty for a static one)."""
        return {}

    def export_table(self) -> TableState:
        """A copy of the whole table."""
        raise NotImplementedError

    def export_range(self, lo: int, hi: int) -> TableState:
        """The rows whose keys lie in ``[lo, hi)``, ascending by key (``extra`` empty)."""
        raise NotImplementedError

    def export_chunks(self, rows: int) -> Iterator[TableState]:
        """Consecutive chunks of at most ``rows`` rows, ascending by key: together exactly
        :meth:`export_table` (admission state in the first chunk's ``extra``)."""
        extra = self.export_extra()
        bounds = self._chunk_bounds(max(1, int(rows)))
        for i in range(len(bounds) - 1):
            part = self.export_range(bounds[i], bounds[i + 1])
            if i == 0:
                part.extra = extra
            yield part

    def _chunk_bounds(self, step: int) -> list[int]:
        total = self.export_rows()
        return chunk_bounds([*range(0, total, step), total])

    def check_import(self, keys: np.ndarray) -> None:
        """Refuse keys outside the table (static rows; a dynamic table takes any key)."""
        rows = self.table.rows
        if keys.size and (keys.min() < 0 or keys.max() >= rows):
            name = self.table.name
            raise KeyOutOfRangeError(
                name, int(keys.min() if keys.min() < 0 else keys.max()), name, rows)

    def import_rows(self, keys: np.ndarray, values: np.ndarray,
                    slots: list[tuple[int, np.ndarray]], counts: np.ndarray | None,
                    last: np.ndarray | None, extra: dict[str, np.ndarray]) -> None:
        """Overwrite the rows of ``keys`` (checked): values, the given slots (by index),
        update counts (saturating) and ``last_step + 1``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared helpers

    def _write_at(self, target: Any, values: np.ndarray, slots: list[tuple[int, np.ndarray]],
                  counts: np.ndarray | None, last: np.ndarray | None, n: int) -> None:
        """Imported rows into the group arrays at ``target`` (host data to the backend's
        arrays, no copy on CPU)."""
        dev = self.ctx.backend.xp.asarray
        g = self.g
        g.values[target] = dev(values)
        for i, src in slots:
            arr = g.slots[i]
            arr[target] = dev(src.reshape(n, arr.shape[1]))  # also 0 keys
        if counts is not None:
            g.meta[target, 0] = dev(np.minimum(counts, np.iinfo(np.int32).max))  # saturates
        if last is not None:
            g.meta[target, 1] = dev(last)

    def _state_of(self, rows: Any, keys: np.ndarray) -> TableState:
        """The state of group rows ``rows`` (absolute) under ``keys``."""
        host = self.ctx.backend.to_host
        slots = {}
        for spec, arr in zip(self.ctx.slot_specs, self.g.slots, strict=True):
            part = host(arr[rows])
            slots[spec.name] = part.reshape(-1) if spec.per_row else part
        meta = host(self.g.meta[rows])
        return TableState(keys=keys, values=host(self.g.values[rows]), slots=slots,
                          update_count=meta[:, 0].astype(np.int64),
                          last_step=meta[:, 1].astype(np.int64) - 1,
                          dtype=self.table.dtype, state_dtype=self.table.state_dtype)

    def table_meta(self) -> np.ndarray:
        """The table's rows of the group's ``meta`` (its eviction and TTL scores)."""
        return self.g.meta[self.offset : self.offset + self.region_rows]

    def fill_rows(self, rows: np.ndarray, init: np.ndarray | None) -> None:
        """Fresh rows (region-local ``rows``): values ``init`` (float32; zeros if None; a
        half table's narrowed to nearest), slots at their initial values, metadata zero."""
        if rows.size == 0:
            return
        g = self.g
        target = np.ascontiguousarray(rows + self.offset, dtype=np.int64)
        if init is None:
            init = np.zeros((rows.size, self.table.dim), np.float32)
        slots = [*g.slots, _NO_ROWS, _NO_ROWS]
        inits = np.array([spec.initial_value for spec in self.ctx.slot_specs] + [0.0, 0.0],
                         dtype=np.float64)
        kd.fresh_rows(g.values, slots[0], slots[1], inits, g.meta, target,
                      np.ascontiguousarray(init, dtype=np.float32), *self.codes)

    @property
    def codes(self) -> tuple[np.int64, np.int64]:
        """``codes.VAL_*`` of the table's values and of its optimizer slots (a half table's
        fresh rows are narrowed to nearest by the kernels)."""
        return (np.int64(DTYPE_CODES[self.table.dtype]),
                np.int64(DTYPE_CODES[self.table.state_dtype]))


def chunk_bounds(bounds: list[int]) -> list[int]:
    """Export chunk boundaries, at least one (empty) chunk."""
    return bounds if len(bounds) >= 2 else [0, 0]
