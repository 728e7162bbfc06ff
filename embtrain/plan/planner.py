"""make_plan: (Recipe, Topology) → Plan. Pure and deterministic; never looks at the machine.

The cost model, in the order it decides:

1. Memory per rank first: a placement is only taken if every rank it touches
   stays within each memory pool (device, host, disk) and each tier budget.
2. ``auto`` tables of at most 1 MiB (values, optimizer state, metadata) are
   replicated (``data_parallel``): no all-to-all at all, a small all-reduce.
3. Other ``auto`` tables, largest first, go whole (``table``) onto the
   least-loaded rank that fits (bytes stored, then lookups per step, then rank
   id): one owner per lookup keeps the all-to-all smallest.
4. A table that fits on no single rank is split: ``row`` (keys modulo world
   size, like SOK), or ``column`` when its dim is at least twice the world size
   and that gives smaller shards; if greedy packing still fails, the planner
   retries with every ``auto`` table that is not tiny split row/column-wise.
5. Explicit shardings are honoured (an error if impossible); one rank puts
   every ``auto`` table whole on rank 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from embtrain.plan.cost import (
    DEFAULT_ID_ALPHA,
    HASH_INDEX_BYTES_PER_ROW,
    TINY_TABLE_BYTES,
    VARIABLE_HOTNESS,
    WIRE_BYTES,
    RowCost,
    directory_bytes,
)
from embtrain.plan.dense import DenseMemory, DenseShape, dense_memory, dense_shape
from embtrain.plan.objects import (
    POOL_LABELS,
    FitSuggestion,
    Plan,
    PlanError,
    RankSummary,
    ShardGroup,
    TablePlan,
    TableTraffic,
    TierBytes,
    TierSpec,
    Totals,
    Traffic,
)
from embtrain.plan.shardings import AUTO as _AUTO
from embtrain.plan.shardings import MODELS, ShardingModel, StepTraffic
from embtrain.plan.shardings import Group as _Group
from embtrain.plan.topology import POOLS, Topology
from embtrain.recipe.models import CategoricalFeature, Recipe
from embtrain.recipe.units import format_bytes

TIER_INDEX = {"device": 0, "host": 1, "disk": 2}
MAX_WORLD_SIZE = 65536
_MAX_CAPACITY = 2**60
_GiB = 2**30
_MiB = 2**20

# Rows of the per-rank integer state matrix: bytes by memory pool (device, host, disk),
# bytes by tier (device, host, disk), values, optimizer state, metadata, shards, load.
_POOL = slice(0, 3)
_SHARDS = 9
_LOAD = 10
_STATE_ROWS = 11
# Rows of the per-rank traffic matrix.
_LOOKUPS, _IDS, _FORWARD, _BACKWARD, _ALLREDUCE = range(5)


# ----------------------------------------------------------------------- compiled recipe


@dataclass(frozen=True)
class _FeatureUse:
    name: str
    hotness: int
    concat: bool
    variable: bool = False


@dataclass(frozen=True)
class _TableSpec:
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
    features: tuple[_FeatureUse, ...]
    value_bytes: int
    optimizer_bytes: int
    metadata_bytes: int

    @property
    def bytes(self) -> int:
        return self.value_bytes + self.optimizer_bytes + self.metadata_bytes

    @property
    def ids_per_sample(self) -> int:
        return sum(f.hotness for f in self.features)


def _requested(spec: _TableSpec) -> ShardingModel:
    """The model of the sharding ``spec`` asks for; ``auto``: any split (a model that may be
    cut one row or one column per rank)."""
    return MODELS.get(spec.requested, _AUTO)


@dataclass(frozen=True)
class _Compiled:
    name: str
    tables: tuple[_TableSpec, ...]
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


def _dense_pool(topology: Topology) -> int:
    """The memory pool the dense network lives in: the GPU's, else host memory."""
    return 0 if topology.has_device else 1


def _compile(recipe: Recipe, batch_size: int | None) -> _Compiled:
    uses: dict[str, list[_FeatureUse]] = {}
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
            _FeatureUse(f.name, hot, f.combiner == "concat", f.hotness == "variable"))
    optimizer = recipe.optimizer.sparse.type
    specs = []
    for i, t in enumerate(recipe.tables):
        cost = RowCost.of(t.dtype, optimizer, t.is_dynamic)
        rows = t.capacity
        values, opt, meta = cost.shard(rows, t.dim)
        storage = tuple(TierSpec(s.tier, s.budget) for s in t.storage)
        specs.append(_TableSpec(i, t.name, rows, t.dim, t.dtype, t.is_dynamic, optimizer,
                                t.sharding, cost, storage, tuple(uses.get(t.name, ())),
                                values, opt, meta))
    order = tuple(s.index for s in sorted(specs, key=lambda s: (-s.bytes, s.index)))
    batch = batch_size if batch_size is not None else recipe.data.batch_size
    if batch < 1:
        raise PlanError(f"plan: batch size must be positive, got {batch}")
    quantize = recipe.distributed.comm.quantize
    return _Compiled(recipe.name or "", tuple(specs), order, batch, WIRE_BYTES[quantize], quantize,
                     tuple(variable), tuple(s.name for s in specs if not s.features),
                     dense_shape(recipe))


# ------------------------------------------------------------------------------- placer


@dataclass(frozen=True)
class _Decision:
    spec: _TableSpec
    mode: str
    reason: str
    groups: tuple[_Group, ...]
    traffic: StepTraffic


@dataclass(frozen=True)
class _Failure:
    spec: _TableSpec
    kind: str  # "memory", "budget" or "structural"
    mode: str
    pool: int = 1
    per_rank: int = 0
    capacity: int = 0
    free: int = 0
    budget: int = 0


def _split_tiers(total: int, storage: tuple[TierSpec, ...]) -> tuple[list[int], int | None]:
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


class _Placer:
    """Places tables one by one on per-rank numpy counters; stops at the first failure."""

    def __init__(self, compiled: _Compiled, topology: Topology, balanced: bool):
        self.c = compiled
        self.topology = topology
        self.w = topology.world_size
        self.balanced = balanced
        self.caps = np.array([topology.capacity(p) for p in POOLS], dtype=np.int64)
        self.tier_pool = (0 if topology.has_device else 1, 1, 2)
        self.state = np.zeros((_STATE_ROWS, self.w), dtype=np.int64)
        dense = compiled.dense_memory(self.w)
        if dense is not None:  # every rank holds the dense network before any table
            self.state[_dense_pool(topology), :] += dense.bytes
        self.traffic = np.zeros((5, self.w), dtype=np.float64)
        self.decisions: list[_Decision] = []
        self.failure: _Failure | None = None

    # ---- layouts

    def _vector(self, spec: _TableSpec, g: _Group) -> tuple[np.ndarray, int | None, int]:
        """Per-rank state increment of a group, the storage cap, and its bytes per rank."""
        values, opt, meta = spec.cost.shard(g.rows, g.columns)
        total = values + opt + meta
        tiers, cap = _split_tiers(total, spec.storage)
        pools = [0, 0, 0]
        for t, b in enumerate(tiers):
            pools[self.tier_pool[t]] += b
        vec = np.array([*pools, *tiers, values, opt, meta, 1, total], dtype=np.int64)
        return vec, cap, total

    def _traffic(self, spec: _TableSpec, mode: str) -> StepTraffic:
        """Totals per step: lookups, ids, forward, backward, all-reduce (bytes)."""
        return MODELS[mode].traffic(spec, self.c.batch_size, self.w, self.c.wire_bytes)

    # ---- fitting

    def _check_group(self, spec: _TableSpec, mode: str, g: _Group, vec: np.ndarray,
                     cap: int | None, total: int) -> _Failure | None:
        if cap is not None and total > cap:
            return _Failure(spec, "budget", mode, per_rank=total, budget=cap)
        cols = slice(g.first, g.first + g.count)
        after = self.state[_POOL, cols] + vec[_POOL, None]
        over = after > self.caps[:, None]
        if not over.any():
            return None
        pool = int(np.argmax(over.any(axis=1)))
        used = self.state[pool, cols]
        return _Failure(spec, "memory", mode, pool=pool, per_rank=total,
                        capacity=int(self.caps[pool]), free=int(self.caps[pool] - used.max()))

    def _try_spread(self, spec: _TableSpec, mode: str) -> tuple[_Decision | None, _Failure | None]:
        model = MODELS[mode]
        if not model.fits(spec.dim, self.w):
            return None, _Failure(spec, "structural", mode)
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
        return _Decision(spec, mode, "", groups, traffic), None

    def _try_table(self, spec: _TableSpec, mode: str) -> tuple[_Decision | None, _Failure | None]:
        """``mode`` with one owner: the whole table on the least-loaded rank that fits."""
        model = MODELS[mode]
        (probe,) = model.layout(spec.rows, spec.dim, self.w)
        vec, cap, total = self._vector(spec, probe)
        if cap is not None and total > cap:
            return None, _Failure(spec, "budget", mode, per_rank=total, budget=cap)
        rank = self._least_loaded(None)
        if not np.all(self.state[_POOL, rank] + vec[_POOL] <= self.caps):
            fits = np.all(self.state[_POOL] + vec[_POOL, None] <= self.caps[:, None], axis=0)
            candidates = np.flatnonzero(fits)
            if candidates.size == 0:
                return None, self._check_group(spec, mode, _Group(rank, 1, 0, 0, 0), vec, cap,
                                               total)
            rank = self._least_loaded(candidates)
        (group,) = model.layout(spec.rows, spec.dim, self.w, rank)
        traffic = self._traffic(spec, mode)
        self._commit(spec, mode, group, vec, traffic)
        return _Decision(spec, mode, "", (group,), traffic), None

    def _least_loaded(self, candidates: np.ndarray | None) -> int:
        """The candidate rank (None: any) with the fewest bytes, then fewest lookups, then lowest id."""
        if candidates is None:
            load = self.state[_LOAD]
            candidates = np.flatnonzero(load == load.min())
        else:
            load = self.state[_LOAD, candidates]
            candidates = candidates[load == load.min()]
        if candidates.size > 1:
            lookups = self.traffic[_LOOKUPS, candidates]
            candidates = candidates[lookups == lookups.min()]
        return int(candidates[0])

    def _commit(self, spec: _TableSpec, mode: str, g: _Group, vec: np.ndarray,
                traffic: StepTraffic) -> None:
        cols = slice(g.first, g.first + g.count)
        self.state[:, cols] += vec[:, None]
        share = np.array(MODELS[mode].rank_traffic(spec, g, self.w, traffic))
        self.traffic[:, cols] += share[:, None]

    def _split_modes(self, spec: _TableSpec) -> list[str]:
        modes = ["row"]
        # rowwise_adagrad keeps one accumulator per whole row: its rows are not split by column
        if spec.dim >= 2 * self.w and spec.optimizer != "rowwise_adagrad":
            row = sum(spec.cost.shard(-(-spec.rows // self.w), spec.dim))
            col = sum(spec.cost.shard(spec.rows, -(-spec.dim // self.w)))
            modes = ["column", "row"] if col < row else ["row", "column"]
        return modes

    def _candidates(self, spec: _TableSpec) -> list[tuple[str, str]]:
        if spec.requested != "auto":
            return [(spec.requested, "requested")]
        if self.w == 1:
            return [("table", "one rank: whole table on rank 0")]
        tiny = spec.bytes <= TINY_TABLE_BYTES
        out: list[tuple[str, str]] = []
        if tiny and not spec.dynamic:  # replicas of a hash table would admit and evict apart
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
            failures: list[_Failure] = []
            for mode, reason in self._candidates(spec):
                if MODELS[mode].one_owner:
                    decision, failure = self._try_table(spec, mode)
                else:
                    decision, failure = self._try_spread(spec, mode)
                if decision is not None:
                    self.decisions.append(_Decision(spec, mode, reason, decision.groups,
                                                    decision.traffic))
                    break
                assert failure is not None
                failures.append(failure)
            else:
                spread = [f for f in failures if MODELS[f.mode].splits and f.kind != "structural"]
                self.failure = spread[0] if spread else failures[-1]
                return False
        return True


def _place(compiled: _Compiled, topology: Topology) -> tuple[_Placer, bool]:
    """Greedy packing, then (if that fails) the balanced retry. Returns the placer used and the pass."""
    first = _Placer(compiled, topology, balanced=False)
    if first.run() or topology.world_size == 1:
        return first, False
    if not any(s.requested == "auto" for s in compiled.tables):
        return first, False
    second = _Placer(compiled, topology, balanced=True)
    second.run()
    return second, True


def _pool_needs(compiled: _Compiled, has_device: bool) -> tuple[list[int], list[int], list[_TableSpec | None]]:
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
        if _requested(spec).replicated:
            every[pool] += spec.bytes
        else:
            once[pool] += spec.bytes
        if largest[pool] is None:
            largest[pool] = spec
    return once, every, largest


def _bound_failure(compiled: _Compiled, topology: Topology) -> _Failure | None:
    """A quick necessary condition: tables kept in one memory pool must fit its total capacity."""
    once, every, largest = _pool_needs(compiled, topology.has_device)
    w = topology.world_size
    dense = compiled.dense_memory(w)
    for pool in range(3):
        spec = largest[pool]
        need = once[pool] + w * every[pool]
        if dense is not None and pool == _dense_pool(topology):
            need += w * dense.bytes
        capacity = topology.capacity(POOLS[pool])
        if spec is not None and need > w * capacity:
            return _Failure(spec, "memory", "bound", pool=pool, per_rank=-(-need // w),
                            capacity=capacity)
    return None


def _dense_short(compiled: _Compiled, topology: Topology) -> bool:
    """Whether the dense network alone exceeds its memory pool on ``topology``."""
    dense = compiled.dense_memory(topology.world_size)
    pool = _dense_pool(topology)
    return dense is not None and dense.bytes > topology.capacity(POOLS[pool])


def _fits(compiled: _Compiled, topology: Topology) -> _Failure | None:
    """None when the recipe can be planned on ``topology``, else why not."""
    if _dense_short(compiled, topology) and compiled.tables:
        spec = compiled.tables[compiled.order[0]]
        dense = compiled.dense_memory(topology.world_size)
        assert dense is not None
        pool = _dense_pool(topology)
        return _Failure(spec, "memory", "bound", pool=pool, per_rank=dense.bytes,
                        capacity=topology.capacity(POOLS[pool]))
    bound = _bound_failure(compiled, topology)
    if bound is not None:
        return bound
    placer, _ = _place(compiled, topology)
    return placer.failure


# ------------------------------------------------------------------------ smallest topology


def _with_world(topology: Topology, world_size: int) -> Topology:
    return Topology(world_size, topology.device_memory, topology.host_memory, topology.disk)


def _with_pool(topology: Topology, pool: int, capacity: int) -> Topology:
    values = [topology.device_memory, topology.host_memory, topology.disk]
    values[pool] = capacity
    return Topology(topology.world_size, values[0], values[1], values[2])


def _rank_ceiling(compiled: _Compiled, max_world_size: int) -> int:
    """The most ranks worth trying: explicit column tables need dim ≥ world size."""
    return min([max_world_size] + [s.dim for s in compiled.tables
                                   if _requested(s).splits_columns])


def _first_fit(fits: Callable[[int], bool], low: int, limit: int) -> int | None:
    """Smallest x in (low, limit] with ``fits(x)``, ``fits(low)`` being false: gallop, then bisect."""
    previous, step = low, 1
    while True:
        x = min(previous + step, limit)
        if x <= previous:
            return None
        if fits(x):
            break
        previous, step = x, step * 2
    low, high = previous, x
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high


def _search_ranks(compiled: _Compiled, topology: Topology, limit: int) -> Topology | None:
    """Fewest ranks above ``topology.world_size`` (at most ``limit``) that fit, same memory."""
    once, every, _ = _pool_needs(compiled, topology.has_device)
    low = topology.world_size
    for pool in range(3):
        if once[pool] == 0 and every[pool] == 0:
            continue
        spare = topology.capacity(POOLS[pool]) - every[pool]
        if spare < 0 or (spare == 0 and once[pool] > 0):
            return None
        if once[pool] > 0:
            low = max(low, -(-once[pool] // spare) - 1)  # fewer ranks cannot hold these bytes
    found = _first_fit(lambda w: _fits(compiled, _with_world(topology, w)) is None, low, limit)
    return None if found is None else _with_world(topology, found)


def _pool_is_enough(compiled: _Compiled, base: Topology, pool: int, unit: int, units: int) -> bool:
    """Whether ``pool`` at ``units × unit`` bytes per rank no longer runs short."""
    failure = _fits(compiled, _with_pool(base, pool, units * unit))
    return failure is None or failure.kind != "memory" or failure.pool != pool


def _search_memory(compiled: _Compiled, topology: Topology,
                   failure: _Failure) -> tuple[Topology | None, tuple[int, ...], Topology]:
    """Raise short pools one by one. Returns (fitting topology or None, pools raised, last tried)."""
    raised: list[int] = []
    current = topology
    w = topology.world_size
    for _ in range(len(POOLS) + 1):
        if failure.kind != "memory":
            return None, tuple(raised), current
        pool = failure.pool
        if pool not in raised:
            raised.append(pool)

        capacity = current.capacity(POOLS[pool])
        unit = _GiB if capacity + failure.per_rank >= _GiB else _MiB
        once, every, _ = _pool_needs(compiled, current.has_device)
        at_least = -(-(once[pool] + w * every[pool]) // w)
        low = max(capacity // unit, -(-at_least // unit) - 1)
        units = _first_fit(partial(_pool_is_enough, compiled, current, pool, unit), low,
                           _MAX_CAPACITY // unit)
        if units is None:
            return None, tuple(raised), current
        current = _with_pool(current, pool, units * unit)
        next_failure = _fits(compiled, current)
        if next_failure is None:
            return current, tuple(raised), current
        failure = next_failure
    return None, tuple(raised), current


def _blocker(compiled: _Compiled, topology: Topology) -> str:
    """Why no topology with at least this many ranks fits, whatever its memory ('' if none)."""
    for spec in compiled.tables:
        requested = _requested(spec)
        if not requested.fits(spec.dim, topology.world_size):
            return (f"table '{spec.name}' asks for {spec.requested} sharding but its dim "
                    f"{spec.dim} is less than {topology.world_size} ranks")
        if requested.whole:
            smallest, what = spec.bytes, f"as {spec.requested} shards"
        else:
            smallest = requested.smallest_shard(spec.cost, spec.rows, spec.dim)
            what = "at least (one row or one column per rank)"
        _, cap = _split_tiers(smallest, spec.storage)
        if cap is not None and smallest > cap:
            return (f"table '{spec.name}' needs {format_bytes(smallest)} per rank {what} but its "
                    f"storage budgets allow {format_bytes(cap)}")
    return ""


def _more_ranks_may_help(failure: _Failure, topology: Topology) -> bool:
    """False when the failing table is pinned whole to a rank and does not fit an empty one."""
    spec = failure.spec
    if not _requested(spec).whole:
        return True
    tiers, _ = _split_tiers(spec.bytes, spec.storage)
    tier_pool = (0 if topology.has_device else 1, 1, 2)
    need = [0, 0, 0]
    for tier, amount in enumerate(tiers):
        need[tier_pool[tier]] += amount
    return all(need[p] <= topology.capacity(POOLS[p]) for p in range(3))


def _roomy(topology: Topology) -> Topology:
    """``topology`` with memory no table can exhaust: only shardings and budgets can fail."""
    device = _MAX_CAPACITY if topology.has_device else None
    return Topology(topology.world_size, device, _MAX_CAPACITY, _MAX_CAPACITY)


def _suggest(compiled: _Compiled, topology: Topology, failure: _Failure | None,
             max_world_size: int) -> FitSuggestion:
    if failure is None:
        return FitSuggestion(topology, (), topology, topology)
    short = (POOLS[failure.pool],) if failure.kind == "memory" else ()
    limit = _blocker(compiled, topology)
    if limit:
        return FitSuggestion(topology, short, None, None, limit)
    ceiling = _rank_ceiling(compiled, max_world_size)
    by_ranks = None
    if failure.kind != "structural" and _more_ranks_may_help(failure, topology):
        by_ranks = _search_ranks(compiled, topology, ceiling)
    by_memory, raised, _ = _search_memory(compiled, topology, failure)
    by_both = None
    if by_ranks is None and by_memory is None:
        # the fewest ranks that any memory could serve, then the least memory there
        roomy = _roomy(topology)
        enough = roomy if _fits(compiled, roomy) is None else _search_ranks(compiled, roomy, ceiling)
        if enough is not None:
            start = _with_world(topology, enough.world_size)
            start_failure = _fits(compiled, start)
            if start_failure is None:
                by_both = start
            else:
                by_both, more, _ = _search_memory(compiled, start, start_failure)
                raised = tuple(sorted(set(raised) | set(more)))
            if by_both == topology:
                by_both = None
    pools = tuple(POOLS[p] for p in sorted(raised)) or short
    found = by_ranks or by_memory or by_both
    limit = "" if found else f"none found up to {ceiling} ranks"
    return FitSuggestion(topology, pools, by_ranks, by_memory, limit, by_both)


def smallest_fitting_topology(recipe: Recipe, topology: Topology, *,
                              max_world_size: int = MAX_WORLD_SIZE) -> FitSuggestion:
    """The smallest topologies, grown from ``topology``, on which ``recipe`` can be planned.

    ``by_ranks`` keeps the memory per rank and searches world sizes upward (up
    to ``max_world_size``); ``by_memory`` keeps the world size and raises the
    short memory pools to whole GiB. Both equal ``topology`` when it fits.
    Every suggested topology is checked with the planner itself.
    """
    compiled = _compile(recipe, None)
    return _suggest(compiled, topology, _fits(compiled, topology), max_world_size)


# --------------------------------------------------------------------------------- plan


def _breakdown(spec: _TableSpec) -> str:
    parts = [f"values {format_bytes(spec.value_bytes)}"]
    if spec.optimizer_bytes:
        parts.append(f"{spec.optimizer} {format_bytes(spec.optimizer_bytes)}")
    parts.append(f"metadata {format_bytes(spec.metadata_bytes)}")
    return " + ".join(parts)


def _error(compiled: _Compiled, topology: Topology, failure: _Failure,
           max_world_size: int) -> PlanError:
    spec, w = failure.spec, topology.world_size
    head = f"plan: table '{spec.name}'"
    if failure.kind == "structural":
        return PlanError(
            f"{head} asks for {failure.mode} sharding but its dim {spec.dim} is less than the world size "
            f"{w}; use row or auto sharding, or at most {spec.dim} ranks",
            table=spec.name, needed=spec.bytes, pool=None)
    suggestion = _suggest(compiled, topology, failure, max_world_size)
    if suggestion.topologies():
        tail = f"; smallest topology that fits: {suggestion.describe()}"
    elif suggestion.limit.startswith(f"table '{spec.name}' needs"):
        split = " or let it be split (sharding: auto)" if _requested(spec).whole else ""
        tail = f"; no larger topology fits: raise its storage budgets{split}"
    else:
        tail = f"; no larger topology fits: {suggestion.limit}"
    if failure.kind == "budget":
        budgets = " + ".join(f"{t.tier} {format_bytes(t.budget)}" for t in spec.storage
                             if t.budget is not None)
        return PlanError(
            f"{head} needs {format_bytes(failure.per_rank)} per rank as {failure.mode} shards "
            f"({_breakdown(spec)} in all) but its storage budgets allow "
            f"{format_bytes(failure.budget)} per rank ({budgets}){tail}",
            table=spec.name, needed=spec.bytes, available=failure.budget, pool=None,
            suggestion=suggestion)
    pool = POOLS[failure.pool]
    label = POOL_LABELS[pool]
    if pool == "host" and not topology.has_device and any(t.tier == "device" for t in spec.storage):
        label += " (no GPU: the device tier is in host memory)"
    left = ""
    if failure.free < failure.capacity:
        after = ("the dense network and larger tables"
                 if compiled.dense is not None and failure.pool == _dense_pool(topology)
                 else "larger tables")
        left = f", {format_bytes(max(failure.free, 0))} of it left after {after}"
    return PlanError(
        f"{head} needs {format_bytes(spec.bytes)} ({_breakdown(spec)}) but each of {w} rank(s) "
        f"has {format_bytes(failure.capacity)} of {label}{left}{tail}",
        table=spec.name, needed=spec.bytes, available=failure.capacity, pool=pool,
        suggestion=suggestion)


def _dense_error(compiled: _Compiled, topology: Topology, dense: DenseMemory) -> PlanError:
    pool = POOLS[_dense_pool(topology)]
    capacity = topology.capacity(pool)
    return PlanError(
        f"plan: the dense network ({_dense_name(compiled)}) needs {format_bytes(dense.bytes)} "
        f"per rank (parameters {format_bytes(dense.parameter_bytes)} + optimizer state "
        f"{format_bytes(dense.optimizer_bytes)} + activations of {dense.batch_per_rank} "
        f"samples {format_bytes(dense.activation_bytes)}) but each of {topology.world_size} "
        f"rank(s) has {format_bytes(capacity)} of {POOL_LABELS[pool]}; lower data.batch_size, "
        "the embedding widths or the layer sizes", table=None, needed=dense.bytes,
        available=capacity, pool=pool)


def _dense_name(compiled: _Compiled) -> str:
    """``5,201 parameters``: how the dense network is named in messages."""
    return f"{compiled.dense.parameters:,} parameters" if compiled.dense is not None else "none"


def _notes(compiled: _Compiled, topology: Topology, placer: _Placer, balanced: bool,
           id_alpha: float) -> tuple[str, ...]:
    notes = []
    if topology.world_size == 1:
        notes.append("one rank: every auto table is whole on rank 0; no all-to-all")
    if not topology.has_device:
        notes.append("no GPU: the device tier is served from host memory and counts against it")
    if compiled.variable:
        notes.append(f"variable hotness assumed to be {VARIABLE_HOTNESS} ids per sample for "
                     f"feature(s) {', '.join(compiled.variable)}")
    if any(s.dynamic for s in compiled.tables):
        notes.append(f"dynamic tables are sized at capacity plus a {HASH_INDEX_BYTES_PER_ROW}-byte "
                     "index per row at most (open addressing at most half full: 2-4 entries of int64 key "
                     "+ int64 row, and the row's key, free-list slot, pin and live flag)")
    if any(len(s.storage) > 1 for s in compiled.tables):
        notes.append(f"tiered tables: the tiers above the last are one cache of whole rows per "
                     f"rank (values, optimizer state, metadata and a {HASH_INDEX_BYTES_PER_ROW}-"
                     f"byte index entry each) within their budgets together; hit is the "
                     f"expected share of lookups the cache serves when it keeps the most used "
                     f"rows, ids power-law with alpha {id_alpha:g}")
    if compiled.unread:
        notes.append(f"table(s) read by no feature: {', '.join(compiled.unread)}")
    if balanced:
        notes.append("greedy whole-table packing did not fit: every auto table above "
                     f"{format_bytes(TINY_TABLE_BYTES)} is split across ranks")
    if any(MODELS[d.mode].replicated for d in placer.decisions) and topology.world_size > 1:
        notes.append("data-parallel tables: all-reduce counts each table's dense float32 "
                     "gradient once per step")
    if compiled.quantize != "none":
        notes.append(f"embedding all-to-all quantized to {compiled.quantize} "
                     f"({compiled.wire_bytes} byte(s) per element, scales not counted)")
    dense = compiled.dense_memory(topology.world_size)
    if dense is not None:
        notes.append(f"every rank also holds the dense network: {format_bytes(dense.bytes)} "
                     f"({dense.parameters:,} parameters, their optimizer state and the "
                     f"activations of {dense.batch_per_rank} samples), counted in "
                     f"{POOL_LABELS[POOLS[_dense_pool(topology)]]}")
    notes.append("traffic counts bytes crossing between ranks per step (a rank's share to "
                 "itself is left out); the dense network's all-reduce is not included")
    return tuple(notes)


def tier_rows(rows: int, row_bytes: int, storage: tuple[TierSpec, ...],
              cache_index_bytes: int = HASH_INDEX_BYTES_PER_ROW,
              dynamic: bool = False) -> tuple[int, ...]:
    """Whole rows of a shard of ``rows`` rows in each tier, in the order of ``storage``, as the
    engine keeps them: the tiers above the last are one cache whose rows cost ``row_bytes``
    (values, optimizer state, metadata) plus ``cache_index_bytes`` (the cache's index), so the
    first ``i`` tiers hold ``Σ budgets // that`` rows; the last tier (or one without a budget)
    holds the rest. A ``dynamic`` table's ``row_bytes`` include its index entry, which a
    tiered one keeps in its key directory: the directory of all ``rows`` keys is paid first."""
    out = []
    held = 0
    spent = 0
    if dynamic and len(storage) > 1:
        row_bytes -= HASH_INDEX_BYTES_PER_ROW
        spent = -directory_bytes(rows)
    per_row = max(row_bytes + (cache_index_bytes if len(storage) > 1 else 0), 1)
    for i, tier in enumerate(storage):
        if i == len(storage) - 1 or tier.budget is None:
            out.append(rows - held)
            out.extend([0] * (len(storage) - 1 - i))
            break
        spent += tier.budget
        upto = min(rows, max(spent, 0) // per_row)
        out.append(upto - held)
        held = upto
    return tuple(out)


def _by_tier(counts: tuple[int, ...], storage: tuple[TierSpec, ...]) -> TierBytes:
    sums = [0, 0, 0]
    for tier, n in zip(storage, counts, strict=True):
        sums[TIER_INDEX[tier.tier]] += n
    return TierBytes(*sums)


def _hit_rates(spec: _TableSpec, mode: str, groups: list[tuple[_Group, tuple[int, ...]]],
               alpha: float) -> tuple[float, ...]:
    """Cumulative expected hit rate of each tier: an LFU-like cache of the first tiers' rows
    under power-law ids (see :mod:`embtrain.plan.hitrate`)."""
    if len(spec.storage) < 2:
        return ()
    model = MODELS[mode]
    out = [model.cached_mass(spec.rows, alpha, groups, t + 1) for t in range(len(spec.storage))]
    return tuple(round(h, 6) for h in out)


def _table_plan(d: _Decision, placer: _Placer, alpha: float) -> TablePlan:
    spec = d.spec
    groups = []
    counts = []
    values = opt = meta = 0
    for g in d.groups:
        vals, o, m = spec.cost.shard(g.rows, g.columns)
        tiers, _ = _split_tiers(vals + o + m, spec.storage)
        rows = tier_rows(g.rows, sum(spec.cost.shard(1, g.columns)), spec.storage,
                         dynamic=spec.dynamic)
        counts.append((g, rows))
        stride = MODELS[d.mode].key_stride(placer.w)
        groups.append(ShardGroup(g.first, g.count, g.rows, g.columns, stride, g.first_column,
                                 vals, o, m, TierBytes(*tiers), _by_tier(rows, spec.storage)))
        values += vals * g.count
        opt += o * g.count
        meta += m * g.count
    lookups, ids, forward, backward, allreduce = (round(x) for x in d.traffic)
    return TablePlan(
        name=spec.name, rows=spec.rows, dim=spec.dim, dtype=spec.dtype, dynamic=spec.dynamic,
        optimizer=spec.optimizer, requested=spec.requested, sharding=d.mode, reason=d.reason,
        storage=spec.storage, features=tuple(f.name for f in spec.features),
        ids_per_sample=spec.ids_per_sample, groups=tuple(sorted(groups, key=lambda g: g.first_rank)),
        value_bytes=values, optimizer_bytes=opt, metadata_bytes=meta,
        traffic=TableTraffic(lookups, ids, forward, backward, allreduce),
        hit_rates=_hit_rates(spec, d.mode, counts, alpha))


def make_plan(recipe: Recipe, topology: Topology, batch_size: int | None = None, *,
              max_world_size: int = MAX_WORLD_SIZE, id_alpha: float = DEFAULT_ID_ALPHA) -> Plan:
    """Plan every table of ``recipe`` on ``topology``: sharding, tiers, bytes, traffic.

    ``batch_size`` (global) overrides the recipe's for the traffic estimate; ``id_alpha`` is
    the power-law exponent of the ids that tiered tables' expected hit rates assume.
    Raises :class:`PlanError` naming the first table that does not fit, with the
    smallest topology that does (searched up to ``max_world_size`` ranks).
    """
    compiled = _compile(recipe, batch_size)
    dense = compiled.dense_memory(topology.world_size)
    if dense is not None and _dense_short(compiled, topology):
        # Name the dense network when it alone is what does not fit; when the tables do not
        # fit either, their error (with the topology that fits everything) says more.
        tables_only, _ = _place(replace(compiled, dense=None), topology)
        if tables_only.failure is None:
            raise _dense_error(compiled, topology, dense)
    placer, balanced = _place(compiled, topology)
    if placer.failure is not None:
        raise _error(compiled, topology, placer.failure, max_world_size)
    by_index = {d.spec.index: d for d in placer.decisions}
    tables = tuple(_table_plan(by_index[i], placer, id_alpha)
                   for i in range(len(compiled.tables)))
    state = placer.state.tolist()
    traffic = np.rint(placer.traffic).astype(np.int64).tolist()
    ranks = tuple(
        RankSummary(
            rank=r, shards=state[_SHARDS][r],
            tiers=TierBytes(state[3][r], state[4][r], state[5][r]),
            memory=TierBytes(state[0][r], state[1][r], state[2][r]),
            value_bytes=state[6][r], optimizer_bytes=state[7][r], metadata_bytes=state[8][r],
            lookups=traffic[_LOOKUPS][r], ids_bytes=traffic[_IDS][r],
            forward_bytes=traffic[_FORWARD][r], backward_bytes=traffic[_BACKWARD][r],
            allreduce_bytes=traffic[_ALLREDUCE][r])
        for r in range(topology.world_size))
    totals = Totals(
        value_bytes=sum(t.value_bytes for t in tables),
        optimizer_bytes=sum(t.optimizer_bytes for t in tables),
        metadata_bytes=sum(t.metadata_bytes for t in tables),
        tiers=TierBytes(*(sum(r.tiers.get(tier) for r in ranks) for tier in POOLS)))
    step = Traffic(
        batch_size=compiled.batch_size, element_bytes=compiled.wire_bytes,
        lookups=sum(t.traffic.lookups for t in tables),
        ids_bytes=sum(t.traffic.ids_bytes for t in tables),
        forward_bytes=sum(t.traffic.forward_bytes for t in tables),
        backward_bytes=sum(t.traffic.backward_bytes for t in tables),
        allreduce_bytes=sum(t.traffic.allreduce_bytes for t in tables))
    plan = Plan(recipe=compiled.name, topology=topology, tables=tables, ranks=ranks,
                totals=totals, traffic=step,
                notes=_notes(compiled, topology, placer, balanced, id_alpha),
                dense=dense, id_alpha=id_alpha)
    return plan.with_fingerprint()


__all__ = ["MAX_WORLD_SIZE", "make_plan", "smallest_fitting_topology", "tier_rows"]
