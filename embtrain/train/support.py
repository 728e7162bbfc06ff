"""What `embtrain run` supports today; anything else stops the run at start, naming the field."""

from __future__ import annotations

from embtrain.errors import UserInputError
from embtrain.recipe.models import Recipe


def unsupported_fields(recipe: Recipe, world_size: int) -> list[str]:
    """One line per recipe field this version of the runtime cannot honour."""
    out: list[str] = []
    for i, table in enumerate(recipe.tables):
        if table.dynamic is not None and table.sharding == "data_parallel":
            out.append(
                f"tables[{i}].sharding: a dynamic table cannot be data_parallel (replicas "
                "would admit and evict apart); use auto, table, column or row"
            )
        if len(table.storage) > 1:
            out.append(
                f"tables[{i}].storage: storage tiers below the first are not supported by `embtrain run` yet "
                f"(got {', '.join(t.tier for t in table.storage)})"
            )
        elif table.storage[0].tier == "disk":
            out.append(
                f"tables[{i}].storage[0].tier: the disk tier is not supported by `embtrain run` yet"
            )
        if table.dtype != "float32":
            out.append(
                f"tables[{i}].dtype: only float32 tables are supported yet (got {table.dtype})"
            )
    if recipe.train.mixed_precision != "none":
        out.append(
            f"train.mixed_precision: {recipe.train.mixed_precision} is not supported yet; use none"
        )
    if recipe.optimizer.sparse.type == "rowwise_adagrad":
        for i, table in enumerate(recipe.tables):
            if table.sharding == "column":
                out.append(
                    f"tables[{i}].sharding: column sharding splits rows across ranks, but "
                    "rowwise_adagrad keeps one accumulator per whole row; use table or row"
                )
    return out


def check_supported(recipe: Recipe, source: str, world_size: int = 1) -> None:
    """Raise a one-line-per-problem error for every unsupported field."""
    problems = unsupported_fields(recipe, world_size)
    if problems:
        raise UserInputError("\n".join(f"{source}: {p}" for p in problems))
