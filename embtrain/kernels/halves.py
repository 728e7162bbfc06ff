"""Row access of the CPU kernels for every table dtype: float32 arrays as they are, and the
16-bit patterns (``np.uint16``) of float16 and bfloat16 tables, widened to float32 on load and
narrowed on store (:mod:`embtrain.kernels.rules.halves`).

The kernels of :mod:`embtrain.kernels.cpu` read and write table values and optimizer slots
only through these functions. Each is a numba ``overload`` chosen by the array's dtype at
compile time, so a float32 table compiles to exactly the plain indexing and vector row
operations it had before (the half arguments are dead there), and a half table gets a
variant of its own: numba specialises every kernel on its arguments' types.

Codes (:mod:`embtrain.kernels.codes`): ``code`` is ``VAL_F32``, ``VAL_BF16`` or ``VAL_F16``;
``rmode`` is ``ROUND_NEAREST`` or ``ROUND_STOCHASTIC``. A stochastic store of element
``(row, column)`` draws ``round_bits(seed, step, table, row, column)``: ``table`` is the
table's :func:`~embtrain.kernels.rules.halves.round_table_id`, ``row`` its global row (the key
of a static table), ``column`` the global column (an optimizer slot's:
:func:`~embtrain.kernels.rules.halves.slot_column`), so a run on any number of ranks rounds
every element alike. The kernel computes the row's stream ``rh`` once
(:func:`~embtrain.kernels.rules.halves.round_row`) and passes it to :func:`st`.

The update widens a half row once (:func:`widen_row`, vector lanes) into a float32 row of a
worker's scratch (:func:`row_scratch`), reads it there (:func:`ld_widened`), keeps the new
values there (:func:`st_deferred`) and narrows the row once at the end (:func:`flush_row`,
vector lanes; an optimizer slot from its stream's first column ``slot_column(c0, slot)``),
bit for bit what :func:`ld` / :func:`st` per element give. For a float32 array the three are
plain indexing and nothing, and the scratch is empty.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload, register_jitable

from embtrain.kernels import numba_cache
from embtrain.kernels._llvm import (
    axpy,
    half_axpy,
    half_narrow,
    half_scale_copy,
    half_widen,
    scale_copy,
)
from embtrain.kernels.codes import ROUND_NEAREST
from embtrain.kernels.rules.halves import narrow_nearest, narrow_stochastic, round_col, widen

numba_cache.install()  # before the first @njit(cache=True): compiled code goes to its cache_dir()

__all__ = ["SCRATCH_ROWS", "fill_u16", "flush_row", "gather_widen", "ld", "ld_widened",
           "narrow_block", "row_axpy", "row_scale_copy", "row_scratch", "st", "st_deferred",
           "widen_block", "widen_row"]

#: Rows of :func:`row_scratch`: slot 1, slot 2, the values.
SCRATCH_ROWS = 3


def ld(arr, r, d, code):
    """``arr[r, d]`` as float32 (a half pattern widened)."""


def st(arr, r, d, x, code, rmode, rh, col):
    """``arr[r, d] = x`` (float32 ``x``; narrowed for a half array: nearest, or stochastic with
    ``round_col(rh, col)``, ``rh`` the row's stream)."""


def st_deferred(arr, r, d, x, acc, u):
    """``arr[r, d] = x`` for a float32 array; for a half array ``acc[u, d] = x`` (the float32
    row ``acc[u]`` then holds the row's new values, narrowed into ``arr[r]`` at once, in vector
    lanes, by :func:`flush_row`). ``acc[u, d]`` must not be needed after this store."""


def flush_row(arr, r, acc, u, code, rmode, rh, c0):
    """Nothing for a float32 array; for a half array ``arr[r, :] = narrow(acc[u, :])`` (to
    nearest, or stochastically with ``round_col(rh, c0 + d)`` for column ``d``): the stores
    :func:`st_deferred` put off, bit for bit what :func:`st` would have stored."""


def row_scratch(values, slot1, slot2):
    """A worker's float32 scratch for the widened rows of a half update: ``(SCRATCH_ROWS,
    dim)`` when any of the arrays is a half array, else empty ``(0, 0)``."""


def widen_row(arr, r, buf, j, code):
    """Nothing for a float32 array; for a half array ``buf[j, :] = widen(arr[r, :])`` in vector
    lanes (``buf`` float32, rows as wide as ``arr``'s)."""


def ld_widened(arr, r, d, buf, j):
    """``arr[r, d]`` for a float32 array; ``buf[j, d]`` (the row :func:`widen_row` widened, or
    what :func:`st_deferred` stored since) for a half array."""


def row_scale_copy(dst, di, src, si, w, n, code):
    """``dst[di:di+n] = w * src[si:si+n]`` (flat indices; ``dst`` float32)."""


def row_axpy(dst, di, src, si, w, n, code):
    """``dst[di:di+n] += w * src[si:si+n]`` (flat indices; ``dst`` float32)."""


def _is_half(arr) -> bool:
    return isinstance(arr, types.Array) and arr.dtype == types.uint16


def _is_f32(arr) -> bool:
    return isinstance(arr, types.Array) and arr.dtype == types.float32


@overload(ld, inline="always")
def _ld(arr, r, d, code):
    if _is_f32(arr):
        return lambda arr, r, d, code: arr[r, d]
    if _is_half(arr):
        return lambda arr, r, d, code: widen(arr[r, d], code)
    return None


@register_jitable(inline="always")
def _narrow(x, code, rmode, rh, col):
    if rmode == ROUND_NEAREST:
        return narrow_nearest(x, code)
    return narrow_stochastic(x, code, round_col(rh, col))


@overload(st, inline="always")
def _st(arr, r, d, x, code, rmode, rh, col):
    if _is_f32(arr):
        def store_f32(arr, r, d, x, code, rmode, rh, col):
            arr[r, d] = x
        return store_f32
    if _is_half(arr):
        def store_half(arr, r, d, x, code, rmode, rh, col):
            arr[r, d] = _narrow(x, code, rmode, rh, col)
        return store_half
    return None


@overload(st_deferred, inline="always")
def _st_deferred(arr, r, d, x, acc, u):
    if _is_f32(arr):
        def store_f32(arr, r, d, x, acc, u):
            arr[r, d] = x
        return store_f32
    if _is_half(arr):
        def defer_half(arr, r, d, x, acc, u):
            acc[u, d] = x
        return defer_half
    return None


@overload(flush_row, inline="always")
def _flush_row(arr, r, acc, u, code, rmode, rh, c0):
    if _is_f32(arr):
        def nothing_to_flush(arr, r, acc, u, code, rmode, rh, c0):
            pass
        return nothing_to_flush
    if _is_half(arr):
        def flush_half(arr, r, acc, u, code, rmode, rh, c0):
            dim = arr.shape[1]
            half_narrow(arr, r * dim, acc, u * dim, dim, code, rmode, rh, c0)
        return flush_half
    return None


@overload(row_scratch, inline="always")
def _row_scratch(values, slot1, slot2):
    if _is_half(values) or _is_half(slot1) or _is_half(slot2):
        def half_scratch(values, slot1, slot2):
            return np.empty((SCRATCH_ROWS, values.shape[1]), dtype=np.float32)
        return half_scratch
    if _is_f32(values) and _is_f32(slot1) and _is_f32(slot2):
        def no_scratch(values, slot1, slot2):
            return np.empty((0, 0), dtype=np.float32)
        return no_scratch
    return None


@overload(widen_row, inline="always")
def _widen_row(arr, r, buf, j, code):
    if _is_f32(arr):
        def nothing_to_widen(arr, r, buf, j, code):
            pass
        return nothing_to_widen
    if _is_half(arr):
        def widen_half(arr, r, buf, j, code):
            dim = arr.shape[1]
            half_widen(buf, j * dim, arr, r * dim, dim, code)
        return widen_half
    return None


@overload(ld_widened, inline="always")
def _ld_widened(arr, r, d, buf, j):
    if _is_f32(arr):
        return lambda arr, r, d, buf, j: arr[r, d]
    if _is_half(arr):
        return lambda arr, r, d, buf, j: buf[j, d]
    return None


@overload(row_scale_copy, inline="always")
def _row_scale_copy(dst, di, src, si, w, n, code):
    if _is_f32(src):
        return lambda dst, di, src, si, w, n, code: scale_copy(dst, di, src, si, w, n)
    if _is_half(src):
        return lambda dst, di, src, si, w, n, code: half_scale_copy(dst, di, src, si, w, n, code)
    return None


@overload(row_axpy, inline="always")
def _row_axpy(dst, di, src, si, w, n, code):
    if _is_f32(src):
        return lambda dst, di, src, si, w, n, code: axpy(dst, di, src, si, w, n)
    if _is_half(src):
        return lambda dst, di, src, si, w, n, code: half_axpy(dst, di, src, si, w, n, code)
    return None


# ------------------------------------------------------------------ whole-array conversions


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def narrow_block(dst, src, code):
    """``dst[i, j] = narrow_nearest(src[i, j])``: float32 rows into a half array (initial
    values, imports)."""
    for i in prange(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = narrow_nearest(src[i, j], code)


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def widen_block(dst, src, code):
    """``dst[i, j] = widen(src[i, j])``: half rows into float32."""
    for i in prange(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = widen(src[i, j], code)


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def gather_widen(src, rows, out, code):
    """``out[i] = widen(src[rows[i]])`` (``src`` a half array, ``out`` float32)."""
    for i in prange(rows.shape[0]):
        for d in range(src.shape[1]):
            out[i, d] = widen(src[rows[i], d], code)


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def fill_u16(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D uint16 array."""
    v = np.uint16(value)
    for i in prange(arr.shape[0]):
        arr[i] = v
