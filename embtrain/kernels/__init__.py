"""Hot loops of the embedding engine behind one small interface.

:func:`get_backend` returns an object holding the array module (``xp``) and the kernels.
``"cpu"`` (NumPy + numba, :mod:`embtrain.kernels.cpu`) exists now; a ``"cuda"`` backend
(CuPy) will fill the same interface. Every kernel writes into arrays it is given and returns
nothing; argument meanings are documented on the CPU functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from types import ModuleType
from typing import Any, Protocol

__all__ = ["KernelBackend", "available_backends", "get_backend"]


class KernelBackend(Protocol):
    """What the engine needs from a kernel backend."""

    name: str
    xp: ModuleType

    def num_workers(self) -> int:
        """Parallel workers the kernels use (threads on CPU)."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array of the backend (host memory on CPU, device memory on GPU)."""
        ...

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zero-filled array of the backend."""
        ...

    def array_list(self, arrays: Sequence[Any]) -> Any:
        """Pack equally-typed arrays (one per feature) into what the kernels accept."""
        ...

    init_range: Any
    init_rows: Any
    fill_f32: Any
    fill_i64: Any
    fill_i32: Any
    pool_forward: Any
    backward_update: Any
    gather_rows: Any


def available_backends() -> tuple[str, ...]:
    """Names accepted by :func:`get_backend`."""
    return ("cpu",)


@cache
def get_backend(name: str = "cpu") -> KernelBackend:
    """The kernel backend called ``name`` (``"cpu"``)."""
    if name == "cpu":
        from embtrain.kernels.cpu import CpuBackend

        return CpuBackend()
    raise ValueError(f"unknown kernel backend {name!r}; available: {available_backends()}")
