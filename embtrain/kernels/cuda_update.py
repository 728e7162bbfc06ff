"""The CUDA backward: per-key gradients, a deterministic per-row reduce (fixed order, no
atomics) and the fused optimizer. The launches and the sort between them:
:meth:`embtrain.kernels.cuda.CudaBackend.backward_group`."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from embtrain.kernels.codes import COMB_CONCAT, COMB_MEAN, COMB_SQRTN
from embtrain.kernels.cuda_elements import bag_bounds, load_elem, row_stream, store_elem
from embtrain.kernels.rules.halves import slot_column
from embtrain.kernels.rules.optimizers import (
    row_factors,
    row_wise_apply,
    row_wise_begin,
    slot_count,
    update_elem,
)

__all__ = ["grad_items_k", "piece_sum_k", "row_sum_k", "update_k", "update_rowwise_k"]


@cuda.jit
def grad_items_k(
    keys, kstart, fnnz, offs, ostart, wts, wstart, wlen, bags, feat_table, table_offset,
    table_rows, feat_col, feat_comb, feat_hot, width, dim, batch, row_of, coef, gpos, err,
):  # fmt: skip
    """For every key at concatenated position ``P`` of sample ``b``'s bag of feature ``f``
    (one thread per (feature, sample)): ``row_of[P]`` its group row, ``coef[P]`` weight ×
    combiner scale, ``gpos[P]`` the flat index of its gradient's first column in ``grads``.
    A key or bag that is invalid (the inputs changed after the forward) sets ``err[0]`` and
    is left at ``row_of = _NO_ROW`` (filled before the launch)."""
    i = cuda.grid(1)
    nf = bags.shape[0]
    if i >= nf * batch:
        return
    f = i // batch
    b = i - f * batch
    t = feat_table[f]
    off = table_offset[t]
    nrows = table_rows[t]
    comb = feat_comb[f]
    ks = kstart[f]
    has_w = wlen[f] > 0
    ws = wstart[f]
    s, e = bag_bounds(offs, ostart[f], bags[f], b)
    if s < 0 or e > fnnz[f] or s > e or (comb == COMB_CONCAT and e - s > feat_hot[f]):
        err[0] = 1
        return
    scale = np.float32(1.0)
    if comb == COMB_MEAN or comb == COMB_SQRTN:  # noqa: SIM109 (numba: `in` on a tuple is a call)
        sw = np.float32(0.0)
        for p in range(s, e):
            w = wts[ws + p] if has_w else np.float32(1.0)
            sw += w * w if comb == COMB_SQRTN else w
        den = sw if comb == COMB_MEAN else np.float32(math.sqrt(sw))
        scale = np.float32(1.0) / den if den != 0 else np.float32(0.0)
    gb = b * width + feat_col[f]
    for p in range(s, e):
        k = keys[ks + p]
        if k < 0 or k >= nrows:
            err[0] = 1
            continue
        row_of[ks + p] = off + k
        coef[ks + p] = wts[ws + p] * scale if has_w else scale
        gpos[ks + p] = gb + (p - s) * dim if comb == COMB_CONCAT else gb


@cuda.jit
def piece_sum_k(order, piece, npiece, coef, gpos, grads, part):
    """``part[i, d]`` = Σ coef × grad over sorted positions ``piece[i] : piece[i + 1]`` (a
    piece: at most ``chunk`` keys of one row), in sorted order; one thread per (piece,
    column)."""
    i = cuda.grid(1)
    dim = part.shape[1]
    if i >= npiece * dim:
        return
    j = i // dim
    d = i - j * dim
    total = np.float32(0.0)
    for q in range(piece[j], piece[j + 1]):
        p = order[q]
        total += coef[p] * grads[gpos[p] + d]
    part[j, d] = total


@cuda.jit
def row_sum_k(part, seg_piece, piece, sorted_rows, nseg, meta, acc, uniq, last):
    """``acc[u, d]`` = Σ of row ``u``'s pieces ``seg_piece[u] : seg_piece[u + 1]``, in order;
    one thread per (unique row, column). Column 0's thread also records the row and its
    ``last_step`` (read here, before the update kernel rewrites ``meta``)."""
    i = cuda.grid(1)
    dim = acc.shape[1]
    if i >= nseg * dim:
        return
    u = i // dim
    d = i - u * dim
    j0 = seg_piece[u]
    total = part[j0, d]
    for j in range(j0 + 1, seg_piece[u + 1]):
        total += part[j, d]
    acc[u, d] = total
    if d == 0:
        r = sorted_rows[piece[j0]]
        uniq[u] = r
        last[u] = meta[r, 1] - 1


@cuda.jit
def update_k(
    kind, hp, values, slot1, slot2, meta, acc, uniq, last, nseg, step, half, htab, rbase,
    table_offset, rkeys,
):  # fmt: skip
    """Element-wise optimizers: one thread per (unique row, column); column 0's thread
    writes the row's ``meta = (update_count + 1, step + 1)``. Values and slots of a half
    table are widened, updated in float32 and narrowed (:func:`row_stream`)."""
    i = cuda.grid(1)
    dim = acc.shape[1]
    if i >= nseg * dim:
        return
    u = i // dim
    d = i - u * dim
    r = uniq[u]
    vc = half[0]
    sc = half[1]
    rm = half[2]
    rh, c0 = row_stream(half, htab, rbase, table_offset, rkeys, r)
    c = c0 + d
    n_slots = slot_count(kind)
    zero = np.float32(0.0)
    s1 = load_elem(slot1, r, d, sc) if n_slots > 0 else zero
    s2 = load_elem(slot2, r, d, sc) if n_slots > 1 else zero
    f1, f2 = row_factors(kind, hp, step, last[u])
    w, s1, s2 = update_elem(kind, hp, load_elem(values, r, d, vc), s1, s2, acc[u, d], f1, f2)
    store_elem(values, r, d, w, vc, rm, rh, c)
    if n_slots > 0:
        store_elem(slot1, r, d, s1, sc, rm, rh, slot_column(c, 0))
    if n_slots > 1:
        store_elem(slot2, r, d, s2, sc, rm, rh, slot_column(c, 1))
    if d == 0:
        meta[r, 0] += 1
        meta[r, 1] = step + 1


@cuda.jit
def update_rowwise_k(
    kind, hp, values, slot1, meta, acc, uniq, nseg, step, half, htab, rbase, table_offset, rkeys
):  # fmt: skip
    """Row-wise optimizers: one thread per unique row (the row's slot is ``slot1[r, 0]``)."""
    u = cuda.grid(1)
    if u >= nseg:
        return
    dim = acc.shape[1]
    r = uniq[u]
    vc = half[0]
    sc = half[1]
    rm = half[2]
    rh, c0 = row_stream(half, htab, rbase, table_offset, rkeys, r)
    s = np.float32(0.0)
    for d in range(dim):
        g = acc[u, d]
        s += g * g
    a, factor = row_wise_begin(kind, hp, load_elem(slot1, r, 0, sc), s, dim)
    store_elem(slot1, r, 0, a, sc, rm, rh, slot_column(0, 0))
    for d in range(dim):
        w = row_wise_apply(kind, hp, load_elem(values, r, d, vc), acc[u, d], factor)
        store_elem(values, r, d, w, vc, rm, rh, c0 + d)
    meta[r, 0] += 1
    meta[r, 1] = step + 1
