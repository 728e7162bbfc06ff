"""float32 ⇄ IEEE half (fp16) conversion for the quantized exchange, as numba kernels.

NumPy converts to and from ``float16`` one element at a time in software, about 50 times
slower than a copy: on DE tiny's 2-rank exchange (~55 M values per step) it cost over a
second. These kernels work on the bits (round to nearest, ties to even; overflow to ±inf;
subnormals, inf and NaN kept), in parallel, and equal NumPy's ``astype`` bit for bit
(``tests/test_comm_wire.py``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from embtrain.kernels import numba_cache

numba_cache.install()  # compiled into embtrain's content-keyed kernel cache


@njit(cache=True, inline="always")
def _half_bits(x: np.uint32) -> np.uint16:
    sign = (x >> 16) & 0x8000
    exp = (x >> 23) & 0xFF
    mant = x & 0x7FFFFF
    if exp == 0xFF:  # inf, NaN (a quiet NaN keeps a payload bit)
        return np.uint16(sign | 0x7C00 | (0x200 if mant != 0 else 0))
    e = np.int64(exp) - 112  # rebias 127 → 15
    if e >= 31:
        return np.uint16(sign | 0x7C00)
    if e <= 0:  # a half subnormal, or zero
        if e < -10:
            return np.uint16(sign)
        m = mant | 0x800000
        shift = np.uint32(14 - e)
        half = m >> shift
        rem = m & ((np.uint32(1) << shift) - 1)
        halfway = np.uint32(1) << (shift - 1)
        if rem > halfway or (rem == halfway and (half & 1) != 0):
            half += 1
        return np.uint16(sign | half)
    half = (np.uint32(e) << 10) | (mant >> 13)
    rem = mant & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (half & 1) != 0):
        half += 1  # a carry into the exponent is the correct rounding (up to inf)
    return np.uint16(sign | half)


@njit(cache=True, inline="always")
def _float_bits(h: np.uint16) -> np.uint32:
    sign = np.uint32(h & 0x8000) << 16
    exp = np.uint32((h >> 10) & 0x1F)
    mant = np.uint32(h & 0x3FF)
    if exp == 0:
        if mant == 0:
            return sign
        e = np.uint32(0)
        while (mant & 0x400) == 0:
            mant <<= 1
            e += 1
        return sign | ((np.uint32(113) - e) << 23) | ((mant & 0x3FF) << 13)
    if exp == 31:
        return sign | np.uint32(0x7F800000) | (mant << 13)
    return sign | ((exp + 112) << 23) | (mant << 13)


@njit(parallel=True, cache=True)
def _to_half(src: np.ndarray, dst: np.ndarray) -> None:
    for i in prange(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = _half_bits(src[i, j])


@njit(parallel=True, cache=True)
def _from_half(src: np.ndarray, dst: np.ndarray) -> None:
    for i in prange(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = _float_bits(src[i, j])


def to_half(src: np.ndarray, dst: np.ndarray) -> None:
    """Write float32 ``src`` ([rows, cols], any strides) into float16 ``dst`` of its shape."""
    s = np.asarray(src, dtype=np.float32)
    if s.ndim != 2 or dst.shape != s.shape or dst.dtype != np.float16:
        raise ValueError(f"to_half: {s.shape} float32 into {dst.shape} {dst.dtype}")
    if s.size:
        _to_half(s.view(np.uint32), dst.view(np.uint16))


def from_half(src: np.ndarray) -> np.ndarray:
    """float16 ``src`` ([rows, cols]) as a new float32 array."""
    if src.ndim != 2 or src.dtype != np.float16:
        raise ValueError(f"from_half: expected a 2-D float16 array, got {src.shape} {src.dtype}")
    out = np.empty(src.shape, dtype=np.float32)
    if src.size:
        _from_half(np.ascontiguousarray(src).view(np.uint16), out.view(np.uint32))
    return out
