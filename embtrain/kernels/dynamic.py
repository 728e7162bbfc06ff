"""CPU kernels of dynamic (hash) tables: key → row index, admission, victim selection, TTL.

A dynamic table of capacity ``C`` owns rows ``0..C-1`` of its group's value, slot and
``meta`` arrays (the same fused arrays static tables use). Its *index* maps int64 keys of any
value to those rows: open addressing with linear probing over ``index[n, 2]`` int64 entries
``(key, row)`` (``row < 0``: empty), ``n`` a power of two of at least ``2 C`` (load ≤ ½), one
16-byte entry per probe (four per cache line), deleted by backward shift (no tombstones).

Per training step the engine runs, per group: :func:`lookup_group` (parallel, read-only on
the index: each key's row or a miss, and each feature's number of misses), then
:func:`resolve_tables`, the tables of the group in parallel (largest first, spread over the
threads), each table serially in feature-then-position order (the index slots of the next
missed positions prefetched): a table that admits every key and has free rows for all of
the step's missed positions inserts its missed keys in that same pass
(:func:`_insert_misses`, rows popped in order of first occurrence); any other table collects
its distinct missed keys in order of first occurrence with their counts
(:func:`_collect_misses_at`), and then the admission policy, victims
(``DynamicTable.victims``: the live unpinned rows of smallest ``(score, key)``, after
:func:`pin_rows`) when the free rows do not suffice, :func:`insert_keys` and
:func:`assign_misses` follow per table. New rows of the tables that inserted at once are filled
in one pass (:func:`fresh_keyed_rows`). Everything that decides which key gets which row is
serial and ordered within its table, and a table touches only its own index and rows, so
results do not depend on the thread count or on how tables are spread over threads; the
values a key reads do not depend on its row at all.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from embtrain.kernels import numba_cache
from embtrain.kernels._llvm import prefetch
from embtrain.kernels.codes import INIT_UNIFORM, ROUND_NEAREST
from embtrain.kernels.halves import st
from embtrain.kernels.rules.hashing import mix64, unit53
from embtrain.kernels.rules.init import column_stream, init_value, row_hash, uniform_value

numba_cache.install()

_INDEX_SALT = np.uint64(0x5DEECE66D1234567)
_BLOOM_SALT1 = np.uint64(0x2545F4914F6CDD1D)
_BLOOM_SALT2 = np.uint64(0x9FB21C651E98DF25)
_PF = 32  # keys ahead the lookup prefetches (32 measured ~12 % faster than 16 on a 1 GiB index)
_PF_MISS = 16  # missed positions ahead the serial miss passes prefetch

EMPTY = -1


@njit(cache=True, inline="always")
def _home(key, mask):
    return np.int64(mix64(np.uint64(key) ^ _INDEX_SALT) & np.uint64(mask))


@njit(cache=True, nogil=True)
def index_find(index, key):
    """The row of ``key`` in ``index`` or -1."""
    mask = index.shape[0] - 1
    i = _home(key, mask)
    while True:
        r = index[i, 1]
        if r < 0:
            return np.int64(-1)
        if index[i, 0] == key:
            return r
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def index_insert(index, key, row):
    """Add ``key → row`` (``key`` must be absent)."""
    mask = index.shape[0] - 1
    i = _home(key, mask)
    while index[i, 1] >= 0:
        i = (i + 1) & mask
    index[i, 0] = key
    index[i, 1] = row


@njit(cache=True, nogil=True)
def index_delete(index, key):
    """Remove ``key`` (backward-shift deletion); returns its row or -1 when absent."""
    mask = index.shape[0] - 1
    i = _home(key, mask)
    while True:
        r = index[i, 1]
        if r < 0:
            return np.int64(-1)
        if index[i, 0] == key:
            break
        i = (i + 1) & mask
    row = index[i, 1]
    index[i, 1] = EMPTY
    j = i
    while True:
        j = (j + 1) & mask
        if index[j, 1] < 0:
            break
        h = _home(index[j, 0], mask)
        # the entry at j may move to the hole at i unless its home lies cyclically in (i, j]
        if (i < j and (h <= i or h > j)) or (i > j and h <= i and h > j):
            index[i, 0] = index[j, 0]
            index[i, 1] = index[j, 1]
            index[j, 1] = EMPTY
            i = j
    return row


@njit(cache=True, nogil=True, inline="always")
def _chunk_starts(keys_list, chunk):
    """``starts[f]``: the first chunk (work item) of feature ``f``; ``starts[nf]``: all."""
    nf = len(keys_list)
    starts = np.zeros(nf + 1, dtype=np.int64)
    for f in range(nf):
        starts[f + 1] = starts[f] + (keys_list[f].shape[0] + chunk - 1) // chunk
    return starts


@njit(cache=True, nogil=True, inline="always")
def _lookup_item(keys_list, feat_table, indexes, out_list, chunk, starts, item):
    """Work item ``item`` of a lookup (``chunk`` keys of one feature): each key's row into
    ``out``, -1 for a miss; returns the misses. Each key's home slot is computed once, ``_PF``
    keys ahead, and prefetched."""
    f = 0
    while starts[f + 1] <= item:
        f += 1
    keys = keys_list[f]
    out = out_list[f]
    index = indexes[feat_table[f]]
    mask = index.shape[0] - 1
    a = (item - starts[f]) * chunk
    b = min(a + chunk, keys.shape[0])
    ring = np.empty(_PF, dtype=np.int64)
    for i in range(a, min(a + _PF, b)):
        h = _home(keys[i], mask)
        ring[i % _PF] = h
        prefetch(index, 2 * h)
    missed = 0
    for i in range(a, b):
        j = ring[i % _PF]
        if i + _PF < b:
            h = _home(keys[i + _PF], mask)
            ring[i % _PF] = h
            prefetch(index, 2 * h)
        key = keys[i]
        r = np.int64(-1)
        while True:
            e = index[j, 1]
            if e < 0:
                missed += 1
                break
            if index[j, 0] == key:
                r = e
                break
            j = (j + 1) & mask
        out[i] = r
    return missed


@njit(parallel=True, cache=True, nogil=True)
def lookup_group(keys_list, feat_table, indexes, out_list, chunk, misses):
    """``out[f][i]`` = row of ``keys[f][i]`` in table ``feat_table[f]``'s index, else -1;
    ``misses[f]``: feature ``f``'s positions without a row. Parallel over chunks of keys
    (:func:`_lookup_item`)."""
    nf = len(keys_list)
    starts = _chunk_starts(keys_list, chunk)
    item_miss = np.zeros(starts[nf], dtype=np.int64)
    for item in prange(starts[nf]):
        item_miss[item] = _lookup_item(keys_list, feat_table, indexes, out_list, chunk, starts,
                                       item)
    for f in range(nf):
        c = 0
        for item in range(starts[f], starts[f + 1]):
            c += item_miss[item]
        misses[f] = c


@njit(parallel=True, cache=True, nogil=True)
def lookup_items(keys_list, feat_table, indexes, out_list, chunk, item_miss, item_done, stop):
    """:func:`lookup_group` item by item, resumable: the work items (chunks of ``chunk``
    keys, feature after feature) not yet ``item_done`` are looked up, their misses into
    ``item_miss``, until ``stop[0]`` is set (checked before each item; on one thread the
    items go in order). Returns the items done in all. A look-ahead runs it on its thread
    with one kernel thread, then the forward finishes the rest in parallel."""
    nf = len(keys_list)
    starts = _chunk_starts(keys_list, chunk)
    for item in prange(starts[nf]):
        if item_done[item] != 0 or stop[0] != 0:
            continue
        item_miss[item] = _lookup_item(keys_list, feat_table, indexes, out_list, chunk, starts,
                                       item)
        item_done[item] = 1
    n = 0
    for item in range(starts[nf]):
        n += item_done[item]
    return n


@njit(cache=True, nogil=True, inline="always")
def _next_misses(keys, out, mask, index, ahead, pending):
    """Prefetch the home slots of the missed positions (``out == -1``) from ``ahead`` on
    until ``_PF_MISS`` are in flight; returns ``(ahead, pending)`` after the scan."""
    n = keys.shape[0]
    while pending < _PF_MISS and ahead < n:
        if out[ahead] == -1:
            prefetch(index, 2 * _home(keys[ahead], mask))
            pending += 1
        ahead += 1
    return ahead, pending


@njit(cache=True, nogil=True, inline="always")
def _probe_miss(keys, out, i, mask, index, ahead, pending):
    """The walk over missed positions that :func:`_collect_misses_at` and
    :func:`_insert_misses` share, at missed position ``i``: keep ``_PF_MISS`` home slots of
    the next missed positions prefetched (``ahead``/``pending``, :func:`_next_misses`) and
    probe ``index`` for ``keys[i]``. Returns ``(slot, ahead, pending)``."""
    if i < ahead:
        pending -= 1
    else:
        ahead = i + 1
    ahead, pending = _next_misses(keys, out, mask, index, ahead, pending)
    return _probe(index, keys[i]), ahead, pending


@njit(cache=True, nogil=True)
def pin_rows(out_list, feats, pin, epoch):
    """``pin[row] = epoch`` for every row the features ``feats`` found (eviction spares them)."""
    for fi in range(feats.shape[0]):
        out = out_list[feats[fi]]
        for i in range(out.shape[0]):
            if out[i] >= 0:
                pin[out[i]] = epoch


@njit(cache=True, nogil=True)
def collect_misses(keys_list, out_list, feats, scratch_index, miss_keys, miss_counts):
    """Distinct missed keys of the features ``feats`` (one table) in first-occurrence order
    (feature by feature, position by position) into ``miss_keys``, their occurrences into
    ``miss_counts``; each missed position's ``out`` becomes ``-2 - id`` (``id``: the key's
    place in ``miss_keys``). ``scratch_index`` (``[n, 2]``, n a power of two ≥ 2 × misses)
    must be empty. Returns the number of distinct keys."""
    n = 0
    for fi in range(feats.shape[0]):
        f = feats[fi]
        keys = keys_list[f]
        out = out_list[f]
        for i in range(keys.shape[0]):
            if out[i] != -1:
                continue
            key = keys[i]
            d = index_find(scratch_index, key)
            if d < 0:
                d = n
                index_insert(scratch_index, key, d)
                miss_keys[d] = key
                miss_counts[d] = 0
                n += 1
            miss_counts[d] += 1
            out[i] = -2 - d
    return n


@njit(cache=True, nogil=True)
def _probe(index, key):
    """The slot holding ``key`` in ``index``, else the empty slot where it would go."""
    mask = index.shape[0] - 1
    i = _home(key, mask)
    while index[i, 1] >= 0 and index[i, 0] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True, nogil=True)
def _collect_misses_at(keys_list, out_list, feats, scratch, miss_keys, miss_counts, used):
    """:func:`collect_misses` recording the scratch slots it fills in ``used``, then emptying
    them (all of the step's entries go at once: no backward shift needed). The scratch slots
    of the next ``_PF_MISS`` missed positions are prefetched."""
    n = 0
    mask = scratch.shape[0] - 1
    for fi in range(feats.shape[0]):
        f = feats[fi]
        keys = keys_list[f]
        out = out_list[f]
        ahead, pending = 0, 0
        for i in range(keys.shape[0]):
            if out[i] != -1:
                continue
            j, ahead, pending = _probe_miss(keys, out, i, mask, scratch, ahead, pending)
            key = keys[i]
            d = scratch[j, 1]
            if d < 0:
                d = n
                scratch[j, 0] = key
                scratch[j, 1] = d
                used[d] = j
                miss_keys[d] = key
                miss_counts[d] = 0
                n += 1
            miss_counts[d] += 1
            out[i] = -2 - d
    for d in range(n):
        scratch[used[d], 1] = EMPTY
    return n


@njit(cache=True, nogil=True)
def _insert_misses(keys_list, out_list, feats, index, row_key, row_live, free, n_free, pin,
                   epoch, new_keys, new_rows):
    """Every missed position of ``feats`` (one table) gets its key's row, the distinct keys
    rows popped from the free stack in order of first occurrence (feature by feature,
    position by position) into ``new_keys``/``new_rows``: what :func:`collect_misses`,
    admitting all and :func:`insert_keys` give when the free rows suffice, in one pass over
    the table's own index (the home slots of the next ``_PF_MISS`` missed positions
    prefetched).
    Returns ``(distinct keys, free rows left)``."""
    n = 0
    mask = index.shape[0] - 1
    for fi in range(feats.shape[0]):
        f = feats[fi]
        keys = keys_list[f]
        out = out_list[f]
        ahead, pending = 0, 0
        for i in range(keys.shape[0]):
            if out[i] != -1:
                continue
            j, ahead, pending = _probe_miss(keys, out, i, mask, index, ahead, pending)
            key = keys[i]
            r = index[j, 1]
            if r < 0:
                n_free -= 1
                r = free[n_free]
                index[j, 0] = key
                index[j, 1] = r
                row_key[r] = key
                row_live[r] = 1
                pin[r] = epoch
                new_keys[n] = key
                new_rows[n] = r
                n += 1
            out[i] = r
    return n, n_free


@njit(parallel=True, cache=True, nogil=True)
def count_misses(out_list, counts):
    """``counts[f]`` = positions of feature ``f`` without a row (``out < 0``)."""
    for f in prange(counts.shape[0]):
        out = out_list[np.int64(f)]
        c = 0
        for i in range(out.shape[0]):
            if out[i] < 0:
                c += 1
        counts[f] = c


@njit(parallel=True, cache=True, nogil=True)
def resolve_tables(keys_list, out_list, feat_flat, feat_starts, order, bin_starts, fused,
                   indexes, row_keys, row_lives, frees, n_frees, pins, epoch, miss_keys,
                   miss_aux, miss_counts, n_out):
    """The per-table miss phase of a group, tables in parallel: bin ``b`` (one task) runs
    tables ``order[bin_starts[b]:bin_starts[b + 1]]`` one after the other. Table ``t``'s
    features are ``feat_flat[feat_starts[t]:feat_starts[t + 1]]``. ``fused[t]``: its misses
    are inserted at once (:func:`_insert_misses`, new rows into ``miss_aux[t]``, free count
    ``n_frees[t]`` updated); else collected (:func:`_collect_misses_at` with the scratch
    index ``indexes[t]`` and its slots in ``miss_aux[t]``, counts into ``miss_counts[t]``).
    ``n_out[t]``: the distinct missed keys. A table's work is serial and ordered and touches
    only its own arrays, so the results do not depend on the bins or the thread count."""
    for b in prange(bin_starts.shape[0] - 1):
        for k in range(bin_starts[b], bin_starts[b + 1]):
            t = order[k]
            feats = feat_flat[feat_starts[t]:feat_starts[t + 1]]
            if fused[t]:
                n, nf = _insert_misses(keys_list, out_list, feats, indexes[t], row_keys[t],
                                       row_lives[t], frees[t], n_frees[t], pins[t], epoch,
                                       miss_keys[t], miss_aux[t])
                n_frees[t] = nf
            else:
                n = _collect_misses_at(keys_list, out_list, feats, indexes[t], miss_keys[t],
                                       miss_counts[t], miss_aux[t])
            n_out[t] = n


@njit(parallel=True, cache=True, nogil=True)
def assign_misses(out_list, feats, slot_of):
    """``out[i] = slot_of[-2 - out[i]]`` for every missed position of ``feats``."""
    for fi in range(feats.shape[0]):
        out = out_list[feats[fi]]
        for i in prange(out.shape[0]):
            v = out[i]
            if v <= -2:
                out[i] = slot_of[-2 - v]


@njit(cache=True, nogil=True)
def clear_index(index, keys):
    """Mark the entries of ``keys`` empty again (a small scratch index reused every step)."""
    for i in range(keys.shape[0]):
        index_delete(index, keys[i])


# ------------------------------------------------------------------------------- admission


@njit(cache=True, nogil=True)
def count_admit(counter, keys, counts, min_count, admitted):
    """Exact counting admission: each key's count grows by its occurrences; a key reaching
    ``min_count`` is admitted and leaves the counter. ``counter``: an index whose row field
    holds the count (empty: < 0). Returns the keys now pending (counted, not admitted)."""
    pending_delta = 0
    for i in range(keys.shape[0]):
        key = keys[i]
        mask = counter.shape[0] - 1
        j = _home(key, mask)
        found = -1
        while True:
            if counter[j, 1] < 0:
                break
            if counter[j, 0] == key:
                found = j
                break
            j = (j + 1) & mask
        total = np.int64(counts[i]) + (counter[found, 1] if found >= 0 else 0)
        if total >= min_count:
            admitted[i] = True
            if found >= 0:
                index_delete(counter, key)
                pending_delta -= 1
        else:
            admitted[i] = False
            if found >= 0:
                counter[found, 1] = total
            else:
                counter[j, 0] = key
                counter[j, 1] = total
                pending_delta += 1
    return pending_delta


@njit(cache=True, nogil=True)
def rehash(src, dst):
    """Insert every entry of index ``src`` into the empty index ``dst``."""
    for i in range(src.shape[0]):
        if src[i, 1] >= 0:
            index_insert(dst, src[i, 0], src[i, 1])


@njit(cache=True, nogil=True)
def bloom_admit(filt, hashes, keys, counts, min_count, admitted):
    """Counting Bloom filter admission: ``hashes`` saturating uint8 counters per key (double
    hashing over ``filt``); a key is admitted when its smallest counter, after adding its
    occurrences, reaches ``min_count``."""
    m = np.uint64(filt.shape[0])
    for i in range(keys.shape[0]):
        k = np.uint64(keys[i])
        h1 = mix64(k ^ _BLOOM_SALT1)
        h2 = mix64(k ^ _BLOOM_SALT2) | np.uint64(1)
        low = 255
        for j in range(hashes):
            p = np.int64((h1 + np.uint64(j) * h2) % m)
            c = min(np.int64(filt[p]) + counts[i], 255)
            filt[p] = c
            low = min(low, c)
        admitted[i] = low >= min_count


@njit(cache=True, nogil=True)
def probability_admit(base, p, keys, admitted):
    """Admit a key when a hash of (seed, table, key) mapped to [0, 1) is below ``p``."""
    for i in range(keys.shape[0]):
        u = unit53(mix64(base ^ mix64(np.uint64(keys[i]))))
        admitted[i] = u < p


# ------------------------------------------------------------------------------- rows


@njit(cache=True, nogil=True)
def remove_rows(index, rows, row_key, row_live, free, n_free):
    """Delete ``rows`` (live) from the index and push them on the free stack; returns the new
    number of free rows."""
    for i in range(rows.shape[0]):
        r = rows[i]
        index_delete(index, row_key[r])
        row_live[r] = 0
        free[n_free] = r
        n_free += 1
    return n_free


@njit(cache=True, nogil=True)
def expired_rows(meta, row_live, limit, out):
    """Live rows whose ``last_step`` (``meta[:, 1] - 1``) is at most ``limit``, ascending,
    into ``out``; returns ``(count, smallest last_step among the others)``."""
    n = 0
    low = np.int64(1) << 62
    for r in range(row_live.shape[0]):
        if row_live[r] == 0:
            continue
        last = np.int64(meta[r, 1]) - 1
        if last <= limit:
            out[n] = r
            n += 1
        elif last < low:
            low = last
    return n, low


@njit(cache=True, nogil=True)
def insert_keys(index, keys, row_key, row_live, free, n_free, pin, epoch, rows_out):
    """Give each of ``keys`` (absent) a row popped from the free stack, in order; returns the
    new number of free rows (the caller made sure there are enough)."""
    for i in range(keys.shape[0]):
        n_free -= 1
        r = free[n_free]
        index_insert(index, keys[i], r)
        row_key[r] = keys[i]
        row_live[r] = 1
        pin[r] = epoch
        rows_out[i] = r
    return n_free


@njit(parallel=True, cache=True, nogil=True)
def find_many(index, keys, out):
    """``out[i]`` = row of ``keys[i]`` or -1."""
    for i in prange(keys.shape[0]):
        out[i] = index_find(index, keys[i])


@njit(parallel=True, cache=True, nogil=True)
def fresh_rows(values, slot1, slot2, slot_inits, meta, target, init_values, vcode, scode):
    """Rows ``target`` start afresh: values from ``init_values`` (float32), each optimizer
    slot at its initial value (``slot1``/``slot2``: the group's slot arrays, or 0-row
    dummies), metadata zero. A half table's arrays (uint16; ``vcode``/``scode``: the
    ``codes.VAL_*`` of values and slots) take the values narrowed to nearest, as a static
    half table's initial values are. Parallel over rows (numpy's fancy assignment of the
    same took 10x longer)."""
    dim = values.shape[1]
    for i in prange(target.shape[0]):
        r = target[i]
        for c in range(dim):
            st(values, r, c, init_values[i, c], vcode, ROUND_NEAREST, np.uint64(0), c)
        if slot1.shape[0] > 0:
            v = np.float32(slot_inits[0])
            for c in range(slot1.shape[1]):
                st(slot1, r, c, v, scode, ROUND_NEAREST, np.uint64(0), c)
        if slot2.shape[0] > 0:
            v = np.float32(slot_inits[1])
            for c in range(slot2.shape[1]):
                st(slot2, r, c, v, scode, ROUND_NEAREST, np.uint64(0), c)
        meta[r, 0] = 0
        meta[r, 1] = 0


@njit(parallel=True, cache=True, nogil=True)
def fresh_keyed_rows(values, slot1, slot2, slot_inits, meta, target, init_row, table_of,
                     bases, kinds, params, vcode, scode):
    """:func:`fresh_rows` for the new rows of several tables of a group at once: row
    ``target[i]`` takes the initial value of row ``init_row[i]`` of table ``table_of[i]``'s
    initializer (``bases``, ``kinds``, ``params`` per table: the values ``init_rows`` gives),
    each optimizer slot its initial value, metadata zero (half arrays narrowed to nearest, as
    :func:`fresh_rows` does). One parallel pass for the group."""
    dim = values.shape[1]
    cm = np.empty((2, dim), dtype=np.uint64)
    for c in range(dim):
        cm[0, c] = column_stream(c, 0)
        cm[1, c] = column_stream(c, 1)
    for i in prange(target.shape[0]):
        r = target[i]
        t = table_of[i]
        rh = row_hash(bases[t], init_row[i])
        kind, param = kinds[t], params[t]
        if kind == INIT_UNIFORM:  # branch-free: the compiler's vector lanes
            for c in range(dim):
                st(values, r, c, uniform_value(param, rh, cm[0, c]), vcode, ROUND_NEAREST,
                   np.uint64(0), c)
        else:
            for c in range(dim):
                st(values, r, c, init_value(kind, param, rh, c, cm[0, c], cm[1, c]), vcode,
                   ROUND_NEAREST, np.uint64(0), c)
        if slot1.shape[0] > 0:
            v = np.float32(slot_inits[0])
            for c in range(slot1.shape[1]):
                st(slot1, r, c, v, scode, ROUND_NEAREST, np.uint64(0), c)
        if slot2.shape[0] > 0:
            v = np.float32(slot_inits[1])
            for c in range(slot2.shape[1]):
                st(slot2, r, c, v, scode, ROUND_NEAREST, np.uint64(0), c)
        meta[r, 0] = 0
        meta[r, 1] = 0
