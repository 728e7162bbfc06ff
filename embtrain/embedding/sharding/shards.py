"""What one rank holds of a sharded model: each table's strategy (checked against the
optimizer), the routes of every feature to its tables' owners, and the local tables and
features of this rank's engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from embtrain.embedding.config import FeatureConfig, TableConfig
from embtrain.embedding.optimizers import SlotSpec
from embtrain.embedding.sharding import strategy
from embtrain.embedding.sharding.base import Route, ShardingStrategy, TablePlacement


@dataclass(frozen=True)
class LocalShards:
    """The strategies by table, every route, and this rank's engine's tables and features."""

    strategies: dict[str, ShardingStrategy]
    routes: list[Route]
    tables: list[TableConfig]
    features: list[FeatureConfig]


def local_shards(tables: Mapping[str, TableConfig], features: Sequence[FeatureConfig],
                 placements: Mapping[str, TablePlacement], optimizer: str,
                 slots: Sequence[SlotSpec], rank: int, world: int) -> LocalShards:
    """Rank ``rank``'s shards of the model ``tables``/``features`` placed as ``placements``
    says; raises ``ValueError`` for a table without a placement, without an owner, or that
    its mode cannot shard under ``optimizer``."""
    missing = set(tables) - set(placements)
    if missing:
        raise ValueError(f"no placement for tables {sorted(missing)}")
    strategies = {name: strategy(p.mode) for name, p in placements.items()}
    for name, p in placements.items():
        if not p.owners:
            raise ValueError(f"table {name!r}: no rank holds it")
        strategies[name].check(name, tables[name], optimizer, slots)
    routes: list[Route] = []
    for f in features:
        routes += strategies[f.table].routes(f, tables[f.table], placements[f.table])
    local = [strategies[t.name].local_table(t, placements[t.name], rank, world)
             for t in tables.values()
             if strategies[t.name].exchanged and rank in placements[t.name].owners]
    by_name = {f.name: f for f in features}
    local_features = [r.strategy.local_feature(r, by_name[r.feature])
                      for r in routes if r.owner == rank]
    return LocalShards(strategies, routes, local, local_features)


__all__ = ["LocalShards", "local_shards"]
