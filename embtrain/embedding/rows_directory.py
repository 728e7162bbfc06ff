"""A dynamic table's cache over a row store, with a key directory: the directory
(:class:`~embtrain.embedding.tiers.KeyDirectory`) maps keys to the rows the table would use all
in memory, with its admission, eviction and TTL; those rows are the cache's keys, as a
static tiered table's rows are (see :mod:`embtrain.embedding.tiers`)."""

from __future__ import annotations

import numpy as np

from embtrain.embedding.config import TableConfig
from embtrain.embedding.dynamic import DynamicTable, Placed
from embtrain.embedding.rows_cache import CachedRows
from embtrain.embedding.rowspace import RowContext, TableState
from embtrain.embedding.tiers import KeyDirectory, RowStore
from embtrain.kernels import dynamic as kd

__all__ = ["DirectoryRows"]


class DirectoryRows(CachedRows):
    """Cache rows of a tiered dynamic table; the cache's keys are its directory's rows."""

    def __init__(self, table: TableConfig, ctx: RowContext, cache: DynamicTable,
                 store: RowStore, directory: KeyDirectory):
        super().__init__(table, ctx, cache, store)
        self.directory = directory  # type: ignore[assignment]

    def check_keys(self, keys: list[np.ndarray]) -> None:
        """Any key: the directory gives it a row or a scratch row."""

    def initial_values(self, keys: np.ndarray) -> np.ndarray:
        """Initial values of directory rows ``keys`` (their keys' initial values)."""
        return self.key_values(self.directory.table.row_key[keys])

    def key_values(self, keys: np.ndarray) -> np.ndarray:
        """Initial values of the table's own keys ``keys``."""
        p = self.table.placement
        return self.directory.table.initial_values(
            keys, self.table.dim, 0 if p is None else p.col_start, 0 if p is None else p.full_dim)

    def place_directory(self, key_list: object, row_list: object, sub_keys: list[np.ndarray],
                        sub_rows: list[np.ndarray], local: np.ndarray, training: bool,
                        epoch: int, step: int) -> tuple[Placed, int]:
        """The directory's part of the key → row phase, after the fused directory lookup
        filled ``sub_rows`` (positions ``local`` of the group's directory features): missed
        keys admitted and inserted (evicting: the evicted keys' cached rows are dropped).
        Returns the placement and the directory's capacity (rows from it are scratch)."""
        directory, dt = self.directory, self.directory.table
        n_miss = sum(int(np.count_nonzero(sub_rows[i] < 0)) for i in local.tolist())
        dt.stats.lookups += sum(int(sub_keys[i].shape[0]) for i in local.tolist())
        dt.stats.misses += n_miss
        mk = np.empty(n_miss, np.int64)
        mc = np.empty(n_miss, np.int64)
        n = 0
        if n_miss:
            scratch = dt.scratch_index(n_miss)
            n = kd.collect_misses(key_list, row_list, local, scratch, mk, mc)
            kd.clear_index(scratch, mk[:n])
        if training and n > dt.n_free:  # eviction ahead: spare the rows found, score all
            kd.pin_rows(row_list, local, dt.pin, np.int32(epoch))
            directory.sync_meta(self.d, self.table_meta())
        p = dt.place(mk[:n], mc[:n], training, directory.meta, epoch, step)
        if p.evicted_rows.size:  # their keys are gone: so are their cached rows
            self._drop_cached(p.evicted_rows)
            directory.reset(p.evicted_rows)
        directory.reset(p.new_rows)
        if p.slot_of.size:
            kd.assign_misses(row_list, local, p.slot_of)
        return p, dt.capacity

    def _drop_cached(self, keys: np.ndarray) -> None:
        """Forget the cached rows of cache keys ``keys`` (no write-back: they are stale)."""
        d = self.d
        rows = d.find(keys)
        rows = rows[rows >= 0]
        if rows.size:
            d.version += 1
            d.n_free = kd.remove_rows(d.index, rows, d.row_key, d.row_live, d.free, d.n_free)

    def round_keys(self, rows: np.ndarray) -> np.ndarray:
        """The table's own key of each cache row (the directory's key of the row cached)."""
        dt = self.directory.table
        return np.where(rows < self.region_rows,
                        dt.row_key[np.minimum(super().round_keys(rows), dt.capacity - 1)], 0)

    def _store_keys(self, keys: np.ndarray) -> np.ndarray:
        """Keys → the directory's rows held by the store."""
        flat = self.directory.table.find(keys)
        flat = flat[flat >= 0]
        return flat[self.directory.on_store[flat]]

    def _store_write(self, keys: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
                     meta: np.ndarray) -> None:
        self.directory.on_store[keys] = True
        self.directory.meta[keys] = meta
        self.store.write(keys, values, slots, meta)

    def read_in(self, placed: Placed) -> None:
        """New cache rows at their keys' initial state, then the rows the store holds for
        their current key; and the scratch rows."""
        self.fill_keys(placed.new_rows, placed.new_keys)
        if placed.new_rows.size:
            held = self.directory.on_store[placed.new_keys]
            rows, keys = placed.new_rows[held], placed.new_keys[held]
            if rows.size:
                self._read_held(rows, keys)
        self.fill_scratch(placed)

    def expire(self, step: int) -> None:
        dt, ttl = self.directory.table, self.directory.table.dyn.ttl_steps
        if ttl is None or dt.ttl_low > step - ttl:
            return
        self.directory.sync_meta(self.d, self.table_meta())
        gone = dt.expire(self.directory.meta, step)
        if gone.size:
            self._drop_cached(gone)
            self.directory.reset(gone)

    def hash_table(self) -> DynamicTable | None:
        return self.directory.table

    def metrics(self) -> dict[str, dict[str, float]]:
        return {"dynamic": self.directory.table.metrics(), "tier": self.tier_metrics()}

    def export_extra(self) -> dict[str, np.ndarray]:
        return self.directory.table.admission_state()

    def export_rows(self) -> int:
        return self.directory.table.live

    def export_keys(self) -> np.ndarray:
        dt = self.directory.table
        return dt.row_key[dt.live_rows()]

    def _all_rows(self) -> np.ndarray:
        return self.directory.table.live_rows()

    def export_range(self, lo: int, hi: int) -> TableState:
        dt = self.directory.table
        live = dt.live_rows()
        a, b = np.searchsorted(dt.row_key[live], [lo, hi])
        return self._tiered_state(live[a:b])

    def _chunk_bounds(self, step: int) -> list[int]:
        return self._key_bounds(self.directory.table, step)

    def _keys_of(self, rows: np.ndarray) -> np.ndarray:
        return self.directory.table.row_key[rows]

    def _stored(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
                meta: np.ndarray) -> None:
        """Only the rows the store holds for their current key."""
        held = np.flatnonzero(self.directory.on_store[rows])
        if held.size:
            hv, hm = values[held], meta[held]
            hs = [a[held] for a in slots]
            self.store.read(rows[held], hv, hs, hm)
            values[held], meta[held] = hv, hm
            for dst, src in zip(slots, hs, strict=True):
                dst[held] = src

    def check_import(self, keys: np.ndarray) -> None:
        """Any key fits a dynamic table (capacity is checked by the upsert)."""

    def import_rows(self, keys: np.ndarray, values: np.ndarray,
                    slots: list[tuple[int, np.ndarray]], counts: np.ndarray | None,
                    last: np.ndarray | None, extra: dict[str, np.ndarray]) -> None:
        dt = self.directory.table
        found = dt.find(keys)  # the keys' rows in the directory (new ones fresh)
        local = dt.upsert(keys)  # raises (changing nothing) if no fit
        self.directory.reset(local[found < 0])
        dt.load_admission_state(extra)
        self._import_rows(local, values, slots, counts, last)
