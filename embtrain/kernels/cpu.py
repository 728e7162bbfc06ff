"""CPU kernels of the embedding engine, compiled with numba.

Over 700 lines because the backward keeps one loop per built-in optimizer (each calling its
rule from :mod:`embtrain.kernels.rules.optimizers`; one shared all-kinds loop measured 20-55 %
slower, docs/PERFORMANCE.md) beside the pooling kernels of every combiner, and they share
private compiled helpers; splitting pooling from the update is the next step when this file
grows.

Every kernel is ``@njit(parallel=True, cache=True, fastmath=False, nogil=True)`` (the GIL is
released while it runs, so the storage tier's I/O thread reads ahead meanwhile) and
deterministic: work is
split by table (tables of one group own disjoint row ranges) or by blocks of samples, and
every reduction runs in a fixed key order (block-major, below), so the result never depends
on the number of threads.

Vocabulary shared with :mod:`embtrain.embedding.engine`:

* a *group* packs several tables into one ``values[total_rows, dim]`` array; table ``t`` owns
  rows ``table_offset[t] : table_offset[t] + table_rows[t]``;
* the group's features are numbered ``0..nf-1``; feature ``f`` reads table ``feat_table[f]``;
* ``tf_ptr``/``tf_idx``: CSR listing, for each table, the features reading it (ascending);
* *block-major* key order of a table: for each block of ``block`` samples, for each feature
  reading the table, that feature's keys of those samples (the order duplicates are summed);
* per-worker work lists ``wl_ptr[th] : wl_ptr[th+1]`` index work items, assigned by the engine.

Per step: ``pool_forward`` (sample-block-parallel range check, gather and pool, output
through a cached staging block and non-temporal stores) and ``backward_update``
(table-parallel: keys deduplicated through a direct-address map while their gradients are
summed into ``acc`` in block-major order, then the optimizer over the unique rows in order of
first visit). The forward needs no dedup; the backward reads the keys once and never sorts.
Hot loops use software prefetch and explicit vector row operations
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

from embtrain.kernels import numba_cache, typed_lists
from embtrain.kernels._llvm import (
    axpy,
    bf16_axpy,
    bf16_scale_copy,
    half_narrow_nearest,
    prefetch,
    scale_copy,
    store_fence,
    stream16,
)
from embtrain.kernels.codes import (
    BAD_KEY,
    BAD_OFFSETS,
    COMB_CONCAT,
    COMB_MEAN,
    COMB_SQRTN,
    COMB_SUM,
    INIT_UNIFORM,
    OPT_ADAGRAD,
    OPT_ADAM,
    OPT_FTRL,
    OPT_LAZY_ADAM,
    OPT_SGD,
    SPLIT_BITS,
    SPLIT_PARTS,
    VAL_BF16,
    half_code,
)
from embtrain.kernels.contract import GroupPlan, GroupTables, StepBatch, UpdateStep
from embtrain.kernels.halfrows import (
    fill_u16,
    flush_row,
    gather_widen,
    ld,
    ld_widened,
    narrow_block,
    row_axpy,
    row_scale_copy,
    row_scratch,
    st,
    st_deferred,
    widen_block,
    widen_row,
)
from embtrain.kernels.rules.halfs import round_base, round_row, slot_column
from embtrain.kernels.rules.hashing import GOLDEN
from embtrain.kernels.rules.init import column_stream, init_value, row_hash, uniform_value
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
# Counter-based initialisation: value = f(seed, table name, row, column), nothing else.
# --------------------------------------------------------------------------------------------

# (the value rule: :mod:`embtrain.kernels.rules.init`)


@njit(cache=True)
def _column_mix(dim):
    """``column_stream(c, j)`` for every column ``c`` and the first two streams ``j``."""
    cm = np.empty((2, dim), dtype=np.uint64)
    for c in range(dim):
        cm[0, c] = column_stream(c, 0)
        cm[1, c] = column_stream(c, 1)
    return cm


@njit(cache=True, inline="always")
def _init_row(out, i, row, base, kind, param, cm):
    """Write the initial value of ``row`` into ``out[i, :]`` (``cm`` from ``_column_mix``)."""
    rh = row_hash(base, row)
    if kind == INIT_UNIFORM:  # branch-free: the compiler's vector lanes
        for c in range(out.shape[1]):
            out[i, c] = uniform_value(param, rh, cm[0, c])
        return
    for c in range(out.shape[1]):
        out[i, c] = init_value(kind, param, rh, c, cm[0, c], cm[1, c])


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def init_range(out, row_start, base, kind, param):
    """``out[i] = init(row_start + i)`` for every row of ``out`` (``[n, dim]`` float32)."""
    cm = _column_mix(out.shape[1])
    for i in prange(out.shape[0]):
        _init_row(out, i, row_start + i, base, kind, param, cm)


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def init_rows(out, rows, base, kind, param):
    """``out[i] = init(rows[i])``."""
    cm = _column_mix(out.shape[1])
    for i in prange(rows.shape[0]):
        _init_row(out, i, rows[i], base, kind, param, cm)


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def fill_f32(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D float32 array."""
    v = np.float32(value)
    for i in prange(arr.shape[0]):
        arr[i] = v


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def fill_i64(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D int64 array."""
    for i in prange(arr.shape[0]):
        arr[i] = value


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def fill_i32(arr, value):
    """Parallel ``arr[:] = value`` for a 1-D int32 array."""
    v = np.int32(value)
    for i in prange(arr.shape[0]):
        arr[i] = v


# --------------------------------------------------------------------------------------------
# Forward: range check, gather + pool, parallel over blocks of samples.
# --------------------------------------------------------------------------------------------

_PF = 32  # prefetch distance, in keys or rows

@njit(cache=True, inline="always")
def _bag_start(offs, bag, b):
    """Position of bag ``b``'s first key: ``b * bag`` for a fixed bag size, else ``offs[b]``."""
    return b * bag if bag > 0 else offs[b]


@njit(cache=True, inline="always")
def _is_one_hot(offs, bag, b0, b1, nnz):
    """True if every bag ``b0 <= b < b1`` holds exactly key ``b``: ``bag == 1``, or
    (``bag == 0``) ``offs[b] == b`` throughout."""
    if b1 > nnz:
        return False
    if bag > 0:
        return bag == 1
    for b in range(b0, b1 + 1):  # noqa: SIM110 (numba: no generator in all())
        if offs[b] != b:
            return False
    return True


@njit(cache=True)
def _pool_one_hot(keys, w, off, nrows, col, values, out, b0, b1, boff, dim, err, f, vcode):
    """Fast path of ``_pool_rows`` for one key per bag and sum (or unweighted) pooling."""
    has_w = w.shape[0] > 0
    width = out.shape[1]
    nnz = keys.shape[0]
    for b in range(b0, b1):
        if b + _PF < nnz:
            prefetch(values, (off + keys[b + _PF]) * dim)
        k = keys[b]
        if np.uint64(k) >= np.uint64(nrows):  # (negative keys wrap to huge values)
            err[f, BAD_KEY] = 1
            continue
        wp = w[b] if has_w else np.float32(1.0)
        row_scale_copy(out, (b - boff) * width + col, values, (off + k) * dim, wp, dim, vcode)


@njit(cache=True, inline="always")
def _pool_rows(
    keys, offs, bag, w, off, nrows, col, comb, hot, values, out, b0, b1, boff, dim, err, f, vcode
):  # fmt: skip
    """Pool one feature's bags ``b0 <= b < b1`` into rows ``b - boff`` of ``out``; ``dim`` is a
    compile-time constant when the caller passes a literal. ``bag`` > 0: every bag holds
    ``bag`` keys (``offs`` is not read). A malformed bag sets ``err[f, BAD_OFFSETS]`` and a
    key outside ``[0, nrows)`` sets ``err[f, BAD_KEY]``; such a bag's output is zeroed."""
    has_w = w.shape[0] > 0
    nnz = keys.shape[0]
    if (
        (comb == COMB_SUM or not has_w)
        and comb != COMB_CONCAT
        and _is_one_hot(offs, bag, b0, b1, nnz)
    ):
        _pool_one_hot(keys, w, off, nrows, col, values, out, b0, b1, boff, dim, err, f, vcode)
        return
    width = out.shape[1]
    fw = hot * dim if comb == COMB_CONCAT else dim
    for b in range(b0, b1):
        s = _bag_start(offs, bag, b)
        e = _bag_start(offs, bag, b + 1)
        ob = (b - boff) * width + col
        if s < 0 or e > nnz or s > e or (comb == COMB_CONCAT and e - s > hot):
            err[f, BAD_OFFSETS] = 1
            s = e = 0
        for p in range(s, e):
            if np.uint64(keys[p]) >= np.uint64(nrows):
                err[f, BAD_KEY] = 1
                s = e = 0
                break
        for p in range(s + _PF, min(e + _PF, nnz)):
            prefetch(values, (off + keys[p]) * dim)
        n = e - s
        if comb == COMB_CONCAT:
            for p in range(s, e):
                wp = w[p] if has_w else np.float32(1.0)
                row_scale_copy(out, ob + (p - s) * dim, values, (off + keys[p]) * dim, wp, dim, vcode)
            for c in range(n * dim, fw):
                out[b - boff, col + c] = np.float32(0.0)
        elif n == 1 and (comb == COMB_SUM or not has_w):
            # one key: w * v for sum; v / 1 == v for unweighted mean and sqrtn
            wp = w[s] if has_w else np.float32(1.0)
            row_scale_copy(out, ob, values, (off + keys[s]) * dim, wp, dim, vcode)
        elif n == 0:
            for c in range(fw):
                out[b - boff, col + c] = np.float32(0.0)
        else:
            sw = np.float32(0.0)
            for p in range(s, e):
                wp = w[p] if has_w else np.float32(1.0)
                if p == s:
                    row_scale_copy(out, ob, values, (off + keys[p]) * dim, wp, dim, vcode)
                else:
                    row_axpy(out, ob, values, (off + keys[p]) * dim, wp, dim, vcode)
                sw += wp * wp if comb == COMB_SQRTN else wp
            if comb != COMB_SUM:  # mean or sqrtn
                den = sw if comb == COMB_MEAN else np.sqrt(sw)
                for d in range(dim):
                    out[b - boff, col + d] = (
                        out[b - boff, col + d] / den if den != 0 else np.float32(0.0)
                    )


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def pool_forward(
    keys_list,
    offsets_list,
    weights_list,
    feat_bag,
    feat_table,
    table_offset,
    table_rows,
    feat_col,
    feat_comb,
    feat_hot,
    values,
    out,
    out16,
    ocode,
    err,
    block,
    stage,
    vcode,
):
    """``out[b, feat_col[f] : ...]`` = pooled embedding of sample ``b``'s bag of feature ``f``.

    Combiners: sum, mean (÷ Σw, 0 for Σw = 0), sqrtn (÷ sqrt(Σw²)), concat (slot ``j`` of the
    bag in columns ``col + j*dim``; missing slots are zero). ``weights_list[f]`` of length 0
    means all weights are 1. ``feat_bag[f]`` > 0: every bag of feature ``f`` holds that many
    keys and its offsets are not read. Every key of a well-formed bag is range-checked: one
    outside ``[0, table_rows[t])`` sets ``err[f, BAD_KEY] = 1``; a malformed bag (offsets out of range,
    decreasing, or longer than the concat hotness) sets ``err[f, BAD_OFFSETS] = 1``. Either
    way the bag's output is not defined and no memory outside the arrays is touched.

    Samples are processed in blocks of ``block`` rows, all features of a block together;
    worker ``th`` takes a contiguous range of blocks. With ``stage`` of shape
    ``[workers, block, width]`` (``out`` 64-byte aligned, ``width % 16 == 0``) a block is
    pooled into ``stage[th]`` (in cache) and then copied to ``out`` with non-temporal stores
    (no read-for-ownership of ``out``); with a ``[1, 1, 1]`` dummy it is written directly.
    ``vcode``: ``codes.VAL_*`` of ``values`` (float32, or the 16-bit patterns of a half table,
    widened as they are read).

    ``ocode`` ``VAL_BF16``/``VAL_F16`` (0: float32 into ``out``): the pooled vectors are
    written into ``out16`` (``[batch, width]`` uint16) as the half type's patterns, each
    block narrowed from the stage (which must be given) to nearest, ties to even, as
    TensorFlow's cast to that type rounds; ``out`` is then not touched (a dummy).
    """
    dim = values.shape[1]
    batch = out16.shape[0] if ocode != 0 else out.shape[0]
    width = out16.shape[1] if ocode != 0 else out.shape[1]
    nblk = (batch + block - 1) // block
    use_stage = stage.shape[1] == block and stage.shape[2] == width
    if ocode != 0 and not use_stage:
        raise ValueError("pool_forward: a half output needs the staging block")
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
                bag = feat_bag[f]
                t = feat_table[f]
                off = table_offset[t]
                nrows = table_rows[t]
                col = feat_col[f]
                comb = feat_comb[f]
                hot = feat_hot[f]
                if dim == 16:
                    _pool_rows(
                        keys, offs, bag, w, off, nrows, col, comb, hot, values, dst, b0, b1, boff, 16,
                        err, f, vcode,
                    )  # fmt: skip
                elif dim == 8:
                    _pool_rows(
                        keys, offs, bag, w, off, nrows, col, comb, hot, values, dst, b0, b1, boff, 8,
                        err, f, vcode,
                    )  # fmt: skip
                elif dim == 32:
                    _pool_rows(
                        keys, offs, bag, w, off, nrows, col, comb, hot, values, dst, b0, b1, boff, 32,
                        err, f, vcode,
                    )  # fmt: skip
                elif dim == 64:
                    _pool_rows(
                        keys, offs, bag, w, off, nrows, col, comb, hot, values, dst, b0, b1, boff, 64,
                        err, f, vcode,
                    )  # fmt: skip
                else:
                    _pool_rows(
                        keys, offs, bag, w, off, nrows, col, comb, hot, values, dst, b0, b1, boff, dim,
                        err, f, vcode,
                    )  # fmt: skip
            if ocode != 0:
                half_narrow_nearest(out16, b0 * width, dst, 0, (b1 - b0) * width, ocode)
            elif use_stage:
                for i in range(0, (b1 - b0) * width, 16):
                    stream16(out, b0 * width + i, dst, i)
        if use_stage:
            store_fence()


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

    Rows go through :mod:`embtrain.kernels.halfrows`: for float32 arrays plain indexing; a
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
        if p + _PF < p1:  # (a prefetch of a wild address is harmless)
            prefetch(row_map, off + keys[p + _PF])
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
    p0 = min(max(_bag_start(offs, bag, b0), 0), nnz)
    p1 = min(max(_bag_start(offs, bag, b1), p0), nnz, p0 + ids.shape[0])
    n = _number_rows(
        keys, p0, p1, off, nrows, plo, phi, row_map, stamp, uniq, us, n, ids, err, wi
    )  # fmt: skip
    if (
        (comb == COMB_SUM or not has_w)
        and comb != COMB_CONCAT
        and _is_one_hot(offs, bag, b0, b1, nnz)
    ):
        _scatter_one_hot(w, col, ids, acc, us, grads, grads16, width, b0, b1, dim)
        return n
    for b in range(b0, b1):
        s = _bag_start(offs, bag, b)
        e = _bag_start(offs, bag, b + 1)
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
                if rk + _PF < n:
                    rr = uniq[us + rk + _PF]
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


@njit(parallel=True, cache=True, fastmath=False, nogil=True)
def gather_rows(src, rows, out):
    """``out[i] = src[rows[i]]`` for 2-D arrays."""
    for i in prange(rows.shape[0]):
        for d in range(src.shape[1]):
            out[i, d] = src[rows[i], d]


# --------------------------------------------------------------------------------------------
# Backend object
# --------------------------------------------------------------------------------------------


_HUGE_MIN_BYTES = 1 << 22
_NO_STAGE = np.zeros((1, 1, 1), dtype=np.float32)
# The arrays not used when a forward writes (or a backward reads) the half type: as writable
# (read-only) as the ones they stand for, so each kernel keeps one numba type per argument.
_NO_OUT = np.zeros((1, 1), dtype=np.float32)
_NO_HALF = np.zeros((0, 0), dtype=np.uint16)
_NO_GRADS = np.zeros((1, 1), dtype=np.float32)
_NO_HALF_GRADS = np.zeros((0, 0), dtype=np.uint16)
_NO_GRADS.flags.writeable = _NO_HALF_GRADS.flags.writeable = False  # gradients are read-only
_NO_SLOT = np.zeros((1, 1), dtype=np.float32)
# the slot an optimizer with one half slot lacks: a half dummy, so that every optimizer with
# slots of a table whose state is in its half dtype shares one compiled update (one without
# slots, and the row sums, pad with float32 ones: the update of float32 state)
_NO_SLOT16 = np.zeros((1, 1), dtype=np.uint16)
# id bits of a row map entry: at least 16 (up to 32767 calls between zeroings), at most 30
_MIN_ID_BITS = 16
_MAX_ID_BITS = 30


class CpuScratch:
    """Per-group scratch and tuning of the CPU kernels.

    ``block``: samples per block in the forward and backward kernels (a different value may
    change the summation order of a table read by several features, i.e. the last bit);
    ``workers``: work lists of the backward (None: one per thread; results do not depend on
    it). ``row_map`` entries of the latest backward are ``stamp << id_bits | id`` (see
    :func:`map_stamp`); ``unique_ratio``: unique rows / keys per table in the latest
    backward, to balance the next one.
    """

    def __init__(self, plan: GroupPlan, row_map: np.ndarray):
        self.block = 256
        self.workers: int | None = None
        self.row_map = row_map
        self.map_id_bits = 0
        self.map_stamp = 0
        self.map_dirty = False  # some entry may be non-zero
        self.unique_ratio = np.full(plan.table_rows.shape[0], 0.5)
        self.uniq = np.empty(0, dtype=np.int64)
        self.stage = np.empty((0, 0, 0), dtype=np.float32)
        self.acc = np.empty((0, plan.dim), dtype=np.float32)


def map_stamp(scratch: CpuScratch, most_keys: int, backend: CpuBackend) -> int:
    """The ``stamp`` of this backward's row map entries (``row_map[row] = stamp + id``).

    A row's id is below its table's key count, so the low ``id_bits`` bits hold it and
    the bits above hold a per-call counter: entries of earlier calls are below the new
    stamp and read as "not seen", so the map is never cleared row by row. When the
    counter runs out of its ``31 - id_bits`` bits, or more id bits are needed, the map is
    zeroed once (a parallel fill: every ~2000 steps on DE tiny).
    """
    bits = max(int(most_keys).bit_length(), _MIN_ID_BITS)
    if bits > _MAX_ID_BITS:
        raise ValueError(
            f"{most_keys} keys of one table in one batch; "
            f"at most {(1 << _MAX_ID_BITS) - 1} are supported"
        )
    counter = scratch.map_stamp + 1
    if bits > scratch.map_id_bits or counter >= 1 << (31 - scratch.map_id_bits):
        if scratch.map_dirty:
            backend.fill_i32(scratch.row_map, 0)
        scratch.map_id_bits = max(bits, scratch.map_id_bits)
        counter = 1
    scratch.map_stamp = counter
    scratch.map_dirty = True
    return counter << scratch.map_id_bits


def backward_items(
    table_nnz: np.ndarray, table_unique: np.ndarray, workers: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Work items of the backward, a contiguous run of tables per worker: arrays
    (table, first part, end part) and the per-worker pointers ``wl_ptr``.

    The estimated cost of a table is ``keys + 4 × unique rows``. Tables (in group order,
    hence contiguous output columns) are cut at equal shares of the total; a table
    straddling a cut is split by row part (:func:`row_part`, ``SPLIT_PARTS`` of them): each
    share rescans the table's keys but sums and updates only its own rows. Contiguous column
    bands keep each worker's reads of the gradient array to its own cache lines.
    """
    nnz = np.asarray(table_nnz, dtype=np.float64)
    cost = nnz + 4.0 * np.asarray(table_unique, dtype=np.float64)
    busy = np.flatnonzero(nnz > 0).tolist()
    total = float(cost[busy].sum())
    cuts = [total * w / workers for w in range(workers)] + [np.inf]
    per_worker: list[list[tuple[int, int, int]]] = [[] for _ in range(workers)]
    start = 0.0
    for t in busy:
        c = float(cost[t])
        end = start + c
        for w in range(workers):
            a, b = max(start, cuts[w]), min(end, cuts[w + 1])
            if b <= a:
                continue
            lo = 0 if a <= start else round(SPLIT_PARTS * (a - start) / c)
            hi = SPLIT_PARTS if b >= end else round(SPLIT_PARTS * (b - start) / c)
            if hi > lo:
                per_worker[w].append((t, lo, hi))
        start = end
    flat = [item for items in per_worker for item in items]
    ptr = np.zeros(workers + 1, dtype=np.int64)
    np.cumsum([len(items) for items in per_worker], out=ptr[1:])
    arr = np.asarray(flat, dtype=np.int64).reshape(-1, 3)
    return arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), ptr


def _table_round(plan: GroupPlan) -> np.ndarray:
    """``plan.table_round``, or one dummy row per table (a float32 group ignores it)."""
    n = plan.table_rows.shape[0]
    if plan.table_round.shape == (n, 4):
        return plan.table_round
    return np.zeros((n, 4), np.int64)


def _grow(backend: CpuBackend, buf: np.ndarray, n: int) -> np.ndarray:
    """``buf`` if it holds ``n`` rows, else a new buffer with 25 % headroom (from the
    backend: large ones on transparent huge pages, as their rows are visited at random)."""
    if buf.shape[0] >= n:
        return buf
    return backend.empty((int(n * 1.25) + 16, *buf.shape[1:]), buf.dtype)


class CpuBackend:
    """NumPy arrays + numba kernels. Instances are stateless (state lives in each group's
    :class:`CpuScratch`); see :func:`embtrain.kernels.get_backend`."""

    name = "cpu"
    xp = np
    #: the forward writes bfloat16/float16 outputs and the backward reads bfloat16 gradients
    half_outputs = True

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

    def to_host(self, array: np.ndarray) -> np.ndarray:
        """A copy (the arrays are host arrays already)."""
        return np.array(array, copy=True)

    def array_list(self, arrays: Sequence[np.ndarray]) -> List:
        """Pack equally-typed arrays into the kernels' list type."""
        out = List()
        for a in arrays:
            out.append(a)
        return out

    def pack_step(
        self,
        plan: GroupPlan,
        batch: int,
        keys: Sequence[np.ndarray],
        offsets: Sequence[np.ndarray],
        weights: Sequence[np.ndarray],
        bags: np.ndarray,
    ) -> StepBatch:
        """Typed lists of the per-feature arrays (no copies)."""
        nnz = np.array([k.shape[0] for k in keys], dtype=np.int64)
        table_nnz = np.bincount(
            plan.feat_table, weights=nnz, minlength=plan.table_rows.shape[0]
        ).astype(np.int64)
        return StepBatch(
            batch=batch,
            keys=self.array_list(keys),
            offsets=self.array_list(offsets),
            weights=self.array_list(weights),
            bags=np.asarray(bags, dtype=np.int64),
            table_nnz=table_nnz,
            feat_nnz=nnz,
        )

    def new_scratch(self, plan: GroupPlan) -> CpuScratch:
        """Row map, staging and accumulation buffers of one group (grown on demand)."""
        return CpuScratch(plan, self.zeros((plan.total_rows,), np.int32))

    def _stage(self, scratch: CpuScratch, dst: np.ndarray) -> np.ndarray:
        """Per-worker staging buffers for non-temporal output stores, or a dummy; a half
        output (:func:`half_code`) is always narrowed from them."""
        width = dst.shape[1]
        if half_code(dst) == 0 and (
                width % 16 or dst.ctypes.data % 64 or dst.shape[0] < scratch.block):
            return _NO_STAGE
        shape = (self.num_workers(), scratch.block, width)
        if scratch.stage.shape != shape:
            scratch.stage = np.empty(shape, dtype=np.float32)
        return scratch.stage

    def forward_group(
        self,
        plan: GroupPlan,
        tables: GroupTables,
        step: StepBatch,
        out: np.ndarray,
        scratch: CpuScratch,
    ) -> np.ndarray:
        """One :func:`pool_forward` over the group's blocks of samples; ``out`` float32, or
        bfloat16/float16 (:data:`~embtrain.kernels.codes.HALF_OUTPUTS`: narrowed to
        nearest)."""
        err = np.zeros((plan.num_features, 2), dtype=np.int64)
        ocode = half_code(out)
        pool_forward(
            step.keys,
            step.offsets,
            step.weights,
            step.bags,
            plan.feat_table,
            plan.table_offset,
            plan.table_rows,
            plan.feat_col,
            plan.feat_comb,
            plan.feat_hot,
            tables.values,
            _NO_OUT if ocode else out,
            out.view(np.uint16) if ocode else _NO_HALF,
            np.int64(ocode),
            err,
            scratch.block,
            self._stage(scratch, out),
            np.int64(plan.value_code if tables.values.dtype == np.uint16 else 0),
        )
        return err

    def backward_group(
        self,
        plan: GroupPlan,
        tables: GroupTables,
        step: StepBatch,
        grads: np.ndarray,
        update: UpdateStep,
        scratch: CpuScratch,
    ) -> bool:
        """One :func:`backward_update`: work items per thread (:func:`backward_items`), the
        row map's stamp (:func:`map_stamp`), buffers grown to the step's key counts.
        ``grads``: float32, or bfloat16 (read as they are, widened exactly)."""
        gcode = half_code(grads)
        if gcode not in (0, VAL_BF16):
            raise TypeError(f"backward_group: gradients of {grads.dtype} (float32 or bfloat16)")
        workers = scratch.workers or self.num_workers()
        nnz = step.table_nnz
        item_table, item_plo, item_phi, wl_ptr = backward_items(
            nnz, nnz * scratch.unique_ratio, workers
        )
        if item_table.size == 0:
            return False
        # each item owns as many rows of uniq and acc as its table has keys
        item_start = np.zeros(item_table.size, dtype=np.int64)
        np.cumsum(nnz[item_table][:-1], out=item_start[1:])
        total = int(item_start[-1] + nnz[item_table[-1]])
        scratch.uniq = _grow(self, scratch.uniq, total)
        scratch.acc = _grow(self, scratch.acc, total)
        stamp = map_stamp(scratch, int(nnz.max()), self)
        nuniq = np.zeros(item_table.size, dtype=np.int64)
        err = np.zeros(item_table.size, dtype=np.int64)
        pad = _NO_SLOT16 if tables.slots and tables.slots[0].dtype == np.uint16 else _NO_SLOT
        s = [*tables.slots, pad, pad]
        batch = step.batch
        block = scratch.block
        # the most keys any feature has in one block of samples (the id buffer's size)
        edges = np.append(np.arange(0, batch, block), batch)
        block_keys = max(
            block * int(bag) if bag > 0 else int(np.diff(offs[edges]).max(initial=0))
            for offs, bag in zip(step.offsets, step.bags, strict=True)
        )
        backward_update(
            step.keys,
            step.offsets,
            step.weights,
            step.bags,
            plan.table_offset,
            plan.table_rows,
            plan.feat_col,
            plan.feat_comb,
            plan.tf_ptr,
            plan.tf_idx,
            _NO_GRADS if gcode else grads,
            grads.view(np.uint16) if gcode else _NO_HALF_GRADS,
            wl_ptr,
            item_table,
            item_plo,
            item_phi,
            item_start,
            scratch.row_map,
            np.int64(stamp),
            scratch.uniq,
            scratch.acc,
            nuniq,
            err,
            update.kind,
            update.hp,
            tables.values,
            s[0],
            s[1],
            tables.meta,
            np.int64(update.step),
            block,
            block_keys,
            plan.half_codes,
            _table_round(plan),
            plan.row_round,
        )
        busy = nnz > 0
        table_uniq = np.bincount(item_table, weights=nuniq, minlength=nnz.size)
        scratch.unique_ratio[busy] = table_uniq[busy] / nnz[busy]
        return bool(err.any())

    init_range = staticmethod(init_range)
    narrow_block = staticmethod(narrow_block)
    widen_block = staticmethod(widen_block)
    gather_widen = staticmethod(gather_widen)
    fill_u16 = staticmethod(fill_u16)
    init_rows = staticmethod(init_rows)
    fill_f32 = staticmethod(fill_f32)
    fill_i64 = staticmethod(fill_i64)
    fill_i32 = staticmethod(fill_i32)
    pool_forward = staticmethod(pool_forward)
    backward_update = staticmethod(backward_update)
    gather_rows = staticmethod(gather_rows)
