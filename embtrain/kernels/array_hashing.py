"""splitmix64 on NumPy arrays, host side: the kernels' rule (:func:`embtrain.kernels.rules.hashing.mix64`)
applied elementwise, its finalizer, a 63-bit form of it and their inverses.

The one place these are written for NumPy: the data generator's id encodings
(:mod:`embtrain.data.gen_ids`), its labels (:mod:`embtrain.data.labels_gen`) and the reference
of stochastic rounding use them. (The numba kernels call the rule itself; the LLVM IR of
:mod:`embtrain.kernels._llvm` and the TensorFlow ops of :mod:`embtrain.serving.tf_ops` are the
same function for targets that cannot call Python.)
"""

from __future__ import annotations

import numpy as np

from embtrain.kernels.rules.hashing import _MIX1, _MIX2, GOLDEN, mix64

_M1, _M2 = int(_MIX1), int(_MIX2)
#: the low 63 bits
MASK63 = np.uint64((1 << 63) - 1)


def finalize64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 values, a bijection: :func:`mix64` without its golden
    gamma step (``mix64(x - GOLDEN)``, mod 2^64)."""
    with np.errstate(over="ignore"):
        return mix64(np.asarray(x).astype(np.uint64) - GOLDEN)


def mix64_array(z: np.ndarray) -> np.ndarray:
    """:func:`mix64` (splitmix64's output function) of every uint64 of ``z``."""
    with np.errstate(over="ignore"):
        return mix64(np.asarray(z).astype(np.uint64))


def _unshift(x: np.ndarray, shift: int, mask: np.uint64) -> np.ndarray:
    """Inverse of ``x ^= x >> shift`` on values of ``mask``'s width (``mask``: all ones)."""
    y = x.copy()
    for _ in range(64 // shift + 1):
        y = (x ^ (y >> np.uint64(shift))) & mask
    return y


def unfinalize64(x: np.ndarray) -> np.ndarray:
    """Inverse of :func:`finalize64`."""
    ones = np.uint64(0xFFFFFFFFFFFFFFFF)
    x = _unshift(x.astype(np.uint64, copy=True), 31, ones)
    x = x * np.uint64(pow(_M2, -1, 1 << 64))
    x = _unshift(x, 27, ones)
    x = x * np.uint64(pow(_M1, -1, 1 << 64))
    return _unshift(x, 30, ones)


def finalize63(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer modulo 2**63: a bijection of ``[0, 2**63)``."""
    x = x.astype(np.uint64, copy=True) & MASK63
    x ^= x >> np.uint64(30)
    x = (x * np.uint64(_M1)) & MASK63
    x ^= x >> np.uint64(27)
    x = (x * np.uint64(_M2)) & MASK63
    x ^= x >> np.uint64(31)
    return x


def unfinalize63(x: np.ndarray) -> np.ndarray:
    """Inverse of :func:`finalize63`."""
    x = _unshift(x.astype(np.uint64, copy=True) & MASK63, 31, MASK63)
    x = (x * np.uint64(pow(_M2, -1, 1 << 63))) & MASK63
    x = _unshift(x, 27, MASK63)
    x = (x * np.uint64(pow(_M1, -1, 1 << 63))) & MASK63
    return _unshift(x, 30, MASK63)


