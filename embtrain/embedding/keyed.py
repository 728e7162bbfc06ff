"""The key → row phase of a keyed group: its tables' row spaces, run fused.

A group of dynamic tables, or of tiered ones, turns each feature's keys into rows of its
table's region before the forward pools them (see :mod:`embtrain.embedding.dynamic` and
:mod:`embtrain.embedding.tiers`). The tables' hash tables are looked up in one parallel pass
for the whole group; per table, the distinct missed keys are then placed by its row space.
Three visible steps, in this order, each over every table of the group:

``resolve``     keys → rows: the fused lookup, admission, eviction (a key directory's first)
``write_back``  evicted cache rows (still holding their state) to the table's row store
``read_in``     new rows from the store or their initializer, scratch rows, and the rows of
                the missed keys written into the features' row arrays
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from embtrain.embedding.dynamic import DynamicTable, HeldLists, Placed, group_misses
from embtrain.embedding.lookahead import Lookahead
from embtrain.embedding.rowspace import GroupArrays, TableRows, TableState, chunk_bounds
from embtrain.kernels import KernelBackend
from embtrain.kernels import dynamic as kd

__all__ = ["KeyedGroup", "KeyedRows", "StepRows", "write_round_keys"]

_CHUNK = 4096  # keys per work item of the parallel lookup


class KeyedRows(TableRows):
    """A row space whose keys go through a hash table (``d``) into region rows; rows
    ``region_rows..`` of the region are the step's scratch rows."""

    keyed = True
    inserts_always = False  # a cache inserts at evaluation too
    # whether the group's lookup may run a step ahead (KeyedGroup.look_ahead): a hash table
    # all in memory, whose index only the key -> row phase and the TTL change
    looks_ahead = False

    def __init__(self, table, ctx, d: DynamicTable):  # type: ignore[no-untyped-def]
        super().__init__(table, ctx)
        self.d = d

    @property
    def lookup_index(self) -> np.ndarray:
        """The index the group's fused lookup reads for this table."""
        return self.d.index

    def check_keys(self, keys: list[np.ndarray]) -> None:
        """Refuse keys the table cannot hold (a static table behind a cache)."""

    def fused_inserts(self, training: bool) -> bool:
        """Whether this step's missed keys may take rows in the same pass that finds them
        (a table all in memory that inserts now and admits every key)."""
        return False

    def reads_in_together(self, placed: Placed) -> bool:
        """Whether ``placed``'s rows may be filled with other tables' of the group in one pass
        (:meth:`read_in_together`)."""
        return False

    @staticmethod
    def read_in_together(spaces: Sequence[KeyedRows], placed: Sequence[Placed]) -> None:
        """:meth:`read_in` of several tables of the group at once."""
        for space, p in zip(spaces, placed, strict=True):
            space.read_in(p)

    def initial_values(self, keys: np.ndarray) -> np.ndarray:
        """Initial values of the region keys ``keys``."""
        p = self.table.placement
        return self.d.initial_values(keys, self.table.dim, 0 if p is None else p.col_start,
                                     0 if p is None else p.full_dim)

    def fill_keys(self, rows: np.ndarray, keys: np.ndarray | None) -> None:
        """Fresh rows at the initial values of region keys ``keys`` (zeros if None)."""
        if rows.size == 0:
            return
        self.fill_rows(rows, None if keys is None else self.initial_values(keys))

    def place(self, keys: np.ndarray, counts: np.ndarray, training: bool, epoch: int,
              step: int) -> Placed:
        """Rows for the distinct missed ``keys`` (see :meth:`DynamicTable.place`)."""
        return self.d.place(keys, counts, training or self.inserts_always, self.table_meta(),
                            epoch, step)

    def write_back(self, placed: Placed) -> None:
        """Evicted rows to the row store (none in memory)."""

    def read_in(self, placed: Placed) -> None:
        """The placed keys' new rows and the step's scratch rows, filled."""
        self.fill_keys(placed.new_rows, placed.new_keys)
        self.fill_scratch(placed)

    def fill_scratch(self, placed: Placed) -> None:
        cap = self.region_rows
        if placed.scratch_zero:
            self.fill_keys(np.array([cap], np.int64), None)
        elif placed.scratch_keys.size:
            self.fill_keys(cap + np.arange(placed.scratch_keys.size, dtype=np.int64),
                           placed.scratch_keys)

    def expire(self, step: int) -> None:
        self.d.expire(self.table_meta(), step)

    def round_keys(self, rows: np.ndarray) -> np.ndarray:
        """The key each of region ``rows`` rounds by (a half table's stochastic rounding is a
        function of the key, never of the row it sits in): the hash table's key of the row
        (a tiered static table's: its row in the shard); 0 for a scratch row, whose update is
        thrown away."""
        cap = self.region_rows
        return np.where(rows < cap, self.d.row_key[np.minimum(rows, cap - 1)], 0)

    def hash_table(self) -> DynamicTable | None:
        return self.d

    def export_extra(self) -> dict[str, np.ndarray]:
        return self.d.admission_state()

    def export_table(self) -> TableState:
        state = self._state_all()
        state.extra = self.export_extra()
        return state

    def _state_all(self) -> TableState:
        raise NotImplementedError

    def _key_bounds(self, table: DynamicTable, step: int) -> list[int]:
        """Chunk boundaries by key: every ``step``-th live key of ``table``."""
        keys = table.row_key[table.live_rows()]
        bounds = [int(keys[i]) for i in range(0, keys.size, step)]
        bounds.append(int(keys[-1]) + 1 if keys.size else 0)
        return chunk_bounds(bounds)


class _Keyless(NamedTuple):
    """Positions of feature ``feature`` whose keys have no row in table ``table``'s directory:
    they read scratch row ``capacity + scratch`` of the cache region (filled from ``keys``,
    or zeros when ``keys`` is None; ``scratch_rows`` rows in all, 0 when another feature of
    the table fills them)."""

    table: int
    feature: int
    positions: np.ndarray
    scratch: np.ndarray
    keys: np.ndarray | None
    scratch_rows: int


@dataclass
class StepRows:
    """A keyed group's rows for one step, between :meth:`KeyedGroup.resolve` and
    :meth:`KeyedGroup.read_in`: each feature's rows (``rows``; the missed keys' rows are
    written by ``read_in``), and per table the missed keys' features and placement."""

    rows: list[np.ndarray]
    row_list: object  # ``rows`` as the backend's array list
    feats: list[np.ndarray]
    placed: list[Placed]
    keyless: list[_Keyless]


class KeyedGroup:
    """The key → row phase of one fused group of keyed tables (see the module docstring).

    ``group()`` gives the group's current arrays and row spaces (the engine rebuilds the
    group with more scratch rows through ``grow(need)`` when a step needs them)."""

    def __init__(self, backend: KernelBackend, group: Callable[[], GroupArrays],
                 grow: Callable[[Sequence[int]], GroupArrays]):
        self.backend = backend
        self._group = group
        self._grow = grow
        self.row_bufs: list[np.ndarray] = []  # each feature's rows, kept across steps
        self.vrow_bufs: list[np.ndarray] = []  # a directory's rows of the keys, per feature
        self.held = HeldLists(backend.array_list)  # typed lists of the tables' arrays
        self.ahead_bufs: list[np.ndarray] = []  # the rows a look-ahead writes, per feature
        self._ahead: Lookahead | None = None
        self.ahead_used = 0  # look-aheads whose rows a forward used
        self.ahead_items = [0, 0]  # chunks of keys their threads looked up, chunks in all

    def look_ahead(self, keys: list[np.ndarray]) -> None:
        """Start looking up ``keys`` (the next training step's, one array per feature of the
        group) on an idle-priority thread while this step's dense part runs
        (:mod:`embtrain.embedding.lookahead`): :meth:`resolve` of the same arrays then uses
        the rows found, when no table's index changed in between, and looks up itself what
        the thread did not reach. Nothing when a table is not a hash table all in memory.
        Call it after this step's forward; every later call into the group stops the thread
        first (:meth:`settle`)."""
        self.settle()
        group = self._group()
        spaces: list[KeyedRows] = group.spaces  # type: ignore[attr-defined]
        if not spaces or not all(s.looks_ahead for s in spaces):
            return
        self.ahead_bufs = _fitted(self.ahead_bufs, keys)
        outs = [buf[: k.shape[0]] for buf, k in zip(self.ahead_bufs, keys, strict=True)]
        be = self.backend
        key_list, out_list = be.array_list(keys), be.array_list(outs)
        indexes = self.held("lookup", [s.lookup_index for s in spaces])
        feat_table = group.feat_table  # type: ignore[attr-defined]
        chunks = np.array([-(-k.shape[0] // _CHUNK) for k in keys], dtype=np.int64)
        items = int(chunks.sum())
        item_miss = np.zeros(items, dtype=np.int64)
        item_done = np.zeros(items, dtype=np.uint8)

        def lookup(stop: np.ndarray) -> int:
            return kd.lookup_items(key_list, feat_table, indexes, out_list, _CHUNK, item_miss,
                                   item_done, stop)

        def misses() -> np.ndarray:  # each feature's: the sum over its chunks
            sums = np.concatenate(([0], np.cumsum(item_miss)))
            bounds = np.concatenate(([0], np.cumsum(chunks)))
            return sums[bounds[1:]] - sums[bounds[:-1]]

        self._ahead = Lookahead(keys, outs, _index_states(spaces), items, lookup, misses)

    def settle(self) -> None:
        """Stop a look-ahead's thread (what it found is kept for the forward of its keys):
        before anything may change a table's index or use the row buffers."""
        if self._ahead is not None:
            self._ahead.stop()

    def _take_ahead(self, keys: list[np.ndarray], spaces: list[KeyedRows]
                    ) -> Lookahead | None:
        """The look-ahead of ``keys``, completed, when its rows are what a lookup now gives,
        else None (and it is dropped either way)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        ahead.stop()
        if not ahead.usable(keys, _index_states(spaces)):
            return None
        ahead.finish()
        self.ahead_used += 1
        self.ahead_items[0] += ahead.hidden_items
        self.ahead_items[1] += ahead.items
        return ahead

    def resolve(self, keys: list[np.ndarray], training: bool, step: int) -> StepRows:
        """Each feature's keys as rows of its table's region; misses placed (admitted keys
        take free or evicted rows), the group grown when the step needs more scratch rows."""
        group = self._group()
        spaces: list[KeyedRows] = group.spaces  # type: ignore[attr-defined]
        be = self.backend
        ahead = self._take_ahead(keys, spaces)
        if ahead is not None:  # looked up while the last step's dense part ran
            # its buffers become this step's; this step's are the next look-ahead's
            self.row_bufs, self.ahead_bufs = self.ahead_bufs, self.row_bufs
        # each feature's rows, in buffers kept across steps (fresh ones fault in their pages)
        self.row_bufs = _fitted(self.row_bufs, keys)
        outs = [buf[: k.shape[0]] for buf, k in zip(self.row_bufs, keys, strict=True)]
        group.epoch = group.epoch % 2_000_000_000 + 1
        keyless: list[_Keyless] = []
        if any(s.directory is not None for s in spaces):  # type: ignore[attr-defined]
            keys, keyless = self._directory_phase(group, keys, training, step)
        out_list = be.array_list(outs)
        key_list = be.array_list(keys)
        per_feat: np.ndarray | None = np.empty(len(keys), dtype=np.int64)
        if ahead is not None:
            per_feat = ahead.misses()
        else:
            kd.lookup_group(key_list, group.feat_table,  # type: ignore[attr-defined]
                            self.held("lookup", [s.lookup_index for s in spaces]), out_list,
                            _CHUNK, per_feat)
        for k in keyless:  # keys without a directory row: not cache misses (scratch rows)
            outs[k.feature][k.positions] = 0
        if keyless:  # the lookup's miss counts included them
            per_feat = None
        feats = [group.feats_of(ti) for ti in range(len(spaces))]  # type: ignore[attr-defined]
        for space, fs in zip(spaces, feats, strict=True):
            space.check_keys([keys[f] for f in fs.tolist()])
        misses = group_misses([s.d for s in spaces], feats,
                              [s.fused_inserts(training) for s in spaces], keys, key_list,
                              out_list, group.epoch, be.num_workers(), be.array_list,
                              per_feat, self.held)
        placed: list[Placed] = []
        for ti, m in enumerate(misses):
            if m.placed is not None:  # inserted at once (no admission, no eviction)
                placed.append(m.placed)
                continue
            d = spaces[ti].d
            insert = training or spaces[ti].inserts_always
            if insert and m.keys.size > d.n_free:  # eviction ahead: spare the rows found
                kd.pin_rows(out_list, m.feats, d.pin, np.int32(group.epoch))
            placed.append(spaces[ti].place(m.keys, m.counts, training, group.epoch, step))
        need = [p.scratch_keys.size + int(p.scratch_zero) for p in placed]
        for k in keyless:
            need[k.table] = max(need[k.table], k.scratch_rows)
        reserve = group.reserve.tolist()  # type: ignore[attr-defined]
        if any(n > r for n, r in zip(need, reserve, strict=True)):
            self._grow(need)
        return StepRows(outs, out_list, [m.feats for m in misses], placed, keyless)

    def write_back(self, rows: StepRows) -> None:
        """Rows evicted this step to their tables' row stores."""
        spaces: list[KeyedRows] = self._group().spaces  # type: ignore[attr-defined]
        for space, p in zip(spaces, rows.placed, strict=True):
            space.write_back(p)

    def read_in(self, rows: StepRows) -> list[np.ndarray]:
        """New and scratch rows filled; returns each feature's rows, complete."""
        spaces: list[KeyedRows] = self._group().spaces  # type: ignore[attr-defined]
        together = [ti for ti, p in enumerate(rows.placed) if spaces[ti].reads_in_together(p)]
        if together:  # one pass for their new rows (one kind of space: in memory, no scratch)
            type(spaces[together[0]]).read_in_together([spaces[t] for t in together],
                                                        [rows.placed[t] for t in together])
        done = set(together)
        for ti, p in enumerate(rows.placed):
            if ti in done:
                continue
            spaces[ti].read_in(p)
            if p.slot_of.size:
                kd.assign_misses(rows.row_list, rows.feats[ti], p.slot_of)
        for k in rows.keyless:
            space = spaces[k.table]
            cap = space.region_rows
            rows.rows[k.feature][k.positions] = cap + k.scratch
            if k.keys is not None:
                space.fill_rows(cap + np.arange(k.keys.size, dtype=np.int64),
                                space.key_values(k.keys))  # type: ignore[attr-defined]
            elif k.scratch_rows:
                space.fill_keys(np.array([cap], np.int64), None)
        self._round_keys(rows.rows)
        return rows.rows

    def _round_keys(self, rows: list[np.ndarray]) -> None:
        """A half group's ``row_round`` for the rows this step reads (each feature's
        ``rows``): the key each row rounds its update by (see :meth:`KeyedRows.round_keys`)."""
        group = self._group()
        write_round_keys(group.plan.row_round, group, rows)  # type: ignore[attr-defined]

    def _directory_phase(self, group: GroupArrays, keys: list[np.ndarray], training: bool,
                         step: int) -> tuple[list[np.ndarray], list[_Keyless]]:
        """Keys of dynamic tables behind a cache become their directory's rows (found,
        admitted and inserted, evicting or not, exactly as the all-in-memory table does);
        the cache phase then looks those rows up as a static tiered table's. Returns the
        features' cache keys and, per feature, the keys left without a row (scratch)."""
        be = self.backend
        spaces = group.spaces  # type: ignore[attr-defined]
        order = [ti for ti, s in enumerate(spaces) if s.directory is not None]
        feats = [group.feats_of(ti) for ti in order]  # type: ignore[attr-defined]
        flat = [int(f) for fs in feats for f in fs.tolist()]
        if len(self.vrow_bufs) != len(keys):
            self.vrow_bufs = [np.empty(0, np.int64) for _ in keys]
        for f in flat:
            if self.vrow_bufs[f].shape[0] < keys[f].shape[0]:
                self.vrow_bufs[f] = np.empty(int(keys[f].shape[0] * 1.25) + 16, np.int64)
        sub_keys = [keys[f] for f in flat]
        sub_rows = [self.vrow_bufs[f][: keys[f].shape[0]] for f in flat]
        key_list, row_list = be.array_list(sub_keys), be.array_list(sub_rows)
        which = np.array([j for j, fs in enumerate(feats) for _ in fs.tolist()], np.int64)
        kd.lookup_group(key_list, which, self.held(
            "directory", [spaces[ti].directory.table.index for ti in order]), row_list, 4096,
            np.empty(len(sub_keys), dtype=np.int64))
        out = list(keys)
        keyless: list[_Keyless] = []
        start = 0
        for ti, fs in zip(order, feats, strict=True):
            local = np.arange(start, start + fs.size, dtype=np.int64)
            start += fs.size
            p, cap = spaces[ti].place_directory(key_list, row_list, sub_keys, sub_rows, local,
                                                training, group.epoch, step)
            n_scratch = p.scratch_keys.size + int(p.scratch_zero)
            first = True  # the first feature with keyless positions fills the scratch rows
            for j, f in zip(local.tolist(), fs.tolist(), strict=True):
                rows = sub_rows[j]
                out[f] = rows
                pos = np.flatnonzero(rows >= cap) if n_scratch else np.empty(0, np.int64)
                if pos.size:
                    keys_of = p.scratch_keys if first and p.scratch_keys.size else None
                    keyless.append(_Keyless(ti, f, pos, rows[pos] - cap, keys_of,
                                            n_scratch if first else 0))
                    rows[pos] = 0  # any row: the cache phase overwrites these positions
                    first = False
        # the directory rows are the cache phase's keys: read-only like the reader's keys, so
        # the lookup kernels keep the one specialisation the warm-up compiled
        return [_read_only(k) for k in out], keyless


def _fitted(bufs: list[np.ndarray], keys: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``bufs`` (int64 row buffers kept across steps, one per feature), each grown where it
    holds fewer rows than its feature's ``keys`` (with 25 % headroom)."""
    if len(bufs) != len(keys):
        bufs = [np.empty(0, np.int64) for _ in keys]
    for i, k in enumerate(keys):
        if bufs[i].shape[0] < k.shape[0]:
            bufs[i] = np.empty(int(k.shape[0] * 1.25) + 16, np.int64)
    return bufs


def _index_states(spaces: Sequence[KeyedRows]) -> list[tuple[int, ...]]:
    return [s.d.index_state() for s in spaces]


def _read_only(a: np.ndarray) -> np.ndarray:
    """``a`` itself when read-only, else a read-only view of it."""
    if not isinstance(a, np.ndarray) or not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def write_round_keys(round_of: Any, group: GroupArrays, rows: list[Any]) -> None:
    """``round_of[row] = key`` for the rows each feature of ``group`` reads this step
    (``rows``): a keyed half group's row keys, which its update rounds by (nothing for an
    empty ``round_of``: a float32 group). Host arrays or the device's alike."""
    if round_of.shape[0] == 0:
        return
    for ti, space in enumerate(group.spaces):  # type: ignore[attr-defined]
        for f in group.feats_of(ti).tolist():  # type: ignore[attr-defined]
            r = rows[f]
            round_of[space.offset + r] = space.round_keys(r)
