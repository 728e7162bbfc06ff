"""Key hashing: splitmix64's output function and float conversions (one definition, every
target).

``mix64(z)``: ``z += 0x9E3779B97F4A7C15; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
z = (z ^ z>>27) * 0x94D049BB133111EB; z ^ z>>31`` (all mod 2^64). The functions take and
return ``np.uint64`` (scalars in kernels; they also work elementwise on NumPy uint64 arrays,
wrapped in ``np.errstate(over="ignore")``). :func:`mix64_int` is the pure-Python form for
per-table constants.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
TWO_POW_M53 = 1.0 / 9007199254740992.0


@register_jitable(inline="always")
def mix64(z):
    """splitmix64 output function of state ``z`` (adds the golden gamma, then finalises)."""
    z = z + GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@register_jitable(inline="always")
def unit53(bits):
    """Top 53 bits of ``bits`` as a float64 in [0, 1)."""
    return np.float64(bits >> _S11) * TWO_POW_M53


@register_jitable(inline="always")
def unit53_open(bits):
    """Top 53 bits of ``bits`` plus one, times 2^-53: a float64 in (0, 1]."""
    return (np.float64(bits >> _S11) + 1.0) * TWO_POW_M53


def mix64_int(z: int) -> int:
    """:func:`mix64` of a Python integer (taken mod 2^64), as a Python integer."""
    with np.errstate(over="ignore"):
        return int(mix64(np.uint64(z & 0xFFFFFFFFFFFFFFFF)))
