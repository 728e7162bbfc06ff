"""Dynamic (hash) tables of the engine: the key → row phase before pooling.

A :class:`DynamicTable` owns the index, the row bookkeeping and the admission state of one
dynamic table; its values, optimizer slots and ``meta`` (``update_count``, ``last_step + 1``)
are rows ``0..capacity-1`` of its fused group's arrays, so pooling, backward and every
optimizer run on rows unchanged. Rows ``capacity..`` of the table's region are *scratch*
rows of the current step: a key without a row (not admitted yet, or unseen at evaluation)
reads one of them, filled with its initial value (or zeros), and what the backward writes
there is thrown away.

Per step (:meth:`EmbeddingEngine.forward`): the parallel lookup gives each key its row or a
miss and pins the rows the batch reads; per table, the distinct missed keys (in order of
first occurrence) go through admission (training only); admitted keys take free rows, and
when there are not enough, the live unpinned rows of smallest ``(score, key)`` are evicted
(``lru``: score ``last_step``; ``lfu``: ``update_count``). After a training step's update,
rows idle for ``ttl_steps`` are removed. The tables of a group run this in parallel
(:func:`group_misses`; a table that admits every key and has free rows for all its missed
positions inserts them in the pass that finds them). Everything that decides which key gets
which row is serial and ordered within a table: results do not depend on the number of
threads, and the values a key reads never depend on its row.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from embtrain.embedding.config import DynamicConfig, TableConfig
from embtrain.embedding.initializers import initializer_code, mix64, table_base
from embtrain.errors import DataError
from embtrain.kernels import dynamic as kd
from embtrain.kernels import get_backend
from embtrain.kernels.rules import hashing
from embtrain.plan.cost import index_slots

__all__ = ["DynamicStats", "DynamicTable", "HeldLists", "TableFullError", "TableMisses",
           "group_misses", "hash_table_rates", "new_index", "shard_of_keys"]

_PROBABILITY_SALT = 0x6A09E667F3BCC908
_SHARD_SALT = 0x3C6EF372FE94F82B


class TableFullError(DataError, RuntimeError):
    """A dynamic table without eviction has no free row for a new key."""

    def __init__(self, table: str, step: int, capacity: int, live: int, wanted: int,
                 evictable: int | None = None):
        self.table, self.step, self.capacity = table, step, capacity
        if evictable is None:
            why = (f"table {table!r} is full at step {step}: {live} of {capacity} rows live, "
                   f"{wanted} new keys, eviction 'none'; raise tables[].dynamic.capacity or "
                   "choose eviction lru or lfu")
        else:
            why = (f"table {table!r} at step {step}: one batch holds {wanted} new keys but only "
                   f"{evictable} rows can be freed (capacity {capacity}); raise "
                   "tables[].dynamic.capacity")
        super().__init__(why)

    @classmethod
    def cache(cls, table: str, step: int, rows: int, wanted: int, free: int) -> TableFullError:
        """A tiered table's first tier is smaller than one batch's rows."""
        err = cls.__new__(cls)
        err.table, err.step, err.capacity = table, step, rows
        RuntimeError.__init__(err, f"table {table!r} at step {step}: one batch reads {wanted} "
                              f"rows missing from its first tier, which can free only {free} of "
                              f"its {rows} rows; raise tables[].storage[0].budget")
        return err


def new_index(entries: int) -> np.ndarray:
    """An empty index of at least ``2 × entries`` slots (a power of two, at least 16)."""
    n = index_slots(entries)
    index = np.empty((n, 2), dtype=np.int64)
    index[:, 1] = -1
    return index


def shard_of_keys(keys: np.ndarray, world: int) -> np.ndarray:
    """The rank owning each key of a dynamic table sharded over ``world`` ranks (a hash of
    the key, independent of the index's hash)."""
    z = np.asarray(keys, dtype=np.int64).view(np.uint64) ^ np.uint64(_SHARD_SALT)
    with np.errstate(over="ignore"):
        z = hashing.mix64(z)  # elementwise on the uint64 array
    return ((z >> np.uint64(32)) % np.uint64(world)).astype(np.int64)


@dataclass
class DynamicStats:
    """Counters of one dynamic table since the engine was built (a run's totals across resumes
    are checkpointed by :mod:`embtrain.train.counters`)."""

    inserts: int = 0
    evictions: int = 0
    expired: int = 0
    not_admitted: int = 0  # distinct keys per step that read an initial value without a row
    lookups: int = 0  # keys looked up (occurrences)
    misses: int = 0  # of them, keys without a row at lookup
    distinct_misses: int = 0  # distinct keys per step without a row at lookup (tiers)

    def as_dict(self, live: int, capacity: int, pending: int) -> dict[str, float]:
        """The metrics line of a table."""
        return {"rows": live, "capacity": capacity, "inserts": self.inserts,
                "evictions": self.evictions, "expired": self.expired,
                "admissions_pending": pending,
                "load_factor": round(live / capacity, 6) if capacity else 0.0}


@dataclass
class Placed:
    """Where the distinct missed keys of a step go: ``slot_of[i]`` (row of the table's
    region) and which of them need a fresh row (``new_rows``) or a scratch row."""

    slot_of: np.ndarray
    new_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    new_keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    scratch_keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    scratch_zero: bool = False
    # rows evicted to make room (their keys and rows; the rows still hold their old state
    # until the new keys' rows are filled: a backing store writes them back in between)
    evicted_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    evicted_keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # inserted by :func:`group_misses` in the pass that found them (no scratch, no eviction;
    # the missed positions hold their rows already)
    inserted_at_once: bool = False


class DynamicTable:
    """Index, rows and admission state of one dynamic table (capacity ``config.rows``)."""

    def __init__(self, config: TableConfig, seed: int, init_offset: int = 0,
                 init_stride: int = 1):
        if config.dynamic is None:
            raise ValueError(f"table {config.name!r} is not dynamic")
        # key k starts at the initial value of row init_offset + init_stride * k (a tiered
        # static shard's keys are its local rows; a dynamic table's keys are their own rows)
        self.init_offset, self.init_stride = int(init_offset), int(init_stride)
        self.store = None  # a tiered table's backing store (embtrain.embedding.tiers)
        self.directory = None  # a tiered dynamic table's KeyDirectory (its rows: our keys)
        self.config = config
        self.dyn: DynamicConfig = config.dynamic
        self.name = config.name
        self.capacity = int(config.rows)
        self.seed = int(seed)
        self.index = new_index(self.capacity)
        self.version = 0  # counts the changes of the index (see index_state)
        self.row_key = np.zeros(self.capacity, dtype=np.int64)
        self.row_live = np.zeros(self.capacity, dtype=np.uint8)
        self.free = np.arange(self.capacity - 1, -1, -1, dtype=np.int64)  # pops 0, 1, 2, ...
        self.n_free = self.capacity
        self.pin = np.zeros(self.capacity, dtype=np.int32)
        self.ttl_low = -(1 << 62)  # no live row has a last_step below this
        self.stats = DynamicStats()
        self._scratch = new_index(0)
        self.pending = 0  # keys counted (count admission) and not admitted yet
        self.counter = new_index(1024) if self.dyn.admission == "count" else None
        self.bloom = self.bloom_hashes = None
        if self.dyn.admission == "bloom":
            n, p = self.dyn.bloom_capacity, self.dyn.false_positive_rate
            m = max(64, math.ceil(-n * math.log(p) / math.log(2) ** 2))
            self.bloom = np.zeros(m, dtype=np.uint8)
            self.bloom_hashes = max(1, round(m / n * math.log(2)))
        self.prob_base = np.uint64(mix64(int(table_base(self.seed, self.name)) ^ _PROBABILITY_SALT))

    def scratch_index(self, entries: int) -> np.ndarray:
        """An empty index for ``entries`` distinct keys, reused from step to step (emptied by
        the caller after use): filling a fresh one cost more than the lookups it serves."""
        if self._scratch.shape[0] < 2 * entries:
            self._scratch = new_index(entries)
        return self._scratch

    # ------------------------------------------------------------------ state

    @property
    def live(self) -> int:
        """Rows holding a key."""
        return self.capacity - self.n_free

    def live_rows(self) -> np.ndarray:
        """The live rows, ordered by their key."""
        rows = np.flatnonzero(self.row_live).astype(np.int64)
        return rows[np.argsort(self.row_key[rows], kind="stable")]

    def metrics(self) -> dict[str, float]:
        """Rows, inserts, evictions, pending admissions and load factor."""
        pending = self.pending
        return self.stats.as_dict(self.live, self.capacity, pending)

    def admission_state(self) -> dict[str, np.ndarray]:
        """What admission remembers, for checkpoints: count admission's counted keys and
        counts (by key), or the Bloom filter's counters."""
        if self.counter is not None:
            used = self.counter[:, 1] >= 0
            keys, counts = self.counter[used, 0], self.counter[used, 1]
            order = np.argsort(keys, kind="stable")
            return {"admission_keys": keys[order], "admission_counts": counts[order]}
        if self.bloom is not None:
            return {"bloom": self.bloom.copy()}
        return {}

    def load_admission_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`admission_state` (merging with what is there: counts add up, Bloom
        counters are replaced)."""
        if self.counter is not None and "admission_keys" in state:
            keys = np.asarray(state["admission_keys"], dtype=np.int64)
            counts = np.asarray(state["admission_counts"], dtype=np.int64)
            if keys.shape != counts.shape:
                raise ValueError(f"table {self.name!r}: admission keys and counts differ in length")
            if counts.size and (counts.min() < 1 or counts.max() >= self.dyn.min_count):
                raise ValueError(f"table {self.name!r}: admission counts outside 1..min_count-1")
            self._reserve_counter(keys.size)
            admitted = np.zeros(keys.size, dtype=np.bool_)
            self.pending += kd.count_admit(self.counter, keys, counts, self.dyn.min_count,
                                           admitted)
        if self.bloom is not None and "bloom" in state:
            bloom = np.asarray(state["bloom"], dtype=np.uint8)
            if bloom.shape != self.bloom.shape:
                raise ValueError(f"table {self.name!r}: Bloom filter of {bloom.size} counters, "
                                 f"this recipe makes {self.bloom.size}")
            self.bloom[:] = bloom

    def _reserve_counter(self, more: int) -> None:
        assert self.counter is not None
        if 2 * (self.pending + more) > self.counter.shape[0]:
            bigger = new_index(2 * (self.pending + more))
            kd.rehash(self.counter, bigger)
            self.counter = bigger

    def index_state(self) -> tuple[int, ...]:
        """What tells that the index changed: its change counter, the free rows and the
        index array itself (a look-ahead's rows are used only while this is unchanged)."""
        return (self.version, self.n_free, id(self.index))

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The row of each key, -1 when it has none."""
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        out = np.empty(keys.size, dtype=np.int64)
        kd.find_many(self.index, keys, out)
        return out

    def upsert(self, keys: np.ndarray) -> np.ndarray:
        """Rows for ``keys`` (distinct): existing rows, new ones from the free stack for the
        others (a checkpoint restore or ``load``). Raises when they do not fit."""
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        if np.unique(keys).size != keys.size:
            raise ValueError(f"table {self.name!r}: duplicate keys")
        rows = self.find(keys)
        new = np.flatnonzero(rows < 0)
        if new.size > self.n_free:
            raise ValueError(f"table {self.name!r}: {self.live + new.size} keys do not fit its "
                             f"capacity of {self.capacity} rows")
        got = np.empty(new.size, dtype=np.int64)
        self.version += 1
        self.n_free = kd.insert_keys(self.index, keys[new], self.row_key, self.row_live,
                                     self.free, self.n_free, self.pin, np.int32(0), got)
        rows[new] = got
        self.ttl_low = -(1 << 62)
        return rows

    # ------------------------------------------------------------------ step

    def admit(self, keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Which of the distinct missed ``keys`` (seen ``counts`` times this step) are
        admitted now; updates the admission state."""
        admitted = np.ones(keys.size, dtype=np.bool_)
        kind = self.dyn.admission
        if kind == "count":
            self._reserve_counter(keys.size)
            self.pending += kd.count_admit(self.counter, keys, counts, self.dyn.min_count,
                                           admitted)
        elif kind == "bloom":
            kd.bloom_admit(self.bloom, self.bloom_hashes, keys, counts, self.dyn.min_count,
                           admitted)
        elif kind == "probability":
            kd.probability_admit(self.prob_base, float(self.dyn.p), keys, admitted)
        return admitted

    def place(self, keys: np.ndarray, counts: np.ndarray, training: bool, meta: np.ndarray,
              epoch: int, step: int) -> Placed:
        """Rows of the region for the distinct missed ``keys``: admitted keys get rows (free
        ones, else evicted ones), the others scratch rows ``capacity + j`` (or the shared
        zero row ``capacity`` at evaluation with ``missing: zeros``). ``meta``: the table's
        rows of the group's ``meta`` (the eviction scores)."""
        cap = self.capacity
        n = keys.size
        if not training:
            if self.dyn.missing == "zeros":
                return Placed(np.full(n, cap, dtype=np.int64), scratch_zero=n > 0)
            return Placed(cap + np.arange(n, dtype=np.int64), scratch_keys=keys)
        admitted = self.admit(keys, counts)
        self.version += 1
        new = np.flatnonzero(admitted)
        rest = np.flatnonzero(~admitted)
        slot_of = np.empty(n, dtype=np.int64)
        slot_of[rest] = cap + np.arange(rest.size, dtype=np.int64)
        self.stats.not_admitted += int(rest.size)
        need = new.size - self.n_free
        victims = np.empty(0, dtype=np.int64)
        evicted_keys = victims
        if need > 0:
            if self.dyn.eviction == "none":
                raise TableFullError(self.name, step, cap, self.live, int(new.size))
            victims = self.victims(meta, need, epoch)
            found = victims.size
            if found < need:
                if self.store is not None:
                    raise TableFullError.cache(self.name, step, cap, int(new.size),
                                               self.n_free + int(found))
                raise TableFullError(self.name, step, cap, self.live, int(new.size),
                                     evictable=self.n_free + int(found))
            evicted_keys = self.row_key[victims]
            self.n_free = kd.remove_rows(self.index, victims, self.row_key, self.row_live,
                                         self.free, self.n_free)
            self.stats.evictions += need
        rows = np.empty(new.size, dtype=np.int64)
        self.n_free = kd.insert_keys(self.index, keys[new], self.row_key, self.row_live,
                                     self.free, self.n_free, self.pin, np.int32(epoch), rows)
        self.stats.inserts += int(new.size)
        slot_of[new] = rows
        return Placed(slot_of, new_rows=rows, new_keys=keys[new], scratch_keys=keys[rest],
                      evicted_rows=victims, evicted_keys=evicted_keys)

    def victims(self, meta: np.ndarray, k: int, epoch: int) -> np.ndarray:
        """The ``k`` live rows not pinned at ``epoch`` with the smallest ``(score, key)``
        (``lru``: ``last_step``, ``lfu``: ``update_count``), ascending by row; fewer when fewer
        are evictable. A tiered table's cache breaks score ties by the other score first
        (LFU among rows used as often: the least recent; a cache's choice never changes
        results, and by key alone an LFU cache evicted the smallest ids, the most popular
        ones of power-law data). One pass over the table plus a selection, O(capacity) whatever ``k``
        (a cache evicts hundreds of thousands of rows a step)."""
        col = 1 if self.dyn.eviction == "lru" else 0
        cand = np.flatnonzero((self.row_live != 0) & (self.pin != np.int32(epoch)))
        if cand.size <= k:
            return cand.astype(np.int64)
        scores = meta[cand, col]
        if self.store is not None:  # a cache: ties go by the other score, then by key
            scores = (scores.astype(np.int64) << 32) | meta[cand, 1 - col].astype(np.int64)
        threshold = np.partition(scores, k - 1)[k - 1]
        below = cand[scores < threshold]
        ties = cand[scores == threshold]
        need = k - below.size
        if need < ties.size:  # the smallest keys among the ties (keys are distinct)
            ties = ties[np.argpartition(self.row_key[ties], need - 1)[:need]]
        return np.sort(np.concatenate([below, ties])).astype(np.int64)

    def expire(self, meta: np.ndarray, step: int) -> np.ndarray:
        """After training step ``step``: remove the rows not updated for ``ttl_steps`` steps
        (``last_step <= step - ttl_steps``); returns them. Skips the scan while no live row
        can have expired."""
        ttl = self.dyn.ttl_steps
        if ttl is None:
            return np.empty(0, dtype=np.int64)
        limit = int(step) - int(ttl)
        if self.ttl_low > limit:
            return np.empty(0, dtype=np.int64)
        out = np.empty(self.capacity, dtype=np.int64)
        n, low = kd.expired_rows(meta, self.row_live, np.int64(limit), out)
        rows = out[:n].copy()
        self.version += int(n > 0)
        self.n_free = kd.remove_rows(self.index, rows, self.row_key, self.row_live, self.free,
                                     self.n_free)
        self.ttl_low = int(low)
        self.stats.expired += int(n)
        return rows

    def initial_values(self, keys: np.ndarray, dim: int, col_start: int = 0,
                       full_dim: int = 0) -> np.ndarray:
        """Initial values ``[len(keys), dim]`` of ``keys`` (columns ``col_start..`` of a
        table ``full_dim`` wide): the same function of (seed, table, key) as a static row."""
        full = max(full_dim, dim)
        out = np.empty((keys.size, full), dtype=np.float32)
        kind, param = initializer_code(self.config.initializer)
        rows = np.ascontiguousarray(keys, dtype=np.int64)
        if self.init_offset or self.init_stride != 1:
            rows = self.init_offset + self.init_stride * rows
        get_backend("cpu").init_rows(out, rows, table_base(self.seed, self.name), kind, param)
        return out if full == dim else np.ascontiguousarray(out[:, col_start:col_start + dim])



@dataclass
class TableMisses:
    """One table's misses of a step: its features, the distinct missed keys in order of first
    occurrence and their occurrences; ``placed`` when they were inserted already (their
    positions then hold their rows)."""

    feats: np.ndarray
    keys: np.ndarray
    counts: np.ndarray
    placed: Placed | None = None


class HeldLists:
    """The backend's typed lists of arrays, kept by name and packed again only when one of
    the arrays is another object: the lists of arrays that live from step to step (indexes,
    row bookkeeping) cost more to pack (~10 µs an array, 55 tables) than to check."""

    def __init__(self, pack: Callable[[Sequence[np.ndarray]], object]):
        self.pack = pack
        self._held: dict[str, tuple[list[np.ndarray], object]] = {}

    def __call__(self, name: str, arrays: Sequence[np.ndarray]) -> object:
        """The typed list of ``arrays`` (the one packed last time under ``name`` when every
        array is the same object)."""
        held = self._held.get(name)
        if held is not None and len(held[0]) == len(arrays) and all(
                a is b for a, b in zip(held[0], arrays, strict=True)):
            return held[1]
        packed = self.pack(arrays)
        self._held[name] = (list(arrays), packed)
        return packed


def _bins(work: Sequence[int], bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Tables with work spread over ``bins`` tasks, largest first onto the least loaded
    (``order``, ``bin_starts``). Only the speed depends on this split, never a result."""
    todo = sorted((w, t) for t, w in enumerate(work) if w > 0)[::-1]
    bins = max(1, min(bins, len(todo)))
    heap = [(0, b) for b in range(bins)]
    members: list[list[int]] = [[] for _ in range(bins)]
    for w, t in todo:
        load, b = heapq.heappop(heap)
        members[b].append(t)
        heapq.heappush(heap, (load + w, b))
    order = np.array([t for m in members for t in m], dtype=np.int64)
    starts = np.cumsum([0] + [len(m) for m in members]).astype(np.int64)
    return order, starts


def group_misses(tables: Sequence[DynamicTable], feats: Sequence[np.ndarray],
                 fusable: Sequence[bool], keys: Sequence[np.ndarray], key_list: object,
                 out_list: object, epoch: int, workers: int,
                 array_list: object, per_feat: np.ndarray | None = None,
                 held: HeldLists | None = None) -> list[TableMisses]:
    """The misses of a fused group's tables after the lookup (``out_list``: each feature's
    rows, -1 for a miss), all tables in parallel. A table whose misses may be inserted at
    once (``fusable``: it inserts now, admits every key, and its free rows cover the step's
    missed positions, so no eviction can be needed) gets its rows in one pass: the same rows,
    in the same order, as collecting, admitting and inserting one after the other. Other
    tables' distinct misses are collected (positions become ``-2 - id``) for
    :meth:`DynamicTable.place`. Updates the lookup counters (and ``inserts`` when inserted).
    ``per_feat``: each feature's missed positions when the lookup counted them, else counted
    here. ``held``: the caller's :class:`HeldLists` for the tables' arrays that live from
    step to step (else packed anew)."""
    if per_feat is None:
        per_feat = np.zeros(len(keys), dtype=np.int64)
        kd.count_misses(out_list, per_feat)
    nt = len(tables)
    n_miss = [int(per_feat[f].sum()) for f in feats]
    fused = np.array([bool(fusable[t]) and n_miss[t] <= tables[t].n_free for t in range(nt)],
                     dtype=np.bool_)
    miss_keys = [np.empty(n, np.int64) for n in n_miss]
    miss_aux = [np.empty(n, np.int64) for n in n_miss]
    miss_counts = [np.empty(0 if fused[t] else n_miss[t], np.int64) for t in range(nt)]
    indexes = [d.index if fused[t] or n_miss[t] == 0 else d.scratch_index(n_miss[t])
               for t, d in enumerate(tables)]
    n_frees = np.array([d.n_free for d in tables], dtype=np.int64)
    n_out = np.zeros(nt, dtype=np.int64)
    order, bin_starts = _bins(n_miss, workers)
    flat = np.concatenate([np.asarray(f, np.int64) for f in feats]) if nt else np.empty(0, np.int64)
    feat_starts = np.cumsum([0] + [len(f) for f in feats]).astype(np.int64)
    lst = array_list  # the backend's typed-list packer
    keep = held if held is not None else HeldLists(array_list)  # type: ignore[arg-type]
    kd.resolve_tables(key_list, out_list, flat, feat_starts, order, bin_starts, fused,
                      keep("indexes", indexes), keep("row_key", [d.row_key for d in tables]),
                      keep("row_live", [d.row_live for d in tables]),
                      keep("free", [d.free for d in tables]), n_frees,
                      keep("pin", [d.pin for d in tables]), np.int32(epoch),
                      lst(miss_keys), lst(miss_aux), lst(miss_counts), n_out)  # type: ignore[operator]
    result: list[TableMisses] = []
    for t, d in enumerate(tables):
        n = int(n_out[t])
        st = d.stats
        st.lookups += sum(int(keys[f].shape[0]) for f in feats[t].tolist())
        st.misses += n_miss[t]
        st.distinct_misses += n
        if fused[t]:
            d.n_free = int(n_frees[t])
            d.version += int(n > 0)
            st.inserts += n
            rows, new_keys = miss_aux[t][:n], miss_keys[t][:n]
            result.append(TableMisses(feats[t], new_keys, miss_counts[t][:0],
                                      Placed(np.empty(0, np.int64), new_rows=rows,
                                             new_keys=new_keys, inserted_at_once=True)))
        else:
            result.append(TableMisses(feats[t], miss_keys[t][:n], miss_counts[t][:n]))
    return result



def hash_table_rates(capacity: int, batch: int = 1 << 16, seed: int = 0) -> dict[str, object]:
    """Inserts/s and lookups/s of one table's index alone (random 63-bit keys), measured as
    it fills: per load factor reached, the insert rate of the batches that got it there and
    the lookup rate of a batch of present keys (the engine's parallel lookup)."""
    import time

    from numba.typed import List

    rng = np.random.default_rng(seed)
    table = DynamicTable(TableConfig("rates", capacity, 1, dynamic=DynamicConfig()), seed)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, capacity + capacity // 8,
                                  dtype=np.int64))[:capacity]
    rng.shuffle(keys)
    rows = np.empty(batch, dtype=np.int64)
    out: list[dict[str, float]] = []
    at = 0
    # load the kernels before timing
    kd.insert_keys(table.index, keys[:0], table.row_key, table.row_live, table.free,
                   table.n_free, table.pin, np.int32(1), rows[:0])
    kd.lookup_group(List([keys[:0]]), np.zeros(1, np.int64), List([table.index]),
                    List([rows[:0]]), 4096, np.empty(1, np.int64))
    for target in (0.25, 0.5, 0.75, 0.9, 1.0):
        stop = int(capacity * target)
        t0 = time.perf_counter()
        inserted = 0
        while at < stop:
            chunk = keys[at:min(at + batch, stop)]
            table.n_free = kd.insert_keys(table.index, chunk, table.row_key, table.row_live,
                                          table.free, table.n_free, table.pin, np.int32(1),
                                          rows[: chunk.size])
            at += chunk.size
            inserted += chunk.size
        t1 = time.perf_counter()
        probe = keys[rng.integers(0, at, batch)]
        found = np.empty(batch, dtype=np.int64)
        best = float("inf")
        for _ in range(3):
            t2 = time.perf_counter()
            kd.lookup_group(List([probe]), np.zeros(1, np.int64), List([table.index]),
                            List([found]), 4096, np.empty(1, np.int64))
            best = min(best, time.perf_counter() - t2)
        if (found < 0).any():
            raise AssertionError("hash_table_rates: a present key was not found")
        out.append({"load_factor": round(at / capacity, 3),
                    "inserts_per_s": inserted / max(t1 - t0, 1e-9),
                    "lookups_per_s": batch / max(best, 1e-9)})
    return {"capacity": capacity, "index_slots": int(table.index.shape[0]),
            "batch": batch, "by_load_factor": out}
