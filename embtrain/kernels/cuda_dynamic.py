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

Not yet wired into the engine: dynamic tables still run their key → row phase on host arrays
(see ``embtrain.train.device``). Tested under numba's CUDA simulator against the CPU index
(``tests/test_cuda_dynamic.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from embtrain.kernels.cuda import xp
from embtrain.kernels.dynamic import _INDEX_SALT as INDEX_SALT  # one salt for both sides
from embtrain.kernels.rules.hashing import mix64

__all__ = ["DeviceHashIndex"]

_THREADS = 128


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
        if e < 0:
            break
        if flat[2 * j] == key:
            r = e
            break
        j = (j + 1) & mask
    out[i] = r


@cuda.jit
def _insert_k(flat, mask, keys, rows):
    i = cuda.grid(1)
    if i >= keys.shape[0]:
        return
    key = keys[i]
    row = rows[i]
    j = _home(key, mask)
    while True:
        if cuda.atomic.cas(flat, 2 * j + 1, np.int64(-1), row) < 0:  # claimed
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
        self.count = 0

    @classmethod
    def from_host(cls, index: np.ndarray) -> DeviceHashIndex:
        """A device copy of a CPU index (``kernels.dynamic`` layout)."""
        index = np.ascontiguousarray(index, dtype=np.int64)
        out = cls(int(index.shape[0]))
        out.index = xp.asarray(index)
        out.count = int(np.count_nonzero(index[:, 1] >= 0))
        return out

    def to_host(self) -> np.ndarray:
        """The index as a NumPy array the CPU kernels read."""
        return self.index if xp is np else xp.asnumpy(self.index)  # pragma: no cover - GPU

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
        if n:
            _insert_k[_blocks(n), _THREADS](self.index.reshape(-1), np.int64(self.slots - 1),
                                            keys, rows)
        self.count += n
