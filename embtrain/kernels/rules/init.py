"""Counter-based initial values: value = f(seed, table name, row, column), nothing else.

See :mod:`embtrain.embedding.initializers` for the recipe. A kernel computes the row's hash
once (:func:`row_hash`), the column's stream mixes of attempt 0 (:func:`column_stream`, the CPU
kernels precompute them per column) and then :func:`init_value` per column.
"""

from __future__ import annotations

import math

import numpy as np
from numba.extending import register_jitable

from embtrain.kernels.codes import (
    INIT_CONSTANT,
    INIT_NORMAL,
    INIT_TRUNCATED_NORMAL,
    INIT_UNIFORM,
    INIT_ZEROS,
)
from embtrain.kernels.rules.hashing import mix64, unit53, unit53_open

_S8 = np.uint64(8)
_ONE = np.uint64(1)
_TWO_PI = 6.283185307179586
MAX_TRUNC_ATTEMPTS = 127


@register_jitable(inline="always")
def row_hash(base, row):
    """``mix64(base ^ mix64(row))``: the hash every column of ``row`` starts from."""
    return mix64(base ^ mix64(np.uint64(row)))


@register_jitable(inline="always")
def column_stream(c, j):
    """``mix64(c << 8 | j)``: stream ``j`` (< 256) of column ``c``."""
    return mix64((np.uint64(c) << _S8) | np.uint64(j))


@register_jitable(inline="always")
def uniform_value(param, rh, m1):
    """The initial value of a column of a uniform initializer (``init_value`` for
    ``INIT_UNIFORM``; branch-free, so a loop over a row's columns runs in vector lanes)."""
    return np.float32(param * (2.0 * unit53(mix64(rh ^ m1)) - 1.0))


@register_jitable(inline="always")
def init_value(kind, param, rh, c, m1, m2):
    """Initial float32 value of column ``c`` of the row with hash ``rh``; ``m1``, ``m2`` are
    ``column_stream(c, 0)`` and ``column_stream(c, 1)``. ``kind``: ``codes.INIT_*``;
    ``param``: the scale (uniform), std (normal kinds) or value (constant)."""
    if kind == INIT_ZEROS:
        return np.float32(0.0)
    if kind == INIT_CONSTANT:
        return np.float32(param)
    if kind == INIT_UNIFORM:
        return uniform_value(param, rh, m1)
    ctr = np.uint64(c) << _S8
    z = 0.0
    for attempt in range(MAX_TRUNC_ATTEMPTS):
        if attempt > 0:
            a = np.uint64(2 * attempt)
            m1 = mix64(ctr | a)
            m2 = mix64(ctr | (a + _ONE))
        u1 = unit53_open(mix64(rh ^ m1))
        u2 = unit53(mix64(rh ^ m2))
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(_TWO_PI * u2)
        if kind == INIT_NORMAL or abs(z) <= 2.0:
            break
    if kind == INIT_TRUNCATED_NORMAL and abs(z) > 2.0:
        z = 0.0
    return np.float32(param * z)
