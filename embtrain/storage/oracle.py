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
