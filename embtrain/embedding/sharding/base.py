"""What every sharding strategy answers: the seam between :class:`ShardedEmbedding` and a mode.

:class:`~embtrain.embedding.sharded.ShardedEmbedding` runs one fused exchange per phase for
all tables (one ``alltoallv`` of ids, one of pooled vectors, one of gradients), so a step
costs three collectives whatever the modes. Each table's part of each exchange is its
strategy's (TorchRec's input dist / lookup / output dist, per mode):

* **id exchange** (input dist): :meth:`ShardingStrategy.routes` (which owners a feature's ids
  go to, and under which name the owner's engine knows it), :meth:`~ShardingStrategy.outbound`
  (what one route sends), :meth:`~ShardingStrategy.received` (what the owner keeps of the
  bag lengths it got);
* **lookup**: the owner's :class:`~embtrain.embedding.engine.EmbeddingEngine` over the local
  shards :meth:`~ShardingStrategy.local_table` and :meth:`~ShardingStrategy.local_feature`
  describe;
* **pooled exchange** (output dist): :meth:`~ShardingStrategy.place` (where a received block
  lands in the one-process layout);
* **gradient exchange**: :meth:`~ShardingStrategy.grad_block` (what gradient block a route
  sends back to its owner);
* **state**: exporting (:meth:`~ShardingStrategy.export_range`, :meth:`~ShardingStrategy.merge`)
  and importing (:meth:`~ShardingStrategy.select`, :meth:`~ShardingStrategy.cut`) whole tables
  with global keys;
* **traffic**: :meth:`~ShardingStrategy.traffic`, the bytes model the planner prices the
  mode with (:mod:`embtrain.plan.shardings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, NamedTuple

import numpy as np

from embtrain.embedding.config import (
    FeatureConfig,
    ShardPlacement,
    SparseInput,
    TableConfig,
)
from embtrain.embedding.engine import EmbeddingEngine, TableState
from embtrain.embedding.optimizers import SlotSpec
from embtrain.plan.cost import cache_rows
from embtrain.plan.shardings import MODELS, ShardingModel, StepTraffic, TableShape


@dataclass(frozen=True)
class TablePlacement:
    """Where one table lives: its sharding mode and, per owner rank, its rows and columns."""

    mode: str
    owners: tuple[int, ...]
    rows: Mapping[int, int]
    columns: Mapping[int, tuple[int, int]]

    def __post_init__(self) -> None:
        if self.mode not in MODELS:
            raise ValueError(f"unknown sharding {self.mode!r}; one of {tuple(MODELS)}")


@dataclass(frozen=True)
class Route:
    """One feature's path to one owner of its table."""

    feature: str  # global feature name
    local: str  # the feature's name in the owner's engine
    table: str
    owner: int
    strategy: ShardingStrategy
    position: int  # concat position of a row-sharded concat feature, else -1
    width: int  # columns of the block that travels, per sample
    cols: tuple[int, int]  # column range of the full dim (column mode)
    pieces: int  # hotness for concat, else 1


@dataclass
class Pending:
    """What a forward leaves for its backward."""

    sizes: list[int]
    scales: dict[str, np.ndarray] = field(default_factory=dict)
    # partial routes: which of this rank's samples have a key at the owner (route index → mask)
    sent_present: dict[int, np.ndarray] = field(default_factory=dict)
    # partial routes this rank owns: which samples of each sender have a key here
    recv_present: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)


class Outbound(NamedTuple):
    """One route's part of a message to its owner: header ``[nnz, has_weights, bag_size]``,
    the arrays, and (partial routes) which samples have a key at the owner."""

    header: list[int]
    arrays: list[np.ndarray]
    present: np.ndarray | None


class Samples:
    """Per feature of one batch, the sample of each key (computed once, when first asked)."""

    def __init__(self) -> None:
        self._of: dict[str, np.ndarray] = {}

    def of(self, feature: str, inp: SparseInput) -> np.ndarray:
        got = self._of.get(feature)
        if got is None:
            offs = np.asarray(inp.offsets, dtype=np.int64)
            got = self._of[feature] = np.repeat(np.arange(inp.batch_size, dtype=np.int64),
                                                np.diff(offs))
        return got


class ShardingStrategy:
    """A sharding mode at run time (the base: whole bags to one owner per route).

    Strategies are stateless singletons; :mod:`embtrain.embedding.sharding` maps each mode
    name to one.
    """

    name: ClassVar[str]
    model: ClassVar[ShardingModel]
    #: the table's shards live in the rank's exchanged engine (False: replicas held apart)
    exchanged: ClassVar[bool] = True
    #: an owner holds the whole table (every row and column, global keys)
    whole: ClassVar[bool] = False

    # ---------------------------------------------------------------- plan and checks

    def traffic(self, table: TableShape, batch: int, world: int, element: int) -> StepTraffic:
        """Lookups and bytes per step, all ranks together: the planner's formula."""
        return self.model.traffic(table, batch, world, element)

    def check(self, name: str, table: TableConfig, optimizer: str,
              slots: Sequence[SlotSpec]) -> None:
        """Raise ``ValueError`` when ``table`` cannot be sharded this way."""

    # ---------------------------------------------------------------- structure

    def routes(self, feature: FeatureConfig, table: TableConfig,
               placement: TablePlacement) -> list[Route]:
        """The paths of ``feature``'s ids to the owners of ``table``."""
        raise NotImplementedError

    def local_table(self, table: TableConfig, placement: TablePlacement, rank: int,
                    world: int) -> TableConfig:
        """The shard of ``table`` that ``rank`` (an owner) holds in its engine."""
        c0, c1 = placement.columns[rank]
        shard_rows = placement.rows[rank]
        tier = table.tier
        if tier is not None and table.dynamic is not None and tier.row_bytes and \
                shard_rows < table.rows:  # the shard's key directory costs less
            rows = cache_rows(tier.budget, tier.row_bytes, shard_rows, True)
            tier = replace(tier, cache_rows=min(rows, shard_rows))
        where = ShardPlacement(self.model.key_offset(rank), self.model.key_stride(world), c0,
                               table.dim)
        return replace(table, rows=shard_rows, dim=c1 - c0, tier=tier, placement=where)

    def local_feature(self, route: Route, feature: FeatureConfig) -> FeatureConfig:
        """The feature the owner's engine pools for ``route``."""
        return FeatureConfig(route.local, feature.table, feature.combiner, feature.hotness)

    # ---------------------------------------------------------------- id exchange

    def outbound(self, route: Route, inp: SparseInput, samples: Samples, world: int,
                 dynamic: bool) -> Outbound:
        """What ``route`` sends its owner of this rank's ``inp``: every bag whole."""
        keys = np.asarray(inp.keys, dtype=np.int64)
        weights = None if inp.weights is None else np.asarray(inp.weights, dtype=np.float32)
        bag = int(inp.bag_size)
        arrays = [] if bag > 0 else [np.diff(np.asarray(inp.offsets, np.int64)).astype(np.int32)]
        arrays.append(keys)
        if weights is not None:
            arrays.append(weights)
        return Outbound([keys.shape[0], int(weights is not None), bag], arrays, None)

    def received(self, pending: Pending, index: int, src: int, lengths: np.ndarray) -> None:
        """The owner got ``lengths`` (bag lengths) of route ``index`` from rank ``src``."""

    # ---------------------------------------------------------------- pooled exchange

    def place(self, result: list[np.ndarray], where: tuple[int, int, int], route: Route,
              block: np.ndarray, dim: int, row_sums: dict[str, np.ndarray],
              present: np.ndarray | None) -> None:
        """Put ``block`` (this rank's samples' pooled vectors from ``route``'s owner) at
        ``where`` (group, column, width) of the one-process ``result``."""
        G, C, W = where
        result[G][:, C:C + W] = block

    def partial_sums(self, route: Route) -> bool:
        """Whether ``route``'s pooled block is a partial sum, added to other owners' (it then
        travels as float32 whatever the table's dtype, to be rounded once after the sum)."""
        return False

    # ---------------------------------------------------------------- gradient exchange

    def grad_block(self, g: np.ndarray, route: Route, pending: Pending, batch: int,
                   dim: int) -> np.ndarray:
        """The gradient ``route`` sends its owner, from ``g`` (the feature's columns of the
        gradient, ``[batch, width]``)."""
        return g

    # ---------------------------------------------------------------- state

    def export_range(self, engine: EmbeddingEngine, name: str, lo: int, hi: int, rank: int,
                     world: int, dynamic: bool) -> TableState:
        """This owner's part of the global key range ``[lo, hi)`` of table ``name``."""
        return engine.export_range(name, lo, hi)

    def merge(self, states: Mapping[int, TableState], placement: TablePlacement, world: int,
              dynamic: bool, slot_names: Sequence[str]) -> TableState:
        """One table (or key range) with global keys from its owners' states."""
        raise NotImplementedError

    def select(self, keys: np.ndarray, extra: dict[str, Any], rank: int, world: int,
               dynamic: bool) -> tuple[Any, np.ndarray, dict[str, Any]]:
        """Of a whole table's ``keys`` (and admission ``extra``): which this owner keeps, as
        ``(selection, local keys, extra)``."""
        return slice(None), keys, extra

    def cut(self, array: np.ndarray, per_column: bool, columns: tuple[int, int]) -> np.ndarray:
        """This owner's ``columns`` of a selected array (``per_column``: one value per column)."""
        return array


def placements_from_plan(plan: Any) -> dict[str, TablePlacement]:
    """Each table's :class:`TablePlacement` from a :class:`~embtrain.plan.Plan`."""
    out = {}
    for t in plan.tables:
        shards = [s for s in t.shards if s.rows > 0 and s.col_stop > s.col_start]
        out[t.name] = TablePlacement(
            mode=t.sharding,
            owners=tuple(s.rank for s in shards),
            rows={s.rank: s.rows for s in shards},
            columns={s.rank: (s.col_start, s.col_stop) for s in shards},
        )
    return out


def whole_tables(tables: Sequence[TableConfig], world: int) -> dict[str, TablePlacement]:
    """Every table whole on rank 0: the placements of one rank (several need a plan's)."""
    if world > 1:
        raise ValueError("several ranks need the plan's placements")
    return {t.name: TablePlacement("table", (0,), {0: t.rows}, {0: (0, t.dim)}) for t in tables}


def bag_scales(combiner: str, inp: SparseInput) -> np.ndarray:
    """Per sample: 1/Σw (``mean``) or 1/sqrt(Σw²) (``sqrtn``), 0 for an empty or zero-weight
    bag (the combiner of partial sums pooled by several owners, row sharding)."""
    offs = np.asarray(inp.offsets, dtype=np.int64)
    n = offs.shape[0] - 1
    w = (np.ones(int(offs[-1]), np.float32) if inp.weights is None
         else np.asarray(inp.weights, np.float32))
    sample = np.repeat(np.arange(n), np.diff(offs))
    x = w if combiner == "mean" else w * w
    s = np.bincount(sample, weights=x, minlength=n).astype(np.float32)
    if combiner == "sqrtn":
        s = np.sqrt(s)
    out = np.zeros(n, np.float32)
    np.divide(np.float32(1), s, out=out, where=s != 0)
    return out


__all__ = [
    "Outbound",
    "Pending",
    "Route",
    "Samples",
    "ShardingStrategy",
    "TablePlacement",
    "bag_scales",
    "placements_from_plan",
    "whole_tables",
]
