"""CPU kernels of the embedding engine, compiled with numba.

Every kernel is ``@njit(parallel=True, cache=True, fastmath=False)`` and deterministic: work is
split by table (tables of one group own disjoint row ranges) or by blocks of samples, and
every reduction runs in a fixed key order (block-major, below), so the result never depends
on the number of threads.

Vocabulary shared with :mod:`embtrain.embedding.engine`:

* a *group* packs several tables into one ``values[total_rows, dim]`` array; table ``t`` owns
  rows ``table_offset[t] : table_offset[t] + table_rows[t]``;
* the group's features are numbered ``0..nf-1``; feature ``f`` reads table ``feat_table[f]``;
  its keys occupy *positions* ``pos_start[f] : pos_start[f+1]`` of the group;
* ``tf_ptr``/``tf_idx``: CSR listing, for each table, the features reading it (ascending);
* *block-major* key order of a table: for each block of ``block`` samples, for each feature
  reading the table, that feature's keys of those samples (dedup and backward agree on it);
* per-worker work lists ``wl_ptr[th] : wl_ptr[th+1]`` index work items, assigned by the engine.

Per step: ``dedup`` (table-parallel: a direct-address map gives each row its table-local id
``lid`` in order of first visit), ``pool_forward`` (sample-block-parallel gather + pool, output through a cached
staging block and non-temporal stores), ``backward_update`` (table-parallel: per-key gradients
summed into ``acc`` in block-major order, then the optimizer over the unique rows in ``lid``
order). Hot loops use software prefetch and explicit vector row operations
(:mod:`embtrain.kernels._llvm`); the row width is a compile-time constant for dims 8/16/32/64.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence

import numba
import numpy as np
from numba import njit, prange
from numba.typed import List

from embtrain.kernels._llvm import axpy, prefetch, scale_copy, store_fence, stream16
from embtrain.kernels.codes import (
    COMB_CONCAT,
    COMB_MEAN,
    COMB_SQRTN,
    COMB_SUM,
    HP_BETA1,
    HP_BETA2,
    HP_EPS,
    HP_L1,
    HP_L2,
    HP_L2_SHRINKAGE,
    HP_LR,
    HP_LR_POWER,
    HP_LR_T,
    HP_ONE_MINUS_BETA1,
    HP_ONE_MINUS_BETA2,
    INIT_CONSTANT,
    INIT_NORMAL,
    INIT_TRUNCATED_NORMAL,
    INIT_UNIFORM,
    INIT_ZEROS,
    OPT_ADAGRAD,
    OPT_ADAM,
    OPT_FTRL,
    OPT_LAZY_ADAM,
    OPT_ROWWISE_ADAGRAD,
    OPT_SGD,
)

# --------------------------------------------------------------------------------------------
# Counter-based initialisation: value = f(seed, table name, row, column), nothing else.
# --------------------------------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_S8 = np.uint64(8)
_TWO_POW_M53 = 1.0 / 9007199254740992.0
_TWO_PI = 6.283185307179586

_MAX_TRUNC_ATTEMPTS = 127


@njit(cache=True, inline="always")
def mix64(z: np.uint64) -> np.uint64:
    """splitmix64 output function of state ``z`` (adds the golden gamma, then finalises)."""
    z = z + _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@njit(cache=True, inline="always")
def _unit(bits: np.uint64) -> float:
    """Top 53 bits as a float64 in [0, 1)."""
    return np.float64(bits >> _S11) * _TWO_POW_M53


@njit(cache=True)
def _column_mix(dim):
    """``mix64(c << 8 | j)`` for every column ``c`` and the first two streams ``j``."""
    cm = np.empty((2, dim), dtype=np.uint64)
    for c in range(dim):
        cm[0, c] = mix64(np.uint64(c) << _S8)
        cm[1, c] = mix64((np.uint64(c) << _S8) | np.uint64(1))
    return cm


@njit(cache=True, inline="always")
def _init_row(out, i, row, base, kind, param, cm):
    """Write the initial value of ``row`` into ``out[i, :]`` (``cm`` from ``_column_mix``)."""
    dim = out.shape[1]
    if kind == INIT_ZEROS:
        for c in range(dim):
            out[i, c] = np.float32(0.0)
        return
    if kind == INIT_CONSTANT:
        for c in range(dim):
            out[i, c] = np.float32(param)
        return
    rh = mix64(base ^ mix64(np.uint64(row)))
    if kind == INIT_UNIFORM:
        for c in range(dim):
            u = _unit(mix64(rh ^ cm[0, c]))
            out[i, c] = np.float32(param * (2.0 * u - 1.0))
        return
    for c in range(dim):
        ctr = np.uint64(c) << _S8
        z = 0.0
        for attempt in range(_MAX_TRUNC_ATTEMPTS):
            if attempt == 0:
                m1 = cm[0, c]
                m2 = cm[1, c]
            else:
                a = np.uint64(2 * attempt)
                m1 = mix64(ctr | a)
                m2 = mix64(ctr | (a + np.uint64(1)))
            u1 = (np.float64(mix64(rh ^ m1) >> _S11) + 1.0) * _TWO_POW_M53
            u2 = _unit(mix64(rh ^ m2))
            z = np.sqrt(-2.0 * np.log(u1)) * np.cos(_TWO_PI * u2)
            if kind == INIT_NORMAL or abs(z) <= 2.0:
                break
        if kind == INIT_TRUNCATED_NORMAL and abs(z) > 2.0:
            z = 0.0
        out[i, c] = np.float32(param * z)


@njit(parallel=True, cache=True, fastmath=False)
def init_range(out, row_start, base, kind, param):
    """``out[i] = init(row_start + i)`` for every row of ``out`` (``[n, dim]`` float32)."""
    cm = _column_mix(out.shape[1])
    for i in prange(out.shape[0]):
        _init_row(out, i, row_start + i, base, kind, param, cm)


@njit(parallel=True, cache=True, fastmath=False)
def init_rows(out, rows, base, kind, param):
    """``out[i] = init(rows[i])``."""
    cm = _column_mix(out.shape[1])
    for i in prange(rows.shape[0]):
        _init_row(out, i, rows[i], base, kind, param, cm)


@njit(parallel=True, cache=True, fastmath=False)
def fill_f32(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D float32 array."""
    v = np.float32(value)
    for i in prange(arr.shape[0]):
        arr[i] = v


@njit(parallel=True, cache=True, fastmath=False)
def fill_i64(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D int64 array."""
    for i in prange(arr.shape[0]):
        arr[i] = value


@njit(parallel=True, cache=True, fastmath=False)
def fill_i32(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D int32 array."""
    v = np.int32(value)
    for i in prange(arr.shape[0]):
        arr[i] = v


# --------------------------------------------------------------------------------------------
# Dedup: one pass over the keys, a persistent direct-address map per group.
# --------------------------------------------------------------------------------------------

_PF = 32  # prefetch distance, in keys or rows


@njit(parallel=True, cache=True, fastmath=False)
def dedup(
    keys_list,
    offsets_list,
    pos_start,
    table_offset,
    table_rows,
    tf_ptr,
    tf_idx,
    table_ustart,
    wl_ptr,
    wl_item,
    row_map,
    inv,
    uniq,
    nuniq,
    err,
    block,
):
    """Range-check keys and deduplicate rows, table by table (work item = table).

    Keys are visited in *block-major* order, the order of ``backward_update``: for each block
    of ``block`` samples, for each feature reading the table (ascending), its keys of those
    samples. A row's first visit gives it the next table-local id ``lid`` (so ids first
    appear in increasing order); ``inv[p]`` is the ``lid`` of position ``p`` and
    ``uniq[table_ustart[t] + lid]`` the group row. ``row_map`` (int32, all 0, restored before
    returning) holds ``lid + 1`` of the rows seen so far.

    (The unique rows are not sorted: an earlier radix sort into ascending row order cost
    ~8 ms of a ~40 ms dedup on the DE tiny model at batch 65536 and made the update pass no
    faster; hot rows are in cache whatever the order.)

    On a key outside ``[0, table_rows[t])``: ``err[t] = (feature, key)`` and the table stops.
    Every key is visited even if the offsets are malformed (block ranges are clamped).
    """
    for th in prange(wl_ptr.shape[0] - 1):
        for wi in range(wl_ptr[th], wl_ptr[th + 1]):
            t = wl_item[wi]
            off = table_offset[t]
            nrows = table_rows[t]
            us = table_ustart[t]
            n = 0
            bad = False
            f0 = tf_idx[tf_ptr[t]]
            batch = offsets_list[f0].shape[0] - 1
            for b0 in range(0, batch, block):
                b1 = min(batch, b0 + block)
                for j in range(tf_ptr[t], tf_ptr[t + 1]):
                    f = tf_idx[j]
                    keys = keys_list[f]
                    offs = offsets_list[f]
                    ps = pos_start[f]
                    nk = keys.shape[0]
                    p0 = min(max(offs[b0], 0), nk)
                    p1 = min(max(offs[b1], 0), nk)
                    for i in range(p0, p1):
                        if i + _PF < p1:  # (a prefetch of a wild address is harmless)
                            prefetch(row_map, off + keys[i + _PF])
                        k = keys[i]
                        if k < 0 or k >= nrows:
                            err[t, 0] = f
                            err[t, 1] = k
                            bad = True
                            break
                        u = row_map[off + k] - 1
                        if u < 0:
                            u = n
                            row_map[off + k] = n + 1
                            uniq[us + n] = off + k
                            n += 1
                        inv[ps + i] = u
                    if bad:
                        break
                if bad:
                    break
            for lid in range(n):
                row_map[uniq[us + lid]] = 0
            nuniq[t] = n


# --------------------------------------------------------------------------------------------
# Forward: gather + pool, parallel over blocks of samples.
# --------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _is_one_hot_block(offs, b0, b1):
    """True if every bag ``b0 <= b < b1`` holds exactly key ``b`` (``offs[b] == b``)."""
    for b in range(b0, b1 + 1):  # noqa: SIM110 (numba: no generator in all())
        if offs[b] != b:
            return False
    return True


@njit(cache=True)
def _pool_one_hot(keys, w, off, col, values, out, b0, b1, boff, dim):
    """Fast path of ``_pool_rows`` for one key per bag and sum (or unweighted) pooling."""
    has_w = w.shape[0] > 0
    width = out.shape[1]
    nnz = keys.shape[0]
    for b in range(b0, b1):
        if b + _PF < nnz:
            prefetch(values, (off + keys[b + _PF]) * dim)
        wp = w[b] if has_w else np.float32(1.0)
        scale_copy(out, (b - boff) * width + col, values, (off + keys[b]) * dim, wp, dim)


@njit(cache=True, inline="always")
def _pool_rows(keys, offs, w, off, col, comb, hot, values, out, b0, b1, boff, dim):
    """Pool one feature's bags ``b0 <= b < b1`` into rows ``b - boff`` of ``out``; ``dim`` is a
    compile-time constant when the caller passes a literal. Returns 1 if a bag was malformed
    (its output is zeroed)."""
    has_w = w.shape[0] > 0
    if (comb == COMB_SUM or not has_w) and comb != COMB_CONCAT and _is_one_hot_block(offs, b0, b1):
        _pool_one_hot(keys, w, off, col, values, out, b0, b1, boff, dim)
        return 0
    nnz = keys.shape[0]
    width = out.shape[1]
    fw = hot * dim if comb == COMB_CONCAT else dim
    bad = 0
    for b in range(b0, b1):
        s = offs[b]
        e = offs[b + 1]
        ob = (b - boff) * width + col
        if s < 0 or e > nnz or s > e or (comb == COMB_CONCAT and e - s > hot):
            bad = 1
            s = e = 0
        for p in range(s + _PF, min(e + _PF, nnz)):
            prefetch(values, (off + keys[p]) * dim)
        n = e - s
        if comb == COMB_CONCAT:
            for p in range(s, e):
                wp = w[p] if has_w else np.float32(1.0)
                scale_copy(out, ob + (p - s) * dim, values, (off + keys[p]) * dim, wp, dim)
            for c in range(n * dim, fw):
                out[b - boff, col + c] = np.float32(0.0)
        elif n == 1 and (comb == COMB_SUM or not has_w):
            # one key: w * v for sum; v / 1 == v for unweighted mean and sqrtn
            wp = w[s] if has_w else np.float32(1.0)
            scale_copy(out, ob, values, (off + keys[s]) * dim, wp, dim)
        elif n == 0:
            for c in range(fw):
                out[b - boff, col + c] = np.float32(0.0)
        else:
            sw = np.float32(0.0)
            for p in range(s, e):
                wp = w[p] if has_w else np.float32(1.0)
                if p == s:
                    scale_copy(out, ob, values, (off + keys[p]) * dim, wp, dim)
                else:
                    axpy(out, ob, values, (off + keys[p]) * dim, wp, dim)
                sw += wp * wp if comb == COMB_SQRTN else wp
            if comb != COMB_SUM:  # mean or sqrtn
                den = sw if comb == COMB_MEAN else np.sqrt(sw)
                for d in range(dim):
                    out[b - boff, col + d] = (
                        out[b - boff, col + d] / den if den != 0 else np.float32(0.0)
                    )
    return bad


@njit(parallel=True, cache=True, fastmath=False)
def pool_forward(
    keys_list,
    offsets_list,
    weights_list,
    feat_table,
    table_offset,
    feat_col,
    feat_comb,
    feat_hot,
    values,
    out,
    err,
    block,
    stage,
):
    """``out[b, feat_col[f] : ...]`` = pooled embedding of sample ``b``'s bag of feature ``f``.

    Combiners: sum, mean (÷ Σw, 0 for Σw = 0), sqrtn (÷ sqrt(Σw²)), concat (slot ``j`` of the
    bag in columns ``col + j*dim``; missing slots are zero). ``weights_list[f]`` of length 0
    means all weights are 1. A malformed bag (offsets out of range, decreasing, or longer than
    the concat hotness) sets ``err[f] = 1`` and yields zeros.

    Samples are processed in blocks of ``block`` rows, all features of a block together;
    worker ``th`` takes a contiguous range of blocks. With ``stage`` of shape
    ``[workers, block, width]`` (``out`` 64-byte aligned, ``width % 16 == 0``) a block is
    pooled into ``stage[th]`` (in cache) and then copied to ``out`` with non-temporal stores
    (no read-for-ownership of ``out``); with a ``[1, 1, 1]`` dummy it is written directly.
    """
    dim = values.shape[1]
    batch = out.shape[0]
    width = out.shape[1]
    nblk = (batch + block - 1) // block
    use_stage = stage.shape[1] == block and stage.shape[2] == width
    nth = stage.shape[0] if use_stage else min(nblk, 64)
    for th in prange(nth):
        for blk in range(th * nblk // nth, (th + 1) * nblk // nth):
            b0 = blk * block
            b1 = min(batch, b0 + block)
            dst = stage[th] if use_stage else out
            boff = b0 if use_stage else 0
            for f in range(len(keys_list)):
                keys = keys_list[f]
                offs = offsets_list[f]
                w = weights_list[f]
                off = table_offset[feat_table[f]]
                col = feat_col[f]
                comb = feat_comb[f]
                hot = feat_hot[f]
                if dim == 16:
                    bad = _pool_rows(
                        keys, offs, w, off, col, comb, hot, values, dst, b0, b1, boff, 16
                    )
                elif dim == 8:
                    bad = _pool_rows(
                        keys, offs, w, off, col, comb, hot, values, dst, b0, b1, boff, 8
                    )
                elif dim == 32:
                    bad = _pool_rows(
                        keys, offs, w, off, col, comb, hot, values, dst, b0, b1, boff, 32
                    )
                elif dim == 64:
                    bad = _pool_rows(
                        keys, offs, w, off, col, comb, hot, values, dst, b0, b1, boff, 64
                    )
                else:
                    bad = _pool_rows(
                        keys, offs, w, off, col, comb, hot, values, dst, b0, b1, boff, dim
                    )
                if bad:
                    err[f] = 1
            if use_stage:
                for i in range(0, (b1 - b0) * width, 16):
                    stream16(out, b0 * width + i, dst, i)
        if use_stage:
            store_fence()


# --------------------------------------------------------------------------------------------
# Backward + fused sparse optimizer update.
# --------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _update_row(kind, hp, values, slot1, slot2, r, acc, u, step, last):
    """Apply the optimizer to group row ``r`` with summed gradient ``acc[u, :]``."""
    dim = values.shape[1]
    lr = hp[HP_LR]
    eps = hp[HP_EPS]
    if kind == OPT_SGD:
        for d in range(dim):
            values[r, d] -= lr * acc[u, d]
    elif kind == OPT_ADAGRAD:
        for d in range(dim):
            g = acc[u, d]
            a = slot1[r, d] + g * g
            slot1[r, d] = a
            values[r, d] -= g * lr / (np.sqrt(a) + eps)
    elif kind == OPT_ROWWISE_ADAGRAD:
        s = np.float32(0.0)
        for d in range(dim):
            g = acc[u, d]
            s += g * g
        a = slot1[r, 0] + s / np.float32(dim)
        slot1[r, 0] = a
        den = np.sqrt(a) + eps
        for d in range(dim):
            values[r, d] -= acc[u, d] * lr / den
    elif kind == OPT_ADAM or kind == OPT_LAZY_ADAM:  # noqa: SIM109 (numba: `in` on a tuple is a call)
        b1 = hp[HP_BETA1]
        b2 = hp[HP_BETA2]
        omb1 = hp[HP_ONE_MINUS_BETA1]
        omb2 = hp[HP_ONE_MINUS_BETA2]
        lr_t = hp[HP_LR_T]
        skipped = step - last - 1
        if kind == OPT_ADAM and skipped > 0:
            f1 = np.float32(np.float64(b1) ** skipped)
            f2 = np.float32(np.float64(b2) ** skipped)
            for d in range(dim):
                slot1[r, d] = slot1[r, d] * f1
                slot2[r, d] = slot2[r, d] * f2
        for d in range(dim):
            g = acc[u, d]
            m = b1 * slot1[r, d] + omb1 * g
            v = b2 * slot2[r, d] + omb2 * (g * g)
            slot1[r, d] = m
            slot2[r, d] = v
            values[r, d] -= lr_t * m / (np.sqrt(v) + eps)
    elif kind == OPT_FTRL:
        lr_power = hp[HP_LR_POWER]
        l1 = hp[HP_L1]
        l2 = hp[HP_L2]
        shrink = hp[HP_L2_SHRINKAGE]
        two = np.float32(2.0)
        for d in range(dim):
            g = acc[u, d]
            var = values[r, d]
            accum = slot1[r, d]
            gs = g + two * shrink * var if shrink > 0 else g
            new_accum = accum + g * g
            if lr_power == np.float32(-0.5):
                pn = np.sqrt(new_accum)
                po = np.sqrt(accum)
            else:
                pn = new_accum ** (-lr_power)  # float32 pow, as TensorFlow's kernel
                po = accum ** (-lr_power)
            lin = slot2[r, d] + (gs - (pn - po) / lr * var)
            slot2[r, d] = lin
            clipped = min(max(lin, -l1), l1)
            x = clipped - lin
            y = pn / lr + two * l2
            values[r, d] = x / y
            slot1[r, d] = new_accum


@njit(cache=True)
def _scatter_one_hot(w, inv, ps, col, lo, hi, nxt, ub, grads, acc, b0, b1, dim):
    """Fast path of ``_scatter_rows`` for one key per bag (position ``b``) and weight-only
    scaling (sum, or unweighted mean/sqrtn)."""
    has_w = w.shape[0] > 0
    width = grads.shape[1]
    for b in range(b0, b1):
        lid = inv[ps + b]
        first = lid == nxt
        if first:
            nxt += 1
        if lid < lo or lid >= hi:
            continue
        c = w[b] if has_w else np.float32(1.0)
        if first:
            scale_copy(acc, (ub + lid) * dim, grads, b * width + col, c, dim)
        else:
            axpy(acc, (ub + lid) * dim, grads, b * width + col, c, dim)
    return nxt


@njit(cache=True, inline="always")
def _scatter_rows(offs, w, inv, ps, col, comb, lo, hi, nxt, ub, grads, acc, b0, b1, dim):
    """Add one feature's per-key gradients of bags ``b0 <= b < b1`` into ``acc`` row
    ``ub + lid``, for ids ``lid`` in ``[lo, hi)``; ``dim`` literal when
    the caller passes one. Ids ``lid`` first appear in increasing order (see ``dedup``): the
    first contribution of a row is *set*, not added, so ``acc`` needs no zeroing. ``nxt`` is
    the next unseen ``lid``; returns the updated value."""
    has_w = w.shape[0] > 0
    if (comb == COMB_SUM or not has_w) and comb != COMB_CONCAT and _is_one_hot_block(offs, b0, b1):
        return _scatter_one_hot(w, inv, ps, col, lo, hi, nxt, ub, grads, acc, b0, b1, dim)
    width = grads.shape[1]
    for b in range(b0, b1):
        s = offs[b]
        e = offs[b + 1]
        if s >= e:
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
            lid = inv[ps + p]
            first = lid == nxt
            if first:
                nxt += 1
            if lid < lo or lid >= hi:
                continue
            c = w[p] * scale if has_w else scale
            gc = gb + (p - s) * dim if comb == COMB_CONCAT else gb
            if first:
                scale_copy(acc, (ub + lid) * dim, grads, gc, c, dim)
            else:
                axpy(acc, (ub + lid) * dim, grads, gc, c, dim)
    return nxt


@njit(parallel=True, cache=True, fastmath=False)
def backward_update(
    offsets_list,
    weights_list,
    inv,
    pos_start,
    feat_col,
    feat_comb,
    tf_ptr,
    tf_idx,
    table_ustart,
    table_ubase,
    uniq,
    grads,
    acc,
    wl_ptr,
    item_table,
    item_lo,
    item_hi,
    kind,
    hp,
    values,
    slot1,
    slot2,
    meta,
    step,
    block,
):
    """Per-key gradients, duplicate reduction and the optimizer update, in one pass.

    Worker ``th`` owns work items ``wl_ptr[th] : wl_ptr[th+1]``; item ``i`` covers the unique
    rows with ids ``[item_lo[i], item_hi[i])`` of table ``item_table[i]`` (``dedup``'s
    ``lid``). The worker sums every contribution ``coef * grads[b, col:col+dim]`` of those
    rows into ``acc[table_ubase[t] + lid]``, in ``dedup``'s block-major key order (the same
    ``block``), then updates the rows in ``lid`` order (``uniq`` gives the row): ``values``, the
    slots, and ``meta[row] = (update_count + 1, step + 1)`` (``meta`` holds
    ``(update_count, last_step + 1)``, all zero for fresh rows).
    """
    dim = values.shape[1]
    batch = grads.shape[0]
    nblk = (batch + block - 1) // block
    s1w = slot1.shape[1]
    s2w = slot2.shape[1]
    n_slots = 2
    if kind == OPT_SGD:
        n_slots = 0
    elif kind == OPT_ADAGRAD or kind == OPT_ROWWISE_ADAGRAD:  # noqa: SIM109 (numba: `in` on a tuple is a call)
        n_slots = 1
    nxt = np.empty(item_lo.shape[0], dtype=np.int64)
    for th in prange(wl_ptr.shape[0] - 1):
        i0 = wl_ptr[th]
        i1 = wl_ptr[th + 1]
        for wi in range(i0, i1):
            nxt[wi] = 0
        for blk in range(nblk):
            b0 = blk * block
            b1 = min(batch, b0 + block)
            for wi in range(i0, i1):
                t = item_table[wi]
                lo = item_lo[wi]
                hi = item_hi[wi]
                ub = table_ubase[t]
                for j in range(tf_ptr[t], tf_ptr[t + 1]):
                    f = tf_idx[j]
                    offs = offsets_list[f]
                    w = weights_list[f]
                    ps = pos_start[f]
                    col = feat_col[f]
                    comb = feat_comb[f]
                    n0 = nxt[wi]
                    if dim == 16:
                        n0 = _scatter_rows(
                            offs,
                            w,
                            inv,
                            ps,
                            col,
                            comb,
                            lo,
                            hi,
                            n0,
                            ub,
                            grads,
                            acc,
                            b0,
                            b1,
                            16,
                        )
                    elif dim == 8:
                        n0 = _scatter_rows(
                            offs,
                            w,
                            inv,
                            ps,
                            col,
                            comb,
                            lo,
                            hi,
                            n0,
                            ub,
                            grads,
                            acc,
                            b0,
                            b1,
                            8,
                        )
                    elif dim == 32:
                        n0 = _scatter_rows(
                            offs,
                            w,
                            inv,
                            ps,
                            col,
                            comb,
                            lo,
                            hi,
                            n0,
                            ub,
                            grads,
                            acc,
                            b0,
                            b1,
                            32,
                        )
                    elif dim == 64:
                        n0 = _scatter_rows(
                            offs,
                            w,
                            inv,
                            ps,
                            col,
                            comb,
                            lo,
                            hi,
                            n0,
                            ub,
                            grads,
                            acc,
                            b0,
                            b1,
                            64,
                        )
                    else:
                        n0 = _scatter_rows(
                            offs,
                            w,
                            inv,
                            ps,
                            col,
                            comb,
                            lo,
                            hi,
                            n0,
                            ub,
                            grads,
                            acc,
                            b0,
                            b1,
                            dim,
                        )
                    nxt[wi] = n0
        for wi in range(i0, i1):
            t = item_table[wi]
            lo = item_lo[wi]
            hi = item_hi[wi]
            ub = table_ubase[t]
            us = table_ustart[t]
            for rk in range(lo, hi):
                if rk + _PF < hi:
                    rr = uniq[us + rk + _PF]
                    prefetch(values, rr * dim)
                    prefetch(meta, rr * 2)
                    if n_slots > 0:
                        prefetch(slot1, rr * s1w)
                    if n_slots > 1:
                        prefetch(slot2, rr * s2w)
                r = uniq[us + rk]
                last = meta[r, 1] - 1
                _update_row(kind, hp, values, slot1, slot2, r, acc, ub + rk, step, last)
                meta[r, 0] += 1
                meta[r, 1] = step + 1


@njit(parallel=True, cache=True, fastmath=False)
def gather_rows(src, rows, out):
    """``out[i] = src[rows[i]]`` for 2-D arrays."""
    for i in prange(rows.shape[0]):
        for d in range(src.shape[1]):
            out[i, d] = src[rows[i], d]


# --------------------------------------------------------------------------------------------
# Backend object
# --------------------------------------------------------------------------------------------


_HUGE_MIN_BYTES = 1 << 22


class CpuBackend:
    """NumPy arrays + numba kernels. Instances are stateless; see :func:`get_backend`."""

    name = "cpu"
    xp = np

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An uninitialised, 64-byte aligned array; large ones are anonymous mappings with
        transparent huge pages requested (fewer page faults and TLB misses on random rows)."""
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * dt.itemsize
        if nbytes < _HUGE_MIN_BYTES:  # 64-byte aligned, like the mapping below
            raw = np.empty(nbytes + 64, dtype=np.uint8)
            start = -raw.ctypes.data % 64
            return raw[start : start + nbytes].view(dt).reshape(shape)
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):
                buf.madvise(mmap.MADV_HUGEPAGE)
        return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)

    def num_workers(self) -> int:
        """Number of parallel workers the kernels use."""
        return int(numba.get_num_threads())

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """A zero-filled array like :meth:`empty` (fresh mappings are zero: no fill pass, pages
        are faulted in when first touched)."""
        dt = np.dtype(dtype)
        if int(np.prod(shape, dtype=np.int64)) * dt.itemsize >= _HUGE_MIN_BYTES:
            return self.empty(shape, dt)
        out = self.empty(shape, dt)
        out[...] = 0
        return out

    def array_list(self, arrays: Sequence[np.ndarray]) -> List:
        """Pack equally-typed arrays into the kernels' list type."""
        out = List()
        for a in arrays:
            out.append(a)
        return out

    init_range = staticmethod(init_range)
    init_rows = staticmethod(init_rows)
    fill_f32 = staticmethod(fill_f32)
    fill_i64 = staticmethod(fill_i64)
    fill_i32 = staticmethod(fill_i32)
    dedup = staticmethod(dedup)
    pool_forward = staticmethod(pool_forward)
    backward_update = staticmethod(backward_update)
    gather_rows = staticmethod(gather_rows)
