"""The registries of the recipe language's closed lists, each defined once: sharding modes,
tier kinds, table dtypes.

Every layer above (the planner, the engine, the tiers, the tests) reads these; nothing else
spells them out. Each list is a tuple of names, in order, and the ``Literal`` type derived from
it (what the recipe's models validate, and the JSON schema lists). The sparse optimizers'
registry is :data:`embtrain.kernels.optimizer_spec.SPARSE_OPTIMIZERS` (the kernels compile it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: How a table is placed on the ranks (``tables[].sharding``; ``auto`` lets the planner choose).
#: Each name has a cost model (``plan/shardings.py`` ``MODELS``) and a run-time strategy
#: (``embedding/sharding/<name>.py``); both refuse to import when they and this list differ.
SHARDING_MODES: tuple[str, ...] = ("data_parallel", "table", "column", "row")
ShardingMode = Literal[SHARDING_MODES]  # type: ignore[valid-type]


@dataclass(frozen=True)
class TierKindSpec:
    """One storage tier kind (``tables[].storage[].tier``), and the memory pool of the
    topology it lives in.

    ``pool_label`` names the pool in a plan; ``capacity`` is the
    :class:`embtrain.plan.topology.Topology` field holding the pool's bytes per rank.
    ``files``: the tier keeps its rows in files under the tier's ``path`` (a row store of its
    own, opened by ``storage/kinds.py`` ``ROW_STORES[name]``); otherwise its rows are in
    memory (a cache tier, or an in-memory row store when it is the last tier).
    """

    name: str
    pool_label: str
    capacity: str
    files: bool = False


#: Storage tiers (and the topology's memory pools), fastest first: a table lists its tiers in
#: this order.
TIERS: dict[str, TierKindSpec] = {
    s.name: s
    for s in (
        TierKindSpec("device", "device memory", "device_memory"),
        TierKindSpec("host", "host memory", "host_memory"),
        TierKindSpec("disk", "disk", "disk", files=True),
    )
}
TIER_KINDS: tuple[str, ...] = tuple(TIERS)
TierKind = Literal[TIER_KINDS]  # type: ignore[valid-type]
#: A tier's place in :data:`TIER_KINDS` (0: fastest).
TIER_RANK: dict[str, int] = {kind: i for i, kind in enumerate(TIER_KINDS)}
#: The tier kinds that keep rows in files (take a ``path``).
FILE_TIER_KINDS: tuple[str, ...] = tuple(k for k, s in TIERS.items() if s.files)


def in_files(tier: str) -> bool:
    """Whether tier kind ``tier`` keeps its rows in files under a ``path``."""
    return TIERS[tier].files


def tier_rank(tier: str) -> int:
    """Tier kind ``tier``'s place in the registry's fastest-first order (0: fastest)."""
    return list(TIERS).index(tier)


#: A table's value type (``tables[].dtype``) and its bytes per value.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
TABLE_DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)
TableDtype = Literal[TABLE_DTYPES]  # type: ignore[valid-type]
#: The half-precision table dtypes (values stored as uint16 bit patterns).
HALF_TABLE_DTYPES: tuple[str, ...] = tuple(d for d, n in DTYPE_BYTES.items() if n == 2)
