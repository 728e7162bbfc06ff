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


def split_cache(rows: list[int], row_bytes: list[int], draws: list[float], budget: int,
                alpha: float, floor: list[int] | None = None) -> list[int]:
    """Cache rows per table for one memory ``budget`` (bytes) shared by several tables, so that
    the rows kept are the ones most likely to appear in a step, whatever their table.

    Table ``t`` has ``rows[t]`` rows of ``row_bytes[t]`` bytes and draws ``draws[t]`` ids per
    step (power law, exponent ``alpha``); its row ``k`` is drawn with probability
    ``p_tk = (k+1)^-alpha / H(rows[t], alpha)``. Keeping every row whose expected draws per
    byte, ``draws[t] p_tk / row_bytes[t]``, is above one cutoff ``θ`` is the greedy knapsack
    by value per byte (a row's chance to appear in a step, ``1 - (1 - p)^draws``, grows with
    ``draws p``): ``c_t = (draws[t] / (θ H_t row_bytes[t]))^(1/alpha)`` rows, capped at
    ``rows[t]``; ``θ`` is found by bisection so the bytes fit the budget. With ``alpha = 0``
    (uniform ids) every table gets the same fraction of its rows. ``floor``: rows each table
    gets at least (e.g. what one batch can read), before the rest is split."""
    n = len(rows)
    if n == 0:
        return []
    low = [0] * n if floor is None else [min(int(f), r) for f, r in zip(floor, rows, strict=True)]
    total = sum(r * b for r, b in zip(rows, row_bytes, strict=True))
    if budget >= total:
        return list(rows)
    if alpha == 0:
        share = budget / total
        return [max(lo, int(share * r)) for lo, r in zip(low, rows, strict=True)]
    h = [harmonic(r, alpha) for r in rows]

    def counts(theta: float) -> list[int]:
        out = []
        for r, b, d, ht, lo in zip(rows, row_bytes, draws, h, low, strict=True):
            if d <= 0:
                out.append(lo)
                continue
            c = (d / (theta * ht * b)) ** (1.0 / alpha)
            out.append(max(lo, int(min(r, c))))
        return out

    def used(theta: float) -> int:
        return sum(c * b for c, b in zip(counts(theta), row_bytes, strict=True))

    lo, hi = 1e-300, 1e300  # used(lo) ≥ budget ≥ used(hi)
    for _ in range(400):
        mid = math.sqrt(lo * hi)
        if used(mid) > budget:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return counts(hi)
