"""Per-group scratch of the CPU kernels and the scheduling of their backward: which worker
updates which tables (:func:`backward_items`) and the stamps of the row map
(:func:`map_stamp`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from embtrain.kernels.codes import SPLIT_PARTS
from embtrain.kernels.contract import GroupPlan

if TYPE_CHECKING:
    from embtrain.kernels.cpu import CpuBackend

# id bits of a row map entry: at least 16 (up to 32767 calls between zeroings), at most 30
_MIN_ID_BITS = 16
_MAX_ID_BITS = 30


class CpuScratch:
    """Per-group scratch and tuning of the CPU kernels.

    ``block``: samples per block in the forward and backward kernels (a different value may
    change the summation order of a table read by several features, i.e. the last bit);
    ``workers``: work lists of the backward (None: one per thread; results do not depend on
    it). ``row_map`` entries of the latest backward are ``stamp << id_bits | id`` (see
    :func:`map_stamp`); ``unique_ratio``: unique rows / keys per table in the latest
    backward, to balance the next one.
    """

    def __init__(self, plan: GroupPlan, row_map: np.ndarray):
        self.block = 256
        self.workers: int | None = None
        self.row_map = row_map
        self.map_id_bits = 0
        self.map_stamp = 0
        self.map_dirty = False  # some entry may be non-zero
        self.unique_ratio = np.full(plan.table_rows.shape[0], 0.5)
        self.uniq = np.empty(0, dtype=np.int64)
        self.stage = np.empty((0, 0, 0), dtype=np.float32)
        self.acc = np.empty((0, plan.dim), dtype=np.float32)


def map_stamp(scratch: CpuScratch, most_keys: int, backend: CpuBackend) -> int:
    """The ``stamp`` of this backward's row map entries (``row_map[row] = stamp + id``).

    A row's id is below its table's key count, so the low ``id_bits`` bits hold it and
    the bits above hold a per-call counter: entries of earlier calls are below the new
    stamp and read as "not seen", so the map is never cleared row by row. When the
    counter runs out of its ``31 - id_bits`` bits, or more id bits are needed, the map is
    zeroed once (a parallel fill: every ~2000 steps on DE tiny).
    """
    bits = max(int(most_keys).bit_length(), _MIN_ID_BITS)
    if bits > _MAX_ID_BITS:
        raise ValueError(
            f"{most_keys} keys of one table in one batch; "
            f"at most {(1 << _MAX_ID_BITS) - 1} are supported"
        )
    counter = scratch.map_stamp + 1
    if bits > scratch.map_id_bits or counter >= 1 << (31 - scratch.map_id_bits):
        if scratch.map_dirty:
            backend.fill_i32(scratch.row_map, 0)
        scratch.map_id_bits = max(bits, scratch.map_id_bits)
        counter = 1
    scratch.map_stamp = counter
    scratch.map_dirty = True
    return counter << scratch.map_id_bits


def backward_items(
    table_nnz: np.ndarray, table_unique: np.ndarray, workers: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Work items of the backward, a contiguous run of tables per worker: arrays
    (table, first part, end part) and the per-worker pointers ``wl_ptr``.

    The estimated cost of a table is ``keys + 4 × unique rows``. Tables (in group order,
    hence contiguous output columns) are cut at equal shares of the total; a table
    straddling a cut is split by row part (:func:`row_part`, ``SPLIT_PARTS`` of them): each
    share rescans the table's keys but sums and updates only its own rows. Contiguous column
    bands keep each worker's reads of the gradient array to its own cache lines.
    """
    nnz = np.asarray(table_nnz, dtype=np.float64)
    cost = nnz + 4.0 * np.asarray(table_unique, dtype=np.float64)
    busy = np.flatnonzero(nnz > 0).tolist()
    total = float(cost[busy].sum())
    cuts = [total * w / workers for w in range(workers)] + [np.inf]
    per_worker: list[list[tuple[int, int, int]]] = [[] for _ in range(workers)]
    start = 0.0
    for t in busy:
        c = float(cost[t])
        end = start + c
        for w in range(workers):
            a, b = max(start, cuts[w]), min(end, cuts[w + 1])
            if b <= a:
                continue
            lo = 0 if a <= start else round(SPLIT_PARTS * (a - start) / c)
            hi = SPLIT_PARTS if b >= end else round(SPLIT_PARTS * (b - start) / c)
            if hi > lo:
                per_worker[w].append((t, lo, hi))
        start = end
    flat = [item for items in per_worker for item in items]
    ptr = np.zeros(workers + 1, dtype=np.int64)
    np.cumsum([len(items) for items in per_worker], out=ptr[1:])
    arr = np.asarray(flat, dtype=np.int64).reshape(-1, 3)
    return arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), ptr
