"""What `embtrain run` supports today; anything else stops the run at start, naming the field."""

from __future__ import annotations

from embtrain.errors import UserInputError
from embtrain.kernels.optimizer_spec import spec_of
from embtrain.recipe.kinds import in_files
from embtrain.recipe.models import Recipe


def _cache_fits_a_batch(recipe: Recipe, i: int, world_size: int) -> list[str]:
    """The first tiers must hold every row one batch can read (they are where lookups and
    updates happen)."""
    from embtrain.embedding.from_recipe import cache_row_bytes, tier_config
    from embtrain.plan.cost import cache_rows

    table = recipe.tables[i]
    tier = tier_config(table, recipe.optimizer.sparse.type)
    if tier is None:
        return []
    hot = [f.hotness for f in recipe.categorical_features if f.table == table.name]
    if any(h == "variable" for h in hot):
        return []
    # a row-sharded dynamic table's rank holds a key directory of its shard only
    shard = table.capacity
    if table.dynamic is not None and table.sharding == "row":
        shard = -(-table.capacity // world_size)
    held = min(cache_rows(tier.budget, tier.row_bytes, shard, table.dynamic is not None), shard)
    most = min(recipe.data.batch_size * sum(int(h) for h in hot), shard)
    if held >= most:
        return []
    need = most * cache_row_bytes(table, recipe.optimizer.sparse.type)
    if table.dynamic is not None:  # the key directory comes first
        from embtrain.plan.cost import directory_bytes

        need += directory_bytes(shard)
    return [f"tables[{i}].storage: the memory tiers hold {held} rows of table "
            f"'{table.name}' but one batch can read {most}; give the tiers above the last at "
            f"least {need} bytes together (e.g. budget: {-(-need // 2**20)}MiB)"]


def unsupported_fields(recipe: Recipe, world_size: int) -> list[str]:
    """One line per recipe field this version of the runtime cannot honour."""
    out: list[str] = []
    for i, table in enumerate(recipe.tables):
        if table.dynamic is not None and table.sharding == "data_parallel":
            out.append(
                f"tables[{i}].sharding: a dynamic table cannot be data_parallel (replicas "
                "would admit and evict apart); use auto, table, column or row"
            )
        if len(table.storage) > 1 and table.sharding == "data_parallel":
            out.append(
                f"tables[{i}].sharding: a tiered table cannot be data_parallel (its rows live in "
                "a cache over its store, not in one replica per rank); use auto, table, column "
                "or row"
            )
        if len(table.storage) > 1:
            out += _cache_fits_a_batch(recipe, i, world_size)
        if len(table.storage) == 1 and in_files(table.storage[0].tier):
            out.append(
                f"tables[{i}].storage[0].tier: the {table.storage[0].tier} tier is not "
                "supported by `embtrain run` yet"
            )
    sparse = recipe.optimizer.sparse.type
    if spec_of(sparse).row_wise:  # state per whole row (rowwise_adagrad)
        for i, table in enumerate(recipe.tables):
            if table.sharding == "column":
                out.append(
                    f"tables[{i}].sharding: column sharding splits rows across ranks, but "
                    f"{sparse} keeps one accumulator per whole row; use table or row"
                )
    return out


def check_supported(recipe: Recipe, source: str, world_size: int = 1) -> None:
    """Raise a one-line-per-problem error for every unsupported field."""
    problems = unsupported_fields(recipe, world_size)
    if problems:
        raise UserInputError("\n".join(f"{source}: {p}" for p in problems))
