"""float32 ⇄ IEEE half (fp16) and ⇄ bfloat16 conversion for the exchange, as numba kernels.

bfloat16 (the upper 16 bits of a float32) is rounded to nearest, ties to even, with NaN kept
quiet; a plain integer loop the compiler vectorises (``to_bfloat16``/``from_bfloat16``), equal
to ``ml_dtypes.bfloat16`` bit for bit (``tests/test_comm_wire.py``). Arrays of bfloat16
travel as their ``uint16`` bit patterns.

NumPy converts to and from ``float16`` one element at a time in software, about 50 times
slower than a copy: on DE tiny's 2-rank exchange (~55 M values per step) it cost over a
second. Here eight values at a time go through LLVM's ``fptrunc``/``fpext`` on ``<8 x half>``
(one ``vcvtps2ph``/``vcvtph2ps`` where the CPU has F16C), and the rest through a bit-exact
software conversion (round to nearest, ties to even; overflow to ±inf; subnormals, inf and NaN
kept), which is also the fallback where the vector form cannot be compiled. Both equal NumPy's
``astype`` bit for bit (``tests/test_comm_wire.py``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

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


_LANES = 8


def _item_ptr(context, builder, aryty, ary, i, j):
    arr = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer2(
        context, builder, arr.data, cgutils.unpack_tuple(builder, arr.shape),
        cgutils.unpack_tuple(builder, arr.strides), aryty.layout, [i, j])


def _make_convert(to_half: bool):
    wide, narrow = ir.FloatType(), ir.HalfType()

    def typer(typingctx, src, i, j, dst):
        src_dt, dst_dt = (types.float32, types.uint16) if to_half else (types.uint16, types.float32)
        if not (isinstance(src, types.Array) and src.dtype == src_dt and src.ndim == 2
                and isinstance(dst, types.Array) and dst.dtype == dst_dt and dst.ndim == 2):
            return None
        sig = types.void(src, i, j, dst)

        def codegen(context, builder, signature, args):
            sty, ity, jty, dty = signature.args
            i = context.cast(builder, args[1], ity, types.intp)
            j = context.cast(builder, args[2], jty, types.intp)
            sp = _item_ptr(context, builder, sty, args[0], i, j)
            dp = _item_ptr(context, builder, dty, args[3], i, j)
            i16 = ir.VectorType(ir.IntType(16), _LANES)
            if to_half:
                v = builder.load(builder.bitcast(sp, ir.VectorType(wide, _LANES).as_pointer()),
                                 align=4)
                h = builder.bitcast(builder.fptrunc(v, ir.VectorType(narrow, _LANES)), i16)
                builder.store(h, builder.bitcast(dp, i16.as_pointer()), align=2)
            else:
                h = builder.load(builder.bitcast(sp, i16.as_pointer()), align=2)
                v = builder.fpext(builder.bitcast(h, ir.VectorType(narrow, _LANES)),
                                  ir.VectorType(wide, _LANES))
                builder.store(v, builder.bitcast(dp, ir.VectorType(wide, _LANES).as_pointer()),
                              align=4)
            return context.get_dummy_value()

        return sig, codegen

    return typer


_half8 = intrinsic(_make_convert(True))
_float8 = intrinsic(_make_convert(False))


@njit(parallel=True, cache=True)
def _to_half_vec(src: np.ndarray, bits: np.ndarray, dst: np.ndarray) -> None:
    whole = src.shape[1] - src.shape[1] % _LANES
    for i in prange(src.shape[0]):
        for j in range(0, whole, _LANES):
            _half8(src, i, j, dst)
        for j in range(whole, src.shape[1]):
            dst[i, j] = _half_bits(bits[i, j])


@njit(parallel=True, cache=True)
def _from_half_vec(src: np.ndarray, dst: np.ndarray, bits: np.ndarray) -> None:
    whole = src.shape[1] - src.shape[1] % _LANES
    for i in prange(src.shape[0]):
        for j in range(0, whole, _LANES):
            _float8(src, i, j, dst)
        for j in range(whole, src.shape[1]):
            bits[i, j] = _float_bits(src[i, j])


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
        global _vector
        if _vector:
            try:
                _to_half_vec(s, s.view(np.uint32), dst.view(np.uint16))
                return
            except Exception:
                _vector = False
        _to_half(s.view(np.uint32), dst.view(np.uint16))


def from_half(src: np.ndarray) -> np.ndarray:
    """float16 ``src`` ([rows, cols]) as a new float32 array."""
    if src.ndim != 2 or src.dtype != np.float16:
        raise ValueError(f"from_half: expected a 2-D float16 array, got {src.shape} {src.dtype}")
    out = np.empty(src.shape, dtype=np.float32)
    if src.size:
        halves = np.ascontiguousarray(src).view(np.uint16)
        global _vector
        if _vector:
            try:
                _from_half_vec(halves, out, out.view(np.uint32))
                return out
            except Exception:
                _vector = False
        _from_half(halves, out.view(np.uint32))
    return out


@njit(parallel=True, cache=True)
def _to_bf16(src: np.ndarray, dst: np.ndarray) -> None:
    for i in prange(src.shape[0]):
        for j in range(src.shape[1]):
            x = src[i, j]
            if (x & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN: quiet, sign kept
                dst[i, j] = np.uint16((x >> np.uint32(16)) | np.uint32(0x40))
            else:
                bias = np.uint32(0x7FFF) + ((x >> np.uint32(16)) & np.uint32(1))
                dst[i, j] = np.uint16((x + bias) >> np.uint32(16))


@njit(parallel=True, cache=True)
def _from_bf16(src: np.ndarray, dst: np.ndarray) -> None:
    for i in prange(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = np.uint32(src[i, j]) << np.uint32(16)


def to_bfloat16(src: np.ndarray, dst: np.ndarray) -> None:
    """Write float32 ``src`` ([rows, cols], any strides) into ``dst``, the ``uint16`` bit
    patterns of bfloat16 (round to nearest even)."""
    s = np.asarray(src, dtype=np.float32)
    if s.ndim != 2 or dst.shape != s.shape or dst.dtype != np.uint16:
        raise ValueError(f"to_bfloat16: {s.shape} float32 into {dst.shape} {dst.dtype}")
    if s.size:
        _to_bf16(s.view(np.uint32), dst)


def from_bfloat16(src: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns ``src`` ([rows, cols] ``uint16``) as a new float32 array."""
    if src.ndim != 2 or src.dtype != np.uint16:
        raise ValueError(f"from_bfloat16: expected 2-D uint16 bits, got {src.shape} {src.dtype}")
    out = np.empty(src.shape, dtype=np.float32)
    if src.size:
        _from_bf16(src, out.view(np.uint32))
    return out


_vector = True  # False once the vector kernels failed to compile on this machine
