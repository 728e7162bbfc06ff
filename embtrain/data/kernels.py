"""Compiled (numba) loops of the data layer: the string-id hash and CSR row gathers.

String ids are hashed with **xxHash64** (seed 0) over their UTF-8 bytes, the 64-bit result
reinterpreted as a two's-complement int64. It is the reference algorithm of
https://github.com/Cyan4973/xxHash (XXH64), so ``xxhash.xxh64_intdigest(s.encode())`` in
Python, ``XXH64(s, len, 0)`` in C and this module agree, e.g.::

    ""      -> 0xEF46DB3751D8E999 (int64 -1205034819632174695)
    "a"     -> 0xD24EC4F1A98C6E5B (int64 -3292477735350538661)
    "abc"   -> 0x44BC2CF5AD770999 (int64  4952883123889572249)

The kernels read Arrow string buffers directly (offsets + UTF-8 bytes), one pass, no
Python-level loop over rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from embtrain.kernels import numba_cache

numba_cache.install()  # before the first @njit(cache=True): compiled code goes to its cache_dir()
_P1 = np.uint64(11400714785074694791)
_P2 = np.uint64(14029467366897019727)
_P3 = np.uint64(1609587929392839161)
_P4 = np.uint64(9650029242287828579)
_P5 = np.uint64(2870177450012600261)


@njit(inline="always", cache=True)
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(inline="always", cache=True)
def _read64(buf: np.ndarray, p: int) -> np.uint64:
    v = np.uint64(0)
    for i in range(8):
        v |= np.uint64(buf[p + i]) << np.uint64(8 * i)
    return v


@njit(inline="always", cache=True)
def _read32(buf: np.ndarray, p: int) -> np.uint64:
    v = np.uint64(0)
    for i in range(4):
        v |= np.uint64(buf[p + i]) << np.uint64(8 * i)
    return v


@njit(inline="always", cache=True)
def _round(acc: np.uint64, lane: np.uint64) -> np.uint64:
    acc = acc + lane * _P2
    acc = _rotl(acc, 31)
    return acc * _P1


@njit(inline="always", cache=True)
def _merge(acc: np.uint64, val: np.uint64) -> np.uint64:
    acc ^= _round(np.uint64(0), val)
    return acc * _P1 + _P4


@njit(cache=True, nogil=True)
def _xxh64(buf: np.ndarray, start: int, end: int) -> np.uint64:
    """XXH64 with seed 0 of ``buf[start:end]`` (uint8)."""
    length = end - start
    p = start
    if length >= 32:
        v1 = _P1 + _P2
        v2 = _P2
        v3 = np.uint64(0)
        v4 = np.uint64(0) - _P1
        limit = end - 32
        while p <= limit:
            v1 = _round(v1, _read64(buf, p))
            v2 = _round(v2, _read64(buf, p + 8))
            v3 = _round(v3, _read64(buf, p + 16))
            v4 = _round(v4, _read64(buf, p + 24))
            p += 32
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _merge(h, v1)
        h = _merge(h, v2)
        h = _merge(h, v3)
        h = _merge(h, v4)
    else:
        h = _P5
    h += np.uint64(length)
    while p + 8 <= end:
        h ^= _round(np.uint64(0), _read64(buf, p))
        h = _rotl(h, 27) * _P1 + _P4
        p += 8
    if p + 4 <= end:
        h ^= _read32(buf, p) * _P1
        h = _rotl(h, 23) * _P2 + _P3
        p += 4
    while p < end:
        h ^= np.uint64(buf[p]) * _P5
        h = _rotl(h, 11) * _P1
        p += 1
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h


@njit(cache=True, nogil=True)
def _hash_strings(offsets: np.ndarray, data: np.ndarray, out: np.ndarray) -> None:
    for i in range(out.shape[0]):
        out[i] = _xxh64(data, offsets[i], offsets[i + 1])


def hash_string_array(array: pa.Array) -> np.ndarray:
    """xxHash64 (seed 0) of every UTF-8 string of an Arrow ``string``/``large_string`` array, as int64.

    Nulls must have been rejected by the caller (their slot hashes to the empty string's value).
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_string_view(array.type) or pa.types.is_binary_view(array.type):
        array = array.cast(pa.large_string())
    n = len(array)
    out = np.empty(n, dtype=np.uint64)
    if n:
        buffers = array.buffers()
        off_dtype = np.int64 if pa.types.is_large_string(array.type) or pa.types.is_large_binary(
            array.type) else np.int32
        offsets = np.frombuffer(buffers[1], dtype=off_dtype)[array.offset: array.offset + n + 1]
        offsets = offsets.astype(np.int64)  # one compiled signature for string and large_string
        data = (np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None
                else np.zeros(0, dtype=np.uint8))
        _hash_strings(offsets, data, out)
    return out.view(np.int64)


def hash_strings(values: list[str]) -> np.ndarray:
    """xxHash64 (seed 0) of Python strings as int64 (convenience; builds an Arrow array)."""
    return hash_string_array(pa.array(values, type=pa.string()))


@njit(cache=True, nogil=True)
def csr_take_offsets(offsets: np.ndarray, rows: np.ndarray, out_offsets: np.ndarray) -> int:
    """Offsets of rows ``rows`` of a CSR into ``out_offsets`` (len(rows) + 1); returns nnz."""
    out_offsets[0] = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        out_offsets[i + 1] = out_offsets[i] + (offsets[r + 1] - offsets[r])
    return out_offsets[rows.shape[0]]


@njit(cache=True, nogil=True)
def csr_take_values(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray,
                    out_offsets: np.ndarray, out: np.ndarray) -> None:
    """Values of rows ``rows`` of a CSR, after :func:`csr_take_offsets`."""
    for i in range(rows.shape[0]):
        r = rows[i]
        a = offsets[r]
        o = out_offsets[i]
        for j in range(offsets[r + 1] - a):
            out[o + j] = values[a + j]


@njit(cache=True, nogil=True)
def dense_column(values: np.ndarray, bitmap: np.ndarray, bit_offset: int, has_bitmap: bool,
                 fill: float, has_fill: bool, out: np.ndarray, j: int, start: int,
                 stop: int) -> tuple[int, int]:
    """``out[i, j] = values[i]``, or ``fill`` where null or NaN, for ``i`` in ``[start, stop)``.

    Returns ``(row, 1)`` for the first null and ``(row, 2)`` for the first NaN when there is no
    fill, else ``(-1, 0)``.
    """
    for i in range(start, stop):
        if has_bitmap:
            b = bit_offset + i
            if not (bitmap[b >> 3] >> (b & 7)) & 1:
                if not has_fill:
                    return i, 1
                out[i, j] = fill
                continue
        x = np.float64(values[i])
        if x != x:
            if not has_fill:
                return i, 2
            x = fill
        out[i, j] = x
    return -1, 0


@njit(cache=True, nogil=True)
def copy_ids(values: np.ndarray, out: np.ndarray, rows: int, mode: int) -> int:
    """``out[:] = values`` as int64. ``mode`` 1: return the first index outside ``[0, rows)``
    (else -1); 2: take ids modulo ``rows``; 0: no check."""
    for i in range(values.shape[0]):
        v = np.int64(values[i])
        if mode == 1:
            if v < 0 or v >= rows:
                return i
        elif mode == 2:
            v = v % rows
            if v < 0:
                v += rows
        out[i] = v
    return -1


@njit(cache=True, nogil=True)
def transpose_into(src: np.ndarray, out: np.ndarray, start: int) -> None:
    """``out[start + i, f] = src[f, i]`` (column-major block into a row-major matrix), cache-blocked."""
    nf, n = src.shape
    block = 2048
    for s in range(0, n, block):
        e = min(n, s + block)
        for f in range(nf):
            for i in range(s, e):
                out[start + i, f] = src[f, i]


@njit(cache=True, nogil=True)
def gather_transposed(matrix: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[f, i] = matrix[rows[i], f]``: gather rows of a row-major matrix, column-major out."""
    nf = matrix.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for f in range(nf):
            out[f, i] = matrix[r, f]


@njit(cache=True, nogil=True)
def gather_rows(matrix: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[i, :] = matrix[rows[i], :]``."""
    nf = matrix.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for f in range(nf):
            out[i, f] = matrix[r, f]
