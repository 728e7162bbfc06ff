"""The placer: a recipe compiled into table specs, placed table by table on per-rank counters.

:func:`compile_recipe` turns a recipe into :class:`TableSpec` rows with every byte count the
placer needs; :class:`Placer` places them in the order :mod:`embtrain.plan.planner` describes,
asking each sharding mode's model (:mod:`embtrain.plan.shardings`) for its shard layout and
traffic; :func:`fits` says whether (and why not) a recipe fits a topology.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embtrain.kernels.optimizer_spec import spec_of
from embtrain.plan.cost import (
    TINY_TABLE_BYTES,
    VARIABLE_HOTNESS,
    WIRE_BYTES,
    RowCost,
)
from embtrain.plan.dense import DenseMemory, DenseShape, dense_memory, dense_shape
from embtrain.plan.objects import (
    PlanError,
    TierSpec,
)
from embtrain.plan.shardings import AUTO as _AUTO
from embtrain.plan.shardings import MODELS, Group, ShardingModel, StepTraffic
from embtrain.plan.topology import POOLS, Topology
from embtrain.recipe.kinds import TIER_RANK
from embtrain.recipe.models import CategoricalFeature, Recipe
from embtrain.recipe.units import format_bytes

TIER_INDEX = TIER_RANK  # a tier kind -> its pool index (fastest first)
MAX_CAPACITY = 2**60

# Rows of the per-rank integer state matrix: bytes by memory pool (device, host, disk),
# bytes by tier (device, host, disk), values, optimizer state, metadata, shards, load.
POOL_ROWS = slice(0, 3)
SHARDS_ROW = 9
LOAD_ROW = 10
STATE_ROWS = 11
# Rows of the per-rank traffic matrix.
LOOKUPS, IDS, FORWARD, BACKWARD, ALLREDUCE = range(5)


# ----------------------------------------------------------------------- compiled recipe


@dataclass(frozen=True)
class FeatureUse:
    name: str
    hotness: int
    concat: bool
    variable: bool = False


@dataclass(frozen=True)
class TableSpec:
    """A table with everything the placer needs precomputed."""

    index: int
    name: str
    rows: int
    dim: int
    dtype: str
    dynamic: bool
    optimizer: str
    requested: str
    cost: RowCost
    storage: tuple[TierSpec, ...]
    features: tuple[FeatureUse, ...]
    value_bytes: int
    optimizer_bytes: int
    metadata_bytes: int

    @property
    def bytes(self) -> int:
        return self.value_bytes + self.optimizer_bytes + self.metadata_bytes

    @property
    def ids_per_sample(self) -> int:
        return sum(f.hotness for f in self.features)


def requested_model(spec: TableSpec) -> ShardingModel:
    """The model of the sharding ``spec`` asks for; ``auto``: any split (a model that may be
    cut one row or one column per rank)."""
    return MODELS.get(spec.requested, _AUTO)


@dataclass(frozen=True)
class Compiled:
    name: str
    tables: tuple[TableSpec, ...]
    order: tuple[int, ...]
    batch_size: int
    wire_bytes: int
    quantize: str
    variable: tuple[str, ...]
    unread: tuple[str, ...]
    dense: DenseShape | None = None

    def dense_memory(self, world_size: int) -> DenseMemory | None:
        """The dense network's bytes on each of ``world_size`` ranks."""
        if self.dense is None:
            return None
        return dense_memory(self.dense, self.batch_size, world_size)


def dense_pool(topology: Topology) -> int:
    """The memory pool the dense network lives in: the GPU's, else host memory."""
    return 0 if topology.has_device else 1


def compile_recipe(recipe: Recipe, batch_size: int | None) -> Compiled:
    uses: dict[str, list[FeatureUse]] = {}
    variable: list[str] = []
    for f in recipe.features:
        if not isinstance(f, CategoricalFeature):
            continue
        if f.hotness == "variable":
            variable.append(f.name)
            hot = VARIABLE_HOTNESS
        else:
            hot = int(f.hotness)
        uses.setdefault(f.table, []).append(
            FeatureUse(f.name, hot, f.combiner == "concat", f.hotness == "variable"))
    optimizer = recipe.optimizer.sparse.type
    specs = []
    for i, t in enumerate(recipe.tables):
        cost = RowCost.of(t.dtype, optimizer, t.is_dynamic, t.state_dtype)
        rows = t.capacity
        values, opt, meta = cost.shard(rows, t.dim)
        storage = tuple(TierSpec(s.tier, s.budget) for s in t.storage)
        specs.append(TableSpec(i, t.name, rows, t.dim, t.dtype, t.is_dynamic, optimizer,
                                t.sharding, cost, storage, tuple(uses.get(t.name, ())),
                                values, opt, meta))
    order = tuple(s.index for s in sorted(specs, key=lambda s: (-s.bytes, s.index)))
    batch = batch_size if batch_size is not None else recipe.data.batch_size
    if batch < 1:
        raise PlanError(f"plan: batch size must be positive, got {batch}")
    quantize = recipe.distributed.comm.quantize
    return Compiled(recipe.name or "", tuple(specs), order, batch, WIRE_BYTES[quantize], quantize,
                     tuple(variable), tuple(s.name for s in specs if not s.features),
                     dense_shape(recipe))


# ------------------------------------------------------------------------------- placer


@dataclass(frozen=True)
class Decision:
    spec: TableSpec
    mode: str
    reason: str
    groups: tuple[Group, ...]
    traffic: StepTraffic


@dataclass(frozen=True)
class Failure:
    spec: TableSpec
    kind: str  # "memory", "budget" or "structural"
    mode: str
    pool: int = 1
    per_rank: int = 0
    capacity: int = 0
    free: int = 0
    budget: int = 0


def split_tiers(total: int, storage: tuple[TierSpec, ...]) -> tuple[list[int], int | None]:
    """Fill tiers in order up to their budgets; the rest goes to the last. Returns (bytes by tier, cap)."""
    out = [0, 0, 0]
    remaining = total
    cap: int | None = 0
    for i, tier in enumerate(storage):
        last = i == len(storage) - 1
        if tier.budget is None:
            cap = None
        elif cap is not None:
            cap += tier.budget
        take = remaining if (last or tier.budget is None) else min(remaining, tier.budget)
        out[TIER_INDEX[tier.tier]] += take
        remaining -= take
    return out, cap


class Placer:
    """Places tables one by one on per-rank numpy counters; stops at the first failure."""

    def __init__(self, compiled: Compiled, topology: Topology, balanced: bool):
        self.c = compiled
        self.topology = topology
        self.w = topology.world_size
        self.balanced = balanced
        self.caps = np.array([topology.capacity(p) for p in POOLS], dtype=np.int64)
        self.tier_pool = (0 if topology.has_device else 1, 1, 2)
        self.state = np.zeros((STATE_ROWS, self.w), dtype=np.int64)
        dense = compiled.dense_memory(self.w)
        if dense is not None:  # every rank holds the dense network before any table
            self.state[dense_pool(topology), :] += dense.bytes
        self.traffic = np.zeros((5, self.w), dtype=np.float64)
        self.decisions: list[Decision] = []
        self.failure: Failure | None = None

    # ---- layouts

    def _vector(self, spec: TableSpec, g: Group) -> tuple[np.ndarray, int | None, int]:
        """Per-rank state increment of a group, the storage cap, and its bytes per rank."""
        values, opt, meta = spec.cost.shard(g.rows, g.columns)
        total = values + opt + meta
        tiers, cap = split_tiers(total, spec.storage)
        pools = [0, 0, 0]
        for t, b in enumerate(tiers):
            pools[self.tier_pool[t]] += b
        vec = np.array([*pools, *tiers, values, opt, meta, 1, total], dtype=np.int64)
        return vec, cap, total

    def _traffic(self, spec: TableSpec, mode: str) -> StepTraffic:
        """Totals per step: lookups, ids, forward, backward, all-reduce (bytes)."""
        return MODELS[mode].traffic(spec, self.c.batch_size, self.w, self.c.wire_bytes)

    # ---- fitting

    def _check_group(self, spec: TableSpec, mode: str, g: Group, vec: np.ndarray,
                     cap: int | None, total: int) -> Failure | None:
        if cap is not None and total > cap:
            return Failure(spec, "budget", mode, per_rank=total, budget=cap)
        cols = slice(g.first, g.first + g.count)
        after = self.state[POOL_ROWS, cols] + vec[POOL_ROWS, None]
        over = after > self.caps[:, None]
        if not over.any():
            return None
        pool = int(np.argmax(over.any(axis=1)))
        used = self.state[pool, cols]
        return Failure(spec, "memory", mode, pool=pool, per_rank=total,
                        capacity=int(self.caps[pool]), free=int(self.caps[pool] - used.max()))

    def _try_spread(self, spec: TableSpec, mode: str) -> tuple[Decision | None, Failure | None]:
        model = MODELS[mode]
        if not model.fits(spec.dim, self.w):
            return None, Failure(spec, "structural", mode)
        groups = model.layout(spec.rows, spec.dim, self.w)
        prepared = []
        for g in groups:
            vec, cap, total = self._vector(spec, g)
            failure = self._check_group(spec, mode, g, vec, cap, total)
            if failure is not None:
                return None, failure
            prepared.append((g, vec))
        traffic = self._traffic(spec, mode)
        for g, vec in prepared:
            self._commit(spec, mode, g, vec, traffic)
        return Decision(spec, mode, "", groups, traffic), None

    def _try_table(self, spec: TableSpec, mode: str) -> tuple[Decision | None, Failure | None]:
        """``mode`` with one owner: the whole table on the least-loaded rank that fits."""
        model = MODELS[mode]
        (probe,) = model.layout(spec.rows, spec.dim, self.w)
        vec, cap, total = self._vector(spec, probe)
        if cap is not None and total > cap:
            return None, Failure(spec, "budget", mode, per_rank=total, budget=cap)
        rank = self._least_loaded(None)
        if not np.all(self.state[POOL_ROWS, rank] + vec[POOL_ROWS] <= self.caps):
            fits = np.all(self.state[POOL_ROWS] + vec[POOL_ROWS, None] <= self.caps[:, None], axis=0)
            candidates = np.flatnonzero(fits)
            if candidates.size == 0:
                return None, self._check_group(spec, mode, Group(rank, 1, 0, 0, 0), vec, cap,
                                               total)
            rank = self._least_loaded(candidates)
        (group,) = model.layout(spec.rows, spec.dim, self.w, rank)
        traffic = self._traffic(spec, mode)
        self._commit(spec, mode, group, vec, traffic)
        return Decision(spec, mode, "", (group,), traffic), None

    def _least_loaded(self, candidates: np.ndarray | None) -> int:
        """The candidate rank (None: any) with the fewest bytes, then fewest lookups, then lowest id."""
        if candidates is None:
            load = self.state[LOAD_ROW]
            candidates = np.flatnonzero(load == load.min())
        else:
            load = self.state[LOAD_ROW, candidates]
            candidates = candidates[load == load.min()]
        if candidates.size > 1:
            lookups = self.traffic[LOOKUPS, candidates]
            candidates = candidates[lookups == lookups.min()]
        return int(candidates[0])

    def _commit(self, spec: TableSpec, mode: str, g: Group, vec: np.ndarray,
                traffic: StepTraffic) -> None:
        cols = slice(g.first, g.first + g.count)
        self.state[:, cols] += vec[:, None]
        share = np.array(MODELS[mode].rank_traffic(spec, g, self.w, traffic))
        self.traffic[:, cols] += share[:, None]

    def _split_modes(self, spec: TableSpec) -> list[str]:
        modes = ["row"]
        # an optimizer with state per whole row (rowwise_adagrad): its rows are not split by column
        if spec.dim >= 2 * self.w and not spec_of(spec.optimizer).row_wise:
            row = sum(spec.cost.shard(-(-spec.rows // self.w), spec.dim))
            col = sum(spec.cost.shard(spec.rows, -(-spec.dim // self.w)))
            modes = ["column", "row"] if col < row else ["row", "column"]
        return modes

    def _candidates(self, spec: TableSpec) -> list[tuple[str, str]]:
        if spec.requested != "auto":
            return [(spec.requested, "requested")]
        if self.w == 1:
            return [("table", "one rank: whole table on rank 0")]
        tiny = spec.bytes <= TINY_TABLE_BYTES
        out: list[tuple[str, str]] = []
        # replicas of a hash table would admit and evict apart; a tiered table's rows live in
        # a cache over its store, which the replicas' row-sum all-reduce does not cover
        if tiny and not spec.dynamic and len(spec.storage) <= 1:
            out.append(("data_parallel", f"tiny (at most {format_bytes(TINY_TABLE_BYTES)}): "
                                         "replicated on every rank"))
        if tiny or not self.balanced:
            out.append(("table", "whole table on the least-loaded rank that fits"))
        why = ("greedy whole-table packing did not fit" if self.balanced
               else "fits on no single rank")
        for mode in self._split_modes(spec):
            out.append((mode, f"{why}: {MODELS[mode].split_how(spec.dynamic)}"))
        return out

    def run(self) -> bool:
        """Place every table; False (and ``failure`` set) at the first one that does not fit."""
        for index in self.c.order:
            spec = self.c.tables[index]
            failures: list[Failure] = []
            for mode, reason in self._candidates(spec):
                if MODELS[mode].one_owner:
                    decision, failure = self._try_table(spec, mode)
                else:
                    decision, failure = self._try_spread(spec, mode)
                if decision is not None:
                    self.decisions.append(Decision(spec, mode, reason, decision.groups,
                                                    decision.traffic))
                    break
                assert failure is not None
                failures.append(failure)
            else:
                spread = [f for f in failures if MODELS[f.mode].splits and f.kind != "structural"]
                self.failure = spread[0] if spread else failures[-1]
                return False
        return True


def place(compiled: Compiled, topology: Topology) -> tuple[Placer, bool]:
    """Greedy packing, then (if that fails) the balanced retry. Returns the placer used and the pass."""
    first = Placer(compiled, topology, balanced=False)
    if first.run() or topology.world_size == 1:
        return first, False
    if not any(s.requested == "auto" for s in compiled.tables):
        return first, False
    second = Placer(compiled, topology, balanced=True)
    second.run()
    return second, True


def pool_needs(compiled: Compiled, has_device: bool) -> tuple[list[int], list[int], list[TableSpec | None]]:
    """Bytes of tables whose tiers all sit in one memory pool, by pool.

    Returns (bytes stored once, bytes stored on every rank (explicit data-parallel),
    the largest such table).
    """
    tier_pool = (0 if has_device else 1, 1, 2)
    once, every, largest = [0, 0, 0], [0, 0, 0], [None, None, None]
    for index in compiled.order:
        spec = compiled.tables[index]
        pools = {tier_pool[TIER_INDEX[t.tier]] for t in spec.storage}
        if len(pools) != 1:
            continue
        pool = pools.pop()
        if requested_model(spec).replicated:
            every[pool] += spec.bytes
        else:
            once[pool] += spec.bytes
        if largest[pool] is None:
            largest[pool] = spec
    return once, every, largest


def _bound_failure(compiled: Compiled, topology: Topology) -> Failure | None:
    """A quick necessary condition: tables kept in one memory pool must fit its total capacity."""
    once, every, largest = pool_needs(compiled, topology.has_device)
    w = topology.world_size
    dense = compiled.dense_memory(w)
    for pool in range(3):
        spec = largest[pool]
        need = once[pool] + w * every[pool]
        if dense is not None and pool == dense_pool(topology):
            need += w * dense.bytes
        capacity = topology.capacity(POOLS[pool])
        if spec is not None and need > w * capacity:
            return Failure(spec, "memory", "bound", pool=pool, per_rank=-(-need // w),
                            capacity=capacity)
    return None


def dense_short(compiled: Compiled, topology: Topology) -> bool:
    """Whether the dense network alone exceeds its memory pool on ``topology``."""
    dense = compiled.dense_memory(topology.world_size)
    pool = dense_pool(topology)
    return dense is not None and dense.bytes > topology.capacity(POOLS[pool])


def fits(compiled: Compiled, topology: Topology) -> Failure | None:
    """None when the recipe can be planned on ``topology``, else why not."""
    if dense_short(compiled, topology) and compiled.tables:
        spec = compiled.tables[compiled.order[0]]
        dense = compiled.dense_memory(topology.world_size)
        assert dense is not None
        pool = dense_pool(topology)
        return Failure(spec, "memory", "bound", pool=pool, per_rank=dense.bytes,
                        capacity=topology.capacity(POOLS[pool]))
    bound = _bound_failure(compiled, topology)
    if bound is not None:
        return bound
    placer, _ = place(compiled, topology)
    return placer.failure
