"""The disk tier as the engine's backing store of a tiered table (``RowStore`` protocol of
:mod:`embtrain.embedding.tiers`): a :class:`~embtrain.storage.disk.RowFile` per table shard
under the tier's ``path``, created fresh by every run (a resumed run rebuilds it from its
checkpoint through the engine's import)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np

from embtrain.embedding.config import TableConfig
from embtrain.embedding.initializers import initializer_code
from embtrain.embedding.tiers import StoreCounters
from embtrain.storage.disk import RowFile, RowLayout, Rows, tier_file_name
from embtrain.storage.tier_io import Ticket, TierIO


def shard_layout(t: TableConfig, widths: list[int], seed: int,
                 slot_inits: list[float] | None = None) -> RowLayout:
    """The record layout of table shard ``t`` with optimizer slots of ``widths`` starting at
    ``slot_inits`` (default 0)."""
    kind, param = initializer_code(t.initializer)
    p = t.placement
    place = (0, 1, 0, t.dim) if p is None else (p.row_offset, p.row_stride, p.col_start,
                                                max(p.full_dim, t.dim))
    inits = slot_inits or [0.0] * len(widths)
    slots = tuple((f"slot{i}", int(w), float(v)) for i, (w, v) in enumerate(zip(widths, inits,
                                                                               strict=True)))
    return RowLayout(t.name, t.rows, t.dim, int(seed), kind, float(param), slots, place,
                     t.dtype, t.state_dtype)


class DiskStore:
    """Every row of one table shard ever written back, in a tier file (see module docstring).

    All file work runs on one ordered I/O thread (:class:`~embtrain.storage.tier_io.TierIO`):
    write-backs are queued and the step goes on; :meth:`prefetch` queues the read of the
    rows the next step will miss, so it runs while this step computes (the kernels release
    the GIL); :meth:`read` serves those rows from the prefetched copy and reads any others on
    demand, after every write queued before it. ``counters.wait_seconds``: time the step
    spent blocked on the thread.
    """

    fills_all = True  # read() fills every row: the stored state or the initial one

    def __init__(self, t: TableConfig, widths: list[int], seed: int, depth: int = 16,
                 slot_inits: list[float] | None = None):
        assert t.tier is not None and t.tier.path is not None
        p = t.placement
        name = tier_file_name(t.name, 0 if p is None else p.row_offset,
                              1 if p is None else p.row_stride, 0 if p is None else p.col_start)
        self.path = Path(t.tier.path) / name
        self.file = RowFile.create(self.path, shard_layout(t, widths, seed, slot_inits),
                                   uuid.uuid4().hex,
                                   depth=depth)
        self.io = TierIO(self.file)
        self.counters = StoreCounters()
        self._ticket: Ticket | None = None
        self._staged_keys = np.empty(0, np.int64)  # sorted keys of the prefetch in flight
        self._staged_ok = np.empty(0, np.bool_)  # False: written since, the copy is stale

    def _sync(self) -> None:
        c, st = self.counters, self.io.stats()
        c.rows_read, c.rows_written = st.rows_read, st.rows_written
        c.bytes_read, c.bytes_written = st.bytes_read, st.bytes_written
        c.wait_seconds = st.wait_seconds
        f = self.file.counters  # the file's reads of rows' records (its own thread's)
        c.read_seconds, c.read_blocks = f.read_seconds, f.read_blocks

    def write(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
              meta: np.ndarray) -> None:
        """Queue whole rows for the file (the arrays are handed over: the caller passes
        copies)."""
        keys = np.asarray(rows, np.int64)
        if self._staged_keys.size:  # a prefetched copy of a row written now is stale
            self._drop_staged(keys)
        self.io.write_back(Rows(keys, values, slots, meta))
        self._sync()

    def prefetch(self, rows: np.ndarray) -> None:
        """Start reading ``rows`` (distinct) in the background, for the next :meth:`read`."""
        keys = np.unique(np.asarray(rows, np.int64))
        self._ticket = self.io.prefetch(keys)
        self._staged_keys = keys
        self._staged_ok = np.ones(keys.size, np.bool_)

    def _drop_staged(self, keys: np.ndarray) -> None:
        self._staged_ok &= ~np.isin(self._staged_keys, keys)

    def read(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
             meta: np.ndarray) -> np.ndarray:
        """Fill the outputs with the rows' stored (or initial) state; returns which ones
        were ever written (all rows are filled: the file computes the others' initial
        state, equal to the engine's)."""
        keys = np.asarray(rows, np.int64)
        staged = np.zeros(keys.size, np.bool_)
        if self._ticket is not None:
            got = self.io.wait(self._ticket)
            pos = np.searchsorted(self._staged_keys, keys)
            pos = np.minimum(pos, max(self._staged_keys.size - 1, 0))
            staged = ((self._staged_keys.size > 0) & (self._staged_keys[pos] == keys)
                      & self._staged_ok[pos] if self._staged_keys.size else staged)
            hit = np.flatnonzero(staged)
            src = pos[hit]
            values[hit] = got.values[src]
            for dst, arr in zip(slots, got.slots, strict=True):
                dst[hit] = arr[src]
            meta[hit] = got.meta[src]
            self.counters.rows_ahead += int(hit.size)
            self._ticket, self._staged_keys = None, np.empty(0, np.int64)
        rest = np.flatnonzero(~staged)
        if rest.size:
            got = self.io.read(keys[rest])
            values[rest] = got.values
            for dst, arr in zip(slots, got.slots, strict=True):
                dst[rest] = arr
            meta[rest] = got.meta
        self._sync()
        return np.ones(keys.size, np.bool_)

    def written(self) -> np.ndarray:
        """The rows ever written, ascending (after the queued writes)."""
        self.io.flush()
        return self.file.written_keys()

    def close(self) -> None:
        """Finish the queued work, write the file's index and mark it clean."""
        self.io.close()


def open_row_store(t: TableConfig, widths: list[int], seed: int,
                   slot_inits: list[float] | None = None) -> DiskStore:
    """The disk tier of tiered table shard ``t`` (``t.tier.store``: ``disk``), whose optimizer
    slots have ``widths`` and start at ``slot_inits``."""
    return DiskStore(t, widths, seed, slot_inits=slot_inits)
