"""The row stores of the tier kinds: which store backs a tiered table's cache.

The storage half of the tier-kind registry (the recipe's half, names and pools, is
:data:`embtrain.recipe.kinds.TIERS`). A store kind (engine ``TierConfig.store``: ``memory``
for a table whose last tier is a memory pool, else the name of its last tier, a kind that
keeps rows in files) maps to a function opening the row store of one table shard (the
``RowStore`` protocol of :mod:`embtrain.embedding.tiers`). The builder hands
:func:`open_store` to the engine; importing this package also makes it the default of engines
built without one. A new file tier kind is one more entry here and its store module; this
module refuses to import while a file tier kind of the recipe has no store here.
"""

from __future__ import annotations

from embtrain.embedding.config import TableConfig
from embtrain.embedding.tiers import MemoryStore, RowStore, StoreOpener, use_stores
from embtrain.recipe.kinds import FILE_TIER_KINDS

#: The store of a table whose tiers are all in memory (the engine's ``TierConfig.store``).
MEMORY_STORE = "memory"

__all__ = ["MEMORY_STORE", "ROW_STORES", "open_store"]


def _memory(t: TableConfig, widths: list[int], seed: int, inits: list[float]) -> RowStore:
    return MemoryStore.of(t, widths)


def _disk(t: TableConfig, widths: list[int], seed: int, inits: list[float]) -> RowStore:
    from embtrain.storage.store import open_row_store

    assert t.tier is not None
    if not t.tier.path:
        raise ValueError("a disk tier needs a path")
    return open_row_store(t, widths, seed, inits)


#: Store kind → the function opening a table shard's row store.
ROW_STORES: dict[str, StoreOpener] = {MEMORY_STORE: _memory, "disk": _disk}

_UNSTORED = sorted(set(FILE_TIER_KINDS) - set(ROW_STORES))
if _UNSTORED:
    raise ImportError(f"tier kinds {_UNSTORED} (embtrain.recipe.kinds.TIERS) have no row store "
                      "in embtrain.storage.kinds.ROW_STORES")


def open_store(t: TableConfig, widths: list[int], seed: int, inits: list[float]) -> RowStore:
    """The row store of tiered table shard ``t`` (kind ``t.tier.store``) whose optimizer
    slots have ``widths`` and start at ``inits``."""
    assert t.tier is not None
    kind = t.tier.store
    if kind not in ROW_STORES:
        raise ValueError(f"table {t.name!r}: unknown tier store {kind!r}; "
                         f"known: {sorted(ROW_STORES)}")
    return ROW_STORES[kind](t, widths, seed, inits)


use_stores(open_store)
