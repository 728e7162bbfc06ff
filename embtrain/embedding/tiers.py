"""Backing stores of tiered static tables: every row of a table below its first-tier cache.

A tiered table is a static table whose rows live in a fixed number of cache rows of its fused
group (the first tier) in front of a :class:`RowStore` holding every row written back so far.
The cache is the engine's key → row phase (:mod:`embtrain.embedding.dynamic`) with the row
ids as keys: a miss fills a cache row from the store (or, for a row never written, from its
initializer: initial values depend only on seed, table and row), an evicted row is written
back first. Lookups and updates only ever touch cache rows, so a tiered run computes exactly
what an all-in-memory run computes.

A *dynamic* table behind a cache adds a :class:`KeyDirectory`: the whole table's key → row
index, admission state, eviction and TTL, exactly as the all-in-memory dynamic table keeps
them (its rows are the rows that table would use), with each row's metadata kept in memory
for the eviction and TTL scores. Those rows are then the cache's keys, as a static table's
rows are: one more lookup per key, and the same computation as all in memory.

A store keeps a row's values, optimizer slots and ``meta`` (``update_count``,
``last_step + 1``) together. :class:`MemoryStore` is the host-memory tier (dense arrays of the
whole table, for a first tier on a device); the disk tier implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from embtrain.embedding.config import TableConfig
from embtrain.embedding.dynamic import DynamicTable

__all__ = ["KeyDirectory", "MemoryStore", "RowStore", "StoreCounters", "StoreOpener",
           "default_stores", "use_stores"]


class StoreCounters:
    """Rows and bytes moved by a store, the seconds and (for a file) 4 KiB blocks its reads of
    rows took, and seconds the step waited on it."""

    def __init__(self) -> None:
        self.rows_read = 0
        self.rows_written = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.read_seconds = 0.0
        self.read_blocks = 0
        self.wait_seconds = 0.0
        self.rows_ahead = 0  # rows a step found already read ahead (prefetched)

    def as_dict(self) -> dict[str, float]:
        """JSON-ready counters."""
        return {"rows_read": self.rows_read, "rows_ahead": self.rows_ahead,
                "rows_written": self.rows_written,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                "read_seconds": round(self.read_seconds, 6), "read_blocks": self.read_blocks,
                "wait_seconds": round(self.wait_seconds, 6)}


class RowStore(Protocol):
    """Every row of one table shard below the cache (rows ``0..rows-1``)."""

    counters: StoreCounters

    def write(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
              meta: np.ndarray) -> None:
        """Store whole rows (values ``[n, dim]``, each slot ``[n, w]``, meta ``[n, 2]``)."""
        ...

    def read(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
             meta: np.ndarray) -> np.ndarray:
        """Fill the outputs for the rows ever written; returns which ones were (bool ``[n]``);
        the others' outputs are left as they are."""
        ...

    def written(self) -> np.ndarray:
        """The rows ever written, ascending."""
        ...

    def close(self) -> None:
        """Release the store's resources."""
        ...


class MemoryStore:
    """A host-memory store: dense arrays of the whole shard (written rows only filled)."""

    def __init__(self, rows: int, dim: int, slot_widths: list[int],
                 value_type: type = np.float32, slot_type: type = np.float32):
        self.rows, self.dim = int(rows), int(dim)
        # a half table's rows as its 16-bit patterns (``value_type``/``slot_type`` np.uint16)
        self.values = np.zeros((self.rows, self.dim), dtype=value_type)
        self.slots = [np.zeros((self.rows, w), dtype=slot_type) for w in slot_widths]
        self.meta = np.zeros((self.rows, 2), dtype=np.int32)
        self.is_written = np.zeros(self.rows, dtype=np.bool_)
        self.record_bytes = (self.values.itemsize * self.dim
                             + np.dtype(slot_type).itemsize * sum(slot_widths) + 8)
        self.counters = StoreCounters()

    @classmethod
    def of(cls, t: TableConfig, slot_widths: list[int]) -> MemoryStore:
        """The store of table shard ``t`` (its rows in the table's dtype)."""
        half = np.uint16 if t.is_half else np.float32
        return cls(t.rows, t.dim, slot_widths, half,
                   half if t.state_dtype != "float32" else np.float32)

    def write(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
              meta: np.ndarray) -> None:
        """Store whole rows."""
        self.values[rows] = values
        for dst, src in zip(self.slots, slots, strict=True):
            dst[rows] = src
        self.meta[rows] = meta
        self.is_written[rows] = True
        self.counters.rows_written += int(rows.size)
        self.counters.bytes_written += int(rows.size) * self.record_bytes

    def read(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
             meta: np.ndarray) -> np.ndarray:
        """Fill the outputs of the rows ever written."""
        found = self.is_written[rows]
        hit = np.flatnonzero(found)
        src = rows[hit]
        values[hit] = self.values[src]
        for dst, arr in zip(slots, self.slots, strict=True):
            dst[hit] = arr[src]
        meta[hit] = self.meta[src]
        self.counters.rows_read += int(hit.size)
        self.counters.bytes_read += int(hit.size) * self.record_bytes
        return found

    def written(self) -> np.ndarray:
        """The rows ever written, ascending."""
        return np.flatnonzero(self.is_written).astype(np.int64)

    def close(self) -> None:
        """Nothing to release."""


# (table shard, its slots' widths, seed, the slots' initial values) → the shard's row store
StoreOpener = Callable[[TableConfig, list[int], int, list[float]], RowStore]


def _memory_only(t: TableConfig, widths: list[int], seed: int, inits: list[float]) -> RowStore:
    """Row stores without :mod:`embtrain.storage`: the host-memory tier only."""
    assert t.tier is not None
    if t.tier.store != "memory":
        raise ValueError(f"table {t.name!r}: tier store {t.tier.store!r} needs a row store "
                         "opener (embtrain.storage.open_store); none was given")
    return MemoryStore.of(t, widths)


_default: StoreOpener = _memory_only


def use_stores(opener: StoreOpener) -> None:
    """Make ``opener`` the row store opener of engines built without one (the registry of
    tier kinds in :mod:`embtrain.storage` installs itself when imported)."""
    global _default
    _default = opener


def default_stores() -> StoreOpener:
    """The row store opener of engines built without one (see :func:`use_stores`)."""
    return _default


class KeyDirectory:
    """(Its memory: :func:`embtrain.plan.cost.directory_bytes`.)

    Keys of a dynamic table whose rows sit behind a cache: ``table`` maps key → row
    (``0..capacity-1``, the rows the table would use all in memory) with its admission,
    eviction and TTL; ``meta`` holds every row's ``(update_count, last_step + 1)`` as of when
    it left the cache (the cache's rows are newer: :meth:`sync_meta`); ``on_store`` says which
    rows the store holds for their current key (a row taken by a new key starts from its
    initializer, whatever an earlier key left in the store)."""

    def __init__(self, config: TableConfig, seed: int):
        self.table = DynamicTable(config, seed)
        self.meta = np.zeros((self.table.capacity, 2), dtype=np.int32)
        self.on_store = np.zeros(self.table.capacity, dtype=np.bool_)

    def sync_meta(self, cache: DynamicTable, cache_meta: np.ndarray) -> None:
        """Copy the cached rows' metadata (``cache_meta``: the cache region's ``meta``) into
        :attr:`meta`, before eviction or TTL reads it."""
        live = np.flatnonzero(cache.row_live)
        self.meta[cache.row_key[live]] = cache_meta[live]

    def reset(self, rows: np.ndarray) -> None:
        """Rows that now hold new keys (or none): not in the store, metadata zero."""
        self.on_store[rows] = False
        self.meta[rows] = 0
