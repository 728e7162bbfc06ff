"""The CPU forward kernel, :func:`pool_forward`: range check, gather and pool, parallel over
blocks of samples, output through a cached staging block and non-temporal stores. It needs
no dedup.

Every kernel is ``@njit(parallel=True, cache=True, fastmath=False, nogil=True)`` and
deterministic (see :mod:`embtrain.kernels.cpu` for the vocabulary).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from embtrain.kernels import numba_cache, typed_lists
from embtrain.kernels._llvm import (
    half_narrow_nearest,
    prefetch,
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
)
from embtrain.kernels.cpu_bags import PREFETCH, bag_start, is_one_hot
from embtrain.kernels.halves import (
    row_axpy,
    row_scale_copy,
)

numba_cache.install()  # before the first @njit(cache=True): compiled code goes to its cache_dir()
typed_lists.install()  # typed lists built from Python: numba's helpers from that cache too

# --------------------------------------------------------------------------------------------
# Forward: range check, gather + pool, parallel over blocks of samples.
# --------------------------------------------------------------------------------------------

@njit(cache=True)
def _pool_one_hot(keys, w, off, nrows, col, values, out, b0, b1, boff, dim, err, f, vcode):
    """Fast path of ``_pool_rows`` for one key per bag and sum (or unweighted) pooling."""
    has_w = w.shape[0] > 0
    width = out.shape[1]
    nnz = keys.shape[0]
    for b in range(b0, b1):
        if b + PREFETCH < nnz:
            prefetch(values, (off + keys[b + PREFETCH]) * dim)
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
        and is_one_hot(offs, bag, b0, b1, nnz)
    ):
        _pool_one_hot(keys, w, off, nrows, col, values, out, b0, b1, boff, dim, err, f, vcode)
        return
    width = out.shape[1]
    fw = hot * dim if comb == COMB_CONCAT else dim
    for b in range(b0, b1):
        s = bag_start(offs, bag, b)
        e = bag_start(offs, bag, b + 1)
        ob = (b - boff) * width + col
        if s < 0 or e > nnz or s > e or (comb == COMB_CONCAT and e - s > hot):
            err[f, BAD_OFFSETS] = 1
            s = e = 0
        for p in range(s, e):
            if np.uint64(keys[p]) >= np.uint64(nrows):
                err[f, BAD_KEY] = 1
                s = e = 0
                break
        for p in range(s + PREFETCH, min(e + PREFETCH, nnz)):
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


