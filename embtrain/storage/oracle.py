"""The offline oracle a tier cache's hit rate is judged against.

Lookups are counted the way the cache counts them: once per distinct row per step (a row
read by several samples of a batch is one hit or one miss). The oracle knows every step in
advance and keeps, for the whole run, the ``cached`` rows that appear in the most steps (ties:
the lower row id); its hit rate is the share of (step, row) lookups that fall on those rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OracleResult:
    """Distinct (step, row) lookups, how many the oracle's rows serve, and its hit rate."""

    lookups: int
    hits: int

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (1.0 when there were none)."""
        return self.hits / self.lookups if self.lookups else 1.0

    @property
    def misses(self) -> int:
        """Lookups the oracle's rows do not serve."""
        return self.lookups - self.hits


def step_rows(steps: Iterable[np.ndarray]) -> list[np.ndarray]:
    """The distinct rows of each step, ascending."""
    return [np.unique(np.asarray(s, dtype=np.int64)) for s in steps]


def oracle_hits(steps: Iterable[np.ndarray], cached: int) -> OracleResult:
    """Lookups and hits of a cache holding, all run long, the ``cached`` rows that appear in the
    most steps of ``steps`` (each an array of row ids looked up in that step)."""
    uniq = step_rows(steps)
    if not uniq:
        return OracleResult(0, 0)
    _rows, counts = np.unique(np.concatenate(uniq), return_counts=True)  # rows ascending
    lookups = int(counts.sum())
    if cached <= 0:
        return OracleResult(lookups, 0)
    # most steps first, then the lower row id (rows is ascending, the sort is stable)
    keep = np.argsort(-counts, kind="stable")[:cached]
    return OracleResult(lookups, int(counts[keep].sum()))


@dataclass(frozen=True)
class WindowCounts:
    """Distinct (step, row) lookups of the steps from ``start`` on, of one table.

    ``oracle_hits``: hits of :func:`oracle_hits` over those steps (the rows it keeps are
    cached from the start, as the issue's oracle); ``oracle_cold_hits``: the same rows, but
    each costs one miss where the run reads it for the first time (a cache that starts empty
    cannot hit a row never read before); ``first_touches``: lookups of rows no earlier step
    read, misses for any cache that starts empty. ``low_hits``, ``low_cold_hits``: the same
    for a cache of the rows ``0 .. cached-1`` (under ``gen-data``'s and ``bench``'s power law
    the most likely rows: the best a cache can do without knowing which rows the draws will
    pick)."""

    lookups: int
    oracle_hits: int
    oracle_cold_hits: int
    first_touches: int
    low_hits: int = 0
    low_cold_hits: int = 0


def window_counts(rows_by_step: list[np.ndarray], start: int, cached: int) -> WindowCounts:
    """:class:`WindowCounts` of the steps ``rows_by_step[start:]`` (each the distinct rows of
    a step, ascending, as :func:`step_rows` gives), with the steps before ``start`` as the
    run's past, for a cache of ``cached`` rows."""
    window = rows_by_step[start:]
    if not window:
        return WindowCounts(0, 0, 0, 0)
    rows, counts = np.unique(np.concatenate(window), return_counts=True)
    past = (np.unique(np.concatenate(rows_by_step[:start])) if start > 0
            else np.empty(0, np.int64))
    new = ~np.isin(rows, past, assume_unique=True)  # first read in the window
    keep = np.argsort(-counts, kind="stable")[:max(cached, 0)]
    hits = int(counts[keep].sum())
    low = rows < cached
    low_hits = int(counts[low].sum())
    return WindowCounts(lookups=int(counts.sum()), oracle_hits=hits,
                        oracle_cold_hits=hits - int(new[keep].sum()),
                        first_touches=int(new.sum()), low_hits=low_hits,
                        low_cold_hits=low_hits - int(new[low].sum()))
