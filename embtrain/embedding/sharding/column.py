"""``column`` sharding: every owner holds a column range of every row.

Ids: every bag goes whole to every owner; each owner pools its columns of the global batch
and sends each rank its samples' column block, which lands in its columns of the
one-process layout (per concat position); gradients go back cut by columns the same way.
Not with an optimizer that keeps state per whole row (rowwise_adagrad). Traffic:
:class:`embtrain.plan.shardings.ColumnModel`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from embtrain.embedding.config import FeatureConfig, TableConfig
from embtrain.embedding.engine import TableState
from embtrain.embedding.optimizers import SlotSpec
from embtrain.embedding.sharding.base import Pending, Route, ShardingStrategy, TablePlacement
from embtrain.plan.shardings import MODELS


class ColumnSharding(ShardingStrategy):
    """Owners side by side, each with columns ``[c0, c1)`` of the dim."""

    name = "column"
    model = MODELS["column"]

    def check(self, name: str, table: TableConfig, optimizer: str,
              slots: Sequence[SlotSpec]) -> None:
        if any(s.per_row for s in slots):
            raise ValueError(
                f"table {name!r}: column sharding splits each row across ranks, but "
                f"{optimizer} keeps one accumulator per whole row; use table or row"
            )

    def routes(self, feature: FeatureConfig, table: TableConfig,
               placement: TablePlacement) -> list[Route]:
        pieces = int(feature.hotness or 1) if feature.combiner == "concat" else 1
        out = []
        for o in placement.owners:
            c0, c1 = placement.columns[o]
            out.append(Route(feature.name, feature.name, table.name, o, self, -1,
                             pieces * (c1 - c0), (c0, c1), pieces))
        return out

    def place(self, result: list[np.ndarray], where: tuple[int, int, int], route: Route,
              block: np.ndarray, dim: int, row_sums: dict[str, np.ndarray],
              present: np.ndarray | None) -> None:
        G, C, W = where
        view = result[G][:, C:C + W].reshape(-1, route.pieces, dim)
        c0, c1 = route.cols
        view[:, :, c0:c1] = block.reshape(-1, route.pieces, c1 - c0)

    def grad_block(self, g: np.ndarray, route: Route, pending: Pending, batch: int,
                   dim: int) -> np.ndarray:
        c0, c1 = route.cols
        return g.reshape(batch, route.pieces, dim)[:, :, c0:c1].reshape(batch, -1)

    def merge(self, states: Mapping[int, TableState], placement: TablePlacement, world: int,
              dynamic: bool, slot_names: Sequence[str]) -> TableState:
        """Column shards side by side (their keys and metadata are the same)."""
        order = sorted(placement.owners, key=lambda o: placement.columns[o][0])
        first = states[order[0]]
        return TableState(
            keys=first.keys,
            values=np.concatenate([states[o].values for o in order], axis=1),
            slots={s: np.concatenate([states[o].slots[s] for o in order], axis=1)
                   for s in first.slots},
            update_count=first.update_count,
            last_step=first.last_step,
            extra=first.extra,
            dtype=first.dtype,
            state_dtype=first.state_dtype,
        )

    def cut(self, array: np.ndarray, per_column: bool, columns: tuple[int, int]) -> np.ndarray:
        return array[:, columns[0]:columns[1]] if per_column else array


STRATEGY = ColumnSharding()
traffic = STRATEGY.traffic

__all__ = ["STRATEGY", "ColumnSharding", "traffic"]
