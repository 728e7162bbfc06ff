"""The smallest topology a recipe fits, and the error that names it.

Searches grow a topology by ranks (:func:`with_world`), by memory per pool, or both, and check
every candidate with the placer itself (:func:`embtrain.plan.placer.fits`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from embtrain.plan.dense import DenseMemory
from embtrain.plan.objects import (
    POOL_LABELS,
    FitSuggestion,
    PlanError,
)
from embtrain.plan.placer import (
    MAX_CAPACITY,
    Compiled,
    Failure,
    TableSpec,
    compile_recipe,
    dense_pool,
    fits,
    pool_needs,
    requested_model,
    split_tiers,
)
from embtrain.plan.topology import POOLS, Topology
from embtrain.recipe.models import Recipe
from embtrain.recipe.units import format_bytes

# ------------------------------------------------------------------------ smallest topology

MAX_WORLD_SIZE = 65536
_GiB = 2**30
_MiB = 2**20


def with_world(topology: Topology, world_size: int) -> Topology:
    """``topology`` with ``world_size`` ranks of the same memory."""
    return Topology(world_size, topology.device_memory, topology.host_memory, topology.disk)


def _with_pool(topology: Topology, pool: int, capacity: int) -> Topology:
    values = [topology.device_memory, topology.host_memory, topology.disk]
    values[pool] = capacity
    return Topology(topology.world_size, values[0], values[1], values[2])


def _rank_ceiling(compiled: Compiled, max_world_size: int) -> int:
    """The most ranks worth trying: explicit column tables need dim ≥ world size."""
    return min([max_world_size] + [s.dim for s in compiled.tables
                                   if requested_model(s).splits_columns])


def _first_fit(ok: Callable[[int], bool], low: int, limit: int) -> int | None:
    """Smallest x in (low, limit] with ``ok(x)``, ``ok(low)`` being false: gallop, then bisect."""
    previous, step = low, 1
    while True:
        x = min(previous + step, limit)
        if x <= previous:
            return None
        if ok(x):
            break
        previous, step = x, step * 2
    low, high = previous, x
    while high - low > 1:
        middle = (low + high) // 2
        if ok(middle):
            high = middle
        else:
            low = middle
    return high


def _search_ranks(compiled: Compiled, topology: Topology, limit: int) -> Topology | None:
    """Fewest ranks above ``topology.world_size`` (at most ``limit``) that fit, same memory."""
    once, every, _ = pool_needs(compiled, topology.has_device)
    low = topology.world_size
    for pool in range(3):
        if once[pool] == 0 and every[pool] == 0:
            continue
        spare = topology.capacity(POOLS[pool]) - every[pool]
        if spare < 0 or (spare == 0 and once[pool] > 0):
            return None
        if once[pool] > 0:
            low = max(low, -(-once[pool] // spare) - 1)  # fewer ranks cannot hold these bytes
    found = _first_fit(lambda w: fits(compiled, with_world(topology, w)) is None, low, limit)
    return None if found is None else with_world(topology, found)


def _pool_is_enough(compiled: Compiled, base: Topology, pool: int, unit: int, units: int) -> bool:
    """Whether ``pool`` at ``units × unit`` bytes per rank no longer runs short."""
    failure = fits(compiled, _with_pool(base, pool, units * unit))
    return failure is None or failure.kind != "memory" or failure.pool != pool


def _search_memory(compiled: Compiled, topology: Topology,
                   failure: Failure) -> tuple[Topology | None, tuple[int, ...], Topology]:
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
        once, every, _ = pool_needs(compiled, current.has_device)
        at_least = -(-(once[pool] + w * every[pool]) // w)
        low = max(capacity // unit, -(-at_least // unit) - 1)
        units = _first_fit(partial(_pool_is_enough, compiled, current, pool, unit), low,
                           MAX_CAPACITY // unit)
        if units is None:
            return None, tuple(raised), current
        current = _with_pool(current, pool, units * unit)
        next_failure = fits(compiled, current)
        if next_failure is None:
            return current, tuple(raised), current
        failure = next_failure
    return None, tuple(raised), current


def _blocker(compiled: Compiled, topology: Topology) -> str:
    """Why no topology with at least this many ranks fits, whatever its memory ('' if none)."""
    for spec in compiled.tables:
        requested = requested_model(spec)
        if not requested.fits(spec.dim, topology.world_size):
            return (f"table '{spec.name}' asks for {spec.requested} sharding but its dim "
                    f"{spec.dim} is less than {topology.world_size} ranks")
        if requested.whole:
            smallest, what = spec.bytes, f"as {spec.requested} shards"
        else:
            smallest = requested.smallest_shard(spec.cost, spec.rows, spec.dim)
            what = "at least (one row or one column per rank)"
        _, cap = split_tiers(smallest, spec.storage)
        if cap is not None and smallest > cap:
            return (f"table '{spec.name}' needs {format_bytes(smallest)} per rank {what} but its "
                    f"storage budgets allow {format_bytes(cap)}")
    return ""


def _more_ranks_may_help(failure: Failure, topology: Topology) -> bool:
    """False when the failing table is pinned whole to a rank and does not fit an empty one."""
    spec = failure.spec
    if not requested_model(spec).whole:
        return True
    tiers, _ = split_tiers(spec.bytes, spec.storage)
    tier_pool = (0 if topology.has_device else 1, 1, 2)
    need = [0, 0, 0]
    for tier, amount in enumerate(tiers):
        need[tier_pool[tier]] += amount
    return all(need[p] <= topology.capacity(POOLS[p]) for p in range(3))


def _roomy(topology: Topology) -> Topology:
    """``topology`` with memory no table can exhaust: only shardings and budgets can fail."""
    device = MAX_CAPACITY if topology.has_device else None
    return Topology(topology.world_size, device, MAX_CAPACITY, MAX_CAPACITY)


def suggest(compiled: Compiled, topology: Topology, failure: Failure | None,
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
        enough = roomy if fits(compiled, roomy) is None else _search_ranks(compiled, roomy, ceiling)
        if enough is not None:
            start = with_world(topology, enough.world_size)
            start_failure = fits(compiled, start)
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
    compiled = compile_recipe(recipe, None)
    return suggest(compiled, topology, fits(compiled, topology), max_world_size)


def _breakdown(spec: TableSpec) -> str:
    parts = [f"values {format_bytes(spec.value_bytes)}"]
    if spec.optimizer_bytes:
        parts.append(f"{spec.optimizer} {format_bytes(spec.optimizer_bytes)}")
    parts.append(f"metadata {format_bytes(spec.metadata_bytes)}")
    return " + ".join(parts)


def placement_error(compiled: Compiled, topology: Topology, failure: Failure,
           max_world_size: int) -> PlanError:
    spec, w = failure.spec, topology.world_size
    head = f"plan: table '{spec.name}'"
    if failure.kind == "structural":
        return PlanError(
            f"{head} asks for {failure.mode} sharding but its dim {spec.dim} is less than the world size "
            f"{w}; use row or auto sharding, or at most {spec.dim} ranks",
            table=spec.name, needed=spec.bytes, pool=None)
    suggestion = suggest(compiled, topology, failure, max_world_size)
    if suggestion.topologies():
        tail = f"; smallest topology that fits: {suggestion.describe()}"
    elif suggestion.limit.startswith(f"table '{spec.name}' needs"):
        split = " or let it be split (sharding: auto)" if requested_model(spec).whole else ""
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
                 if compiled.dense is not None and failure.pool == dense_pool(topology)
                 else "larger tables")
        left = f", {format_bytes(max(failure.free, 0))} of it left after {after}"
    return PlanError(
        f"{head} needs {format_bytes(spec.bytes)} ({_breakdown(spec)}) but each of {w} rank(s) "
        f"has {format_bytes(failure.capacity)} of {label}{left}{tail}",
        table=spec.name, needed=spec.bytes, available=failure.capacity, pool=pool,
        suggestion=suggestion)


def dense_error(compiled: Compiled, topology: Topology, dense: DenseMemory) -> PlanError:
    pool = POOLS[dense_pool(topology)]
    capacity = topology.capacity(pool)
    return PlanError(
        f"plan: the dense network ({_dense_name(compiled)}) needs {format_bytes(dense.bytes)} "
        f"per rank (parameters {format_bytes(dense.parameter_bytes)} + optimizer state "
        f"{format_bytes(dense.optimizer_bytes)} + activations of {dense.batch_per_rank} "
        f"samples {format_bytes(dense.activation_bytes)}) but each of {topology.world_size} "
        f"rank(s) has {format_bytes(capacity)} of {POOL_LABELS[pool]}; lower data.batch_size, "
        "the embedding widths or the layer sizes", table=None, needed=dense.bytes,
        available=capacity, pool=pool)


def _dense_name(compiled: Compiled) -> str:
    """``5,201 parameters``: how the dense network is named in messages."""
    return f"{compiled.dense.parameters:,} parameters" if compiled.dense is not None else "none"
