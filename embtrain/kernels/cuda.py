"""CUDA kernels of the embedding engine (numba's CUDA target), launched on CuPy arrays.

Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba's CUDA module is
imported) the same kernels run thread by thread on the CPU and NumPy arrays stand in for
device arrays; that is how CI checks them. Needs neither TensorFlow nor Pydantic.

Per group and step (one launch per phase, all tables and features of the group together):

* forward: ``pool_k``, one thread per (sample, feature, column): range check, gather and
  pool (sum / mean / sqrtn / concat, weighted or not, fixed or variable bags), written
  straight into the group's ``[batch, width]`` output (consecutive threads write consecutive
  columns);
* backward: ``grad_items_k``, one thread per (feature, sample): every key's group row, its
  coefficient (weight × combiner scale) and the offset of its gradient in ``grads``; a
  stable sort of the rows (``xp.argsort``) and the starts of each row's run and of its
  pieces of at most ``chunk`` keys (``flatnonzero``: the host synchronisations, where the
  number of pieces and unique rows must be known); ``piece_sum_k`` (one thread per (piece,
  column)) then ``row_sum_k`` (one per (unique row, column)) sum in sorted order, the
  pieces in order: a fixed order, no atomics, results do not depend on scheduling;
  ``update_k`` (one thread per row and column) or
  ``update_rowwise_k`` (one thread per row) applies the optimizer and the row's metadata.

Half tables (``np.uint16`` patterns of bfloat16/float16, :mod:`embtrain.kernels.rules.halves`):
every kernel reads values and slots through ``load_elem`` (widened to float32) and writes
them through ``store_elem`` (narrowed to nearest, or stochastically with the bits of
(seed, step, table id, global row or key, global column), as the CPU kernels), so an element
rounds alike on every backend, thread count and number of ranks; all arithmetic is float32.

Initial values (``init_k``) use the counter hash of :mod:`embtrain.embedding.initializers`:
uniform rows equal the CPU's bit for bit; normal rows too wherever the device's float64
``log``/``cos`` round like the host's (they differ by at most an ulp before the float32
rounding).

This module holds the backend object, which packs inputs and launches; the kernels live
beside it, one module per concern: :mod:`.cuda_pool` (forward), :mod:`.cuda_update`
(backward and optimizer), :mod:`.cuda_fill` (initialise, convert and gather half arrays) and
:mod:`.cuda_elements` (the device functions they share: ``load_elem``, ``store_elem``, a
row's rounding stream, a bag's bounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numba import cuda

from embtrain.kernels import cuda_simulated
from embtrain.kernels.codes import VAL_F32
from embtrain.kernels.contract import (
    GroupPlan,
    GroupTables,
    KernelTuning,
    StepBatch,
    UpdateStep,
)
from embtrain.kernels.cuda_fill import gather_widen_k, init_k, narrow_k, widen_k
from embtrain.kernels.cuda_pool import pool_k
from embtrain.kernels.cuda_update import (
    grad_items_k,
    piece_sum_k,
    row_sum_k,
    update_k,
    update_rowwise_k,
)
from embtrain.kernels.rules.halves import round_base
from embtrain.kernels.rules.optimizers import is_row_wise

if cuda_simulated():
    xp: Any = np
else:  # pragma: no cover (needs a GPU)
    import cupy

    xp = cupy

__all__ = ["CudaBackend", "CudaScratch", "Packed"]

_TPB = 128  # threads per block
_NO_ROW = np.iinfo(np.int64).max  # row of a key that was skipped (sorts last)


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
    #: dynamic groups look their keys up on the device, in the forward
    looks_up_ahead = False

    def kernel_input(self, array: Any) -> Any:
        """``array`` as it is (device arrays have one kernel type already)."""
        return array

    def no_weights(self) -> Any:
        """An empty float32 device array."""
        return xp.empty(0, dtype=np.float32)

    def tuning(self, scratch: CudaScratch) -> KernelTuning:
        """The defaults: the launches have no block or worker knobs."""
        return KernelTuning()

    def tune(self, scratch: CudaScratch, tuning: KernelTuning) -> None:
        """Nothing to set (the launch shapes follow the data)."""

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
        """One ``pool_k`` launch for the whole group."""
        nf = plan.num_features
        err = xp.zeros((nf, 2), dtype=np.int64)
        n = step.batch * nf * plan.dim
        if n:
            pool_k[_blocks(n), _TPB](
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
        grad_items_k[_blocks(nf * step.batch), _TPB](
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
            piece_sum_k[_blocks(npiece * dim), _TPB](
                order, piece, npiece, coef, gpos, grads.reshape(-1), part
            )
            acc = xp.empty((nseg, dim), dtype=np.float32)
            uniq = xp.empty(nseg, dtype=np.int64)
            last = xp.empty(nseg, dtype=np.int64)
            row_sum_k[_blocks(nseg * dim), _TPB](
                part, seg_piece, piece, sorted_rows, nseg, tables.meta, acc, uniq, last
            )
            hp = xp.asarray(update.hp)
            s = [*tables.slots, scratch.no_slot, scratch.no_slot]
            half, htab, rbase = scratch.rounding(plan, update.step)
            if is_row_wise(update.kind):
                update_rowwise_k[_blocks(nseg), _TPB](
                    update.kind, hp, tables.values, s[0], tables.meta, acc, uniq, nseg,
                    update.step, half, htab, rbase, scratch.table_offset, scratch.row_round,
                )  # fmt: skip
            else:
                update_k[_blocks(nseg * dim), _TPB](
                    update.kind, hp, tables.values, s[0], s[1], tables.meta, acc, uniq, last,
                    nseg, update.step, half, htab, rbase, scratch.table_offset, scratch.row_round,
                )  # fmt: skip
        return bool(self.to_host(err)[0])

    def init_range(self, out: Any, row_start: Any, base: Any, kind: int, param: float) -> None:
        """``out[i] = init(row_start + i)`` (one thread per element)."""
        n = int(out.shape[0]) * int(out.shape[1])
        if n:
            init_k[_blocks(n), _TPB](
                out, xp.zeros(1, np.int64), np.int64(row_start), False, np.uint64(base),
                int(kind), float(param),
            )  # fmt: skip

    def init_rows(self, out: Any, rows: Any, base: Any, kind: int, param: float) -> None:
        """``out[i] = init(rows[i])`` (one thread per element)."""
        n = int(out.shape[0]) * int(out.shape[1])
        if n:
            init_k[_blocks(n), _TPB](
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
            narrow_k[_blocks(n), _TPB](dst, xp.asarray(src, dtype=np.float32), int(code))

    def widen_block(self, dst: Any, src: Any, code: int) -> None:
        """``dst = widen(src)``: a 2-D half (uint16) array into 2-D float32."""
        n = int(src.shape[0]) * int(src.shape[1])
        if n:
            widen_k[_blocks(n), _TPB](dst, xp.asarray(src, dtype=np.uint16), int(code))

    def gather_widen(self, src: Any, rows: Any, out: Any, code: int) -> None:
        """``out[i] = widen(src[rows[i]])``: rows of a half array into float32."""
        n = int(out.shape[0]) * int(out.shape[1])
        if n:
            gather_widen_k[_blocks(n), _TPB](src, xp.asarray(rows, dtype=np.int64), out,
                                              int(code))

    def gather_rows(self, src: Any, rows: Any, out: Any) -> None:
        """``out[i] = src[rows[i]]``."""
        out[...] = src[xp.asarray(rows, dtype=np.int64)]
