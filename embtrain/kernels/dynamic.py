"""CPU kernels of dynamic (hash) tables: key → row index, admission, victim selection, TTL.

A dynamic table of capacity ``C`` owns rows ``0..C-1`` of its group's value, slot and
``meta`` arrays (the same fused arrays static tables use). Its *index* maps int64 keys of any
value to those rows: open addressing with linear probing over ``index[n, 2]`` int64 entries
``(key, row)`` (``row < 0``: empty), ``n`` a power of two of at least ``2 C`` (load ≤ ½), one
16-byte entry per probe (four per cache line), deleted by backward shift (no tombstones).

Per training step the engine runs, per group: :func:`lookup_group` (parallel, read-only on
the index: each key's row or a miss, and a *pin* on every row the batch reads), then per
table :func:`collect_misses` (serial, in feature-then-position order: the distinct missed keys
in order of first occurrence and their counts), the admission policy on those, victims
(``DynamicTable.victims``: the live unpinned rows of smallest ``(score, key)``) when the free
rows do not suffice, :func:`insert_keys` and :func:`assign_misses`. Everything that decides
which key gets which row is serial and ordered, so results do not depend on the thread count;
the values a key reads do not depend on its row at all.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from embtrain.kernels import numba_cache
from embtrain.kernels._llvm import prefetch
from embtrain.kernels.rules.hashing import mix64, unit53

numba_cache.install()

_INDEX_SALT = np.uint64(0x5DEECE66D1234567)
_BLOOM_SALT1 = np.uint64(0x2545F4914F6CDD1D)
_BLOOM_SALT2 = np.uint64(0x9FB21C651E98DF25)
_PF = 16  # keys ahead the lookup prefetches

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


@njit(parallel=True, cache=True, nogil=True)
def lookup_group(keys_list, feat_table, indexes, out_list, chunk):
    """``out[f][i]`` = row of ``keys[f][i]`` in table ``feat_table[f]``'s index, else -1.
    Parallel over chunks of keys; each key's home slot is computed once, ``_PF`` keys ahead,
    and prefetched."""
    nf = len(keys_list)
    starts = np.zeros(nf + 1, dtype=np.int64)
    for f in range(nf):
        starts[f + 1] = starts[f] + (keys_list[f].shape[0] + chunk - 1) // chunk
    for item in prange(starts[nf]):
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
                    break
                if index[j, 0] == key:
                    r = e
                    break
                j = (j + 1) & mask
            out[i] = r


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
def fresh_rows(values, slot1, slot2, slot_inits, meta, target, init_values):
    """Rows ``target`` start afresh: values from ``init_values``, each optimizer slot at its
    initial value (``slot1``/``slot2``: the group's slot arrays, or 0-row dummies), metadata
    zero. Parallel over rows (numpy's fancy assignment of the same took 10x longer)."""
    dim = values.shape[1]
    for i in prange(target.shape[0]):
        r = target[i]
        for c in range(dim):
            values[r, c] = init_values[i, c]
        if slot1.shape[0] > 0:
            v = np.float32(slot_inits[0])
            for c in range(slot1.shape[1]):
                slot1[r, c] = v
        if slot2.shape[0] > 0:
            v = np.float32(slot_inits[1])
            for c in range(slot2.shape[1]):
                slot2[r, c] = v
        meta[r, 0] = 0
        meta[r, 1] = 0
