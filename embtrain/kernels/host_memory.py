"""Host arrays for the CPU kernels: 64-byte aligned, and large ones on anonymous mappings with
transparent huge pages requested (fewer page faults and TLB misses on rows visited at random).
"""

from __future__ import annotations

import contextlib
import mmap
from typing import Any

import numpy as np

#: arrays of at least this many bytes are anonymous mappings (huge pages requested)
HUGE_MIN_BYTES = 1 << 22


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised, 64-byte aligned array; one of :data:`HUGE_MIN_BYTES` or more is an
    anonymous mapping with transparent huge pages requested."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dt.itemsize
    if nbytes < HUGE_MIN_BYTES:  # 64-byte aligned, like the mapping below
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        start = -raw.ctypes.data % 64
        return raw[start : start + nbytes].view(dt).reshape(shape)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            buf.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)


def aligned_zeros(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A zero-filled array like :func:`aligned_empty` (fresh mappings are zero: no fill pass,
    pages are faulted in when first touched)."""
    dt = np.dtype(dtype)
    out = aligned_empty(shape, dt)
    if int(np.prod(shape, dtype=np.int64)) * dt.itemsize < HUGE_MIN_BYTES:
        out[...] = 0
    return out


def frozen(a: Any) -> Any:
    """A read-only view of a NumPy array: the kernels' inputs always have the same numba type
    (read-only, C-contiguous) whether they came from NumPy, Arrow or TensorFlow, so each CPU
    kernel has one compiled specialisation, which ``embtrain.cli.warm`` compiles ahead of
    time. Device arrays (CuPy) pass through."""
    if not isinstance(a, np.ndarray):
        return a
    view = a.view()
    view.flags.writeable = False
    return view
