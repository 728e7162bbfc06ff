"""Slow, obvious NumPy reference of the half-precision conversions (for tests and
:mod:`embtrain.embedding.reference`).

Written apart from the kernels' rules (:mod:`embtrain.kernels.rules.halves`) on purpose, and in
another form: float16 through NumPy's own ``astype``; bfloat16 by the float32 rounding-bias
formula; stochastic rounding as "truncate toward zero, then step up one unit of the last place
when the low ``s`` random bits reach ``2^s - floor(frac · 2^s)``", with ``frac`` the exact
(float64) fraction of the way to the next half. Half arrays are ``np.uint16`` bit patterns;
``kind`` is ``codes.VAL_BF16`` or ``codes.VAL_F16``. Widening and rounding to nearest are the
host conversions of :mod:`embtrain.embedding.halves` (plain NumPy, also a form apart from the
kernels'), under the ``_ref`` names the tests use.
"""

from __future__ import annotations

import numpy as np

from embtrain.embedding.halves import narrow_nearest as narrow_nearest_ref
from embtrain.embedding.halves import widen as widen_ref
from embtrain.kernels.array_hashing import mix64_array
from embtrain.kernels.codes import VAL_BF16, VAL_F16
from embtrain.kernels.rules.halves import ROUND_SALT, SLOT_STREAM_SHIFT

_U32 = np.uint32
#: float64 value of the first pattern past the largest finite half (the +inf pattern), as the
#: "next half" of the largest finite one: 2^16 for float16, 2^128 for bfloat16.
_PAST_MAX = {VAL_F16: 2.0**16, VAL_BF16: 2.0**128}
_INF_BITS = {VAL_F16: 0x7C00, VAL_BF16: 0x7F80}


def _check(kind: int) -> None:
    if kind not in (VAL_BF16, VAL_F16):
        raise ValueError(f"not a half kind: {kind}")


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


def round_bits_ref(
    seed: int, step: int, table: int, keys: np.ndarray, columns: np.ndarray
) -> np.ndarray:
    """uint32 random bits of every (key, column) (``keys`` and ``columns`` broadcast
    against each other; int64, taken mod 2^64) of ``table`` at ``step``."""
    m = 0xFFFFFFFFFFFFFFFF
    base = mix64_array(np.array([(seed & m) ^ ROUND_SALT], np.uint64))
    base = mix64_array(base ^ np.uint64(step & m))
    base = mix64_array(base ^ np.uint64(table & m))[0]
    k = np.asarray(keys, np.int64).astype(np.uint64)
    c = np.asarray(columns, np.int64).astype(np.uint64)
    row = mix64_array(base ^ mix64_array(k))
    return (mix64_array(row ^ c) >> np.uint64(32)).astype(_U32)


def slot_column_ref(columns: np.ndarray, slot: int) -> np.ndarray:
    """The rounding-stream column of optimizer slot ``slot``'s elements."""
    return np.asarray(columns, np.int64) + (np.int64(slot + 1) << SLOT_STREAM_SHIFT)
