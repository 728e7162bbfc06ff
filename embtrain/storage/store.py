"""The disk tier as the engine's backing store of a tiered table (``RowStore`` protocol of
:mod:`embtrain.embedding.tiers`): a :class:`~embtrain.storage.disk.RowFile` per table shard
under the tier's ``path``, created fresh by every run (a resumed run rebuilds it from its
checkpoint through the engine's import)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np

from embtrain.embedding.config import TableConfig
from embtrain.embedding.initializers import initializer_code
from embtrain.embedding.tiers import StoreCounters
from embtrain.storage.disk import RowFile, RowLayout, Rows, tier_file_name


def shard_layout(t: TableConfig, widths: list[int], seed: int) -> RowLayout:
    """The record layout of table shard ``t`` with optimizer slots of ``widths``."""
    kind, param = initializer_code(t.initializer)
    p = t.placement
    place = (0, 1, 0, t.dim) if p is None else (p.row_offset, p.row_stride, p.col_start,
                                                max(p.full_dim, t.dim))
    slots = tuple((f"slot{i}", int(w), 0.0) for i, w in enumerate(widths))
    return RowLayout(t.name, t.rows, t.dim, int(seed), kind, float(param), slots, place)


class DiskStore:
    """Every row of one table shard ever written back, in a tier file (see module docstring).
    Reads and writes are synchronous: the step waits for them (``counters.wait_seconds``)."""

    def __init__(self, t: TableConfig, widths: list[int], seed: int, depth: int = 16):
        assert t.tier is not None and t.tier.path is not None
        p = t.placement
        name = tier_file_name(t.name, 0 if p is None else p.row_offset,
                              1 if p is None else p.row_stride, 0 if p is None else p.col_start)
        self.path = Path(t.tier.path) / name
        self.file = RowFile.create(self.path, shard_layout(t, widths, seed), uuid.uuid4().hex,
                                   depth=depth)
        self.counters = StoreCounters()

    def _sync(self, t0: float) -> None:
        c, f = self.counters, self.file.counters
        c.rows_read, c.rows_written = f.rows_read, f.rows_written
        c.bytes_read, c.bytes_written = f.bytes_read, f.bytes_written
        c.wait_seconds += time.perf_counter() - t0

    def write(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
              meta: np.ndarray) -> None:
        """Store whole rows (values ``[n, dim]``, each slot ``[n, w]``, meta ``[n, 2]``)."""
        t0 = time.perf_counter()
        self.file.write(Rows(np.asarray(rows, np.int64), values, slots, meta))
        self._sync(t0)

    def read(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
             meta: np.ndarray) -> np.ndarray:
        """Fill the outputs for the rows ever written; returns which ones were."""
        t0 = time.perf_counter()
        keys = np.asarray(rows, np.int64)
        found = self.file.read_written(keys, Rows(np.empty_like(keys), values, slots, meta))
        self._sync(t0)
        return found

    def written(self) -> np.ndarray:
        """The rows ever written, ascending."""
        return self.file.written_keys()

    def close(self) -> None:
        """Write the file's index and mark it clean."""
        self.file.close()


def open_row_store(t: TableConfig, widths: list[int], seed: int) -> DiskStore:
    """The disk tier of tiered table shard ``t`` (``t.tier.store == "disk"``)."""
    return DiskStore(t, widths, seed)
