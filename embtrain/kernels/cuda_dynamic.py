"""CUDA kernels of a dynamic table's key → row index: lookup and insert on the device.

The index is the CPU one (:mod:`embtrain.kernels.dynamic`), byte for byte: open addressing
with linear probing over ``index[n, 2]`` int64 entries ``(key, row)`` (``row < 0``: empty),
``n`` a power of two, a key's home slot ``mix64(key ^ salt) & (n - 1)``. So an index built on
the host can be copied to the device and back, and either side's lookups read the other's.

``lookup``: one thread per key, read-only on the index (each key's row, or -1).
``insert``: one thread per new key; a thread claims the first empty slot from its key's home
with an atomic compare-and-swap on the slot's row, then writes the key. Keys must be absent
and distinct (the host decides which keys enter and which rows they take, as on the CPU);
concurrent inserts may lay entries out in another order than serial ones, but every key is
reachable from its home without an empty slot in between, so every lookup (on either side)
answers as the CPU index would.
``delete``: one thread per key (distinct); the key's entry becomes a *tombstone* (row -2):
lookups probe past it, inserts do not reuse it. The CPU index deletes by backward shift,
which does not parallelise; here tombstones accumulate until an insert would take the used
slots (live + tombstones) above half the index, and :meth:`DeviceHashIndex.compact`
rebuilds it from its live entries first (one parallel insert). :meth:`to_host` compacts, so
the host always receives a CPU-valid index.
``probability_admit``: one thread per key, the CPU's probability admission
(``kernels.dynamic.probability_admit``), bit for bit.

The engine's device dynamic tables (:mod:`embtrain.embedding.dynamic_device`) run their key
→ row phase through these kernels. Tested under numba's CUDA simulator against the CPU index
and kernels (``tests/test_cuda_dynamic.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from embtrain.kernels.cuda import xp
from embtrain.kernels.dynamic import _INDEX_SALT as INDEX_SALT  # one salt for both sides
from embtrain.kernels.rules.hashing import mix64, unit53

__all__ = ["DeviceHashIndex", "lookup_tables", "probability_admit", "share_storage"]

_THREADS = 128
EMPTY = -1
TOMB = -2  # a deleted entry: lookups probe past it


@cuda.jit(device=True, inline=True)
def _home(key, mask):
    return np.int64(mix64(np.uint64(key) ^ INDEX_SALT) & np.uint64(mask))


@cuda.jit
def _lookup_k(flat, mask, keys, out):
    i = cuda.grid(1)
    if i >= keys.shape[0]:
        return
    key = keys[i]
    j = _home(key, mask)
    r = np.int64(-1)
    while True:
        e = flat[2 * j + 1]
        if e == EMPTY:
            break
        if e >= 0 and flat[2 * j] == key:
            r = e
            break
        j = (j + 1) & mask
    out[i] = r


@cuda.jit
def _lookup_tables_k(flat, starts, masks, keys, key_table, out):
    """``_lookup_k`` for the keys of several tables at once: key ``i`` of table
    ``key_table[i]``, whose index is slots ``starts[t]..`` of ``flat``."""
    i = cuda.grid(1)
    if i >= keys.shape[0]:
        return
    t = key_table[i]
    base = starts[t]
    mask = masks[t]
    key = keys[i]
    j = _home(key, mask)
    r = np.int64(-1)
    while True:
        e = flat[2 * (base + j) + 1]
        if e == EMPTY:
            break
        if e >= 0 and flat[2 * (base + j)] == key:
            r = e
            break
        j = (j + 1) & mask
    out[i] = r


@cuda.jit
def _delete_k(flat, mask, keys):
    i = cuda.grid(1)
    if i >= keys.shape[0]:
        return
    key = keys[i]
    j = _home(key, mask)
    while True:
        e = flat[2 * j + 1]
        if e == EMPTY:
            return
        if e >= 0 and flat[2 * j] == key:
            flat[2 * j + 1] = TOMB
            return
        j = (j + 1) & mask


@cuda.jit
def _probability_k(base, p, keys, admitted):
    i = cuda.grid(1)
    if i >= keys.shape[0]:
        return
    u = unit53(mix64(base ^ mix64(np.uint64(keys[i]))))
    admitted[i] = u < p


@cuda.jit
def _insert_k(flat, mask, keys, rows):
    i = cuda.grid(1)
    if i >= keys.shape[0]:
        return
    key = keys[i]
    row = rows[i]
    j = _home(key, mask)
    while True:
        if cuda.atomic.cas(flat, 2 * j + 1, np.int64(EMPTY), row) == EMPTY:  # claimed
            flat[2 * j] = key
            return
        j = (j + 1) & mask


def _blocks(n: int) -> int:
    return max(1, (n + _THREADS - 1) // _THREADS)


class DeviceHashIndex:
    """A dynamic table's key → row index in device memory (CuPy; NumPy under the simulator)."""

    def __init__(self, slots: int):
        if slots < 2 or slots & (slots - 1):
            raise ValueError(f"index slots must be a power of two >= 2, got {slots}")
        self.index = xp.full((slots, 2), -1, dtype=np.int64)
        self.count = 0  # live entries
        self.used = 0  # live entries and tombstones

    @classmethod
    def from_host(cls, index: np.ndarray) -> DeviceHashIndex:
        """A device copy of a CPU index (``kernels.dynamic`` layout)."""
        out = cls(int(np.shape(index)[0]))
        out.load(index)
        return out

    def load(self, index: np.ndarray) -> None:
        """Overwrite the index (in place) with a CPU index of as many slots."""
        index = np.ascontiguousarray(index, dtype=np.int64)
        if index.shape != self.index.shape:
            raise ValueError(f"an index of {index.shape[0]} slots into one of {self.slots}")
        self.index[...] = xp.asarray(index)
        self.count = self.used = int(np.count_nonzero(index[:, 1] >= 0))

    def to_host(self) -> np.ndarray:
        """A NumPy copy of the index that the CPU kernels read (compacted first)."""
        if self.used > self.count:
            self.compact()
        return np.array(self.index) if xp is np else xp.asnumpy(self.index)  # pragma: no cover

    def compact(self) -> None:
        """The index rebuilt from its live entries (no tombstones)."""
        live = xp.flatnonzero(self.index[:, 1] >= 0)
        keys = xp.ascontiguousarray(self.index[live, 0])
        rows = xp.ascontiguousarray(self.index[live, 1])
        self.index.fill(-1)  # in place: the index may be a view of a group's indexes
        self.count = self.used = 0
        self.insert(keys, rows)

    @property
    def slots(self) -> int:
        return int(self.index.shape[0])

    def lookup(self, keys: Any) -> Any:
        """Each key's row, or -1 (device int64 array)."""
        keys = xp.ascontiguousarray(xp.asarray(keys, dtype=np.int64)).reshape(-1)
        out = xp.empty(keys.shape[0], dtype=np.int64)
        if keys.shape[0]:
            _lookup_k[_blocks(keys.shape[0]), _THREADS](
                self.index.reshape(-1), np.int64(self.slots - 1), keys, out)
        return out

    def insert(self, keys: Any, rows: Any) -> None:
        """Add ``keys[i] → rows[i]``: keys absent and distinct, load kept at most ½."""
        keys = xp.ascontiguousarray(xp.asarray(keys, dtype=np.int64)).reshape(-1)
        rows = xp.ascontiguousarray(xp.asarray(rows, dtype=np.int64)).reshape(-1)
        n = int(keys.shape[0])
        if rows.shape[0] != n:
            raise ValueError(f"{n} keys but {rows.shape[0]} rows")
        if 2 * (self.count + n) > self.slots:
            raise ValueError(f"{self.count + n} keys overfill an index of {self.slots} slots "
                             "(load at most 1/2)")
        if 2 * (self.used + n) > self.slots:
            self.compact()
        if n:
            _insert_k[_blocks(n), _THREADS](self.index.reshape(-1), np.int64(self.slots - 1),
                                            keys, rows)
        self.count += n
        self.used += n

    def delete(self, keys: Any) -> None:
        """Remove ``keys`` (distinct and present) from the index (tombstones)."""
        keys = xp.ascontiguousarray(xp.asarray(keys, dtype=np.int64)).reshape(-1)
        n = int(keys.shape[0])
        if n:
            _delete_k[_blocks(n), _THREADS](self.index.reshape(-1), np.int64(self.slots - 1),
                                            keys)
        self.count -= n


def probability_admit(base: np.uint64, p: float, keys: Any) -> Any:
    """Which ``keys`` probability admission lets in (device bool array): a hash of (seed,
    table, key) mapped to [0, 1) below ``p``, as ``kernels.dynamic.probability_admit``."""
    keys = xp.ascontiguousarray(xp.asarray(keys, dtype=np.int64)).reshape(-1)
    out = xp.empty(keys.shape[0], dtype=np.bool_)
    if keys.shape[0]:
        _probability_k[_blocks(keys.shape[0]), _THREADS](np.uint64(base), np.float64(p), keys,
                                                         out)
    return out


def share_storage(indexes: list[DeviceHashIndex]) -> tuple[Any, Any, Any]:
    """Move ``indexes`` into one device buffer (each becomes a view of its part; they keep
    working in place), for :func:`lookup_tables`: ``(buffer, starts, masks)``."""
    slots = [ix.slots for ix in indexes]
    starts = np.concatenate([[0], np.cumsum(slots)[:-1]]).astype(np.int64)
    buffer = xp.concatenate([ix.index for ix in indexes]) if indexes else \
        xp.full((0, 2), -1, dtype=np.int64)
    for ix, a, n in zip(indexes, starts.tolist(), slots, strict=True):
        ix.index = buffer[a:a + n]
    masks = np.array([n - 1 for n in slots], dtype=np.int64)
    return buffer, xp.asarray(starts), xp.asarray(masks)


def lookup_tables(storage: tuple[Any, Any, Any], keys: Any, key_table: Any) -> Any:
    """Each key's row in its table's index (``key_table[i]``: the table of ``keys[i]``), or
    -1: one launch for every table of :func:`share_storage`'s ``storage``."""
    buffer, starts, masks = storage
    keys = xp.ascontiguousarray(xp.asarray(keys, dtype=np.int64)).reshape(-1)
    out = xp.empty(keys.shape[0], dtype=np.int64)
    if keys.shape[0]:
        _lookup_tables_k[_blocks(keys.shape[0]), _THREADS](
            buffer.reshape(-1), starts, masks, keys,
            xp.ascontiguousarray(xp.asarray(key_table, dtype=np.int64)), out)
    return out
