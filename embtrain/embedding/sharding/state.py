"""Whole tables with global keys over sharded engines (:class:`GlobalTables`), and a shard's
table state on the wire: what each owner sends rank 0 when a table is exported (keys, values,
slots, metadata and a dynamic table's admission state, in one packed buffer). Values and slots
travel in their stored form (float32, or a half table's uint16 patterns; the buffer names the
dtypes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from embtrain.comm.base import Communicator, gather_to_root
from embtrain.comm.wire import Cursor, pack
from embtrain.embedding.config import TableConfig
from embtrain.embedding.engine import EmbeddingEngine, KeyOutOfRangeError, TableState
from embtrain.embedding.halves import DTYPE_CODES
from embtrain.embedding.optimizers import SlotSpec
from embtrain.embedding.sharding.base import ShardingStrategy, TablePlacement


def pack_state(s: TableState, slot_names: Sequence[str]) -> bytes:
    """One shard's state (or key range) as bytes for a gather to rank 0."""
    assert s.update_count is not None and s.last_step is not None
    adm_keys = s.extra.get("admission_keys", np.empty(0, np.int64))
    adm_counts = s.extra.get("admission_counts", np.empty(0, np.int64))
    bloom = s.extra.get("bloom", np.empty(0, np.uint8))
    dtypes = np.array([DTYPE_CODES[s.dtype], DTYPE_CODES[s.state_dtype]], np.int64)
    arrays = [np.array([s.keys.shape[0]], np.int64), dtypes, s.keys, s.values,
              *(s.slots[n] for n in slot_names), s.update_count, s.last_step,
              np.array([adm_keys.size, int("admission_keys" in s.extra), bloom.size,
                        int("bloom" in s.extra)], np.int64),
              adm_keys.astype(np.int64), adm_counts.astype(np.int64), bloom]
    return pack([np.ascontiguousarray(a) for a in arrays]).tobytes()


def unpack_state(data: bytes, cols: int, slots_of: Sequence[SlotSpec]) -> TableState:
    """A shard's state from :func:`pack_state`'s bytes (``cols`` columns wide)."""
    cur = Cursor(np.frombuffer(data, np.uint8))
    n = int(cur.take(np.int64, 1)[0])
    vcode, scode = cur.take(np.int64, 2).tolist()
    names = {code: name for name, code in DTYPE_CODES.items()}
    vtype = np.float32 if vcode == 0 else np.uint16
    stype = np.float32 if scode == 0 else np.uint16
    keys = cur.take(np.int64, n)
    values = cur.take(vtype, n * cols).reshape(n, cols)
    slots = {}
    for spec in slots_of:
        slots[spec.name] = (cur.take(stype, n) if spec.per_row
                            else cur.take(stype, n * cols).reshape(n, cols))
    counts, last = cur.take(np.int64, n), cur.take(np.int64, n)
    n_adm, has_adm, n_bloom, has_bloom = cur.take(np.int64, 4).tolist()
    extra = {}
    adm_keys, adm_counts = cur.take(np.int64, n_adm), cur.take(np.int64, n_adm)
    if has_adm:
        extra = {"admission_keys": adm_keys, "admission_counts": adm_counts}
    bloom = cur.take(np.uint8, n_bloom)
    if has_bloom:
        extra["bloom"] = bloom
    return TableState(keys, values, slots, counts, last, extra, names[vcode], names[scode])


def key_ranges(comm: Any, engine: Any, name: str, table: TableConfig,
               placement: TablePlacement, rows: int) -> tuple[list[int], int]:
    """Global key boundaries of table ``name``'s export chunks of about ``rows`` keys and its
    total rows, the same on every rank (a dynamic table's: one allgather of a sample of
    every shard's sorted keys)."""
    t, p = table, placement
    if t.dynamic is None:
        return [*range(0, t.rows, rows), t.rows] if t.rows else [0, 0], t.rows
    mine = np.zeros(0, np.int64)
    # column shards hold the same keys: the first column range speaks for them
    if comm.rank in p.owners and p.columns[comm.rank][0] == 0:
        mine = engine.export_keys(name)
    every = max(1, rows // (2 * comm.size))
    head = [mine.size, int(mine[-1]) if mine.size else 0]
    send = np.concatenate([np.array(head, np.int64), mine[::every]])
    got, sizes = comm.allgatherv(send.view(np.uint8), "checkpoint")
    samples, total, top, at = [], 0, None, 0
    for n in sizes.tolist():
        part = got[at:at + n].view(np.int64)
        at += n
        total += int(part[0])
        if part[0]:
            top = int(part[1]) if top is None else max(top, int(part[1]))
            samples.append(part[2:])
    if top is None:
        return [0, 0], 0
    # between consecutive samples every shard has fewer than `every` keys, so a range of
    # `world` samples holds at most 2 * world * every <= rows keys
    cuts = np.unique(np.concatenate(samples))[::comm.size]
    return [*(int(c) for c in cuts), top + 1], total


class GlobalTables:
    """Tables exported and imported whole, with global keys, whatever their sharding (so
    checkpoints do not depend on the world size): each owner exports its shard, rank 0 merges
    them (the strategies select, cut and merge shards); on import every rank keeps its shard
    of the whole table. A table whole on rank 0 (a replica, or one owner there) needs no
    gather; a table whole on this rank is imported as it is."""

    def __init__(self, comm: Communicator, engine: EmbeddingEngine,
                 replicas: EmbeddingEngine | None, tables: Mapping[str, TableConfig],
                 placements: Mapping[str, TablePlacement],
                 strategies: Mapping[str, ShardingStrategy], slot_specs: Sequence[SlotSpec]):
        self.comm = comm
        self.engine = engine
        self._replicas = replicas
        self._tables = tables
        self._placements = placements
        self._strategies = strategies
        self._slot_specs = tuple(slot_specs)
        self.slot_names = tuple(s.name for s in slot_specs)

    def holder(self, name: str) -> EmbeddingEngine:
        """The engine that holds table ``name`` on this rank (the replicas' for a replica)."""
        if self._replicas is not None and not self._strategies[name].exchanged:
            return self._replicas
        return self.engine

    def _on_root(self, name: str) -> bool:
        """Whether table ``name`` is whole on rank 0 (a replica, or one owner there)."""
        return not self._strategies[name].exchanged or self._placements[name].owners == (0,)

    def streams(self, name: str) -> bool:
        """Whether table ``name`` is exported and imported in chunks (a tiered table); the
        same answer on every rank."""
        return self._tables[name].tier is not None

    def export_table(self, name: str) -> TableState | None:
        """The whole table ``name`` with global keys on rank 0, None on other ranks
        (collective: every rank calls it for the same table)."""
        if self._on_root(name):
            return self.holder(name).export_table(name) if self.comm.rank == 0 else None
        payload = b""
        if self.comm.rank in self._placements[name].owners:
            payload = pack_state(self.engine.export_table(name), self.slot_names)
        got = gather_to_root(self.comm, payload)
        return None if got is None else self._merge(name, got)

    def _merge(self, name: str, got: list[bytes]) -> TableState:
        """One table (or key range) with global keys from its owners' packed states."""
        p = self._placements[name]
        states = {o: unpack_state(got[o], p.columns[o][1] - p.columns[o][0], self._slot_specs)
                  for o in p.owners}
        return self._strategies[name].merge(states, p, self.comm.size,
                                            self._tables[name].dynamic is not None,
                                            self.slot_names)

    def table_stream(self, name: str, rows: int) -> tuple[int, Iterator[TableState | None]]:
        """Table ``name`` as ``(total rows, key-ordered chunks)`` with global keys, never whole
        on any rank: rank 0 gets the chunks, the other ranks ``None`` for each (collective:
        every rank iterates the chunks to the end). Chunks are global key ranges cut the same
        way on every rank (:func:`key_ranges`); each owner exports its part of a range, rank 0
        gathers and merges it. A dynamic table's admission state comes in the first chunk."""
        if self._on_root(name):
            if self.comm.rank != 0:
                return 0, iter(())
            holder = self.holder(name)
            return holder.export_rows(name), holder.export_chunks(name, rows)
        bounds, total = key_ranges(self.comm, self.engine, name, self._tables[name],
                                   self._placements[name], max(1, int(rows)))
        return total, self._range_chunks(name, bounds)

    def _range_chunks(self, name: str, bounds: list[int]) -> Iterator[TableState | None]:
        p, rank, world = self._placements[name], self.comm.rank, self.comm.size
        dynamic = self._tables[name].dynamic is not None
        for i in range(len(bounds) - 1):
            payload = b""
            if rank in p.owners:
                part = self._strategies[name].export_range(self.engine, name, bounds[i],
                                                           bounds[i + 1], rank, world, dynamic)
                part.extra = self.engine.export_extra(name) if i == 0 else {}
                payload = pack_state(part, self.slot_names)
            got = gather_to_root(self.comm, payload)
            yield None if got is None else self._merge(name, got)

    def import_table(self, name: str, state: Any) -> None:
        """Overwrite table ``name`` from a whole-table state with global keys (every rank
        passes the same state and keeps its own shard of it)."""
        p, s, rank = self._placements[name], self._strategies[name], self.comm.rank
        if not s.exchanged or (p.owners == (rank,) and s.whole):
            self.holder(name).import_table(name, state)  # the whole table lives here
            return
        if rank not in p.owners:
            return
        t = self._tables[name]
        keys = np.asarray(state.keys, dtype=np.int64).reshape(-1)
        dynamic = t.dynamic is not None
        if not dynamic and keys.size and (keys.min() < 0 or keys.max() >= t.rows):
            raise KeyOutOfRangeError(name, int(keys.min() if keys.min() < 0 else keys.max()),
                                     name, t.rows)
        values = np.asarray(state.values)
        if values.shape != (keys.size, t.dim):
            raise ValueError(f"table {name!r}: values shape {values.shape} != ({keys.size}, "
                             f"{t.dim})")
        admission = dict(getattr(state, "extra", None) or {})
        sel, local_keys, admission = s.select(keys, admission, rank, self.comm.size, dynamic)
        columns = p.columns[rank]

        def cut(arr: Any, per_dim: bool) -> np.ndarray:
            return s.cut(np.asarray(arr)[sel], per_dim, columns)

        slots = {}
        for spec in self._slot_specs:
            if spec.name in state.slots:
                slots[spec.name] = cut(state.slots[spec.name], not spec.per_row)
        for unknown in set(state.slots) - set(self.slot_names):  # the engine names them
            slots[unknown] = np.asarray(state.slots[unknown])
        self.engine.import_table(name, TableState(
            keys=local_keys,
            values=cut(values, True),
            slots=slots,
            update_count=None if state.update_count is None else cut(state.update_count, False),
            last_step=None if state.last_step is None else cut(state.last_step, False),
            extra=admission,
        ))


__all__ = ["GlobalTables", "key_ranges", "pack_state", "unpack_state"]
