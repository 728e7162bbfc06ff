"""The sharding modes, one cost model each: the registry of mode names.

Each mode's model is pure arithmetic (numbers in, bytes out; no TensorFlow, Horovod or
collectives), so that the planner, which sits below the runtime, and the runtime strategy of
the same mode (``embtrain.embedding.sharding.<mode>``, whose ``traffic`` is this model's)
price one exchange with one formula: the plan's traffic and the wire cannot drift apart.

A model answers, for a table of ``rows`` rows and ``dim`` columns on ``world`` ranks:

* :meth:`ShardingModel.layout`: the shard groups (ranks holding equal shards);
* :meth:`ShardingModel.traffic`: per step, all ranks together, ``(lookups, ids bytes,
  forward bytes, backward bytes, all-reduce bytes)`` (the formulas of :mod:`embtrain.plan.cost`);
* :meth:`ShardingModel.rank_traffic`: one group's rank's share of those;
* where a rank's shard sits in key and column space (:meth:`~ShardingModel.key_offset`,
  :meth:`~ShardingModel.key_stride`, :meth:`~ShardingModel.column_start`);
* the expected hit rate of a tiered table's caches (:meth:`ShardingModel.cached_mass`).

:data:`MODELS` maps every mode name to its model; :data:`MODES` is the one list of names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from embtrain.plan.cost import (
    GRADIENT_BYTES,
    ID_BYTES,
    LENGTH_BYTES,
    RowCost,
    expected_owners,
)
from embtrain.plan.hitrate import top_mass
from embtrain.recipe.kinds import SHARDING_MODES

# lookups, ids bytes, forward bytes, backward bytes, all-reduce bytes (per step, all ranks)
StepTraffic = tuple[float, float, float, float, float]


class FeatureUse(Protocol):
    """What the traffic of one feature reading a table depends on."""

    @property
    def hotness(self) -> int: ...
    @property
    def concat(self) -> bool: ...
    @property
    def variable(self) -> bool: ...


class TableShape(Protocol):
    """What the traffic of one table depends on."""

    @property
    def rows(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def features(self) -> Sequence[FeatureUse]: ...
    @property
    def ids_per_sample(self) -> int: ...


@dataclass(frozen=True)
class Group:
    """Ranks ``first .. first + count - 1``, each with a shard of ``rows`` × ``columns``
    starting at column ``first_column`` (the group's first rank)."""

    first: int
    count: int
    rows: int
    columns: int
    first_column: int


def _pooled_bytes(batch: int, width: float, element: int, remote: float) -> float:
    """Bytes of ``batch`` pooled vectors ``width`` wide that cross between ranks."""
    return batch * width * element * remote


class ShardingModel:
    """One sharding mode as the planner sees it (the base: one whole copy on one rank)."""

    name: ClassVar[str]
    #: every holder keeps the whole table (a table's bytes are its bytes per rank)
    whole: ClassVar[bool] = False
    #: every rank holds a replica
    replicated: ClassVar[bool] = False
    #: the placer chooses the one rank that holds it
    one_owner: ClassVar[bool] = False
    #: the table is cut into parts across ranks
    splits: ClassVar[bool] = False
    #: needs at least one column per rank
    splits_columns: ClassVar[bool] = False

    def fits(self, dim: int, world: int) -> bool:
        """Whether a table ``dim`` wide can be sharded this way on ``world`` ranks."""
        return True

    def layout(self, rows: int, dim: int, world: int, rank: int = 0) -> tuple[Group, ...]:
        """The shard groups of a table of ``rows`` × ``dim`` (``rank``: the one owner)."""
        raise NotImplementedError

    def smallest_shard(self, cost: RowCost, rows: int, dim: int) -> int:
        """Bytes per rank of the smallest shard this mode can cut, whatever the world size."""
        return sum(cost.shard(rows, dim))

    def split_how(self, dynamic: bool) -> str:
        """How this mode cuts a table, for the plan's reasons."""
        return self.name

    def traffic(self, table: TableShape, batch: int, world: int, element: int) -> StepTraffic:
        """Lookups and bytes per step of ``table`` for a global batch of ``batch`` samples on
        ``world`` ranks, ``element`` bytes per pooled value on the wire."""
        raise NotImplementedError

    def shares(self, table: TableShape, group: Group, world: int) -> tuple[float, float]:
        """A rank of ``group``'s share of the lookups and ids, and of the pooled bytes."""
        return 1.0, 1.0

    def rank_traffic(self, table: TableShape, group: Group, world: int,
                     totals: StepTraffic) -> tuple[float, float, float, float, float]:
        """One rank of ``group``'s part of the step's ``totals``."""
        lookups, ids, forward, backward, allreduce = totals
        rows, cols = self.shares(table, group, world)
        return (lookups * rows, ids * rows, forward * cols, backward * cols,
                allreduce if self.replicated else 0.0)

    def key_offset(self, rank: int) -> int:
        """The first key of ``rank``'s shard."""
        return 0

    def key_stride(self, world: int) -> int:
        """The distance between consecutive keys of one shard."""
        return 1

    def column_start(self, first_column: int, index: int, columns: int) -> int:
        """The first column of the ``index``-th rank of a group starting at ``first_column``."""
        return 0

    def cached_mass(self, rows: int, alpha: float,
                    groups: Sequence[tuple[Group, Sequence[int]]], tiers: int) -> float:
        """Expected share of lookups the first ``tiers`` tiers serve (power-law ids): every
        rank holding part of the table serves every lookup of its columns."""
        weight = sum(g.count * g.columns for g, _ in groups)
        return sum(g.count * g.columns * top_mass(rows, alpha, sum(r[:tiers]))
                   for g, r in groups) / max(weight, 1)


def _exchange_traffic(table: TableShape, batch: int, world: int, element: int,
                      fan: int) -> StepTraffic:
    """Ids to the owners (``fan`` owners per id), pooled vectors back, gradients out."""
    b, w, e = batch, world, element
    remote = (w - 1) / w
    hot = table.ids_per_sample
    ids = b * hot * ID_BYTES * remote * fan
    for f in table.features:  # bag lengths of variable bags, per sample
        if f.variable:
            ids += b * LENGTH_BYTES * remote * fan
    width = 0.0
    for f in table.features:
        width += table.dim * f.hotness if f.concat else table.dim
    forward = _pooled_bytes(b, width, e, remote)
    return (float(b * hot * fan), ids, forward, forward, 0.0)


class TableModel(ShardingModel):
    """``table``: the whole table on one rank."""

    name = "table"
    whole = True
    one_owner = True

    def layout(self, rows: int, dim: int, world: int, rank: int = 0) -> tuple[Group, ...]:
        return (Group(rank, 1, rows, dim, 0),)

    def traffic(self, table: TableShape, batch: int, world: int, element: int) -> StepTraffic:
        return _exchange_traffic(table, batch, world, element, 1)


class DataParallelModel(ShardingModel):
    """``data_parallel``: a replica on every rank, gradients all-reduced."""

    name = "data_parallel"
    whole = True
    replicated = True

    def layout(self, rows: int, dim: int, world: int, rank: int = 0) -> tuple[Group, ...]:
        return (Group(0, world, rows, dim, 0),)

    def traffic(self, table: TableShape, batch: int, world: int, element: int) -> StepTraffic:
        # no ids or pooled vectors travel; per-row gradient sums and a touched count are
        # all-reduced
        return (batch * table.ids_per_sample, 0.0, 0.0, 0.0,
                float(table.rows * (table.dim + 1) * GRADIENT_BYTES) if world > 1 else 0.0)

    def shares(self, table: TableShape, group: Group, world: int) -> tuple[float, float]:
        return 1.0 / world, 1.0 / world


class ColumnModel(ShardingModel):
    """``column``: every rank holds a column range of every row."""

    name = "column"
    splits = True
    splits_columns = True

    def fits(self, dim: int, world: int) -> bool:
        return dim >= world

    def layout(self, rows: int, dim: int, world: int, rank: int = 0) -> tuple[Group, ...]:
        n, k = divmod(dim, world)  # callers ensure dim >= world
        groups = [Group(0, k, rows, n + 1, 0)] if k else []
        groups.append(Group(k, world - k, rows, n, k * (n + 1)))
        return tuple(groups)

    def smallest_shard(self, cost: RowCost, rows: int, dim: int) -> int:
        return sum(cost.shard(rows, 1))

    def split_how(self, dynamic: bool) -> str:
        return "dim split across ranks"

    def traffic(self, table: TableShape, batch: int, world: int, element: int) -> StepTraffic:
        return _exchange_traffic(table, batch, world, element, world)

    def shares(self, table: TableShape, group: Group, world: int) -> tuple[float, float]:
        return 1.0 / world, group.columns / table.dim

    def column_start(self, first_column: int, index: int, columns: int) -> int:
        return first_column + index * columns


class RowModel(ShardingModel):
    """``row``: rank ``r`` holds the keys ``≡ r (mod world)`` (a dynamic table: by key hash)."""

    name = "row"
    splits = True

    def layout(self, rows: int, dim: int, world: int, rank: int = 0) -> tuple[Group, ...]:
        n, k = divmod(rows, world)
        groups = [Group(0, k, n + 1, dim, 0)] if k else []
        if n:
            groups.append(Group(k, world - k, n, dim, 0))
        return tuple(groups)

    def smallest_shard(self, cost: RowCost, rows: int, dim: int) -> int:
        return sum(cost.shard(1, dim))

    def split_how(self, dynamic: bool) -> str:
        return "keys split by a hash of the key" if dynamic else "rows split by key modulo world size"

    def traffic(self, table: TableShape, batch: int, world: int, element: int) -> StepTraffic:
        # each id goes to its owner only; bag lengths travel per sample and owner (and concat
        # position); one partial sum per sample comes back from each owner of one of its ids
        b, w, e = batch, world, element
        remote = (w - 1) / w
        hot = table.ids_per_sample
        ids = b * hot * ID_BYTES * remote
        for f in table.features:
            ids += b * LENGTH_BYTES * w * remote * (f.hotness if f.concat else 1)
        width = 0.0
        for f in table.features:
            if f.concat:
                width += table.dim * f.hotness
            else:
                width += table.dim * expected_owners(f.hotness, w)
        forward = _pooled_bytes(b, width, e, remote)
        return (float(b * hot), ids, forward, forward, 0.0)

    def shares(self, table: TableShape, group: Group, world: int) -> tuple[float, float]:
        share = group.rows / table.rows
        return share, share

    def key_offset(self, rank: int) -> int:
        return rank

    def key_stride(self, world: int) -> int:
        return world

    def cached_mass(self, rows: int, alpha: float,
                    groups: Sequence[tuple[Group, Sequence[int]]], tiers: int) -> float:
        # rank r caches keys r, r + W, ...: together the keys below Σ c_r
        cached = sum(g.count * sum(r[:tiers]) for g, r in groups)
        return top_mass(rows, alpha, cached)


#: Every sharding mode by name (the order users read them in).
MODELS: dict[str, ShardingModel] = {
    m.name: m for m in (DataParallelModel(), TableModel(), ColumnModel(), RowModel())
}
#: The names, in the recipe's one list (:data:`embtrain.recipe.kinds.SHARDING_MODES`).
MODES: tuple[str, ...] = SHARDING_MODES
if tuple(MODELS) != MODES:  # pragma: no cover - a new mode needs its model here and its name there
    raise ImportError(f"plan/shardings.py models {tuple(MODELS)}, recipe/kinds.py lists {MODES}")


class _Auto(ShardingModel):
    """``auto`` before the planner decides: any mode, so at best one row or one column per
    rank."""

    name = "auto"

    def smallest_shard(self, cost: RowCost, rows: int, dim: int) -> int:
        return min(m.smallest_shard(cost, rows, dim) for m in MODELS.values() if m.splits)


#: What the planner may assume of a table whose sharding is ``auto``.
AUTO: ShardingModel = _Auto()


def model(mode: str) -> ShardingModel:
    """The cost model of sharding ``mode``."""
    try:
        return MODELS[mode]
    except KeyError:
        raise ValueError(f"unknown sharding {mode!r}; one of {MODES}") from None


__all__ = ["AUTO", "MODELS", "MODES", "Group", "ShardingModel", "StepTraffic", "model"]
