"""The registry of tier kinds: which row store backs a tiered table's cache.

A tier kind (``tables[].storage[].tier`` below the first, engine ``TierConfig.store``) maps
to a function opening the row store of one table shard (the ``RowStore`` protocol of
:mod:`embtrain.embedding.tiers`). The builder hands :func:`open_store` to the engine;
importing this package also makes it the default of engines built without one. A new tier
kind is one more entry here and its store module.
"""

from __future__ import annotations

from embtrain.embedding.config import TableConfig
from embtrain.embedding.tiers import MemoryStore, RowStore, StoreOpener, use_stores

__all__ = ["TIER_KINDS", "open_store"]


def _memory(t: TableConfig, widths: list[int], seed: int, inits: list[float]) -> RowStore:
    return MemoryStore.of(t, widths)


def _disk(t: TableConfig, widths: list[int], seed: int, inits: list[float]) -> RowStore:
    from embtrain.storage.store import open_row_store

    assert t.tier is not None
    if not t.tier.path:
        raise ValueError("a disk tier needs a path")
    return open_row_store(t, widths, seed, inits)


TIER_KINDS: dict[str, StoreOpener] = {"memory": _memory, "disk": _disk}


def open_store(t: TableConfig, widths: list[int], seed: int, inits: list[float]) -> RowStore:
    """The row store of tiered table shard ``t`` (kind ``t.tier.store``) whose optimizer
    slots have ``widths`` and start at ``inits``."""
    assert t.tier is not None
    kind = t.tier.store
    if kind not in TIER_KINDS:
        raise ValueError(f"table {t.name!r}: unknown tier store {kind!r}; "
                         f"known: {sorted(TIER_KINDS)}")
    return TIER_KINDS[kind](t, widths, seed, inits)


use_stores(open_store)
