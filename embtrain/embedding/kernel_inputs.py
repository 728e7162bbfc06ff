"""How the engine hands arrays to the kernels: one numba type per input, on the backend."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["contiguous", "frozen"]


def frozen(a: Any) -> Any:
    """A read-only view of a NumPy array: the kernels' inputs always have the same numba type
    (read-only, C-contiguous) whether they came from NumPy, Arrow or TensorFlow, so each CPU
    kernel has one compiled specialisation, which ``embtrain.cli.warm`` compiles ahead of
    time. Device arrays (CuPy) pass through."""
    if not isinstance(a, np.ndarray):
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def contiguous(xp: ModuleType, a: object, dtype: type) -> np.ndarray:
    """``a`` as a C-contiguous array of the backend's array module (no copy when it is one
    already; host data is copied to the device on GPU)."""
    if xp is np:
        return np.ascontiguousarray(a, dtype=dtype)
    return xp.ascontiguousarray(xp.asarray(a, dtype=dtype))
