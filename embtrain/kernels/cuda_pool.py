"""The CUDA forward: one thread per (sample, feature, column) range-checks, gathers and pools."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from embtrain.kernels.codes import (
    BAD_KEY,
    BAD_OFFSETS,
    COMB_CONCAT,
    COMB_MEAN,
    COMB_SQRTN,
    COMB_SUM,
)
from embtrain.kernels.cuda_elements import bag_bounds, load_elem

__all__ = ["pool_k"]


@cuda.jit
def pool_k(
    keys, kstart, fnnz, offs, ostart, wts, wstart, wlen, bags, feat_table, table_offset,
    table_rows, feat_col, feat_comb, feat_hot, values, out, err, batch, vcode,
):  # fmt: skip
    """``out[b, feat_col[f] + ...]`` = pooled row of sample ``b``'s bag of feature ``f``; one
    thread per (sample, feature, column). A malformed bag sets ``err[f, BAD_OFFSETS]``, a key
    outside its table ``err[f, BAD_KEY]``; such a bag's output is zero. ``vcode``:
    ``codes.VAL_*`` of ``values`` (a half table's patterns are widened as they are read)."""
    i = cuda.grid(1)
    nf = bags.shape[0]
    dim = values.shape[1]
    if i >= batch * nf * dim:
        return
    bf = i // dim
    d = i - bf * dim
    b = bf // nf
    f = bf - b * nf
    t = feat_table[f]
    off = table_offset[t]
    nrows = table_rows[t]
    col = feat_col[f]
    comb = feat_comb[f]
    hot = feat_hot[f]
    ks = kstart[f]
    nnz = fnnz[f]
    has_w = wlen[f] > 0
    ws = wstart[f]
    s, e = bag_bounds(offs, ostart[f], bags[f], b)
    if s < 0 or e > nnz or s > e or (comb == COMB_CONCAT and e - s > hot):
        if d == 0:
            err[f, BAD_OFFSETS] = 1
        s = e = 0
    for p in range(s, e):
        k = keys[ks + p]
        if k < 0 or k >= nrows:
            if d == 0:
                err[f, BAD_KEY] = 1
            s = e = 0
            break
    if comb == COMB_CONCAT:
        for j in range(hot):
            v = np.float32(0.0)
            if j < e - s:
                p = s + j
                w = wts[ws + p] if has_w else np.float32(1.0)
                v = w * load_elem(values, off + keys[ks + p], d, vcode)
            out[b, col + j * dim + d] = v
        return
    acc = np.float32(0.0)
    sw = np.float32(0.0)
    for p in range(s, e):
        w = wts[ws + p] if has_w else np.float32(1.0)
        acc += w * load_elem(values, off + keys[ks + p], d, vcode)
        sw += w * w if comb == COMB_SQRTN else w
    if comb != COMB_SUM and e > s:
        den = sw if comb == COMB_MEAN else np.float32(math.sqrt(sw))
        acc = acc / den if den != 0 else np.float32(0.0)
    out[b, col + d] = acc
