"""Checks of a recipe's disk tiers before training starts: one line per problem, exit 2.

A disk tier's ``path`` must be an existing, writable directory (a missing one is an error,
not created: an unmounted SSD mount point would otherwise fill the root disk) on a file system
with room for the largest tier file of every table shard this machine's ranks put there
(:func:`embtrain.storage.disk.max_file_bytes`; tables sharing a file system add up).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from embtrain.errors import UserInputError
from embtrain.kernels.optimizer_spec import slot_counts
from embtrain.plan.objects import Plan
from embtrain.recipe.kinds import in_files
from embtrain.recipe.models import Recipe
from embtrain.recipe.units import format_bytes
from embtrain.storage.disk import RowLayout, max_file_bytes, tier_file_name


def shard_file_bytes(rows: int, columns: int, optimizer: str, dtype: str = "float32",
                     state_dtype: str = "float32") -> int:
    """The most bytes the tier file of a shard of ``rows`` × ``columns`` can take (values in
    ``dtype``, optimizer slots in ``state_dtype``: a half type's records are smaller)."""
    per_column, per_row = slot_counts(optimizer)
    slots = tuple((f"s{i}", columns, 0.0) for i in range(per_column))
    slots += tuple((f"r{i}", 1, 0.0) for i in range(per_row))
    return max_file_bytes(RowLayout("t", rows, columns, 0, 0, 0.0, slots, (0, 1, 0, 0), dtype,
                                    state_dtype))


def disk_tier_problems(recipe: Recipe, plan: Plan, ranks: Iterable[int] | None = None,
                       base: Path | None = None) -> list[str]:
    """One line per problem with the disk tiers the shards of ``ranks`` (default: every rank
    of the plan, i.e. one machine) use; relative paths resolve against ``base`` (default: the
    working directory)."""
    ranks = list(range(plan.topology.world_size) if ranks is None else ranks)
    base = Path.cwd() if base is None else base
    out: list[str] = []
    need: dict[int, list[tuple[str, str, int, Path]]] = {}  # st_dev -> (field, table, bytes, dir)
    for i, table in enumerate(recipe.tables):
        for j, tier in enumerate(table.storage):
            if not in_files(tier.tier):
                continue
            where = f"tables[{i}].storage[{j}].path"
            if tier.path is None:
                out.append(f"{where}: the {tier.tier} tier needs a path (a directory for the "
                           "table's file)")
                continue
            d = Path(tier.path)
            d = d if d.is_absolute() else base / d
            problem = directory_problem(d)
            if problem:
                out.append(f"{where}: {tier.path} {problem}")
                continue
            tp = plan.table(table.name)
            total = 0
            for r in ranks:
                shard = tp.shard(r)
                if shard is None:
                    continue
                total += shard_file_bytes(shard.rows, shard.col_stop - shard.col_start,
                                          tp.optimizer, table.dtype, table.state_dtype)
                existing = d / tier_file_name(table.name, shard.row_offset, shard.row_stride,
                                               shard.col_start)
                if existing.is_file():  # overwritten by the run: its space counts as free
                    total -= existing.stat().st_blocks * 512
            need.setdefault(os.stat(d).st_dev, []).append((where, table.name, max(total, 0), d))
    for entries in need.values():
        d = entries[0][3]
        st = os.statvfs(d)
        free = st.f_bavail * st.f_frsize
        running = 0
        for where, name, nbytes, path in entries:
            running += nbytes
            if running > free:
                shared = "" if running == nbytes else (
                    f" (with the other tables on that file system: {format_bytes(running)})")
                out.append(f"{where}: {path} has {format_bytes(free)} free but the disk tier of "
                           f"table '{name}' needs up to {format_bytes(nbytes)}{shared}; free "
                           "some space or choose another directory")
                break
    return out


def directory_problem(d: Path) -> str:
    """Why ``d`` cannot hold tier files ('' if it can)."""
    if not d.exists():
        return "does not exist; create the directory (it is not created for you) or choose " \
               "another"
    if not d.is_dir():
        return "is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".embtrain-probe-", dir=d)
    except OSError as exc:
        return f"is not writable ({exc.strerror}); choose a directory you may write to"
    os.close(fd)
    os.unlink(probe)
    return ""


def check_disk_tiers(recipe: Recipe, plan: Plan, source: str,
                     ranks: Iterable[int] | None = None, base: Path | None = None) -> None:
    """Raise a :class:`UserInputError` (exit 2) with one line per disk tier problem, each
    prefixed with ``source`` (the recipe file)."""
    problems = disk_tier_problems(recipe, plan, ranks, base)
    if problems:
        raise UserInputError("\n".join(f"{source}: {p}" for p in problems))
