"""Expected hit rate of a cache in front of a table under power-law ids (pure, NumPy only).

``embtrain gen-data`` and ``bench`` draw id ``k`` of a table of ``n`` rows with probability
``∝ (k + 1)^-alpha``. A cache that keeps the ``c`` most frequently used rows (an LFU-like
policy, in steady state) serves the probability mass of the ``c`` most likely ids:

    hit(c) = H(c, alpha) / H(n, alpha),   H(m, alpha) = Σ_{k<m} (k + 1)^-alpha

summed exactly for ``k < 2^20`` and beyond that by the midpoint rule
``Σ_{k=a}^{b-1} f(k) ≈ ∫_{a-1/2}^{b-1/2} f`` (relative error below 1e-9 there). A row-sharded
table whose ``W`` ranks each cache ``c`` rows holds the keys below ``W c`` in caches, so its
hit rate is ``hit(W c)`` of the whole table.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

EXACT_HEAD = 1 << 20


@lru_cache(maxsize=16)
def _head(alpha: float) -> np.ndarray:
    """``H(m, alpha)`` for ``m = 0 .. EXACT_HEAD``."""
    out = np.zeros(EXACT_HEAD + 1, dtype=np.float64)
    np.cumsum(np.arange(1, EXACT_HEAD + 1, dtype=np.float64) ** -alpha, out=out[1:])
    return out


def _integral(lo: float, hi: float, alpha: float) -> float:
    """∫ x^-alpha dx over [lo, hi)."""
    if abs(alpha - 1.0) < 1e-12:
        return math.log(hi / lo)
    g = 1.0 - alpha
    return (hi**g - lo**g) / g


def harmonic(m: int, alpha: float) -> float:
    """``H(m, alpha) = Σ_{k<m} (k + 1)^-alpha``."""
    if m <= 0:
        return 0.0
    head = _head(float(alpha))
    if m <= EXACT_HEAD:
        return float(head[m])
    # terms k = EXACT_HEAD .. m-1 are (k+1)^-alpha for x = k + 1 in [EXACT_HEAD + 1, m]
    return float(head[EXACT_HEAD]) + _integral(EXACT_HEAD + 0.5, m + 0.5, alpha)


def top_mass(rows: int, alpha: float, cached: int) -> float:
    """Share of lookups that fall on the ``cached`` most likely of ``rows`` ids."""
    if rows <= 0:
        return 1.0
    cached = max(0, min(int(cached), int(rows)))
    if cached == rows:
        return 1.0
    if alpha == 0:
        return cached / rows
    return harmonic(cached, alpha) / harmonic(rows, alpha)
