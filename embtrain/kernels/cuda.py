"""CUDA kernels of the embedding engine (numba's CUDA target), launched on CuPy arrays.

Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba's CUDA module is
imported) the same kernels run thread by thread on the CPU and NumPy arrays stand in for
device arrays; that is how CI checks them. Needs neither TensorFlow nor Pydantic.

Per group and step (one launch per phase, all tables and features of the group together):

* forward: ``_pool_k``, one thread per (sample, feature, column): range check, gather and
  pool (sum / mean / sqrtn / concat, weighted or not, fixed or variable bags), written
  straight into the group's ``[batch, width]`` output (consecutive threads write consecutive
  columns);
* backward: ``_grad_items_k``, one thread per (feature, sample): every key's group row, its
  coefficient (weight × combiner scale) and the offset of its gradient in ``grads``; a
  stable sort of the rows (``xp.argsort``) and the starts of each row's run and of its
  pieces of at most ``chunk`` keys (``flatnonzero``: the host synchronisations, where the
  number of pieces and unique rows must be known); ``_piece_sum_k`` (one thread per (piece,
  column)) then ``_row_sum_k`` (one per (unique row, column)) sum in sorted order, the
  pieces in order: a fixed order, no atomics, results do not depend on scheduling;
  ``_update_k`` (one thread per row and column) or
  ``_update_rowwise_k`` (one thread per row) applies the optimizer and the row's metadata.

Half tables (``np.uint16`` patterns of bfloat16/float16, :mod:`embtrain.kernels.rules.halves`):
every kernel reads values and slots through :func:`load_elem` (widened to float32) and writes
them through :func:`store_elem` (narrowed to nearest, or stochastically with the bits of
(seed, step, table id, global row or key, global column), as the CPU kernels), so an element
rounds alike on every backend, thread count and number of ranks; all arithmetic is float32.

Initial values (``_init_k``) use the counter hash of :mod:`embtrain.embedding.initializers`:
uniform rows equal the CPU's bit for bit; normal rows too wherever the device's float64
``log``/``cos`` round like the host's (they differ by at most an ulp before the float32
rounding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numba import cuda
from numba.extending import register_jitable

from embtrain.kernels import cuda_simulated
from embtrain.kernels.codes import (
    BAD_KEY,
    BAD_OFFSETS,
    COMB_CONCAT,
    COMB_MEAN,
    COMB_SQRTN,
    COMB_SUM,
    ROUND_NEAREST,
    ROUND_STOCHASTIC,
    VAL_F32,
)
from embtrain.kernels.contract import GroupPlan, GroupTables, StepBatch, UpdateStep
from embtrain.kernels.rules.halves import (
    narrow_nearest,
    narrow_stochastic,
    round_base,
    round_col,
    round_row,
    slot_column,
    widen,
)
from embtrain.kernels.rules.init import column_stream, init_value, row_hash
from embtrain.kernels.rules.optimizers import (
    is_row_wise,
    row_factors,
    row_wise_apply,
    row_wise_begin,
    slot_count,
    update_elem,
)

if cuda_simulated():
    xp: Any = np
else:  # pragma: no cover (needs a GPU)
    import cupy

    xp = cupy

__all__ = ["CudaBackend", "CudaScratch", "Packed"]

_TPB = 128  # threads per block
_NO_ROW = np.iinfo(np.int64).max  # row of a key that was skipped (sorts last)

# --------------------------------------------------------------------------------------------
# Element access for every table dtype (compiled into each kernel; Python under the simulator)
# --------------------------------------------------------------------------------------------


@register_jitable(inline="always")
def load_elem(arr, r, d, code):
    """``arr[r, d]`` as float32: as it is (``code == VAL_F32``), or a half pattern widened."""
    if code == VAL_F32:
        return arr[r, d]
    return widen(arr[r, d], code)


@register_jitable(inline="always")
def store_elem(arr, r, d, x, code, rmode, rh, col):
    """``arr[r, d] = x`` (float32 ``x``), narrowed for a half array (``code``): to nearest, or
    stochastically with ``round_col(rh, col)`` (``rh``: the row's stream)."""
    if code == VAL_F32:
        arr[r, d] = x
    elif rmode == ROUND_NEAREST:
        arr[r, d] = narrow_nearest(x, code)
    else:
        arr[r, d] = narrow_stochastic(x, code, round_col(rh, col))


@register_jitable(inline="always")
def table_of(table_offset, r):
    """The group's table holding group row ``r`` (the last table whose first row is ≤ ``r``:
    tables without rows are skipped)."""
    lo = 0
    hi = table_offset.shape[0] - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if table_offset[mid] <= r:
            lo = mid
        else:
            hi = mid - 1
    return lo


@register_jitable(inline="always")
def row_stream(half, htab, rbase, table_offset, rkeys, r):
    """``(rh, first column)`` of group row ``r`` for stochastic rounding: ``rh`` is
    ``round_row(rbase[t], global row)`` with ``htab[t] = (table id, row offset, row stride,
    first column)`` of its table ``t`` in the full table, the row taken from ``rkeys[r]`` in a
    keyed group (its key), else ``r - table_offset[t]``; ``(0, 0)`` when nothing rounds
    stochastically (``half = (value code, slot code, rounding, seed)``)."""
    if half[2] != ROUND_STOCHASTIC or (half[0] == VAL_F32 and half[1] == VAL_F32):
        return np.uint64(0), np.int64(0)
    t = table_of(table_offset, r)
    k = r - table_offset[t] if rkeys.shape[0] == 0 else rkeys[r]
    grow = htab[t, 1] + htab[t, 2] * k
    return round_row(rbase[t], grow), htab[t, 3]


# --------------------------------------------------------------------------------------------
# Counter-based initialisation (the rule: :mod:`embtrain.kernels.rules.init`, as on the CPU)
# --------------------------------------------------------------------------------------------


@cuda.jit
def _init_k(out, rows, row_start, use_rows, base, kind, param):
    """``out[i, c] = init(row, c)`` with ``row = rows[i]`` (``use_rows``) or ``row_start + i``;
    one thread per element."""
    i = cuda.grid(1)
    dim = out.shape[1]
    if i >= out.shape[0] * dim:
        return
    ri = i // dim
    c = i - ri * dim
    row = rows[ri] if use_rows else row_start + ri
    out[ri, c] = init_value(
        kind, param, row_hash(base, row), c, column_stream(c, 0), column_stream(c, 1)
    )


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def _bag_bounds(offs, ostart, bag, b):
    """First and end position of bag ``b`` of a feature (fixed size ``bag`` > 0, or CSR)."""
    if bag > 0:
        return b * bag, (b + 1) * bag
    return offs[ostart + b], offs[ostart + b + 1]


@cuda.jit
def _pool_k(
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
    s, e = _bag_bounds(offs, ostart[f], bags[f], b)
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


# --------------------------------------------------------------------------------------------
# Backward: per-key gradients, deterministic per-row reduce, fused optimizer
# --------------------------------------------------------------------------------------------


@cuda.jit
def _grad_items_k(
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
    s, e = _bag_bounds(offs, ostart[f], bags[f], b)
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
def _piece_sum_k(order, piece, npiece, coef, gpos, grads, part):
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
def _row_sum_k(part, seg_piece, piece, sorted_rows, nseg, meta, acc, uniq, last):
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
def _update_k(
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
def _update_rowwise_k(
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


# --------------------------------------------------------------------------------------------
# Half arrays: whole-block conversions and gathers
# --------------------------------------------------------------------------------------------


@cuda.jit
def _narrow_k(dst, src, code):
    """``dst[i, j] = narrow_nearest(src[i, j])``; one thread per element."""
    i = cuda.grid(1)
    cols = src.shape[1]
    if i >= src.shape[0] * cols:
        return
    r = i // cols
    c = i - r * cols
    dst[r, c] = narrow_nearest(src[r, c], code)


@cuda.jit
def _widen_k(dst, src, code):
    """``dst[i, j] = widen(src[i, j])``; one thread per element."""
    i = cuda.grid(1)
    cols = src.shape[1]
    if i >= src.shape[0] * cols:
        return
    r = i // cols
    c = i - r * cols
    dst[r, c] = widen(src[r, c], code)


@cuda.jit
def _gather_widen_k(src, rows, out, code):
    """``out[i, j] = widen(src[rows[i], j])``; one thread per element of ``out``."""
    i = cuda.grid(1)
    cols = out.shape[1]
    if i >= out.shape[0] * cols:
        return
    r = i // cols
    c = i - r * cols
    out[r, c] = widen(src[rows[r], c], code)


# --------------------------------------------------------------------------------------------
# Backend object
# --------------------------------------------------------------------------------------------


def _blocks(n: int) -> int:
    """Blocks of ``_TPB`` threads covering ``n`` threads (at least one)."""
    return max(1, -(-n // _TPB))


def _value_code(plan: GroupPlan, values: Any) -> int:
    """``codes.VAL_*`` of a group's ``values`` array (``VAL_F32`` for a float32 array)."""
    return int(plan.value_code) if values.dtype == np.uint16 else VAL_F32


class Packed(NamedTuple):
    """Per-feature arrays of one step concatenated: feature ``f``'s elements are
    ``data[start[f] : start[f] + length[f]]`` (``data`` holds at least one element)."""

    data: Any
    start: Any
    length: Any


class CudaScratch:
    """Device copies of a group's plan, the optimizer's placeholder slots, and ``chunk``: the
    most keys of one row summed by one thread before the per-row sum (a hot row's keys are
    summed in pieces, so one power-law id does not serialise the backward)."""

    def __init__(self, plan: GroupPlan):
        self.chunk = 256
        dev = xp.asarray
        self.table_offset = dev(plan.table_offset)
        self.table_rows = dev(plan.table_rows)
        self.feat_table = dev(plan.feat_table)
        self.feat_col = dev(plan.feat_col)
        self.feat_comb = dev(plan.feat_comb)
        self.feat_hot = dev(plan.feat_hot)
        self.no_slot = xp.zeros((1, 1), dtype=np.float32)
        self.half = dev(plan.half_codes)
        n = plan.table_rows.shape[0]
        table_round = plan.table_round
        if table_round.shape != (n, 4):  # a float32 group: never read
            table_round = np.zeros((n, 4), np.int64)
        self._table_ids = table_round[:, 0].astype(np.uint64)
        self.htab = dev(table_round)
        self.row_round = dev(plan.row_round)  # a keyed half group's row keys (filled each step)
        self._rbase: tuple[int, Any] | None = None

    def rounding(self, plan: GroupPlan, step: int) -> tuple[Any, Any, Any]:
        """``(half codes, htab, rbase)`` of the update kernels at ``step``: ``rbase[t]`` =
        ``round_base(seed, step, table id of t)`` (uint64, computed on the host once per
        step)."""
        if self._rbase is None or self._rbase[0] != step:
            seed = np.int64(plan.round_seed).astype(np.uint64)
            with np.errstate(over="ignore"):
                base = round_base(seed, np.uint64(step), self._table_ids)
            self._rbase = (step, xp.asarray(np.asarray(base, dtype=np.uint64)))
        return self.half, self.htab, self._rbase[1]


class CudaBackend:
    """numba CUDA kernels on CuPy arrays (NumPy arrays under the simulator)."""

    name = "cuda"
    xp = xp

    def num_workers(self) -> int:
        """Streaming multiprocessors of the current device (1 under the simulator)."""
        if cuda_simulated():
            return 1
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)  # pragma: no cover

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised device array."""
        return xp.empty(shape, dtype=dtype)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zero-filled device array."""
        return xp.zeros(shape, dtype=dtype)

    def to_host(self, array: Any) -> np.ndarray:
        """A NumPy copy of a device array."""
        if xp is np:
            return np.array(array, copy=True)
        return xp.asnumpy(array)  # pragma: no cover

    def new_scratch(self, plan: GroupPlan) -> CudaScratch:
        """Device copies of the group's index arrays."""
        return CudaScratch(plan)

    def _pack(self, arrays: Sequence[Any], dtype: Any) -> Packed:
        lengths = np.array([int(a.shape[0]) for a in arrays], dtype=np.int64)
        start = np.zeros(len(arrays), dtype=np.int64)
        np.cumsum(lengths[:-1], out=start[1:])
        parts = [xp.asarray(a, dtype=dtype).reshape(-1) for a in arrays]
        parts.append(xp.zeros(1, dtype=dtype))  # never empty
        return Packed(xp.concatenate(parts), xp.asarray(start), xp.asarray(lengths))

    def pack_step(
        self,
        plan: GroupPlan,
        batch: int,
        keys: Sequence[Any],
        offsets: Sequence[Any],
        weights: Sequence[Any],
        bags: np.ndarray,
    ) -> StepBatch:
        """Concatenate the group's keys, offsets and weights (one device copy each)."""
        k = self._pack(keys, np.int64)
        nnz = np.array([int(a.shape[0]) for a in keys], dtype=np.int64)
        table_nnz = np.bincount(
            plan.feat_table, weights=nnz, minlength=plan.table_rows.shape[0]
        ).astype(np.int64)
        return StepBatch(
            batch=batch,
            keys=k,
            offsets=self._pack(offsets, np.int64),
            weights=self._pack(weights, np.float32),
            bags=np.asarray(bags, dtype=np.int64),
            table_nnz=table_nnz,
            feat_nnz=nnz,
        )

    def forward_group(
        self, plan: GroupPlan, tables: GroupTables, step: StepBatch, out: Any, scratch: CudaScratch
    ) -> np.ndarray:
        """One ``_pool_k`` launch for the whole group."""
        nf = plan.num_features
        err = xp.zeros((nf, 2), dtype=np.int64)
        n = step.batch * nf * plan.dim
        if n:
            _pool_k[_blocks(n), _TPB](
                step.keys.data, step.keys.start, step.keys.length, step.offsets.data,
                step.offsets.start, step.weights.data, step.weights.start, step.weights.length,
                xp.asarray(step.bags), scratch.feat_table, scratch.table_offset,
                scratch.table_rows, scratch.feat_col, scratch.feat_comb, scratch.feat_hot,
                tables.values, out, err, step.batch, _value_code(plan, tables.values),
            )  # fmt: skip
        return self.to_host(err)

    def backward_group(
        self,
        plan: GroupPlan,
        tables: GroupTables,
        step: StepBatch,
        grads: Any,
        update: UpdateStep,
        scratch: CudaScratch,
    ) -> bool:
        """Gradient formation, stable sort by row, per-row reduce and the optimizer."""
        nkeys = int(step.feat_nnz.sum())
        nf = plan.num_features
        if nkeys == 0 or step.batch == 0:
            return False
        row_of = xp.full(nkeys + 1, _NO_ROW, dtype=np.int64)
        coef = xp.empty(nkeys + 1, dtype=np.float32)
        gpos = xp.zeros(nkeys + 1, dtype=np.int64)
        err = xp.zeros(1, dtype=np.int64)
        _grad_items_k[_blocks(nf * step.batch), _TPB](
            step.keys.data, step.keys.start, step.keys.length, step.offsets.data,
            step.offsets.start, step.weights.data, step.weights.start, step.weights.length,
            xp.asarray(step.bags), scratch.feat_table, scratch.table_offset, scratch.table_rows,
            scratch.feat_col, scratch.feat_comb, scratch.feat_hot, plan.width, plan.dim,
            step.batch, row_of, coef, gpos, err,
        )  # fmt: skip
        rows = row_of[:nkeys]
        # stable: equal rows keep their key order, so each row's sum has a fixed order
        order = xp.argsort(rows, kind="stable") if xp is np else xp.argsort(rows)
        sorted_rows = rows[order]
        new = xp.empty(nkeys, dtype=bool)
        new[0] = True
        new[1:] = sorted_rows[1:] != sorted_rows[:-1]
        valid = sorted_rows != _NO_ROW
        new &= valid
        # pieces: a new row, or every `chunk` positions inside a row's run of keys
        cut = new | ((xp.arange(nkeys) % scratch.chunk == 0) & valid)
        starts = xp.flatnonzero(cut)  # the host learns the number of pieces ...
        npiece = int(starts.shape[0])
        if npiece:
            nvalid = valid.sum()
            piece = xp.concatenate([starts, xp.reshape(nvalid, (1,)).astype(np.int64)])
            seg_first = xp.flatnonzero(new[starts])  # ... and of unique rows
            nseg = int(seg_first.shape[0])
            seg_piece = xp.concatenate([seg_first, xp.full(1, npiece, dtype=np.int64)])
            dim = plan.dim
            part = xp.empty((npiece, dim), dtype=np.float32)
            _piece_sum_k[_blocks(npiece * dim), _TPB](
                order, piece, npiece, coef, gpos, grads.reshape(-1), part
            )
            acc = xp.empty((nseg, dim), dtype=np.float32)
            uniq = xp.empty(nseg, dtype=np.int64)
            last = xp.empty(nseg, dtype=np.int64)
            _row_sum_k[_blocks(nseg * dim), _TPB](
                part, seg_piece, piece, sorted_rows, nseg, tables.meta, acc, uniq, last
            )
            hp = xp.asarray(update.hp)
            s = [*tables.slots, scratch.no_slot, scratch.no_slot]
            half, htab, rbase = scratch.rounding(plan, update.step)
            if is_row_wise(update.kind):
                _update_rowwise_k[_blocks(nseg), _TPB](
                    update.kind, hp, tables.values, s[0], tables.meta, acc, uniq, nseg,
                    update.step, half, htab, rbase, scratch.table_offset, scratch.row_round,
                )  # fmt: skip
            else:
                _update_k[_blocks(nseg * dim), _TPB](
                    update.kind, hp, tables.values, s[0], s[1], tables.meta, acc, uniq, last,
                    nseg, update.step, half, htab, rbase, scratch.table_offset, scratch.row_round,
                )  # fmt: skip
        return bool(self.to_host(err)[0])

    def init_range(self, out: Any, row_start: Any, base: Any, kind: int, param: float) -> None:
        """``out[i] = init(row_start + i)`` (one thread per element)."""
        n = int(out.shape[0]) * int(out.shape[1])
        if n:
            _init_k[_blocks(n), _TPB](
                out, xp.zeros(1, np.int64), np.int64(row_start), False, np.uint64(base),
                int(kind), float(param),
            )  # fmt: skip

    def init_rows(self, out: Any, rows: Any, base: Any, kind: int, param: float) -> None:
        """``out[i] = init(rows[i])`` (one thread per element)."""
        n = int(out.shape[0]) * int(out.shape[1])
        if n:
            _init_k[_blocks(n), _TPB](
                out, xp.asarray(rows, dtype=np.int64), np.int64(0), True, np.uint64(base),
                int(kind), float(param),
            )  # fmt: skip

    def fill_f32(self, arr: Any, value: float) -> None:
        """``arr[:] = value``."""
        arr.fill(np.float32(value))

    def fill_i32(self, arr: Any, value: int) -> None:
        """``arr[:] = value``."""
        arr.fill(np.int32(value))

    def fill_i64(self, arr: Any, value: int) -> None:
        """``arr[:] = value``."""
        arr.fill(np.int64(value))

    def fill_u16(self, arr: Any, value: int) -> None:
        """``arr[:] = value`` (a half pattern)."""
        arr.fill(np.uint16(value))

    def narrow_block(self, dst: Any, src: Any, code: int) -> None:
        """``dst = narrow_nearest(src)``: 2-D float32 into a 2-D half (uint16) array."""
        n = int(src.shape[0]) * int(src.shape[1])
        if n:
            _narrow_k[_blocks(n), _TPB](dst, xp.asarray(src, dtype=np.float32), int(code))

    def widen_block(self, dst: Any, src: Any, code: int) -> None:
        """``dst = widen(src)``: a 2-D half (uint16) array into 2-D float32."""
        n = int(src.shape[0]) * int(src.shape[1])
        if n:
            _widen_k[_blocks(n), _TPB](dst, xp.asarray(src, dtype=np.uint16), int(code))

    def gather_widen(self, src: Any, rows: Any, out: Any, code: int) -> None:
        """``out[i] = widen(src[rows[i]])``: rows of a half array into float32."""
        n = int(out.shape[0]) * int(out.shape[1])
        if n:
            _gather_widen_k[_blocks(n), _TPB](src, xp.asarray(rows, dtype=np.int64), out,
                                              int(code))

    def gather_rows(self, src: Any, rows: Any, out: Any) -> None:
        """``out[i] = src[rows[i]]``."""
        out[...] = src[xp.asarray(rows, dtype=np.int64)]
