"""Typed array bundles the engine hands to a kernel backend (NumPy only; no numba, no CuPy).

A backend sees three bundles per call and chooses its own decomposition and scratch:

* :class:`GroupPlan` — the static index structure of one fused group (host NumPy, built once);
* :class:`GroupTables` — the group's state arrays (backend arrays: NumPy on CPU, device
  arrays on GPU);
* :class:`StepBatch` — one step's sparse inputs of the group, packed by the backend
  (:meth:`KernelBackend.pack_step`);
* :class:`UpdateStep` — the optimizer code, its hyper-parameter vector and the step.

Scratch (row maps, staging buffers, sort buffers, …) is backend-owned: the engine asks for one
opaque object per group (``new_scratch``) and passes it back on every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["GroupPlan", "GroupTables", "KernelTuning", "StepBatch", "UpdateStep"]


@dataclass(frozen=True, eq=False)
class GroupPlan:
    """Static layout of a fused group (every array host NumPy int64).

    Table ``t`` owns rows ``table_offset[t] : table_offset[t] + table_rows[t]`` of the group's
    ``values``; feature ``f`` reads table ``feat_table[f]``, pools with combiner
    ``feat_comb[f]`` (``codes.COMB_*``) into columns ``feat_col[f] : + feat_width[f]`` of the
    group's ``[batch, width]`` output; ``feat_hot[f]`` is the concat hotness (0 otherwise).
    ``tf_ptr``/``tf_idx``: CSR listing, per table, the features reading it (ascending).

    Half tables (:mod:`embtrain.kernels.rules.halves`): ``value_code`` / ``slot_code``
    (``codes.VAL_*``) are the dtypes of ``values`` and of the slots, ``rounding``
    (``codes.ROUND_*``) how updates narrow, ``round_seed`` the run's seed (as int64 bits) and
    ``table_round[t]`` = ``(round_table_id, row offset, row stride, first column)`` of table
    ``t`` in its full table (int64), so a shard rounds each element as the whole table would.
    ``row_round`` (a keyed group's: dynamic or tiered half tables; empty otherwise) holds each
    group row's key, which its global row is taken from instead of its position (rows take
    keys as the key → row phase places them; filled for the rows of each step).
    """

    dim: int
    width: int
    table_offset: np.ndarray
    table_rows: np.ndarray
    feat_table: np.ndarray
    feat_col: np.ndarray
    feat_width: np.ndarray
    feat_comb: np.ndarray
    feat_hot: np.ndarray
    tf_ptr: np.ndarray
    tf_idx: np.ndarray
    value_code: int = 0
    slot_code: int = 0
    rounding: int = 0
    round_seed: int = 0
    table_round: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.int64))
    row_round: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def half_codes(self) -> np.ndarray:
        """``(value_code, slot_code, rounding, round_seed)`` as the kernels take them (int64)."""
        return np.array([self.value_code, self.slot_code, self.rounding, self.round_seed],
                        dtype=np.int64)

    @property
    def num_features(self) -> int:
        """Features of the group."""
        return int(self.feat_table.shape[0])

    @property
    def total_rows(self) -> int:
        """Rows of all the group's tables together."""
        return int(self.table_rows.sum())


@dataclass
class GroupTables:
    """State of a fused group: ``values[total_rows, dim]`` float32 (``uint16`` half patterns
    for a half table), the optimizer's slots (``[total_rows, dim]`` or ``[total_rows, 1]``
    float32 each, or ``uint16`` with ``optimizer_state: table``), and ``meta[total_rows, 2]``
    int32 = ``(update_count, last_step + 1)`` (zero for a row never updated)."""

    values: Any
    slots: list[Any] = field(default_factory=list)
    meta: Any = None


@dataclass
class StepBatch:
    """One step's inputs of a group as the backend packed them.

    ``keys``/``offsets``/``weights``: the per-feature int64 keys, int64 offsets (``batch + 1``)
    and float32 weights (length 0: all ones), in whatever form the backend's kernels take
    (a typed list on CPU, concatenations on GPU). ``bags[f]`` > 0: every bag of feature ``f``
    holds that many keys (offsets not read). ``table_nnz[t]``: keys reading table ``t``.
    ``feat_nnz[f]``: keys of feature ``f``. ``bags``, ``table_nnz`` and ``feat_nnz`` are host
    NumPy int64.
    """

    batch: int
    keys: Any
    offsets: Any
    weights: Any
    bags: np.ndarray
    table_nnz: np.ndarray
    feat_nnz: np.ndarray


@dataclass(frozen=True)
class UpdateStep:
    """What the fused sparse optimizer needs: ``kind`` (``codes.OPT_*``), ``hp`` (float32,
    ``codes.HP_*`` layout) and the global ``step``."""

    kind: int
    hp: np.ndarray
    step: int


@dataclass(frozen=True)
class KernelTuning:
    """How a backend's kernels split one group's work; results never depend on ``workers``,
    a different ``block`` may change the last bit of a table read by several features.

    ``block``: samples per block of the CPU kernels; ``workers``: work lists of the CPU
    backward (None: one per thread). A backend without such knobs reports the defaults and
    ignores what it is given (:meth:`KernelBackend.tune`)."""

    block: int = 256
    workers: int | None = None
