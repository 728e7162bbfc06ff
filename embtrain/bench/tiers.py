"""`bench --host-memory SIZE|FRACTION --disk PATH`: a synthetic model through storage tiers.

The host-memory budget is one budget for all tables (values, optimizer state, metadata and the
cache's index: what the engine prices a cached row at),
split between them by :func:`embtrain.plan.hitrate.split_cache` (rows of the highest expected
draws per byte, whatever their table): a table whose rows all fit stays in memory; the others
get a host tier of their share and a disk tier under ``--disk``.
"""

from __future__ import annotations

import math
import os
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.bench.synthetic import SyntheticModel
from embtrain.errors import UserInputError
from embtrain.plan.cost import HASH_INDEX_BYTES_PER_ROW, RowCost
from embtrain.plan.hitrate import split_cache, top_mass
from embtrain.recipe import models as rm
from embtrain.recipe.units import format_bytes, parse_bytes
from embtrain.storage.aligned import BLOCK
from embtrain.storage.checks import directory_problem, shard_file_bytes
from embtrain.storage.disk import CHUNK_BLOCKS
from embtrain.storage.oracle import WindowCounts, step_rows, window_counts

# Per tiered table besides its host budget: the disk tier's reused I/O buffer.
IO_BUFFER_BYTES = CHUNK_BLOCKS * BLOCK
# The target: the cache's hit rate (distinct rows per step) at most this many points
# below the offline oracle's on the same batches with the same cache rows.
TARGET_ORACLE_POINTS = 3.0
EVICTIONS = ("lru", "lfu")


def parse_host_memory(value: str, total: int) -> int:
    """``--host-memory``: a size (``4GiB``) or a fraction in (0, 1] of the tables' ``total``
    bytes (``0.1``); a bad value is one line naming the flag."""
    text = value.strip()
    try:
        share = float(text)
    except ValueError:
        share = None
    if share is not None:
        if not (math.isfinite(share) and 0 < share <= 1):
            raise UserInputError(f"--host-memory: {value}: give a size with a unit (4GiB) or "
                                 "a fraction in (0, 1] of the tables' bytes")
        return int(share * total)
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise UserInputError(f"--host-memory: {exc} (or give a fraction such as 0.1)") from None


@dataclass(frozen=True)
class TableTier:
    """How one table is stored: cache rows of its rows, and the expected share of its lookups
    the cache serves."""

    name: str
    rows: int
    dim: int
    cache_rows: int
    row_bytes: int
    lookups_per_step: int
    expected_hit_rate: float

    @property
    def tiered(self) -> bool:
        """Whether part of the table lives on disk."""
        return self.cache_rows < self.rows


@dataclass(frozen=True)
class TierSetup:
    """The tiers of a synthetic model for a budget and a disk path."""

    budget: int
    disk: str
    alpha: float
    tables: tuple[TableTier, ...] = field(default_factory=tuple)
    eviction: str = "lru"

    def storage(self) -> dict[str, list[rm.Tier]]:
        """Tier lists of the tables that need a disk tier."""
        return {t.name: [rm.Tier(tier="host", budget=t.cache_rows * t.row_bytes,
                                 eviction=self.eviction),
                         rm.Tier(tier="disk", path=self.disk)]
                for t in self.tables if t.tiered}

    @property
    def memory_bytes(self) -> int:
        """Process memory of the tables: every cache (with its index), the disk tiers' indexes
        (4 bytes a row) and I/O buffers."""
        cache = sum(t.cache_rows * t.row_bytes for t in self.tables)
        extra = sum(4 * t.rows + IO_BUFFER_BYTES for t in self.tables if t.tiered)
        return cache + extra

    @property
    def expected_hit_rate(self) -> float:
        """Expected share of all lookups served from memory (power law, steady state)."""
        total = sum(t.lookups_per_step for t in self.tables)
        return sum(t.lookups_per_step * t.expected_hit_rate for t in self.tables) / max(total, 1)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "host_memory_bytes": self.budget, "disk": self.disk, "alpha": self.alpha,
            "eviction": self.eviction,
            "memory_bytes": self.memory_bytes,
            "expected_hit_rate": self.expected_hit_rate,
            "tiered_tables": sum(t.tiered for t in self.tables),
            "tables": {t.name: {"rows": t.rows, "cache_rows": t.cache_rows,
                                "expected_hit_rate": t.expected_hit_rate}
                       for t in self.tables if t.tiered},
        }


def tier_setup(model: SyntheticModel, *, scale: float, optimizer: str, batch: int, budget: int,
               disk: str, alpha: float, eviction: str = "lru") -> TierSetup:
    """Split ``budget`` between the model's tables (see the module docstring)."""
    tables = model.tables(scale)
    draws: dict[str, int] = {}
    for i in model.inputs(scale):
        draws[i.table] = draws.get(i.table, 0) + batch * i.hotness
    # a cached row: values, optimizer state, metadata and the cache's index (what the engine
    # prices it at, embtrain.embedding.from_recipe.cache_row_bytes)
    row_bytes = [sum(RowCost.of("float32", optimizer, False).shard(1, t.dim))
                 + HASH_INDEX_BYTES_PER_ROW for t in tables]
    # the cache must hold every row one batch can read
    floor = [min(t.rows, draws.get(t.name, 0)) for t in tables]
    least = sum(f * b for f, b in zip(floor, row_bytes, strict=True))
    if least > budget:
        raise UserInputError(f"--host-memory: {format_bytes(budget)} cannot hold the rows one "
                             f"batch of {batch} reads ({format_bytes(least)}); give at least "
                             "that, or a smaller --batch")
    cache = split_cache([t.rows for t in tables], row_bytes,
                        [float(draws.get(t.name, 0)) for t in tables], budget, alpha, floor)
    out = tuple(TableTier(t.name, t.rows, t.dim, c, b, draws.get(t.name, 0),
                          top_mass(t.rows, alpha, c))
                for t, c, b in zip(tables, cache, row_bytes, strict=True))
    return TierSetup(budget, disk, alpha, out, eviction)


def check_disk(setup: TierSetup, optimizer: str) -> None:
    """``--disk``: an existing, writable directory with room for every tiered table's file;
    otherwise one line naming the flag (exit 2)."""
    path = Path(setup.disk)
    problem = directory_problem(path)
    if problem:
        raise UserInputError(f"--disk: {setup.disk}: {problem}")
    need = sum(shard_file_bytes(t.rows, t.dim, optimizer) for t in setup.tables if t.tiered)
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise UserInputError(f"--disk: {setup.disk} has {format_bytes(free)} free but the "
                             f"tiered tables' files need up to {format_bytes(need)}; free some "
                             "space or choose another directory")



def _rates(c: WindowCounts, cache_misses: int) -> dict[str, float]:
    """Hit rates of the cache and the oracles over one window of steps."""
    n = max(c.lookups, 1)
    cache = 1 - cache_misses / n
    oracle = c.oracle_hits / n
    return {"lookups": c.lookups, "cache_misses": cache_misses,
            "cache_hit_rate": cache, "oracle_hit_rate": oracle,
            "points_below_oracle": 100 * (oracle - cache),
            "oracle_cold_hit_rate": c.oracle_cold_hits / n,
            "first_touch_share": c.first_touches / n,
            "likely_rows_hit_rate": c.low_hits / n,
            "likely_rows_cold_hit_rate": c.low_cold_hits / n}


def cache_vs_oracle(setup: TierSetup, input_tables: list[str], ids: list[np.ndarray],
                    warmup: int, steps: int,
                    by_table: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """The cache's hit rate counted as the oracle counts (a row a step reads is one lookup: a
    hit if the cache held it when the step's lookup ran, else one of the engine's
    ``distinct_misses``) next to :func:`~embtrain.storage.oracle.window_counts` of the same
    batches with each table's cache rows, over the timed steps and over all steps.

    ``ids``: the batches' ids per input (``[batches, batch, hotness]``; ``input_tables``: the
    table of each input), step ``s`` reading batch ``s % len``; ``by_table``: the engine's cumulative counters per tiered table at the
    end of warm-up (``warmup``) and at the end (``end``)."""
    count = ids[0].shape[0] if ids else 0
    total = {"timed": [0] * 7, "all_steps": [0] * 7}  # WindowCounts' fields + misses
    tables: dict[str, Any] = {}
    for t in setup.tables:
        if not t.tiered or t.name not in by_table["end"]:
            continue
        cols = [i for i, name in enumerate(input_tables) if name == t.name]
        per_batch = step_rows(np.concatenate([ids[i][k].reshape(-1) for i in cols])
                              for k in range(count))
        rows = [per_batch[s % count] for s in range(warmup + steps)]
        end = by_table["end"][t.name]["distinct_misses"]
        start = by_table["warmup"][t.name]["distinct_misses"]
        out = {}
        for window, first, misses in (("timed", warmup, end - start), ("all_steps", 0, end)):
            c = window_counts(rows, first, t.cache_rows)
            for j, v in enumerate((*astuple(c), int(misses))):
                total[window][j] += v
            out[window] = _rates(c, int(misses))
        tables[t.name] = {"cache_rows": t.cache_rows, **out}
    doc: dict[str, Any] = {"counted": "distinct rows per step", "eviction": setup.eviction}
    for window, counts in total.items():
        doc[window] = _rates(WindowCounts(*counts[:-1]), counts[-1])
    doc["within_target"] = doc["timed"]["points_below_oracle"] <= TARGET_ORACLE_POINTS
    doc["tables"] = tables
    return doc
