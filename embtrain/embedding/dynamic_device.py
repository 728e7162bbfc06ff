"""A dynamic table's key → row phase on the device: the row space of the ``cuda`` backend.

On ``cuda`` a dynamic table all in memory is a :class:`DeviceHashRows`: its index
(:class:`~embtrain.kernels.cuda_dynamic.DeviceHashIndex`), the row bookkeeping (each row's
key and liveness, the free-row stack, the pins) and the group arrays are the backend's arrays
(CuPy on a GPU, NumPy under numba's CUDA simulator: the same code runs on both). Per step
(:class:`DeviceKeyedGroup`, one table after the other, each table's features together):

1. the device lookup gives each position its row or a miss, and pins the rows found;
2. the distinct missed keys in order of first occurrence (feature by feature, position by
   position) with their counts: a sort (``xp.unique``) and the first positions' order;
3. training: admission (``none``: all; ``probability``: a device kernel; ``count`` and
   ``bloom``, whose state depends on the order keys arrive in, decide on the host from the
   step's distinct missed keys, a few kilobytes copied off the device, with the CPU table's
   own state and kernels); admitted keys pop rows off the free stack in that order, after
   evicting, when the free rows do not suffice, the live unpinned rows of smallest
   ``(score, key)`` (a device sort); the others read scratch rows ``capacity + j``;
   evaluation: scratch rows, or the shared zero row with ``missing: zeros``;
4. new rows and scratch rows filled on the device with their keys' initial values;
5. after a training step's update, TTL: the expired rows (a device scan) are removed.

Every decision of which key gets which row is the CPU table's rule
(:mod:`embtrain.embedding.dynamic`): the same free stack, popped and pushed in the same order,
the same victims. So a key gets the same row as on the CPU, whatever the device's thread
scheduling; only the index's slot layout may differ (concurrent inserts; deletion by
tombstone instead of backward shift), which no lookup can see.

Checkpoints, ``dynamic_table`` and imports use the host :class:`DynamicTable` the row space
keeps as a mirror: it is brought up to date from the device before it is read, and the device
from it after it is written (:meth:`DeviceHashRows.host_table`, :meth:`import_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embtrain.embedding.dynamic import DynamicTable, Placed, TableFullError
from embtrain.embedding.initializers import initializer_code, table_base
from embtrain.embedding.keyed import KeyedGroup
from embtrain.embedding.rows_hash import HashRows
from embtrain.embedding.rowspace import GroupArrays, RowContext, TableRows, TableState
from embtrain.kernels import KernelBackend, get_backend

__all__ = ["DeviceHashRows", "DeviceKeyedGroup", "hash_rows", "key_phase"]


def hash_rows(table: Any, ctx: RowContext, d: DynamicTable) -> HashRows:
    """The row space of a dynamic table in memory: on the device with the ``cuda`` backend."""
    if ctx.backend.name == "cuda":
        return DeviceHashRows(table, ctx, d)
    return HashRows(table, ctx, d)


def key_phase(spaces: Sequence[TableRows], backend: KernelBackend,
              group: Callable[[], GroupArrays],
              grow: Callable[[Sequence[int]], GroupArrays]) -> Any:
    """The key → row phase of a keyed group: on the device when its tables' row spaces are
    (:class:`DeviceKeyedGroup`), else the host phase (:class:`KeyedGroup`)."""
    if spaces and all(isinstance(s, DeviceHashRows) for s in spaces):
        return DeviceKeyedGroup(backend, group, grow)
    return KeyedGroup(get_backend("cpu"), group, grow)


class DeviceHashRows(HashRows):
    """A dynamic table in memory whose key → row phase runs on the device (see the module
    docstring). ``d``: the host mirror (configuration, counters, admission state)."""

    def __init__(self, table: Any, ctx: RowContext, d: DynamicTable):
        if table.is_half:  # fill_rows and the victims' scores assume float32 rows
            raise ValueError(f"table {table.name!r}: {table.dtype} dynamic tables do not run "
                             "on the cuda backend yet")
        super().__init__(table, ctx, d)
        self.xp = ctx.backend.xp
        self._push()

    # ------------------------------------------------------------------ host mirror

    def _push(self) -> None:
        """The device's bookkeeping from the host mirror."""
        from embtrain.kernels.cuda_dynamic import DeviceHashIndex

        xp, d = self.xp, self.d
        self.index = DeviceHashIndex.from_host(d.index)
        self.row_key = xp.array(d.row_key)
        self.row_live = xp.array(d.row_live)
        self.free = xp.array(d.free)
        self.pin = xp.array(d.pin)
        self._stale = False  # whether the mirror lags the device

    def host_table(self) -> DynamicTable:
        """The host mirror, brought up to date (index, rows, free stack, pins)."""
        if self._stale:
            host, d = self.ctx.backend.to_host, self.d
            d.index = self.index.to_host()
            d.row_key, d.row_live = host(self.row_key), host(self.row_live)
            d.free, d.pin = host(self.free), host(self.pin)
            self._stale = False
        return self.d

    def hash_table(self) -> DynamicTable:
        return self.host_table()

    def export_keys(self) -> np.ndarray:
        self.host_table()
        return super().export_keys()

    def _state_all(self) -> TableState:
        d = self.host_table()
        live = d.live_rows()
        return self._state_of(self.xp.asarray(live + self.offset), d.row_key[live])

    def export_range(self, lo: int, hi: int) -> TableState:
        d = self.host_table()
        live = d.live_rows()
        k = d.row_key[live]
        a, b = np.searchsorted(k, [lo, hi])
        return self._state_of(self.xp.asarray(live[a:b] + self.offset), k[a:b])

    def _chunk_bounds(self, step: int) -> list[int]:
        self.host_table()
        return super()._chunk_bounds(step)

    def import_rows(self, keys: np.ndarray, values: np.ndarray,
                    slots: list[tuple[int, np.ndarray]], counts: np.ndarray | None,
                    last: np.ndarray | None, extra: dict[str, np.ndarray]) -> None:
        """``HashRows.import_rows`` on the mirror, then the device from it."""
        d = self.host_table()
        found = d.find(keys)
        local = d.upsert(keys)  # raises (changing nothing) when the keys do not fit
        fresh = found < 0
        self.fill_keys(local[fresh], keys[fresh])
        d.load_admission_state(extra)
        self._write_at(self.xp.asarray(local + self.offset), values, slots, counts, last,
                       keys.size)
        self._push()

    # ------------------------------------------------------------------ rows on the device

    def initial_values(self, keys: Any) -> Any:
        """Initial values of region keys ``keys`` (a device array), computed on the device."""
        xp, d, p = self.xp, self.d, self.table.placement
        dim = self.table.dim
        full = max(0 if p is None else p.full_dim, dim)
        col = 0 if p is None else p.col_start
        keys = xp.asarray(keys, dtype=np.int64)
        out = xp.empty((int(keys.shape[0]), full), dtype=np.float32)
        rows = keys if (d.init_offset, d.init_stride) == (0, 1) else \
            d.init_offset + d.init_stride * keys
        kind, param = initializer_code(d.config.initializer)
        self.ctx.backend.init_rows(out, xp.ascontiguousarray(rows), table_base(d.seed, d.name),
                                   kind, param)
        return out if full == dim else out[:, col:col + dim]

    def fill_rows(self, rows: Any, init: Any) -> None:
        """Fresh rows (region-local ``rows``): values ``init`` (zeros if None), slots at their
        initial values, metadata zero (``kernels.dynamic.fresh_rows``, on the device)."""
        if rows.size == 0:
            return
        xp, g = self.xp, self.g
        target = xp.asarray(rows, dtype=np.int64) + self.offset
        g.values[target] = 0.0 if init is None else xp.asarray(init, dtype=np.float32)
        for spec, arr in zip(self.ctx.slot_specs, g.slots, strict=True):
            arr[target] = np.float32(spec.initial_value)
        g.meta[target] = 0

    def _remove(self, rows: Any) -> None:
        """Live ``rows`` out of the index, pushed on the free stack in their order."""
        k = int(rows.shape[0])
        if k == 0:
            return
        d = self.d
        self.index.delete(self.row_key[rows])
        self.row_live[rows] = 0
        self.free[d.n_free:d.n_free + k] = rows
        d.n_free += k
        self._stale = True

    def _insert(self, keys: Any, epoch: int) -> Any:
        """Rows popped off the free stack for ``keys`` (absent, distinct), in order."""
        xp, d = self.xp, self.d
        k = int(keys.shape[0])
        rows = xp.ascontiguousarray(self.free[d.n_free - k:d.n_free][::-1])
        d.n_free -= k
        if k:
            self.index.insert(keys, rows)
            self.row_key[rows] = keys
            self.row_live[rows] = 1
            self.pin[rows] = np.int32(epoch)
            self._stale = True
        return rows

    def _victims(self, k: int, epoch: int) -> Any:
        """``DynamicTable.victims`` on the device: the ``k`` live rows not pinned at ``epoch``
        with the smallest ``(score, key)``, ascending by row."""
        xp = self.xp
        col = 1 if self.d.dyn.eviction == "lru" else 0
        cand = xp.flatnonzero((self.row_live != 0) & (self.pin != np.int32(epoch)))
        if cand.shape[0] <= k:
            return cand.astype(np.int64)
        scores = self.table_meta()[cand, col].astype(np.int64)
        order = xp.lexsort(xp.stack([self.row_key[cand], scores]))
        return xp.sort(cand[order[:k]]).astype(np.int64)

    def _admit(self, keys: Any, counts: Any) -> Any:
        xp, kind = self.xp, self.d.dyn.admission
        if kind == "none":
            return xp.ones(int(keys.shape[0]), dtype=np.bool_)
        if kind == "probability":
            from embtrain.kernels.cuda_dynamic import probability_admit

            return probability_admit(self.d.prob_base, float(self.d.dyn.p), keys)
        host = self.ctx.backend.to_host  # order-dependent state: decided on the host
        return xp.asarray(self.d.admit(host(keys), host(counts)))

    def place(self, keys: Any, counts: Any, training: bool, epoch: int, step: int) -> Placed:
        """``DynamicTable.place`` on the device (the same rows for the same keys)."""
        xp, d = self.xp, self.d
        cap, n = d.capacity, int(keys.shape[0])
        if not training:
            if d.dyn.missing == "zeros":
                return Placed(xp.full(n, cap, dtype=np.int64), scratch_zero=n > 0)
            return Placed(cap + xp.arange(n, dtype=np.int64), scratch_keys=keys)
        admitted = self._admit(keys, counts)
        new, rest = xp.flatnonzero(admitted), xp.flatnonzero(~admitted)
        slot_of = xp.empty(n, dtype=np.int64)
        slot_of[rest] = cap + xp.arange(int(rest.shape[0]), dtype=np.int64)
        d.stats.not_admitted += int(rest.shape[0])
        need = int(new.shape[0]) - d.n_free
        victims = evicted = xp.empty(0, dtype=np.int64)
        if need > 0:
            if d.dyn.eviction == "none":
                raise TableFullError(d.name, step, cap, d.live, int(new.shape[0]))
            victims = self._victims(need, epoch)
            if int(victims.shape[0]) < need:
                raise TableFullError(d.name, step, cap, d.live, int(new.shape[0]),
                                     evictable=d.n_free + int(victims.shape[0]))
            evicted = self.row_key[victims]
            self._remove(victims)
            d.stats.evictions += need
        rows = self._insert(xp.ascontiguousarray(keys[new]), epoch)
        d.stats.inserts += int(new.shape[0])
        slot_of[new] = rows
        return Placed(slot_of, new_rows=rows, new_keys=keys[new], scratch_keys=keys[rest],
                      evicted_rows=victims, evicted_keys=evicted)

    def resolve_keys(self, keys: Sequence[Any], training: bool, epoch: int,
                     step: int) -> tuple[list[Any], Placed]:
        """The rows of the table's features' ``keys`` (misses placed) and the placement."""
        xp, st = self.xp, self.d.stats
        sizes = [int(k.shape[0]) for k in keys]
        flat = xp.concatenate([xp.asarray(k, dtype=np.int64) for k in keys]) if keys else \
            xp.empty(0, dtype=np.int64)
        rows = self.index.lookup(flat)
        miss = rows < 0
        self.pin[rows[~miss]] = np.int32(epoch)  # eviction spares the rows the batch reads
        missed = flat[miss]
        st.lookups += int(flat.shape[0])
        st.misses += int(missed.shape[0])
        if missed.shape[0]:
            uniq, first, inverse, counts = xp.unique(missed, return_index=True,
                                                     return_inverse=True, return_counts=True)
            order = xp.argsort(first)  # distinct keys in order of first occurrence
            rank = xp.empty_like(order)
            rank[order] = xp.arange(int(order.shape[0]), dtype=order.dtype)
            distinct, counts, ids = uniq[order], counts[order], rank[inverse.reshape(-1)]
        else:
            distinct = counts = ids = xp.empty(0, dtype=np.int64)
        st.distinct_misses += int(distinct.shape[0])
        placed = self.place(distinct, counts, training, epoch, step)
        if missed.shape[0]:
            rows[miss] = placed.slot_of[ids]
        bounds = np.cumsum([0, *sizes])
        return [rows[bounds[i]:bounds[i + 1]] for i in range(len(sizes))], placed

    def expire(self, step: int) -> None:
        """TTL after training step ``step`` (``DynamicTable.expire`` on the device)."""
        xp, d = self.xp, self.d
        ttl = d.dyn.ttl_steps
        if ttl is None:
            return
        limit = int(step) - int(ttl)
        if d.ttl_low > limit:
            return
        last = self.table_meta()[:, 1].astype(np.int64) - 1
        live = self.row_live != 0
        gone = live & (last <= limit)
        rest = last[live & ~gone]
        rows = xp.flatnonzero(gone).astype(np.int64)
        self._remove(rows)
        d.ttl_low = int(rest.min()) if rest.shape[0] else 1 << 62
        d.stats.expired += int(rows.shape[0])


@dataclass
class DeviceStep:
    """A device keyed group's rows for one step: each feature's rows (final) and per table
    the placement of its missed keys (filled by :meth:`DeviceKeyedGroup.read_in`)."""

    rows: list[Any]
    placed: list[Placed]


class DeviceKeyedGroup:
    """The key → row phase of a group of :class:`DeviceHashRows` (the engine's keyed-group
    interface: ``resolve``, ``write_back``, ``read_in``)."""

    def __init__(self, backend: KernelBackend, group: Callable[[], GroupArrays],
                 grow: Callable[[Sequence[int]], GroupArrays]):
        self.backend = backend
        self._group = group
        self._grow = grow

    def resolve(self, keys: list[Any], training: bool, step: int) -> DeviceStep:
        """Each feature's keys as rows of its table's region; misses placed, the group grown
        when the step needs more scratch rows."""
        group = self._group()
        spaces: list[DeviceHashRows] = group.spaces  # type: ignore[attr-defined]
        group.epoch = group.epoch % 2_000_000_000 + 1
        rows: list[Any] = [None] * len(keys)
        placed = []
        for ti, space in enumerate(spaces):
            feats = group.feats_of(ti).tolist()  # type: ignore[attr-defined]
            got, p = space.resolve_keys([keys[f] for f in feats], training, group.epoch, step)
            for f, r in zip(feats, got, strict=True):
                rows[f] = r
            placed.append(p)
        need = [int(p.scratch_keys.shape[0]) + int(p.scratch_zero) for p in placed]
        reserve = group.reserve.tolist()  # type: ignore[attr-defined]
        if any(n > r for n, r in zip(need, reserve, strict=True)):
            self._grow(need)
        return DeviceStep(rows, placed)

    def write_back(self, rows: DeviceStep) -> None:
        """Nothing: a table in memory has no row store."""

    def read_in(self, rows: DeviceStep) -> list[Any]:
        """New and scratch rows filled; returns each feature's rows."""
        spaces: list[DeviceHashRows] = self._group().spaces  # type: ignore[attr-defined]
        for space, p in zip(spaces, rows.placed, strict=True):
            space.read_in(p)
        return rows.rows
