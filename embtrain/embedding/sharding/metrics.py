"""Per-table metrics of a sharded model, summed over the shards of every rank (collective)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from embtrain.comm.base import Communicator
from embtrain.embedding.config import TableConfig
from embtrain.embedding.sharding.base import TablePlacement

DYNAMIC_FIELDS = ("rows", "inserts", "evictions", "expired", "admissions_pending")
TIER_FIELDS = ("cache_rows", "cached", "lookups", "misses", "distinct_misses", "evictions",
               "rows_read", "rows_ahead", "rows_written", "bytes_read", "bytes_written",
               "read_blocks", "read_seconds", "wait_seconds")


def summed_dynamic_metrics(comm: Communicator, engine: Any, names: Sequence[str],
                           tables: Mapping[str, TableConfig],
                           placements: Mapping[str, TablePlacement]
                           ) -> dict[str, dict[str, float]]:
    """Rows, capacity, inserts, evictions, expired, pending admissions and load factor of
    each dynamic table ``names``, summed over its row shards (one all-reduce; over one rank
    the engine's own lines, nothing to sum)."""
    local = engine.dynamic_metrics()
    if comm.size == 1:
        return local
    vec = np.zeros((len(names), len(DYNAMIC_FIELDS)), np.float64)
    for i, name in enumerate(names):
        p = placements[name]
        # column shards hold the same keys: count the first column range only
        if name in local and p.columns[comm.rank][0] == 0:
            vec[i] = [local[name][f] for f in DYNAMIC_FIELDS]
    total = comm.allreduce_sum(vec.reshape(-1), "control").reshape(vec.shape)
    out = {}
    for i, name in enumerate(names):
        m = {f: int(total[i, j]) for j, f in enumerate(DYNAMIC_FIELDS)}
        cap = tables[name].rows
        out[name] = {"rows": m["rows"], "capacity": cap, "inserts": m["inserts"],
                     "evictions": m["evictions"], "expired": m["expired"],
                     "admissions_pending": m["admissions_pending"],
                     "load_factor": round(m["rows"] / cap, 6)}
    return out


def summed_tier_metrics(comm: Communicator, engine: Any, names: Sequence[str]
                        ) -> dict[str, dict[str, float]]:
    """Cache rows, lookups, misses, hit rate, evictions and the store's reads and writes of
    each tiered table ``names``, summed over its shards (one all-reduce; over one rank the
    engine's own lines, nothing to sum)."""
    local = engine.tier_metrics()
    if comm.size == 1:
        return local
    vec = np.zeros((len(names), len(TIER_FIELDS)), np.float64)
    for i, name in enumerate(names):
        if name in local:
            vec[i] = [local[name][f] for f in TIER_FIELDS]
    total = comm.allreduce_sum(vec.reshape(-1), "control").reshape(vec.shape)
    out = {}
    for i, name in enumerate(names):
        m: dict[str, float] = {f: float(total[i, j]) for j, f in enumerate(TIER_FIELDS)}
        for f in TIER_FIELDS:
            if not f.endswith("_seconds"):
                m[f] = int(m[f])
        m["hit_rate"] = round(1 - m["misses"] / m["lookups"], 6) if m["lookups"] else 0.0
        out[name] = m
    return out


__all__ = ["summed_dynamic_metrics", "summed_tier_metrics"]
