"""Device functions every CUDA kernel of the engine shares (compiled into each kernel; Python
under numba's CUDA simulator): element access for every table dtype, the stochastic-rounding
stream of a row, and the bounds of a bag."""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.extending import register_jitable

from embtrain.kernels.codes import ROUND_NEAREST, ROUND_STOCHASTIC, VAL_F32
from embtrain.kernels.rules.halves import (
    narrow_nearest,
    narrow_stochastic,
    round_col,
    round_row,
    widen,
)

__all__ = ["bag_bounds", "load_elem", "row_stream", "store_elem", "table_of"]


@register_jitable(inline="always")
def load_elem(arr, r, d, code):
    """``arr[r, d]`` as float32: as it is (``code == VAL_F32``), or a half pattern widened."""
    if code == VAL_F32:
        return arr[r, d]
    return widen(arr[r, d], code)


@register_jitable(inline="always")
def store_elem(arr, r, d, x, code, rmode, rh, col):
    """``arr[r, d] = x`` (float32 ``x``), narrowed for a half array (``code``): to nearest, or
    stochastically with ``round_col(rh, col)`` (``rh``: the row's stream)."""
    if code == VAL_F32:
        arr[r, d] = x
    elif rmode == ROUND_NEAREST:
        arr[r, d] = narrow_nearest(x, code)
    else:
        arr[r, d] = narrow_stochastic(x, code, round_col(rh, col))


@register_jitable(inline="always")
def table_of(table_offset, r):
    """The group's table holding group row ``r`` (the last table whose first row is ≤ ``r``:
    tables without rows are skipped)."""
    lo = 0
    hi = table_offset.shape[0] - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if table_offset[mid] <= r:
            lo = mid
        else:
            hi = mid - 1
    return lo


@register_jitable(inline="always")
def row_stream(half, htab, rbase, table_offset, rkeys, r):
    """``(rh, first column)`` of group row ``r`` for stochastic rounding: ``rh`` is
    ``round_row(rbase[t], global row)`` with ``htab[t] = (table id, row offset, row stride,
    first column)`` of its table ``t`` in the full table, the row taken from ``rkeys[r]`` in a
    keyed group (its key), else ``r - table_offset[t]``; ``(0, 0)`` when nothing rounds
    stochastically (``half = (value code, slot code, rounding, seed)``)."""
    if half[2] != ROUND_STOCHASTIC or (half[0] == VAL_F32 and half[1] == VAL_F32):
        return np.uint64(0), np.int64(0)
    t = table_of(table_offset, r)
    k = r - table_offset[t] if rkeys.shape[0] == 0 else rkeys[r]
    grow = htab[t, 1] + htab[t, 2] * k
    return round_row(rbase[t], grow), htab[t, 3]


@cuda.jit(device=True)
def bag_bounds(offs, ostart, bag, b):
    """First and end position of bag ``b`` of a feature (fixed size ``bag`` > 0, or CSR)."""
    if bag > 0:
        return b * bag, (b + 1) * bag
    return offs[ostart + b], offs[ostart + b + 1]
