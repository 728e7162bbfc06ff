"""Turn a validated recipe into the engine's own configuration objects (:mod:`.config`).

Beside its consumer: the engine classes themselves never see the recipe; the builder, the
warm start and the kernel warm-up call these.
"""

from __future__ import annotations

import dataclasses

from embtrain.embedding.config import (
    DynamicConfig,
    FeatureConfig,
    InitializerConfig,
    SparseOptimizerConfig,
    TableConfig,
    TierConfig,
)
from embtrain.recipe import models as rm
from embtrain.recipe.kinds import in_files


def initializer_config(init: rm.Initializer) -> InitializerConfig:
    """Recipe initializer → engine initializer."""
    if isinstance(init, rm.UniformInit):
        return InitializerConfig(kind="uniform", scale=init.scale)
    if isinstance(init, rm.NormalInit):
        return InitializerConfig(kind="normal", std=init.std)
    if isinstance(init, rm.TruncatedNormalInit):
        return InitializerConfig(kind="truncated_normal", std=init.std)
    if isinstance(init, rm.ZerosInit):
        return InitializerConfig(kind="zeros")
    return InitializerConfig(kind="constant", value=init.value)


def dynamic_config(d: rm.Dynamic) -> DynamicConfig:
    """Recipe ``tables[].dynamic`` → engine dynamic-table configuration."""
    a = d.admission
    return DynamicConfig(
        eviction=d.eviction,
        admission=a.type,
        min_count=getattr(a, "min_count", 2),
        bloom_capacity=getattr(a, "capacity", 10_000_000),
        false_positive_rate=getattr(a, "false_positive_rate", 0.01),
        p=getattr(a, "p", 1.0),
        ttl_steps=d.ttl_steps,
        missing=d.missing,
    )


def cache_row_bytes(table: rm.Table, optimizer: str) -> int:
    """Bytes one cached row of a tiered table costs in memory: values, optimizer state,
    metadata and the cache's index and bookkeeping (the planner's prices)."""
    from embtrain.plan.cost import HASH_INDEX_BYTES_PER_ROW, RowCost

    return sum(RowCost.of(table.dtype, optimizer, False, table.state_dtype).shard(1, table.dim)) + \
        HASH_INDEX_BYTES_PER_ROW


def tier_config(table: rm.Table, optimizer: str) -> TierConfig | None:
    """A table's storage tiers as the engine runs them: every tier above the last is
    memory on this CPU engine (``device`` is host memory without a GPU), so their budgets
    together buy the cache's rows (a dynamic table's key directory first); the last tier
    holds every row (``disk``: a file under its path; else host memory). None when the
    memory tiers hold the whole table."""
    if len(table.storage) < 2:
        return None
    *upper, last = table.storage
    budget = sum(int(t.budget or 0) for t in upper)
    from embtrain.plan.cost import cache_rows

    row_bytes = cache_row_bytes(table, optimizer)
    rows = cache_rows(budget, row_bytes, table.capacity, table.dynamic is not None)
    if rows >= table.capacity:
        return None
    eviction = next((t.eviction for t in upper if t.eviction is not None), "lru")
    return TierConfig(cache_rows=int(rows), store=store_kind(last.tier),
                      path=last.path, eviction=eviction, budget=budget,
                      row_bytes=row_bytes)


def table_configs(recipe: rm.Recipe) -> list[TableConfig]:
    """The recipe's tables (static, tiered or dynamic with capacity rows), in recipe order."""
    optimizer = recipe.optimizer.sparse.type
    return [
        TableConfig(
            name=t.name,
            rows=t.capacity,
            dim=t.dim,
            initializer=initializer_config(t.initializer),
            dtype=t.dtype,
            rounding=t.rounding_mode,
            optimizer_state=t.optimizer_state or "float32",
            dynamic=None if t.dynamic is None else dynamic_config(t.dynamic),
            tier=tier_config(t, optimizer),
        )
        for t in recipe.tables
    ]


def feature_configs(recipe: rm.Recipe) -> list[FeatureConfig]:
    """Categorical features of the recipe, in recipe order."""
    return [
        FeatureConfig(
            name=f.name,
            table=f.table,
            combiner=f.combiner,
            hotness=None if f.hotness == "variable" else int(f.hotness),
        )
        for f in recipe.categorical_features
    ]


# Recipe option → engine field, where the names differ (the engine follows TensorFlow's names).
_SPARSE_RENAMES = {
    "l1": "l1_regularization_strength",
    "l2": "l2_regularization_strength",
    "l2_shrinkage": "l2_shrinkage_regularization_strength",
}
_SPARSE_FIELDS = {f.name for f in dataclasses.fields(SparseOptimizerConfig)} - {"kind", "options"}


def sparse_optimizer_config(opt: rm.SparseOptimizer) -> SparseOptimizerConfig:
    """Recipe sparse optimizer → engine optimizer (TF's hyper-parameter names), with its
    learning-rate schedule."""
    config = _sparse_optimizer_config(opt)
    if opt.schedule is not None:
        config = dataclasses.replace(config, lr_factor=opt.schedule.factor)
    return config


def _sparse_optimizer_config(opt: rm.SparseOptimizer) -> SparseOptimizerConfig:
    """Recipe sparse optimizer → engine optimizer (TF's hyper-parameter names): the recipe
    model's fields become the engine config's fields of the same (or TensorFlow's) name, and
    the optimizer's own options (those the config has no field for) its ``options``."""
    common: dict[str, float] = {}
    own: list[tuple[str, float]] = []
    for name, value in opt.model_dump(exclude={"type", "schedule"}).items():
        field = _SPARSE_RENAMES.get(name, name)
        if field in _SPARSE_FIELDS:
            common[field] = value
        else:
            own.append((field, float(value)))
    return SparseOptimizerConfig(kind=opt.type, options=tuple(own), **common)


def store_kind(tier: str) -> str:
    """The row store of a table whose last tier is ``tier``: a tier kind that keeps its rows in
    files (:data:`embtrain.recipe.kinds.TIERS`) is a store of its own name in
    ``embtrain.storage.kinds.ROW_STORES``; the memory pools keep their rows in a memory store."""
    return tier if in_files(tier) else "memory"
