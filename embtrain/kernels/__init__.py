"""Hot loops of the embedding engine behind one small interface.

:func:`get_backend` returns an object holding the array module (``xp``) and the kernels:
``"cpu"`` (NumPy + numba, :mod:`embtrain.kernels.cpu`) and ``"cuda"`` (numba CUDA kernels on
CuPy arrays, :mod:`embtrain.kernels.cuda`; NumPy arrays under numba's CUDA simulator). The
engine hands every backend the same typed bundles (:mod:`embtrain.kernels.contract`) once
per group and phase; each backend chooses its own decomposition, launch shapes and scratch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from embtrain.kernels.contract import GroupPlan, GroupTables, KernelTuning, StepBatch, UpdateStep

__all__ = [
    "KernelBackend",
    "available_backends",
    "cuda_simulated",
    "default_backend",
    "get_backend",
]


class KernelBackend(Protocol):
    """What the engine needs from a kernel backend."""

    name: str
    xp: ModuleType
    #: whether a dynamic group's key lookups may run ahead on host threads while the step
    #: before computes (False: the device looks its keys up in the forward)
    looks_up_ahead: bool

    def kernel_input(self, array: Any) -> Any:
        """``array`` (already the backend's, C-contiguous) as the kernels take their inputs:
        read-only on the CPU (one compiled specialisation per kernel), as it is elsewhere."""
        ...

    def no_weights(self) -> Any:
        """The empty float32 weights of a feature without weights."""
        ...

    def tuning(self, scratch: Any) -> KernelTuning:
        """How the kernels split the work of the group owning ``scratch``."""
        ...

    def tune(self, scratch: Any, tuning: KernelTuning) -> None:
        """Split the work of the group owning ``scratch`` as ``tuning`` says (a backend
        without these knobs ignores it)."""
        ...

    def num_workers(self) -> int:
        """Parallel workers the kernels use (threads on CPU, streaming multiprocessors on GPU)."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array of the backend (host memory on CPU, device memory on GPU)."""
        ...

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zero-filled array of the backend."""
        ...

    def to_host(self, array: Any) -> np.ndarray:
        """A NumPy copy of a backend array."""
        ...

    def pack_step(
        self,
        plan: GroupPlan,
        batch: int,
        keys: Sequence[Any],
        offsets: Sequence[Any],
        weights: Sequence[Any],
        bags: np.ndarray,
    ) -> StepBatch:
        """Pack one step's per-feature arrays of a group (features in group order)."""
        ...

    def new_scratch(self, plan: GroupPlan) -> Any:
        """Backend-owned scratch of one group, passed back on every call for that group."""
        ...

    def forward_group(
        self, plan: GroupPlan, tables: GroupTables, step: StepBatch, out: Any, scratch: Any
    ) -> np.ndarray:
        """Range-check, gather and pool the group's features into ``out[batch, width]``.
        Returns the host int64 ``[features, 2]`` error flags (``codes.BAD_*`` columns)."""
        ...

    def backward_group(
        self,
        plan: GroupPlan,
        tables: GroupTables,
        step: StepBatch,
        grads: Any,
        update: UpdateStep,
        scratch: Any,
    ) -> bool:
        """Form per-key gradients from ``grads[batch, width]``, reduce them per row
        (deterministically) and apply the optimizer to those rows. Returns True when an
        invalid key or bag was seen (and skipped)."""
        ...

    def init_range(self, out: Any, row_start: Any, base: Any, kind: int, param: float) -> None:
        """``out[i] = init(row_start + i)`` for every row of ``out``."""
        ...

    def init_rows(self, out: Any, rows: Any, base: Any, kind: int, param: float) -> None:
        """``out[i] = init(rows[i])``."""
        ...

    def fill_f32(self, arr: Any, value: float) -> None:
        """``arr[:] = value`` (1-D float32)."""
        ...

    def fill_i32(self, arr: Any, value: int) -> None:
        """``arr[:] = value`` (1-D int32)."""
        ...

    def fill_i64(self, arr: Any, value: int) -> None:
        """``arr[:] = value`` (1-D int64)."""
        ...

    def gather_rows(self, src: Any, rows: Any, out: Any) -> None:
        """``out[i] = src[rows[i]]`` for 2-D arrays."""
        ...

    def gather_widen(self, src: Any, rows: Any, out: Any, code: int) -> None:
        """``out[i] = widen(src[rows[i]])``: rows of a half array (``codes.VAL_*`` ``code``)
        into float32."""
        ...

    def narrow_block(self, dst: Any, src: Any, code: int) -> None:
        """``dst = narrow_nearest(src)``: 2-D float32 into a 2-D half (uint16) array."""
        ...

    def widen_block(self, dst: Any, src: Any, code: int) -> None:
        """``dst = widen(src)``: a 2-D half (uint16) array into 2-D float32."""
        ...

    def fill_u16(self, arr: Any, value: int) -> None:
        """``arr[:] = value`` (1-D uint16)."""
        ...


def cuda_simulated() -> bool:
    """True when numba's CUDA simulator is switched on (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


@cache
def _cuda_usable() -> bool:
    """numba's CUDA target (or its simulator) imports and reports a device, and the array
    library is there (CuPy on a GPU; NumPy under the simulator)."""
    try:
        from numba import cuda

        if not cuda.is_available():
            return False
        if cuda_simulated():
            return True
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


def available_backends() -> tuple[str, ...]:
    """Names accepted by :func:`get_backend` on this machine."""
    return ("cpu", "cuda") if _cuda_usable() else ("cpu",)


def default_backend() -> str:
    """``"cuda"`` where a real GPU, numba's CUDA target and CuPy are present, else ``"cpu"``
    (never the simulator: it is for tests)."""
    return "cuda" if not cuda_simulated() and _cuda_usable() else "cpu"


@cache
def get_backend(name: str = "cpu") -> KernelBackend:
    """The kernel backend called ``name`` (``"cpu"`` or ``"cuda"``)."""
    if name == "cpu":
        from embtrain.kernels.cpu import CpuBackend

        return CpuBackend()
    if name == "cuda" and _cuda_usable():
        from embtrain.kernels.cuda import CudaBackend

        return CudaBackend()
    raise ValueError(f"unknown kernel backend {name!r}; available: {available_backends()}")
