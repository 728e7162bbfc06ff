"""A static table's cache over a row store: its rows live in ``cache_rows`` rows of its
group (the cache is a hash table whose keys are the table's rows) in front of a
:class:`~embtrain.embedding.tiers.RowStore` holding every row written back (see
:mod:`embtrain.embedding.tiers`)."""

from __future__ import annotations

import numpy as np

from embtrain.embedding.config import TableConfig
from embtrain.embedding.dynamic import DynamicTable, Placed
from embtrain.embedding.halves import half_pattern, stored_as
from embtrain.embedding.keyed import KeyedRows
from embtrain.embedding.rowspace import KeyOutOfRangeError, RowContext, TableState
from embtrain.embedding.tiers import RowStore

__all__ = ["IMPORT_CHUNK_ROWS", "CachedRows"]

IMPORT_CHUNK_ROWS = 1 << 16  # keys a tiered table imports at a time


class CachedRows(KeyedRows):
    """Cache rows of a tiered static table in front of its row store ``store``."""

    inserts_always = True
    directory = None

    def __init__(self, table: TableConfig, ctx: RowContext, cache: DynamicTable,
                 store: RowStore):
        super().__init__(table, ctx, cache)
        self.store = store
        cache.store = store  # the cache breaks eviction ties as a cache does

    @property
    def region_rows(self) -> int:
        assert self.table.tier is not None
        return self.table.tier.cache_rows

    @property
    def reads_ahead(self) -> bool:
        """Whether the store can read rows ahead (:meth:`prefetch`)."""
        return hasattr(self.store, "prefetch")

    def check_keys(self, keys: list[np.ndarray]) -> None:
        """Keys of a tiered (static) table must be rows of it."""
        t = self.table
        for k in keys:
            if k.size and (int(k.min()) < 0 or int(k.max()) >= t.rows):
                bad = int(k.min()) if int(k.min()) < 0 else int(k.max())
                f = next(f.name for f in self.g.features if f.table == t.name)  # type: ignore[attr-defined]
                raise KeyOutOfRangeError(f, bad, t.name, t.rows)

    # ------------------------------------------------------------------ the step's tier I/O

    def _store_keys(self, keys: np.ndarray) -> np.ndarray:
        """Of the next batch's keys, the store rows they read (static: the keys)."""
        return keys

    def prefetch(self, keys: list[np.ndarray]) -> None:
        """Start reading, in the background, the store rows ``keys`` will miss in the cache:
        nothing enters or leaves the cache before the next resolve, which finds them read."""
        flat = self._store_keys(np.concatenate(keys))
        miss = flat[self.d.find(flat) < 0]
        miss = np.unique(miss[(miss >= 0) & (miss < self.table.rows)])
        if miss.size:
            self.store.prefetch(miss)  # type: ignore[attr-defined]

    def _row_state(self, rows: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        target = rows + self.offset
        return (self.g.values[target], [arr[target] for arr in self.g.slots],
                self.g.meta[target])

    def write_back(self, placed: Placed) -> None:
        """Evicted cache rows (still holding their state) to the store."""
        if placed.evicted_rows.size:
            self._store_write(placed.evicted_keys, *self._row_state(placed.evicted_rows))

    def _store_write(self, keys: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
                     meta: np.ndarray) -> None:
        self.store.write(keys, values, slots, meta)

    def read_in(self, placed: Placed) -> None:
        """New cache rows from the store (a store that fills every row gives them whole;
        otherwise the initial state, then the rows it holds), and the scratch rows."""
        if getattr(self.store, "fills_all", False):
            self._read_whole(placed.new_rows, placed.new_keys)
        else:
            self.fill_keys(placed.new_rows, placed.new_keys)
            if placed.new_rows.size:
                self._read_held(placed.new_rows, placed.new_keys)
        self.fill_scratch(placed)

    def _read_held(self, rows: np.ndarray, keys: np.ndarray) -> None:
        """Fresh cache rows (already at their initial state) from the store, for the rows it
        holds."""
        values, slots, meta = self._row_state(rows)
        found = self.store.read(keys, values, slots, meta)
        if found.any():
            g = self.g
            target = rows[found] + self.offset
            g.values[target] = values[found]
            for arr, got in zip(g.slots, slots, strict=True):
                arr[target] = got[found]
            g.meta[target] = meta[found]

    def _read_whole(self, rows: np.ndarray, keys: np.ndarray) -> None:
        """Fresh cache rows straight from a store that fills every row (its stored state, or
        the initial state of a row never written: the engine's fill would be thrown away)."""
        if rows.size == 0:
            return
        g = self.g
        n = rows.size
        values = np.empty((n, g.dim), g.values.dtype)  # the table's stored form
        slots = [np.empty((n, arr.shape[1]), arr.dtype) for arr in g.slots]
        meta = np.empty((n, 2), np.int32)
        self.store.read(keys, values, slots, meta)
        target = rows + self.offset
        g.values[target] = values
        for arr, got in zip(g.slots, slots, strict=True):
            arr[target] = got
        g.meta[target] = meta

    # ------------------------------------------------------------------ metrics

    def metrics(self) -> dict[str, dict[str, float]]:
        return {"tier": self.tier_metrics()}

    def tier_metrics(self) -> dict[str, float]:
        """Cache rows, lookups and misses (key occurrences), hit rate, distinct misses,
        evictions (written back) and what the store read and wrote."""
        d = self.d
        st = d.stats
        return {"cache_rows": d.capacity, "cached": d.live,
                "lookups": st.lookups, "misses": st.misses,
                "hit_rate": round(1 - st.misses / st.lookups, 6) if st.lookups else 0.0,
                "distinct_misses": st.distinct_misses, "evictions": st.evictions,
                **self.store.counters.as_dict()}  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ export / import

    def streams(self) -> bool:
        return True

    def export_rows(self) -> int:
        return self.table.rows

    def _all_rows(self) -> np.ndarray:
        """Every row of the table, ascending by key."""
        return np.arange(self.table.rows, dtype=np.int64)

    def _state_all(self) -> TableState:
        return self._tiered_state(self._all_rows())

    def export_range(self, lo: int, hi: int) -> TableState:
        return self._tiered_state(np.arange(max(int(lo), 0), min(int(hi), self.table.rows),
                                            dtype=np.int64))

    def _stored(self, rows: np.ndarray, values: np.ndarray, slots: list[np.ndarray],
                meta: np.ndarray) -> None:
        """The store's state of ``rows`` into the outputs (the rows it holds)."""
        self.store.read(rows, values, slots, meta)

    def _full_rows(self, rows: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        """Whole state of rows wherever they are: initial, else the store's, else (newest)
        the cache's (in the table's stored form: a half table's initial values narrowed to
        nearest, as its cache rows start)."""
        vcode, scode = (int(c) for c in self.codes)
        values = stored_as(self.initial_values(rows), vcode)
        slots = [np.full((rows.size, arr.shape[1]), half_pattern(spec.initial_value, scode)
                         if scode else spec.initial_value, arr.dtype)
                 for spec, arr in zip(self.ctx.slot_specs, self.g.slots, strict=True)]
        meta = np.zeros((rows.size, 2), np.int32)
        self._stored(rows, values, slots, meta)
        cached = self.d.find(rows)
        hit = np.flatnonzero(cached >= 0)
        if hit.size:
            cv, cs, cm = self._row_state(cached[hit])
            values[hit] = cv
            for dst, src in zip(slots, cs, strict=True):
                dst[hit] = src
            meta[hit] = cm
        return values, slots, meta

    def _keys_of(self, rows: np.ndarray) -> np.ndarray:
        return rows

    def _tiered_state(self, rows: np.ndarray) -> TableState:
        values, slots, meta = self._full_rows(rows)
        return TableState(
            keys=self._keys_of(rows),
            values=values,
            slots={spec.name: (a.reshape(-1) if spec.per_row else a)
                   for spec, a in zip(self.ctx.slot_specs, slots, strict=True)},
            update_count=meta[:, 0].astype(np.int64),
            last_step=meta[:, 1].astype(np.int64) - 1,
            dtype=self.table.dtype, state_dtype=self.table.state_dtype,
        )

    def import_rows(self, keys: np.ndarray, values: np.ndarray,
                    slots: list[tuple[int, np.ndarray]], counts: np.ndarray | None,
                    last: np.ndarray | None, extra: dict[str, np.ndarray]) -> None:
        self._import_rows(keys, values, slots, counts, last)

    def _import_rows(self, keys: np.ndarray, values: np.ndarray,
                     slots: list[tuple[int, np.ndarray]], counts: np.ndarray | None,
                     last: np.ndarray | None) -> None:
        """Imported rows go where the row is: its cache row, else the store (whole records);
        :data:`IMPORT_CHUNK_ROWS` keys at a time, so a large import holds no whole-table copy."""
        g = self.g
        n, step = keys.size, IMPORT_CHUNK_ROWS
        if n > step:
            for a in range(0, n, step):
                b = min(n, a + step)
                self._import_rows(keys[a:b], values[a:b],
                                  [(i, src.reshape(n, g.slots[i].shape[1])[a:b])
                                   for i, src in slots],
                                  None if counts is None else counts[a:b],
                                  None if last is None else last[a:b])
            return
        cur_v, cur_s, cur_m = self._full_rows(keys)
        cur_v[:] = values
        for i, src in slots:
            cur_s[i][:] = src.reshape(keys.size, cur_s[i].shape[1])
        if counts is not None:
            cur_m[:, 0] = np.minimum(counts, np.iinfo(np.int32).max)
        if last is not None:
            cur_m[:, 1] = last
        cached = self.d.find(keys)
        hit = np.flatnonzero(cached >= 0)
        if hit.size:
            target = cached[hit] + self.offset
            g.values[target] = cur_v[hit]
            for arr, src in zip(g.slots, cur_s, strict=True):
                arr[target] = src[hit]
            g.meta[target] = cur_m[hit]
        rest = np.flatnonzero(cached < 0)
        if rest.size:
            self._store_write(keys[rest], cur_v[rest], [a[rest] for a in cur_s], cur_m[rest])
