"""A dynamic table's key → row phase on the device: the row space of the ``cuda`` backend.

On ``cuda`` a dynamic table all in memory is a :class:`DeviceHashRows`: its index
(:class:`~embtrain.kernels.cuda_dynamic.DeviceHashIndex`), the row bookkeeping (each row's
key and liveness, the free-row stack, the pins) and the group arrays are the backend's arrays
(CuPy on a GPU, NumPy under numba's CUDA simulator: the same code runs on both). Per step
(:class:`DeviceKeyedGroup`; the group's tables' indexes share one device buffer):

1. one lookup launch for every key of the group gives each position its row or a miss;
2. one sort gives each table's distinct missed keys in order of first occurrence (feature by
   feature, position by position) with their counts; then, table by table (the rows found
   pinned first when eviction is ahead):
3. training: admission (``none``: all; ``probability``: a device kernel; ``count`` and
   ``bloom``, whose state depends on the order keys arrive in, decide on the host from the
   step's distinct missed keys, a few kilobytes copied off the device, with the CPU table's
   own state and kernels); admitted keys pop rows off the free stack in that order, after
   evicting, when the free rows do not suffice, the live unpinned rows of smallest
   ``(score, key)`` (a device sort); the others read scratch rows ``capacity + j``;
   evaluation: scratch rows, or the shared zero row with ``missing: zeros``;
4. new rows and scratch rows filled on the device with their keys' initial values;
5. after a training step's update, TTL: the expired rows (a device scan) are removed.

A half (bfloat16/float16) table's rows and slots are in its dtype on the device too: fresh rows
are narrowed to nearest, and each row read in a step has its key written to the group's
device ``row_round``, so the update rounds stochastically by key, as on the CPU.

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
from embtrain.embedding.halves import half_pattern
from embtrain.embedding.initializers import initializer_code, table_base
from embtrain.embedding.keyed import KeyedGroup, write_round_keys
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
        return DeviceKeyedGroup(backend, group, grow, spaces)  # type: ignore[arg-type]
    return KeyedGroup(get_backend("cpu"), group, grow)


class DeviceHashRows(HashRows):
    """A dynamic table in memory whose key → row phase runs on the device (see the module
    docstring). ``d``: the host mirror (configuration, counters, admission state)."""

    looks_ahead = False  # its lookup runs on the device, in the forward

    def __init__(self, table: Any, ctx: RowContext, d: DynamicTable):
        super().__init__(table, ctx, d)
        from embtrain.kernels.cuda_dynamic import DeviceHashIndex

        self.xp = ctx.backend.xp
        self.index = DeviceHashIndex(int(d.index.shape[0]))
        self._push()

    # ------------------------------------------------------------------ host mirror

    def _push(self) -> None:
        """The device's bookkeeping from the host mirror."""
        xp, d = self.xp, self.d
        self.index.load(d.index)  # in place (the group's lookup reads it where it is)
        self.row_key = xp.array(d.row_key)
        self.row_live = xp.array(d.row_live)
        self.free = xp.array(d.free)
        self.pin_rows = xp.array(d.pin)
        self._stale = False  # whether the mirror lags the device

    def host_table(self) -> DynamicTable:
        """The host mirror, brought up to date (index, rows, free stack, pins)."""
        if self._stale:
            host, d = self.ctx.backend.to_host, self.d
            d.index = self.index.to_host()
            d.row_key, d.row_live = host(self.row_key), host(self.row_live)
            d.free, d.pin = host(self.free), host(self.pin_rows)
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
        vcode, scode = (int(c) for c in self.codes)
        target = xp.asarray(rows, dtype=np.int64) + self.offset
        if init is None:
            g.values[target] = 0  # +0.0 in every dtype
        elif vcode:  # a half table's fresh rows, narrowed to nearest (as on the CPU)
            init = xp.ascontiguousarray(xp.asarray(init, dtype=np.float32))
            narrowed = xp.empty(init.shape, dtype=np.uint16)
            self.ctx.backend.narrow_block(narrowed, init, vcode)
            g.values[target] = narrowed
        else:
            g.values[target] = xp.asarray(init, dtype=np.float32)
        for spec, arr in zip(self.ctx.slot_specs, g.slots, strict=True):
            arr[target] = (half_pattern(spec.initial_value, scode) if scode
                           else np.float32(spec.initial_value))
        g.meta[target] = 0

    def round_keys(self, rows: Any) -> Any:
        """``HashRows.round_keys`` on the device: the key of each region row (0 for a
        scratch row, whose update is thrown away)."""
        xp, cap = self.xp, self.region_rows
        return xp.where(rows < cap, self.row_key[xp.minimum(rows, cap - 1)], 0)

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
            self.pin_rows[rows] = np.int32(epoch)
            self._stale = True
        return rows

    def _victims(self, k: int, epoch: int) -> Any:
        """``DynamicTable.victims`` on the device: the ``k`` live rows not pinned at ``epoch``
        with the smallest ``(score, key)``, ascending by row."""
        xp = self.xp
        col = 1 if self.d.dyn.eviction == "lru" else 0
        cand = xp.flatnonzero((self.row_live != 0) & (self.pin_rows != np.int32(epoch)))
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

    def pin(self, rows: Any, epoch: int) -> None:
        """The rows the batch found (``rows``; -1: a miss) are spared by this step's eviction."""
        self.pin_rows[rows[rows >= 0]] = np.int32(epoch)

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
    interface: ``resolve``, ``write_back``, ``read_in``). The tables' indexes share one device
    buffer, so the group's keys are looked up in one launch and its misses deduplicated in one
    sort; what is placed where is then decided table by table (as on the CPU)."""

    def __init__(self, backend: KernelBackend, group: Callable[[], GroupArrays],
                 grow: Callable[[Sequence[int]], GroupArrays],
                 spaces: Sequence[DeviceHashRows]):
        from embtrain.kernels.cuda_dynamic import share_storage

        self.backend = backend
        self._group = group
        self._grow = grow
        self._indexes = share_storage([s.index for s in spaces])  # the group's row spaces
        self.ahead_used, self.ahead_items = 0, [0, 0]

    def look_ahead(self, keys: list[Any]) -> None:
        """Nothing: the device's lookup runs in the forward (the host phase's
        :meth:`KeyedGroup.look_ahead` hides it behind the dense part)."""

    def settle(self) -> None:
        """Nothing to wait for (see :meth:`look_ahead`)."""

    def resolve(self, keys: list[Any], training: bool, step: int) -> DeviceStep:
        """Each feature's keys as rows of its table's region; misses placed, the group grown
        when the step needs more scratch rows."""
        from embtrain.kernels.cuda_dynamic import lookup_tables

        xp, host = self.backend.xp, self.backend.to_host
        group = self._group()
        spaces: list[DeviceHashRows] = group.spaces  # type: ignore[attr-defined]
        nt = len(spaces)
        epoch = group.epoch = group.epoch % 2_000_000_000 + 1
        feats = [group.feats_of(t).tolist() for t in range(nt)]  # type: ignore[attr-defined]
        order = [f for fs in feats for f in fs]  # table by table, each its features in order
        sizes = [int(keys[f].shape[0]) for f in order]
        per_table = [sum(int(keys[f].shape[0]) for f in fs) for fs in feats]
        flat = xp.concatenate([xp.asarray(keys[f], dtype=np.int64) for f in order])
        key_table = xp.repeat(xp.arange(nt, dtype=np.int64), per_table)
        rows = lookup_tables(self._indexes, flat, key_table)
        at = xp.flatnonzero(rows < 0)  # missed positions, ascending
        missed, missed_table = flat[at], key_table[at]
        distinct, tables, counts, ids = _first_occurrences(xp, missed, missed_table)
        n_miss = host(xp.bincount(missed_table, minlength=nt)).tolist()
        bounds = host(xp.searchsorted(tables, xp.arange(nt + 1, dtype=np.int64))).tolist()
        placed, slots = [], []
        starts = np.cumsum([0, *per_table]).tolist()
        for t, space in enumerate(spaces):
            st, a, b = space.d.stats, bounds[t], bounds[t + 1]
            st.lookups += per_table[t]
            st.misses += n_miss[t]
            st.distinct_misses += b - a
            if b == a:
                placed.append(Placed(xp.empty(0, dtype=np.int64)))
                continue
            if (training or space.inserts_always) and b - a > space.d.n_free:
                space.pin(rows[starts[t]:starts[t + 1]], epoch)  # eviction ahead
            p = space.place(distinct[a:b], counts[a:b], training, epoch, step)
            placed.append(p)
            slots.append(p.slot_of)
        if slots:
            rows[at] = xp.concatenate(slots)[ids]
        need = [int(p.scratch_keys.shape[0]) + int(p.scratch_zero) for p in placed]
        reserve = group.reserve.tolist()  # type: ignore[attr-defined]
        if any(n > r for n, r in zip(need, reserve, strict=True)):
            self._grow(need)
        cut = np.cumsum([0, *sizes]).tolist()
        out: list[Any] = [None] * len(keys)
        for i, f in enumerate(order):
            out[f] = rows[cut[i]:cut[i + 1]]
        return DeviceStep(out, placed)

    def write_back(self, rows: DeviceStep) -> None:
        """Nothing: a table in memory has no row store."""

    def read_in(self, rows: DeviceStep) -> list[Any]:
        """New and scratch rows filled; returns each feature's rows."""
        group = self._group()
        spaces: list[DeviceHashRows] = group.spaces  # type: ignore[attr-defined]
        for space, p in zip(spaces, rows.placed, strict=True):
            space.read_in(p)
        write_round_keys(group.scratch.row_round, group, rows.rows)  # type: ignore[attr-defined]
        return rows.rows


def _first_occurrences(xp: Any, keys: Any, tables: Any) -> tuple[Any, Any, Any, Any]:
    """The distinct ``(table, key)`` pairs of ``keys`` (``tables``: each key's table, in
    ascending runs), in order of first occurrence: their keys, tables and occurrences, and
    each key's place among them (``ids``). One sort by (table, key, position)."""
    n = int(keys.shape[0])
    if n == 0:
        empty = xp.empty(0, dtype=np.int64)
        return empty, empty, empty, empty
    # by (table, key, position): a total order, so equal pairs keep their positions' order
    by = xp.lexsort(xp.stack([xp.arange(n, dtype=np.int64), keys, tables]))
    sk, stab = keys[by], tables[by]
    head = xp.ones(n, dtype=np.bool_)
    head[1:] = (sk[1:] != sk[:-1]) | (stab[1:] != stab[:-1])
    run = xp.cumsum(head) - 1  # each sorted key's pair
    first = by[head]  # a pair's first position (its run's first element)
    runs = int(first.shape[0])
    counts = xp.diff(xp.concatenate([xp.flatnonzero(head), xp.asarray([n])]))
    seq = xp.argsort(first)  # pairs in order of first occurrence
    rank = xp.empty(runs, dtype=np.int64)
    rank[seq] = xp.arange(runs, dtype=np.int64)
    ids = xp.empty(n, dtype=np.int64)
    ids[by] = rank[run]
    return sk[head][seq], stab[head][seq], counts[seq], ids
