"""CPU kernels that fill, initialise and gather rows: counter-based initialisation
(value = f(seed, table name, row, column), the rule of :mod:`embtrain.kernels.rules.init`),
constant fills and row gathers.

Every kernel is ``@njit(parallel=True, cache=True, fastmath=False, nogil=True)`` and
deterministic (see :mod:`embtrain.kernels.cpu` for the vocabulary).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from embtrain.kernels import numba_cache, typed_lists
from embtrain.kernels.codes import (
    INIT_UNIFORM,
)
from embtrain.kernels.rules.init import column_stream, init_value, row_hash, uniform_value

numba_cache.install()  # before the first @njit(cache=True): compiled code goes to its cache_dir()
typed_lists.install()  # typed lists built from Python: numba's helpers from that cache too

# --------------------------------------------------------------------------------------------
# Counter-based initialisation: value = f(seed, table name, row, column), nothing else.
# --------------------------------------------------------------------------------------------

# (the value rule: :mod:`embtrain.kernels.rules.init`)


@njit(cache=True)
def _column_mix(dim):
    """``column_stream(c, j)`` for every column ``c`` and the first two streams ``j``."""
    cm = np.empty((2, dim), dtype=np.uint64)
    for c in range(dim):
        cm[0, c] = column_stream(c, 0)
        cm[1, c] = column_stream(c, 1)
    return cm


@njit(cache=True, inline="always")
def _init_row(out, i, row, base, kind, param, cm):
    """Write the initial value of ``row`` into ``out[i, :]`` (``cm`` from ``_column_mix``)."""
    rh = row_hash(base, row)
    if kind == INIT_UNIFORM:  # branch-free: the compiler's vector lanes
        for c in range(out.shape[1]):
            out[i, c] = uniform_value(param, rh, cm[0, c])
        return
    for c in range(out.shape[1]):
        out[i, c] = init_value(kind, param, rh, c, cm[0, c], cm[1, c])


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def init_range(out, row_start, base, kind, param):
    """``out[i] = init(row_start + i)`` for every row of ``out`` (``[n, dim]`` float32)."""
    cm = _column_mix(out.shape[1])
    for i in prange(out.shape[0]):
        _init_row(out, i, row_start + i, base, kind, param, cm)


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def init_rows(out, rows, base, kind, param):
    """``out[i] = init(rows[i])``."""
    cm = _column_mix(out.shape[1])
    for i in prange(rows.shape[0]):
        _init_row(out, i, rows[i], base, kind, param, cm)


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def fill_f32(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D float32 array."""
    v = np.float32(value)
    for i in prange(arr.shape[0]):
        arr[i] = v


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def fill_i64(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D int64 array."""
    for i in prange(arr.shape[0]):
        arr[i] = value


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def fill_i32(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D int32 array."""
    v = np.int32(value)
    for i in prange(arr.shape[0]):
        arr[i] = v


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def gather_rows(src, rows, out):
    """``out[i] = src[rows[i]]`` for 2-D arrays."""
    for i in prange(rows.shape[0]):
        for d in range(src.shape[1]):
            out[i, d] = src[rows[i], d]


