"""The CPU backward kernel, :func:`backward_update`, with the fused sparse optimizer update.

Table-parallel: keys are deduplicated through a direct-address map while their gradients are
summed into ``acc`` in block-major order, then the optimizer runs over the unique rows in
order of first visit; the backward reads the keys once and never sorts. It keeps one loop
per built-in optimizer (each calling its rule from :mod:`embtrain.kernels.rules.optimizers`;
one shared all-kinds loop measured 20-55 % slower, docs/PERFORMANCE.md).

Every kernel is ``@njit(parallel=True, cache=True, fastmath=False, nogil=True)`` and
deterministic (see :mod:`embtrain.kernels.cpu` for the vocabulary).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from embtrain.kernels import numba_cache, typed_lists
from embtrain.kernels._llvm import (
    axpy,
    bf16_axpy,
    bf16_scale_copy,
    prefetch,
    scale_copy,
)
from embtrain.kernels.codes import (
    COMB_CONCAT,
    COMB_MEAN,
    COMB_SQRTN,
    COMB_SUM,
    OPT_ADAGRAD,
    OPT_ADAM,
    OPT_FTRL,
    OPT_LAZY_ADAM,
    OPT_SGD,
    SPLIT_BITS,
    SPLIT_PARTS,
)
from embtrain.kernels.cpu_bags import PREFETCH, bag_start, is_one_hot
from embtrain.kernels.halves import (
    flush_row,
    ld,
    ld_widened,
    row_scratch,
    st,
    st_deferred,
    widen_row,
)
from embtrain.kernels.rules.halves import round_base, round_row, slot_column
from embtrain.kernels.rules.hashing import GOLDEN
from embtrain.kernels.rules.optimizers import (
    adagrad,
    adam,
    ftrl,
    is_row_wise,
    row_factors,
    row_wise_apply,
    row_wise_begin,
    sgd,
    slot_count,
    update_elem,
)

numba_cache.install()  # before the first @njit(cache=True): compiled code goes to its cache_dir()
typed_lists.install()  # typed lists built from Python: numba's helpers from that cache too

# --------------------------------------------------------------------------------------------
# Backward + fused sparse optimizer update.
# --------------------------------------------------------------------------------------------

# rows of a worker's :func:`row_scratch` (:func:`_update_row`)
_SB_SLOT1, _SB_SLOT2, _SB_VALUES = 0, 1, 2

_SPLIT_MUL = GOLDEN  # Fibonacci hashing: the golden ratio's 64-bit constant
_SPLIT_SHIFT = np.uint64(64 - SPLIT_BITS)


def row_part(rows: np.ndarray) -> np.ndarray:
    """The part (``0 .. SPLIT_PARTS-1``) of table-local rows: the top bits of a Fibonacci
    hash, so every part gets a fair share of the rows a batch touches, whatever their ids."""
    r = np.asarray(rows, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        return ((r * _SPLIT_MUL) >> _SPLIT_SHIFT).astype(np.int64)


@njit(cache=True)
def _row_wise_accumulate(kind, hp, slot1, r, squares, dim, sc, rm, rh):
    """Add a row's ``squares`` to its one accumulator ``slot1[r, 0]``; returns the update's
    factor. A function of its own, not inlined into :func:`_update_row`: inlined there,
    numba's IR inlining of ``ld``/``st`` lost this store (rowwise_adagrad's accumulator never
    changed; tests/test_backends.py)."""
    new_acc, factor = row_wise_begin(kind, hp, ld(slot1, r, 0, sc), squares, dim)
    st(slot1, r, 0, new_acc, sc, rm, rh, slot_column(0, 0))
    return factor


@njit(cache=True, inline="always")
def _update_row(kind, hp, values, slot1, slot2, r, acc, u, step, last, n_slots, h, sb):
    """Apply the optimizer (:mod:`embtrain.kernels.rules.optimizers`) to group row ``r`` with
    summed gradient ``acc[u, :]``; ``n_slots`` = ``slot_count(kind)``. The optimizers of the
    first branches get a loop of their own rule (the kind tested once per row, as fast as
    hand-written code); any other kind runs through :func:`update_elem`.

    Rows go through :mod:`embtrain.kernels.halves`: for float32 arrays plain indexing; a
    half array's row is widened once (:func:`widen_row`, vector lanes) into the worker's
    scratch ``sb`` (:func:`row_scratch`: row ``_SB_VALUES`` the values, ``_SB_SLOT1`` /
    ``_SB_SLOT2`` the slots), read there (:func:`ld_widened`), its new float32 values kept
    (:func:`st_deferred`: the values' in ``acc[u]``, whose gradient they replace element by
    element; the slots' in ``sb``) and narrowed once (:func:`flush_row`, vector lanes; a
    slot from its rounding stream's first column :func:`slot_column`).
    ``h``: ``(vcode, scode, rmode, rh, c0)``: the codes, the rounding mode, the row's
    rounding stream and its first global column (:func:`_row_ctx`)."""
    dim = values.shape[1]
    vc, sc, rm, rh, c0 = h
    widen_row(values, r, sb, _SB_VALUES, vc)
    if kind == OPT_SGD:
        for d in range(dim):
            w = sgd(hp, ld_widened(values, r, d, sb, _SB_VALUES), acc[u, d])
            st_deferred(values, r, d, w, acc, u)
    elif kind == OPT_ADAGRAD:
        widen_row(slot1, r, sb, _SB_SLOT1, sc)
        for d in range(dim):
            w, a = adagrad(hp, ld_widened(values, r, d, sb, _SB_VALUES),
                           ld_widened(slot1, r, d, sb, _SB_SLOT1), acc[u, d])
            st_deferred(slot1, r, d, a, sb, _SB_SLOT1)
            st_deferred(values, r, d, w, acc, u)
        flush_row(slot1, r, sb, _SB_SLOT1, sc, rm, rh, slot_column(c0, 0))
    elif kind == OPT_ADAM or kind == OPT_LAZY_ADAM:  # noqa: SIM109 (numba: `in` on a tuple is a call)
        f1, f2 = row_factors(kind, hp, step, last)
        widen_row(slot1, r, sb, _SB_SLOT1, sc)
        widen_row(slot2, r, sb, _SB_SLOT2, sc)
        for d in range(dim):
            w, m, v = adam(hp, ld_widened(values, r, d, sb, _SB_VALUES),
                           ld_widened(slot1, r, d, sb, _SB_SLOT1),
                           ld_widened(slot2, r, d, sb, _SB_SLOT2), acc[u, d], f1, f2)
            st_deferred(slot1, r, d, m, sb, _SB_SLOT1)
            st_deferred(slot2, r, d, v, sb, _SB_SLOT2)
            st_deferred(values, r, d, w, acc, u)
        flush_row(slot1, r, sb, _SB_SLOT1, sc, rm, rh, slot_column(c0, 0))
        flush_row(slot2, r, sb, _SB_SLOT2, sc, rm, rh, slot_column(c0, 1))
    elif kind == OPT_FTRL:
        widen_row(slot1, r, sb, _SB_SLOT1, sc)
        widen_row(slot2, r, sb, _SB_SLOT2, sc)
        for d in range(dim):
            w, a, lin = ftrl(hp, ld_widened(values, r, d, sb, _SB_VALUES),
                             ld_widened(slot1, r, d, sb, _SB_SLOT1),
                             ld_widened(slot2, r, d, sb, _SB_SLOT2), acc[u, d])
            st_deferred(slot2, r, d, lin, sb, _SB_SLOT2)
            st_deferred(values, r, d, w, acc, u)
            st_deferred(slot1, r, d, a, sb, _SB_SLOT1)
        flush_row(slot2, r, sb, _SB_SLOT2, sc, rm, rh, slot_column(c0, 1))
        flush_row(slot1, r, sb, _SB_SLOT1, sc, rm, rh, slot_column(c0, 0))
    elif is_row_wise(kind):
        s = np.float32(0.0)
        for d in range(dim):
            g = acc[u, d]
            s += g * g
        factor = _row_wise_accumulate(kind, hp, slot1, r, s, dim, sc, rm, rh)
        for d in range(dim):
            w = row_wise_apply(kind, hp, ld_widened(values, r, d, sb, _SB_VALUES), acc[u, d],
                               factor)
            st_deferred(values, r, d, w, acc, u)
    else:
        zero = np.float32(0.0)
        f1, f2 = row_factors(kind, hp, step, last)
        if n_slots > 0:
            widen_row(slot1, r, sb, _SB_SLOT1, sc)
        if n_slots > 1:
            widen_row(slot2, r, sb, _SB_SLOT2, sc)
        for d in range(dim):
            a1 = ld_widened(slot1, r, d, sb, _SB_SLOT1) if n_slots > 0 else zero
            a2 = ld_widened(slot2, r, d, sb, _SB_SLOT2) if n_slots > 1 else zero
            w, a1, a2 = update_elem(kind, hp, ld_widened(values, r, d, sb, _SB_VALUES), a1, a2,
                                    acc[u, d], f1, f2)
            st_deferred(values, r, d, w, acc, u)
            if n_slots > 0:
                st_deferred(slot1, r, d, a1, sb, _SB_SLOT1)
            if n_slots > 1:
                st_deferred(slot2, r, d, a2, sb, _SB_SLOT2)
        if n_slots > 0:
            flush_row(slot1, r, sb, _SB_SLOT1, sc, rm, rh, slot_column(c0, 0))
        if n_slots > 1:
            flush_row(slot2, r, sb, _SB_SLOT2, sc, rm, rh, slot_column(c0, 1))
    flush_row(values, r, acc, u, vc, rm, rh, c0)


@njit(cache=True, inline="always")
def _row_ctx(half, htab, t, rb, r, off, rkeys):
    """``(vcode, scode, rmode, rh, first column)`` of group row ``r`` of table ``t`` (first
    group row ``off``, rounding stream ``rb`` = ``round_base(seed, step, table id)``):
    ``half`` = ``(vcode, scode, rmode, seed)``, ``htab[t]`` = ``(table id, row offset, row
    stride, first column)`` of the table in its full table; ``rh`` is the stream of the
    row's global row. ``rkeys`` (a keyed group's: dynamic or tiered tables) holds each
    group row's key, taken instead of ``r - off``; empty for static rows."""
    k = r - off if rkeys.shape[0] == 0 else rkeys[r]
    grow = htab[t, 1] + htab[t, 2] * k
    return half[0], half[1], half[2], round_row(rb, grow), htab[t, 3]


@njit(cache=True, inline="always")
def _number_rows(keys, p0, p1, off, nrows, plo, phi, row_map, stamp, uniq, us, n, ids, err, wi):
    """Pass 1 of ``_scatter_rows``: give the keys at positions ``p0 <= p < p1`` their row's id
    (rows seen for the first time get ``n, n+1, ...``). ``ids[p - p0]``: the id ``u`` of a
    row seen before, ``-(u + 2)`` for a first visit, ``-1`` for a key not taken (another
    work item's part, or invalid: ``err[wi] = 1``). ``row_map[r] == stamp + u`` marks row
    ``r`` as seen in this call with id ``u < n``; any other entry is from an earlier call.
    Returns the new ``n``."""
    split = plo != 0 or phi != SPLIT_PARTS
    for p in range(p0, p1):
        if p + PREFETCH < p1:  # (a prefetch of a wild address is harmless)
            prefetch(row_map, off + keys[p + PREFETCH])
        k = keys[p]
        if np.uint64(k) >= np.uint64(nrows):
            err[wi] = 1
            ids[p - p0] = -1
            continue
        if split:
            part = (np.uint64(k) * _SPLIT_MUL) >> _SPLIT_SHIFT
            if part < plo or part >= phi:
                ids[p - p0] = -1
                continue
        r = off + k
        u = row_map[r] - stamp
        if np.uint64(u) >= np.uint64(n):  # not seen in this call (ids seen are < n)
            row_map[r] = stamp + n
            uniq[us + n] = r
            ids[p - p0] = -(n + 2)
            n += 1
        else:
            ids[p - p0] = u
    return n


@njit(cache=True, inline="always")
def _add_row(acc, us, v, grads, grads16, gc, c, dim):
    """Pass 2 of ``_scatter_rows`` for one key with id code ``v`` (see ``_number_rows``):
    set (first visit) or add ``c * grads[gc : gc + dim]`` into its ``acc`` row; from the
    bfloat16 gradients ``grads16`` (widened exactly) when they are given (not ``[0, 0]``)."""
    if grads16.shape[1] > 0:
        if v >= 0:
            bf16_axpy(acc, (us + v) * dim, grads16, gc, c, dim)
        elif v < -1:
            bf16_scale_copy(acc, (us - v - 2) * dim, grads16, gc, c, dim)
    elif v >= 0:
        axpy(acc, (us + v) * dim, grads, gc, c, dim)
    elif v < -1:
        scale_copy(acc, (us - v - 2) * dim, grads, gc, c, dim)


@njit(cache=True)
def _scatter_one_hot(w, col, ids, acc, us, grads, grads16, width, b0, b1, dim):
    """Pass 2 of ``_scatter_rows`` for one key per bag (position ``b``) and weight-only
    scaling (sum, or unweighted mean/sqrtn)."""
    has_w = w.shape[0] > 0
    for b in range(b0, b1):
        c = w[b] if has_w else np.float32(1.0)
        _add_row(acc, us, ids[b - b0], grads, grads16, b * width + col, c, dim)


@njit(cache=True, inline="always")
def _scatter_rows(
    keys, offs, bag, w, off, nrows, col, comb, plo, phi, row_map, stamp, uniq, acc, us, n, grads,
    grads16, width, b0, b1, dim, ids, err, wi,
):  # fmt: skip
    """Add one feature's per-key gradients of bags ``b0 <= b < b1`` into the work item's
    ``acc`` rows, deduplicating on the way; ``dim`` literal when the caller passes one.

    Only keys whose row hashes into parts ``[plo, phi)`` are taken. A row seen for the first
    time gets the next id ``n`` (``row_map[row] = stamp + n``, ``uniq[us + n] = row``) and its
    contribution is *set* into ``acc[us + n]`` (no zeroing pass); later ones are added.
    Two passes over the block's keys: ids first (a tight loop whose ``row_map`` misses
    overlap), then the sums (``ids`` holds the block's ids, in cache). Returns the new
    ``n``. ``bag`` > 0: every bag holds ``bag`` keys (``offs`` is not read). A key or bag
    that is invalid (the inputs changed after the forward checked them) sets ``err[wi] = 1``
    and is skipped."""
    has_w = w.shape[0] > 0
    nnz = keys.shape[0]
    p0 = min(max(bag_start(offs, bag, b0), 0), nnz)
    p1 = min(max(bag_start(offs, bag, b1), p0), nnz, p0 + ids.shape[0])
    n = _number_rows(
        keys, p0, p1, off, nrows, plo, phi, row_map, stamp, uniq, us, n, ids, err, wi
    )  # fmt: skip
    if (
        (comb == COMB_SUM or not has_w)
        and comb != COMB_CONCAT
        and is_one_hot(offs, bag, b0, b1, nnz)
    ):
        _scatter_one_hot(w, col, ids, acc, us, grads, grads16, width, b0, b1, dim)
        return n
    for b in range(b0, b1):
        s = bag_start(offs, bag, b)
        e = bag_start(offs, bag, b + 1)
        if s < p0 or e > p1 or s > e:
            err[wi] = 1
            continue
        if s == e:
            continue
        scale = np.float32(1.0)
        if comb == COMB_MEAN or comb == COMB_SQRTN:  # noqa: SIM109 (numba: `in` on a tuple is a call)
            sw = np.float32(0.0)
            for p in range(s, e):
                wp = w[p] if has_w else np.float32(1.0)
                sw += wp * wp if comb == COMB_SQRTN else wp
            den = sw if comb == COMB_MEAN else np.sqrt(sw)
            scale = np.float32(1.0) / den if den != 0 else np.float32(0.0)
        gb = b * width + col
        for p in range(s, e):
            c = w[p] * scale if has_w else scale
            gc = gb + (p - s) * dim if comb == COMB_CONCAT else gb
            _add_row(acc, us, ids[p - p0], grads, grads16, gc, c, dim)
    return n


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def backward_update(
    keys_list,
    offsets_list,
    weights_list,
    feat_bag,
    table_offset,
    table_rows,
    feat_col,
    feat_comb,
    tf_ptr,
    tf_idx,
    grads,
    grads16,
    wl_ptr,
    item_table,
    item_plo,
    item_phi,
    item_start,
    row_map,
    stamp,
    uniq,
    acc,
    nuniq,
    err,
    kind,
    hp,
    values,
    slot1,
    slot2,
    meta,
    step,
    block,
    block_keys,
    half,
    htab,
    rkeys,
):
    """Per-key gradients, deduplication, duplicate reduction and the optimizer, in one pass.

    Worker ``th`` owns work items ``wl_ptr[th] : wl_ptr[th+1]``; item ``i`` covers the rows
    of table ``t = item_table[i]`` whose part (``row_part``) is in
    ``[item_plo[i], item_phi[i])`` (``[0, SPLIT_PARTS)``: the whole table), and owns rows
    ``item_start[i] : item_start[i] + nnz(t)`` of ``uniq`` and ``acc``. The worker visits
    its tables' keys in *block-major* order and sums every contribution
    ``coef * grads[b, col:col+dim]`` of a row into the row's ``acc`` row, numbering rows in
    order of first visit: ``row_map[row] = stamp + id`` (int32). Every entry earlier calls
    left in the map must be below ``stamp`` (the engine raises it each call and zeroes the
    map when it runs out of stamps), so the map is never restored row by row. Then it
    updates the ``nuniq[i]`` rows in id order: ``values``, the slots,
    ``meta[row] = (update_count + 1, step + 1)`` (``meta`` holds
    ``(update_count, last_step + 1)``, zero for fresh rows). Each row's sum runs in the same
    order whatever the split, so results do not depend on the number of workers.
    ``err[i] = 1``: a key or bag of item ``i`` was invalid and skipped (see ``_scatter_rows``).
    ``block_keys``: at least the number of keys any feature has in one block of samples.
    ``half`` (int64: value code, slot code, rounding mode, seed) and ``htab`` (int64 per
    table: id, row offset, row stride, first column in its full table) say how a half
    table's arrays are narrowed (:func:`_row_ctx`; ``rkeys``: a keyed group's row keys, or
    empty); float32 arrays ignore them. ``grads16``: ``[batch, width]`` bfloat16 patterns read
    instead of ``grads`` (then a dummy), or ``[0, 0]``.
    """
    dim = values.shape[1]
    half_grads = grads16.shape[1] > 0
    batch = grads16.shape[0] if half_grads else grads.shape[0]
    width = grads16.shape[1] if half_grads else grads.shape[1]
    nblk = (batch + block - 1) // block
    s1w = slot1.shape[1]
    s2w = slot2.shape[1]
    n_slots = slot_count(kind)
    for th in prange(wl_ptr.shape[0] - 1):
        i0 = wl_ptr[th]
        i1 = wl_ptr[th + 1]
        ids = np.empty(block_keys, dtype=np.int64)
        sb = row_scratch(values, slot1, slot2)
        for wi in range(i0, i1):
            nuniq[wi] = 0
        for blk in range(nblk):
            b0 = blk * block
            b1 = min(batch, b0 + block)
            for wi in range(i0, i1):
                t = item_table[wi]
                off = table_offset[t]
                nrows = table_rows[t]
                plo = np.uint64(item_plo[wi])
                phi = np.uint64(item_phi[wi])
                us = item_start[wi]
                for j in range(tf_ptr[t], tf_ptr[t + 1]):
                    f = tf_idx[j]
                    keys = keys_list[f]
                    offs = offsets_list[f]
                    w = weights_list[f]
                    bag = feat_bag[f]
                    col = feat_col[f]
                    comb = feat_comb[f]
                    n = nuniq[wi]
                    if dim == 16:
                        n = _scatter_rows(
                            keys, offs, bag, w, off, nrows, col, comb, plo, phi, row_map, stamp, uniq,
                            acc, us, n, grads, grads16, width, b0, b1, 16, ids, err, wi,
                        )  # fmt: skip
                    elif dim == 8:
                        n = _scatter_rows(
                            keys, offs, bag, w, off, nrows, col, comb, plo, phi, row_map, stamp, uniq,
                            acc, us, n, grads, grads16, width, b0, b1, 8, ids, err, wi,
                        )  # fmt: skip
                    elif dim == 32:
                        n = _scatter_rows(
                            keys, offs, bag, w, off, nrows, col, comb, plo, phi, row_map, stamp, uniq,
                            acc, us, n, grads, grads16, width, b0, b1, 32, ids, err, wi,
                        )  # fmt: skip
                    elif dim == 64:
                        n = _scatter_rows(
                            keys, offs, bag, w, off, nrows, col, comb, plo, phi, row_map, stamp, uniq,
                            acc, us, n, grads, grads16, width, b0, b1, 64, ids, err, wi,
                        )  # fmt: skip
                    else:
                        n = _scatter_rows(
                            keys, offs, bag, w, off, nrows, col, comb, plo, phi, row_map, stamp, uniq,
                            acc, us, n, grads, grads16, width, b0, b1, dim, ids, err, wi,
                        )  # fmt: skip
                    nuniq[wi] = n
        for wi in range(i0, i1):
            us = item_start[wi]
            n = nuniq[wi]
            t = item_table[wi]
            off = table_offset[t]
            rb = round_base(half[3], step, htab[t, 0])
            for rk in range(n):
                if rk + PREFETCH < n:
                    rr = uniq[us + rk + PREFETCH]
                    prefetch(values, rr * dim)
                    prefetch(meta, rr * 2)
                    if n_slots > 0:
                        prefetch(slot1, rr * s1w)
                    if n_slots > 1:
                        prefetch(slot2, rr * s2w)
                r = uniq[us + rk]
                last = meta[r, 1] - 1
                h = _row_ctx(half, htab, t, rb, r, off, rkeys)
                _update_row(kind, hp, values, slot1, slot2, r, acc, us + rk, step, last, n_slots,
                            h, sb)
                meta[r, 0] += 1
                meta[r, 1] = step + 1


