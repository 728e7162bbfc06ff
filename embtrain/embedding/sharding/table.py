"""``table`` sharding: the whole table on one rank.

Ids: every bag of a feature goes whole to the owner (one ``alltoallv`` for all tables); the
owner pools the global batch and sends each rank its samples' vectors; gradients go back the
same way. Traffic: :class:`embtrain.plan.shardings.TableModel`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from embtrain.embedding.config import FeatureConfig, TableConfig
from embtrain.embedding.engine import TableState
from embtrain.embedding.sharding.base import Route, ShardingStrategy, TablePlacement
from embtrain.plan.shardings import MODELS


class TableSharding(ShardingStrategy):
    """One owner holds every row and column."""

    name = "table"
    model = MODELS["table"]
    whole = True

    def routes(self, feature: FeatureConfig, table: TableConfig,
               placement: TablePlacement) -> list[Route]:
        pieces = int(feature.hotness or 1) if feature.combiner == "concat" else 1
        return [Route(feature.name, feature.name, table.name, placement.owners[0], self, -1,
                      pieces * table.dim, (0, table.dim), pieces)]

    def merge(self, states: Mapping[int, TableState], placement: TablePlacement, world: int,
              dynamic: bool, slot_names: Sequence[str]) -> TableState:
        return states[placement.owners[0]]


STRATEGY = TableSharding()
traffic = STRATEGY.traffic

__all__ = ["STRATEGY", "TableSharding", "traffic"]
