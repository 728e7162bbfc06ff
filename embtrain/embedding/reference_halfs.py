"""Slow, obvious NumPy reference of the half-precision conversions (for tests and
:mod:`embtrain.embedding.reference`).

Written apart from the kernels' rules (:mod:`embtrain.kernels.rules.halfs`) on purpose, and in
another form: float16 through NumPy's own ``astype``; bfloat16 by the float32 rounding-bias
formula; stochastic rounding as "truncate toward zero, then step up one unit of the last place
when the low ``s`` random bits reach ``2^s - floor(frac · 2^s)``", with ``frac`` the exact
(float64) fraction of the way to the next half. Half arrays are ``np.uint16`` bit patterns;
``kind`` is ``codes.VAL_BF16`` or ``codes.VAL_F16``.
"""

from __future__ import annotations

import numpy as np

from embtrain.kernels.codes import VAL_BF16, VAL_F16
from embtrain.kernels.rules.halfs import ROUND_SALT, SLOT_STREAM_SHIFT

_U32 = np.uint32
#: float64 value of the first pattern past the largest finite half (the +inf pattern), as the
#: "next half" of the largest finite one: 2^16 for float16, 2^128 for bfloat16.
_PAST_MAX = {VAL_F16: 2.0**16, VAL_BF16: 2.0**128}
_INF_BITS = {VAL_F16: 0x7C00, VAL_BF16: 0x7F80}


def _check(kind: int) -> None:
    if kind not in (VAL_BF16, VAL_F16):
        raise ValueError(f"not a half kind: {kind}")


def widen_ref(bits: np.ndarray, kind: int) -> np.ndarray:
    """float32 values of the uint16 half patterns ``bits``."""
    _check(kind)
    h = np.asarray(bits, dtype=np.uint16)
    if kind == VAL_F16:
        return h.view(np.float16).astype(np.float32)
    return (h.astype(_U32) << _U32(16)).view(np.float32)


def narrow_nearest_ref(x: np.ndarray, kind: int) -> np.ndarray:
    """uint16 patterns of float32 ``x`` rounded to nearest (ties to even)."""
    _check(kind)
    x = np.asarray(x, dtype=np.float32)
    if kind == VAL_F16:
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(np.float16).view(np.uint16)
    b = x.view(_U32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16))
    nan = (np.uint64(0x7FC0) | ((b >> np.uint64(16)) & np.uint64(0x8000)))
    return np.where(np.isnan(x), nan, rounded).astype(np.uint16)


def _truncate(a: np.ndarray, kind: int) -> np.ndarray:
    """Patterns of finite non-negative float32 ``a`` rounded toward zero (``int64``)."""
    if kind == VAL_BF16:
        return (a.view(_U32) >> _U32(16)).astype(np.int64)
    n = narrow_nearest_ref(a, kind).astype(np.int64)
    above = widen_ref(n.astype(np.uint16), kind).astype(np.float64) > a.astype(np.float64)
    return n - above


def _dropped_bits(a: np.ndarray, kind: int) -> np.ndarray:
    """How many random bits decide the rounding of ``|x| = a`` (see the kernels' rules)."""
    if kind == VAL_BF16:
        return np.full(a.shape, 16, np.int64)
    e = (a.view(_U32) >> _U32(23)).astype(np.int64)
    return np.clip(126 - e, 13, 32)


def narrow_stochastic_ref(x: np.ndarray, kind: int, rbits: np.ndarray) -> np.ndarray:
    """uint16 patterns of float32 ``x`` rounded stochastically with the uint32 ``rbits``
    (broadcast against ``x``)."""
    _check(kind)
    x = np.asarray(x, dtype=np.float32)
    x, r = np.broadcast_arrays(x, np.asarray(rbits, dtype=_U32))
    finite = np.isfinite(x)
    a = np.where(finite, np.abs(x), np.float32(0)).astype(np.float32)
    t = _truncate(a, kind)
    lo = widen_ref(t.astype(np.uint16), kind).astype(np.float64)
    nxt = t + 1
    hi = np.where(
        nxt == _INF_BITS[kind],
        _PAST_MAX[kind],
        widen_ref(np.minimum(nxt, _INF_BITS[kind]).astype(np.uint16), kind).astype(np.float64),
    )
    frac = np.minimum((a.astype(np.float64) - lo) / (hi - lo), 1.0)  # exact: hi - lo is 2^k
    s = _dropped_bits(a, kind)
    scale = np.ldexp(1.0, s)
    dropped = np.floor(frac * scale).astype(np.int64)
    low = r.astype(np.int64) & ((np.int64(1) << s) - 1)
    up = (dropped > 0) & (low >= (np.int64(1) << s) - dropped)
    sign = np.signbit(x).astype(np.int64) << 15
    out = sign | (t + up)
    return np.where(finite, out, narrow_nearest_ref(x, kind)).astype(np.uint16)


def _mix64(z: np.ndarray) -> np.ndarray:
    """The mix64 finaliser (kernels/rules/hashing.py) on uint64 arrays: the oracles' one copy."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def round_bits_ref(
    seed: int, step: int, table: int, keys: np.ndarray, columns: np.ndarray
) -> np.ndarray:
    """uint32 random bits of every (key, column) (``keys`` and ``columns`` broadcast
    against each other; int64, taken mod 2^64) of ``table`` at ``step``."""
    m = 0xFFFFFFFFFFFFFFFF
    base = _mix64(np.array([(seed & m) ^ ROUND_SALT], np.uint64))
    base = _mix64(base ^ np.uint64(step & m))
    base = _mix64(base ^ np.uint64(table & m))[0]
    k = np.asarray(keys, np.int64).astype(np.uint64)
    c = np.asarray(columns, np.int64).astype(np.uint64)
    row = _mix64(base ^ _mix64(k))
    return (_mix64(row ^ c) >> np.uint64(32)).astype(_U32)


def slot_column_ref(columns: np.ndarray, slot: int) -> np.ndarray:
    """The rounding-stream column of optimizer slot ``slot``'s elements."""
    return np.asarray(columns, np.int64) + (np.int64(slot + 1) << SLOT_STREAM_SHIFT)
