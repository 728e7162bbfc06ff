"""What the planner returns: a frozen, JSON-ready, fingerprinted :class:`Plan`.

Shards are stored as :class:`ShardGroup` runs of consecutive ranks that hold
the same amount (a row-sharded table over 512 ranks is two groups, not 512
shards), which keeps plans of thousands of tables on hundreds of ranks small
and fast; :attr:`TablePlan.shards` expands them into one :class:`Shard` per rank.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields, replace
from typing import Any

from embtrain.errors import UserInputError
from embtrain.plan.cost import GiB, MiB
from embtrain.plan.shardings import MODELS, MODES
from embtrain.plan.topology import POOLS, Topology
from embtrain.recipe.kinds import TIERS
from embtrain.recipe.units import format_bytes

SHARDINGS = MODES


@dataclass(frozen=True)
class TierBytes:
    """Bytes in each storage tier (or memory pool): device, host, disk."""

    device: int = 0
    host: int = 0
    disk: int = 0

    @property
    def total(self) -> int:
        """All tiers together."""
        return self.device + self.host + self.disk

    def get(self, tier: str) -> int:
        """Bytes of one tier by name."""
        return int(getattr(self, tier))

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready mapping."""
        return {pool: self.get(pool) for pool in POOLS}


if tuple(f.name for f in fields(TierBytes)) != POOLS:
    raise ImportError(f"TierBytes' fields must be the tier kinds {POOLS} "
                      "(embtrain.recipe.kinds.TIERS), in order")


@dataclass(frozen=True)
class TierSpec:
    """One storage tier of a table as the recipe gives it; ``budget`` is bytes per rank."""

    tier: str
    budget: int | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {"tier": self.tier, "budget": self.budget}


@dataclass(frozen=True)
class Shard:
    """A table's part on one rank.

    The rank holds the rows ``row_offset, row_offset + row_stride, ...`` (``rows``
    of them: a contiguous ``[0, rows)`` when the stride is 1, keys with
    ``key % world_size == rank`` for row sharding) and columns
    ``[col_start, col_stop)``. Bytes are this rank's.
    """

    rank: int
    rows: int
    row_offset: int
    row_stride: int
    col_start: int
    col_stop: int
    value_bytes: int
    optimizer_bytes: int
    metadata_bytes: int
    tiers: TierBytes

    @property
    def bytes(self) -> int:
        """Values, optimizer state and metadata together."""
        return self.value_bytes + self.optimizer_bytes + self.metadata_bytes


@dataclass(frozen=True)
class ShardGroup:
    """Ranks ``first_rank .. first_rank + ranks - 1`` each holding a shard of the same size.

    Each rank holds ``rows`` rows and ``columns`` columns; ``row_stride`` is the
    world size for row sharding (rank r holds keys ≡ r) and 1 otherwise; for
    column sharding the group's first rank starts at ``first_column`` and each
    next rank ``columns`` further. Bytes and tiers are per rank.
    """

    first_rank: int
    ranks: int
    rows: int
    columns: int
    row_stride: int
    first_column: int
    value_bytes: int
    optimizer_bytes: int
    metadata_bytes: int
    tiers: TierBytes
    tier_rows: TierBytes = TierBytes()  # rows per rank in each tier (whole rows)

    @property
    def bytes(self) -> int:
        """Bytes per rank: values, optimizer state and metadata together."""
        return self.value_bytes + self.optimizer_bytes + self.metadata_bytes

    @property
    def rank_ids(self) -> range:
        """The ranks of the group."""
        return range(self.first_rank, self.first_rank + self.ranks)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "first_rank": self.first_rank, "ranks": self.ranks, "rows": self.rows,
            "columns": self.columns, "row_stride": self.row_stride,
            "first_column": self.first_column, "bytes": self.bytes,
            "value_bytes": self.value_bytes, "optimizer_bytes": self.optimizer_bytes,
            "metadata_bytes": self.metadata_bytes, "tiers": self.tiers.to_dict(),
            "tier_rows": self.tier_rows.to_dict(),
        }


@dataclass(frozen=True)
class TableTraffic:
    """A table's traffic per step, all ranks together (see :mod:`embtrain.plan.cost`)."""

    lookups: int
    ids_bytes: int
    forward_bytes: int
    backward_bytes: int
    allreduce_bytes: int

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready mapping."""
        return {"lookups": self.lookups, "ids_bytes": self.ids_bytes,
                "forward_bytes": self.forward_bytes, "backward_bytes": self.backward_bytes,
                "allreduce_bytes": self.allreduce_bytes}


@dataclass(frozen=True)
class TablePlan:
    """Where one table lives, what it costs and why."""

    name: str
    rows: int
    dim: int
    dtype: str
    dynamic: bool
    optimizer: str
    requested: str
    sharding: str
    reason: str
    storage: tuple[TierSpec, ...]
    features: tuple[str, ...]
    ids_per_sample: int
    groups: tuple[ShardGroup, ...]
    value_bytes: int
    optimizer_bytes: int
    metadata_bytes: int
    traffic: TableTraffic
    # expected share of lookups served by each tier or one above it (cumulative, in the order
    # of ``storage``), under power-law ids (``Plan.id_alpha``); empty for a one-tier table
    hit_rates: tuple[float, ...] = ()

    @property
    def hit_rate(self) -> float | None:
        """Expected share of lookups the cache (every tier above the last) serves (None: one
        tier)."""
        return self.hit_rates[-2] if len(self.hit_rates) > 1 else None

    @property
    def bytes(self) -> int:
        """Bytes of the table on all ranks together (replicas counted once per rank)."""
        return self.value_bytes + self.optimizer_bytes + self.metadata_bytes

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks holding a shard of the table, ascending."""
        return tuple(r for g in self.groups for r in g.rank_ids)

    @property
    def shards(self) -> tuple[Shard, ...]:
        """One :class:`Shard` per rank holding part of the table, by rank."""
        return tuple(self._shard(g, i) for g in self.groups for i in range(g.ranks))

    def shard(self, rank: int) -> Shard | None:
        """The shard on ``rank``, or None when the rank holds none of the table."""
        for g in self.groups:
            if g.first_rank <= rank < g.first_rank + g.ranks:
                return self._shard(g, rank - g.first_rank)
        return None

    def _shard(self, g: ShardGroup, i: int) -> Shard:
        rank = g.first_rank + i
        mode = MODELS[self.sharding]
        offset = mode.key_offset(rank)
        col_start = mode.column_start(g.first_column, i, g.columns)
        return Shard(rank, g.rows, offset, g.row_stride, col_start, col_start + g.columns,
                     g.value_bytes, g.optimizer_bytes, g.metadata_bytes, g.tiers)

    @property
    def ranks_label(self) -> str:
        """The ranks as text: ``3``, ``0-7``, ``all``."""
        ranks = self.ranks
        if not ranks:
            return "-"
        if len(ranks) == 1:
            return str(ranks[0])
        if ranks == tuple(range(ranks[0], ranks[-1] + 1)):
            return f"{ranks[0]}-{ranks[-1]}"
        return ",".join(map(str, ranks))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "name": self.name, "rows": self.rows, "dim": self.dim, "dtype": self.dtype,
            "dynamic": self.dynamic, "optimizer": self.optimizer, "requested": self.requested,
            "sharding": self.sharding, "reason": self.reason,
            "storage": [t.to_dict() for t in self.storage], "features": list(self.features),
            "ids_per_sample": self.ids_per_sample,
            "shards": [g.to_dict() for g in self.groups], "bytes": self.bytes,
            "value_bytes": self.value_bytes, "optimizer_bytes": self.optimizer_bytes,
            "metadata_bytes": self.metadata_bytes, "traffic": self.traffic.to_dict(),
            "hit_rates": list(self.hit_rates),
        }


@dataclass(frozen=True)
class RankSummary:
    """What one rank holds and does per step.

    ``tiers`` is bytes by storage tier; ``memory`` is bytes by memory pool (the
    same, except that without a GPU the device tier is counted in host memory).
    Traffic is this rank's as a table owner: ids it receives, embeddings it
    sends forward, gradients it receives backward, all-reduce of its replicas.
    """

    rank: int
    shards: int
    tiers: TierBytes
    memory: TierBytes
    value_bytes: int
    optimizer_bytes: int
    metadata_bytes: int
    lookups: int
    ids_bytes: int
    forward_bytes: int
    backward_bytes: int
    allreduce_bytes: int

    @property
    def bytes(self) -> int:
        """Everything the rank stores."""
        return self.value_bytes + self.optimizer_bytes + self.metadata_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "rank": self.rank, "shards": self.shards, "tiers": self.tiers.to_dict(),
            "memory": self.memory.to_dict(), "bytes": self.bytes,
            "value_bytes": self.value_bytes, "optimizer_bytes": self.optimizer_bytes,
            "metadata_bytes": self.metadata_bytes, "lookups": self.lookups,
            "ids_bytes": self.ids_bytes, "forward_bytes": self.forward_bytes,
            "backward_bytes": self.backward_bytes, "allreduce_bytes": self.allreduce_bytes,
        }


@dataclass(frozen=True)
class Traffic:
    """Traffic per training step, all ranks together (see :mod:`embtrain.plan.cost`)."""

    batch_size: int
    element_bytes: int
    lookups: int
    ids_bytes: int
    forward_bytes: int
    backward_bytes: int
    allreduce_bytes: int

    @property
    def alltoall_bytes(self) -> int:
        """Ids, embeddings and gradients exchanged between ranks."""
        return self.ids_bytes + self.forward_bytes + self.backward_bytes

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready mapping."""
        return {"batch_size": self.batch_size, "element_bytes": self.element_bytes,
                "lookups": self.lookups, "ids_bytes": self.ids_bytes,
                "forward_bytes": self.forward_bytes, "backward_bytes": self.backward_bytes,
                "allreduce_bytes": self.allreduce_bytes}


@dataclass(frozen=True)
class Totals:
    """Bytes of every table on every rank together."""

    value_bytes: int
    optimizer_bytes: int
    metadata_bytes: int
    tiers: TierBytes

    @property
    def bytes(self) -> int:
        """Everything stored, all ranks together."""
        return self.value_bytes + self.optimizer_bytes + self.metadata_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {"bytes": self.bytes, "value_bytes": self.value_bytes,
                "optimizer_bytes": self.optimizer_bytes, "metadata_bytes": self.metadata_bytes,
                "tiers": self.tiers.to_dict()}


@dataclass(frozen=True)
class Plan:
    """Where every table lives, what each rank stores and what a step moves."""

    recipe: str
    topology: Topology
    tables: tuple[TablePlan, ...]
    ranks: tuple[RankSummary, ...]
    totals: Totals
    traffic: Traffic
    notes: tuple[str, ...]
    fingerprint: str = ""
    dense: Any = None  # DenseMemory: the dense network on every rank (counted in ``ranks``)
    id_alpha: float = 0.0  # power-law exponent of the ids the hit rates assume

    def table(self, name: str) -> TablePlan:
        """The plan of the table called ``name``."""
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping, fingerprint included."""
        return {
            "recipe": self.recipe, "topology": self.topology.to_dict(),
            "tables": [t.to_dict() for t in self.tables],
            "ranks": [r.to_dict() for r in self.ranks], "totals": self.totals.to_dict(),
            "traffic": self.traffic.to_dict(), "notes": list(self.notes),
            "fingerprint": self.fingerprint,
            "dense": None if self.dense is None else self.dense.to_dict(),
            "id_alpha": self.id_alpha,
        }

    def to_json(self) -> str:
        """Deterministic JSON: sorted keys, indent 2."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2)

    def with_fingerprint(self) -> Plan:
        """This plan with ``fingerprint`` set: sha256 of its canonical JSON (sorted keys, no spaces)."""
        body = self.to_dict()
        del body["fingerprint"]
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return replace(self, fingerprint=hashlib.sha256(canonical.encode()).hexdigest())


def format_size(n: int) -> str:
    """Whole MiB or GiB as ``94 GiB``; anything else as :func:`format_bytes` writes it."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB")):
        if unit <= n < unit * 1024 and n % unit == 0:
            return f"{n // unit} {name}"
    return format_bytes(n)


POOL_LABELS = {pool: TIERS[pool].pool_label for pool in POOLS}


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


@dataclass(frozen=True)
class FitSuggestion:
    """Smallest topologies, grown from a given one, on which a recipe can be planned.

    ``by_ranks``: fewest ranks (at least the given number) with the same memory
    per rank; ``by_memory``: the same ranks with the short memory pools
    (``pools``) raised to the smallest whole GiB (MiB below 1 GiB) that fits;
    ``by_both``: only when neither alone fits, raised memory and more ranks.
    None where growing that way does not help; ``limit`` then says why (a
    sharding or a storage budget that no larger topology satisfies).
    """

    given: Topology
    pools: tuple[str, ...]
    by_ranks: Topology | None
    by_memory: Topology | None
    limit: str = ""
    by_both: Topology | None = None

    @property
    def fits_as_given(self) -> bool:
        """Whether the given topology fits already."""
        return self.by_ranks == self.given and self.by_memory == self.given

    def topologies(self) -> tuple[Topology, ...]:
        """The suggested topologies (none to three)."""
        return tuple(t for t in (self.by_ranks, self.by_memory, self.by_both) if t is not None)

    def _phrase(self, topology: Topology, exact: bool) -> str:
        size = format_size if exact else format_bytes
        memory = " and ".join(f"{size(topology.capacity(p))} of {POOL_LABELS[p]}"
                              for p in self.pools or ("host",))
        each = " each" if topology.world_size > 1 else ""
        return f"{_ranks(topology.world_size)} with {memory}{each}"

    def describe(self) -> str:
        """``5 ranks with 22.3 GiB of host memory each, or 1 rank with 94 GiB of host memory``."""
        parts = []
        if self.by_ranks is not None:
            parts.append(self._phrase(self.by_ranks, exact=False))
        if self.by_memory is not None:
            parts.append(self._phrase(self.by_memory, exact=True))
        if self.by_both is not None:
            parts.append(self._phrase(self.by_both, exact=True))
        return ", or ".join(parts) if parts else f"none ({self.limit or 'nothing found'})"


class PlanError(UserInputError):
    """The recipe's tables cannot be placed on the topology (exit code 2).

    ``table`` names the table that did not fit, ``needed`` its bytes (all shards),
    ``available`` the per-rank capacity that was short, and ``suggestion`` the
    smallest topologies that fit (None when none was searched for).
    """

    def __init__(self, message: str, *, table: str | None = None, needed: int = 0,
                 available: int = 0, pool: str | None = None,
                 suggestion: FitSuggestion | None = None):
        super().__init__(message)
        self.table = table
        self.needed = needed
        self.available = available
        self.pool = pool
        self.suggestion = suggestion


__all__ = [
    "POOLS",
    "SHARDINGS",
    "FitSuggestion",
    "Plan",
    "PlanError",
    "RankSummary",
    "Shard",
    "ShardGroup",
    "TablePlan",
    "TableTraffic",
    "TierBytes",
    "TierSpec",
    "Totals",
    "Traffic",
]
