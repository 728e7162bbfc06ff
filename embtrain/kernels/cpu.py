"""The CPU backend of the embedding engine: NumPy arrays and numba kernels.

The kernels live beside this backend, one module per concern: :mod:`.cpu_fill` (initialise,
fill, gather), :mod:`.cpu_pool` (forward), :mod:`.cpu_update` (backward and optimizer),
:mod:`.cpu_bags` (their shared bag helpers); :mod:`.cpu_schedule` assigns the backward's work
and :mod:`.host_memory` allocates the arrays.

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

from collections.abc import Sequence

import numba
import numpy as np
from numba.typed import List

from embtrain.kernels import host_memory
from embtrain.kernels.codes import VAL_BF16, half_code
from embtrain.kernels.contract import (
    GroupPlan,
    GroupTables,
    KernelTuning,
    StepBatch,
    UpdateStep,
)
from embtrain.kernels.cpu_fill import (
    fill_f32,
    fill_i32,
    fill_i64,
    gather_rows,
    init_range,
    init_rows,
)
from embtrain.kernels.cpu_pool import pool_forward
from embtrain.kernels.cpu_schedule import CpuScratch, backward_items, map_stamp
from embtrain.kernels.cpu_update import backward_update
from embtrain.kernels.halves import (
    fill_u16,
    gather_widen,
    narrow_block,
    widen_block,
)

# --------------------------------------------------------------------------------------------
# Backend object
# --------------------------------------------------------------------------------------------


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
_NO_WEIGHTS = host_memory.frozen(np.empty(0, dtype=np.float32))


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
    #: dynamic groups look their next batch's keys up on host threads (:mod:`.dynamic`)
    looks_up_ahead = True

    def kernel_input(self, array: np.ndarray) -> np.ndarray:
        """A read-only view (:func:`host_memory.frozen`): one compiled specialisation per
        kernel, whatever produced the array."""
        return host_memory.frozen(array)

    def no_weights(self) -> np.ndarray:
        """One shared read-only empty float32 array."""
        return _NO_WEIGHTS

    def tuning(self, scratch: CpuScratch) -> KernelTuning:
        """The group's ``block`` and ``workers`` (:class:`CpuScratch`)."""
        return KernelTuning(scratch.block, scratch.workers)

    def tune(self, scratch: CpuScratch, tuning: KernelTuning) -> None:
        """Set the group's ``block`` and ``workers``."""
        scratch.block = int(tuning.block)
        scratch.workers = tuning.workers

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An uninitialised, 64-byte aligned array (:func:`host_memory.aligned_empty`)."""
        return host_memory.aligned_empty(shape, dtype)

    def num_workers(self) -> int:
        """Number of parallel workers the kernels use."""
        return int(numba.get_num_threads())

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """A zero-filled array like :meth:`empty` (:func:`host_memory.aligned_zeros`)."""
        return host_memory.aligned_zeros(shape, dtype)

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
