"""The closed lists of the recipe language, each defined once.

Every layer above (the planner, the engine, the tiers) imports these; nothing else spells
them out. Each list is a ``Literal`` type (what the recipe's models validate) and the tuple of
its values, in order.
"""

from __future__ import annotations

from typing import Literal, get_args

#: How a table is placed on the ranks (``tables[].sharding``; ``auto`` lets the planner choose).
ShardingMode = Literal["data_parallel", "table", "column", "row"]
SHARDING_MODES: tuple[str, ...] = get_args(ShardingMode)

#: Storage tiers (and the topology's memory pools), fastest first: a table lists its tiers in
#: this order.
TierKind = Literal["device", "host", "disk"]
TIER_KINDS: tuple[str, ...] = get_args(TierKind)
#: A tier's place in :data:`TIER_KINDS` (0: fastest).
TIER_RANK: dict[str, int] = {kind: i for i, kind in enumerate(TIER_KINDS)}

#: A table's value type (``tables[].dtype``) and its bytes per value.
TableDtype = Literal["float32", "float16", "bfloat16"]
TABLE_DTYPES: tuple[str, ...] = get_args(TableDtype)
DTYPE_BYTES: dict[str, int] = dict(zip(TABLE_DTYPES, (4, 2, 2), strict=True))
