"""Which row space a table gets (:mod:`embtrain.embedding.rowspace`): static rows in memory,
a hash table for a dynamic table, or a cache over the table's row store (with a key
directory for a dynamic table)."""

from __future__ import annotations

from dataclasses import replace

from embtrain.embedding.config import DynamicConfig, TableConfig
from embtrain.embedding.dynamic import DynamicTable
from embtrain.embedding.dynamic_device import hash_rows
from embtrain.embedding.rows_cache import CachedRows
from embtrain.embedding.rows_directory import DirectoryRows
from embtrain.embedding.rows_static import StaticRows
from embtrain.embedding.rowspace import RowContext, TableRows
from embtrain.embedding.tiers import KeyDirectory, StoreOpener, default_stores

__all__ = ["table_rows"]


def table_rows(table: TableConfig, ctx: RowContext, stores: StoreOpener | None = None
               ) -> TableRows:
    """``table``'s row space. ``stores`` opens a tiered table's row store
    (:data:`~embtrain.embedding.tiers.StoreOpener`; default: the one registered in
    :mod:`embtrain.storage`)."""
    if table.tier is None:
        if table.dynamic is None:
            return StaticRows(table, ctx)
        return hash_rows(table, ctx, DynamicTable(table, ctx.seed))
    p = table.placement
    cache = replace(table, rows=table.tier.cache_rows, tier=None,
                    dynamic=DynamicConfig(eviction=table.tier.eviction))
    rows = DynamicTable(cache, ctx.seed, 0 if p is None else p.row_offset,
                        1 if p is None else p.row_stride)
    # the cache's keys are the rows of a dynamic table's directory
    directory = KeyDirectory(replace(table, tier=None), ctx.seed) \
        if table.dynamic is not None else None
    widths = [1 if spec.per_row else table.dim for spec in ctx.slot_specs]
    inits = [spec.initial_value for spec in ctx.slot_specs]
    store = (stores or default_stores())(table, widths, ctx.seed, inits)
    if directory is None:
        return CachedRows(table, ctx, rows, store)
    return DirectoryRows(table, ctx, rows, store, directory)
