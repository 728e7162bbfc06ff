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

from dataclasses import replace

import numpy as np

from embtrain.plan.cost import (
    DEFAULT_ID_ALPHA,
    HASH_INDEX_BYTES_PER_ROW,
    TINY_TABLE_BYTES,
    VARIABLE_HOTNESS,
    directory_bytes,
)
from embtrain.plan.fit import (
    MAX_WORLD_SIZE,
    dense_error,
    placement_error,
    smallest_fitting_topology,
)
from embtrain.plan.objects import (
    POOL_LABELS,
    Plan,
    RankSummary,
    ShardGroup,
    TablePlan,
    TableTraffic,
    TierBytes,
    TierSpec,
    Totals,
    Traffic,
)
from embtrain.plan.placer import (
    ALLREDUCE,
    BACKWARD,
    FORWARD,
    IDS,
    LOOKUPS,
    SHARDS_ROW,
    TIER_INDEX,
    Compiled,
    Decision,
    Placer,
    TableSpec,
    compile_recipe,
    dense_pool,
    dense_short,
    place,
    split_tiers,
)
from embtrain.plan.shardings import MODELS, Group
from embtrain.plan.topology import POOLS, Topology
from embtrain.recipe.models import Recipe
from embtrain.recipe.units import format_bytes


def _notes(compiled: Compiled, topology: Topology, placer: Placer, balanced: bool,
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
                     f"{POOL_LABELS[POOLS[dense_pool(topology)]]}")
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


def _hit_rates(spec: TableSpec, mode: str, groups: list[tuple[Group, tuple[int, ...]]],
               alpha: float) -> tuple[float, ...]:
    """Cumulative expected hit rate of each tier: an LFU-like cache of the first tiers' rows
    under power-law ids (see :mod:`embtrain.plan.hitrate`)."""
    if len(spec.storage) < 2:
        return ()
    model = MODELS[mode]
    out = [model.cached_mass(spec.rows, alpha, groups, t + 1) for t in range(len(spec.storage))]
    return tuple(round(h, 6) for h in out)


def _table_plan(d: Decision, placer: Placer, alpha: float) -> TablePlan:
    spec = d.spec
    groups = []
    counts = []
    values = opt = meta = 0
    for g in d.groups:
        vals, o, m = spec.cost.shard(g.rows, g.columns)
        tiers, _ = split_tiers(vals + o + m, spec.storage)
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
    compiled = compile_recipe(recipe, batch_size)
    dense = compiled.dense_memory(topology.world_size)
    if dense is not None and dense_short(compiled, topology):
        # Name the dense network when it alone is what does not fit; when the tables do not
        # fit either, their error (with the topology that fits everything) says more.
        tables_only, _ = place(replace(compiled, dense=None), topology)
        if tables_only.failure is None:
            raise dense_error(compiled, topology, dense)
    placer, balanced = place(compiled, topology)
    if placer.failure is not None:
        raise placement_error(compiled, topology, placer.failure, max_world_size)
    by_index = {d.spec.index: d for d in placer.decisions}
    tables = tuple(_table_plan(by_index[i], placer, id_alpha)
                   for i in range(len(compiled.tables)))
    state = placer.state.tolist()
    traffic = np.rint(placer.traffic).astype(np.int64).tolist()
    ranks = tuple(
        RankSummary(
            rank=r, shards=state[SHARDS_ROW][r],
            tiers=TierBytes(state[3][r], state[4][r], state[5][r]),
            memory=TierBytes(state[0][r], state[1][r], state[2][r]),
            value_bytes=state[6][r], optimizer_bytes=state[7][r], metadata_bytes=state[8][r],
            lookups=traffic[LOOKUPS][r], ids_bytes=traffic[IDS][r],
            forward_bytes=traffic[FORWARD][r], backward_bytes=traffic[BACKWARD][r],
            allreduce_bytes=traffic[ALLREDUCE][r])
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
