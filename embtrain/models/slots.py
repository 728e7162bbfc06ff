"""Where each categorical feature's pooled vector sits in the engine's per-group arrays.

Pure Python, no TensorFlow: the engine and the planner may import it freely.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embtrain.recipe import models as rm


@dataclass(frozen=True)
class FeatureSlot:
    """A categorical feature's columns ``[start, start + width)`` of group array ``group``.

    ``dim`` is the table's dim; ``width == dim`` except for the ``concat`` combiner,
    where ``width = hotness × dim`` (interaction models then see ``hotness`` fields).
    ``memory_group``: the group the feature would be in with every table in memory (a tier
    puts its table in a group of its own); consecutive slots of one memory group form one
    input block of the network whatever the storage (:func:`input_blocks`). ``None``: the
    slot stands alone.
    """

    name: str
    group: int
    start: int
    width: int
    dim: int
    memory_group: int | None = None

    def __post_init__(self) -> None:
        if self.group < 0 or self.start < 0:
            raise ValueError(f"feature {self.name!r}: group and start must be >= 0")
        if self.width <= 0 or self.dim <= 0:
            raise ValueError(f"feature {self.name!r}: width and dim must be > 0")
        if self.width % self.dim:
            raise ValueError(
                f"feature {self.name!r}: width {self.width} is not a multiple of dim {self.dim}")

    @property
    def end(self) -> int:
        """One past the last column."""
        return self.start + self.width

    @property
    def fields(self) -> int:
        """How many ``dim``-vectors the feature contributes to an interaction (hotness for concat)."""
        return self.width // self.dim


@dataclass(frozen=True)
class Run:
    """Consecutive slots (in list order) that are contiguous columns of one group with one dim."""

    group: int
    start: int
    width: int
    dim: int
    names: tuple[str, ...]
    memory_group: int | None = None

    @property
    def fields(self) -> int:
        """Number of ``dim``-vectors in the run."""
        return self.width // self.dim


def validate_slots(slots: Sequence[FeatureSlot]) -> None:
    """Raise ``ValueError`` on duplicate names or overlapping columns within a group."""
    seen: set[str] = set()
    for slot in slots:
        if slot.name in seen:
            raise ValueError(f"feature {slot.name!r} appears twice in the slots")
        seen.add(slot.name)
    by_group: dict[int, list[FeatureSlot]] = {}
    for slot in slots:
        by_group.setdefault(slot.group, []).append(slot)
    for group, members in by_group.items():
        members = sorted(members, key=lambda s: s.start)
        for a, b in itertools.pairwise(members):
            if b.start < a.end:
                raise ValueError(
                    f"features {a.name!r} and {b.name!r} overlap in group {group} "
                    f"(columns [{a.start}, {a.end}) and [{b.start}, {b.end}))")


def group_widths(slots: Sequence[FeatureSlot]) -> list[int | None]:
    """Expected width of every group array: the last used column; ``None`` for an unused group."""
    if not slots:
        return []
    widths: list[int | None] = [None] * (max(s.group for s in slots) + 1)
    for slot in slots:
        widths[slot.group] = max(widths[slot.group] or 0, slot.end)
    return widths


def merge_runs(slots: Sequence[FeatureSlot]) -> list[Run]:
    """Merge consecutive, contiguous, same-group, same-dim slots into runs (order kept).

    When the slots are listed in the engine's column order every group becomes one run,
    so the model reads whole group arrays without slicing.
    """
    runs: list[Run] = []
    for slot in slots:
        last = runs[-1] if runs else None
        if (last is not None and last.group == slot.group and last.dim == slot.dim
                and last.start + last.width == slot.start
                and last.memory_group == slot.memory_group):
            runs[-1] = Run(last.group, last.start, last.width + slot.width, last.dim,
                           (*last.names, slot.name), last.memory_group)
        else:
            runs.append(Run(slot.group, slot.start, slot.width, slot.dim, (slot.name,),
                            slot.memory_group))
    return runs


def input_blocks(runs: Sequence[Run]) -> list[tuple[Run, ...]]:
    """The network's input blocks: consecutive runs of one memory group (and dim) joined, the
    block standing for their concatenation; every other run a block of its own.

    With every table in memory each group is one run, so each block is one run (one group
    array read whole). A tiered table sits in a group of its own, which splits its memory
    group into several runs; joining them gives the network the very blocks (and so the very
    matmuls and sums) of the all-in-memory run, which keeps tiered == in memory bit for bit.
    """
    blocks: list[tuple[Run, ...]] = []
    for run in runs:
        last = blocks[-1][-1] if blocks else None
        if (last is not None and run.memory_group is not None
                and last.memory_group == run.memory_group and last.dim == run.dim):
            blocks[-1] = (*blocks[-1], run)
        else:
            blocks.append((run,))
    return blocks


def feature_slots(recipe: rm.Recipe, layout: Mapping[str, tuple[int, int, int]]) -> list[FeatureSlot]:
    """The model's view of the engine output: one slot per categorical feature, in the
    column order of the engine with every table in memory (group by group, left to right;
    a tiered table where its in-memory twin would be, so the order does not depend on
    storage).

    This order is the order of the dense network's concatenated input. Listing the slots as
    the engine lays them out makes every group one contiguous run, so the network reads each
    group array whole: no column slices of ``[batch, width]`` arrays in the forward and no
    zero-padded slice gradients summed in the backward (on the DE tiny model at batch 65536
    that was ~20 % of the dense step).
    """
    from embtrain.embedding.from_recipe import feature_configs, table_configs
    from embtrain.embedding.groups import memory_layout

    memory, _ = memory_layout(table_configs(recipe), feature_configs(recipe))
    dims = {t.name: t.dim for t in recipe.tables}
    slots = [
        FeatureSlot(name=f.name, group=g, start=start, width=width, dim=dims[f.table],
                    memory_group=memory[f.name].group)
        for f in recipe.categorical_features
        for g, start, width in [layout[f.name]]
    ]
    return sorted(slots, key=lambda s: tuple(memory[s.name][:2]))


def check_step_shapes(dense: Any, groups: Sequence[Any], labels: Any, num_dense: int,
                      widths: Sequence[int | None], heads: int | None) -> int:
    """The batch size of a step's arrays (any backend's: their ``shape``), after checking that
    ``dense`` is ``[batch, num_dense]``, each group ``[batch, width]`` and ``labels`` (when
    given) ``[batch]`` (``heads`` None) or ``[batch, heads]``; a mismatch is a ValueError."""
    batch = int(dense.shape[0])
    if tuple(dense.shape[1:]) != (num_dense,):
        raise ValueError(f"dense: expected shape [batch, {num_dense}], got {list(dense.shape)}")
    if len(groups) != len(widths):
        raise ValueError(f"expected {len(widths)} group arrays, got {len(groups)}")
    for g, (arr, width) in enumerate(zip(groups, widths, strict=True)):
        if len(arr.shape) != 2 or int(arr.shape[0]) != batch or (
                width is not None and int(arr.shape[1]) != width):
            raise ValueError(f"group {g}: expected shape [{batch}, {width}], "
                             f"got {list(arr.shape)}")
    if labels is not None:
        want = (batch,) if heads is None else (batch, heads)
        if tuple(labels.shape) != want:
            raise ValueError(f"labels: expected shape {list(want)}, got {list(labels.shape)}")
    return batch
