"""How the engine hands arrays to the kernels: one numba type per input, on the backend."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from embtrain.kernels.host_memory import frozen

__all__ = ["contiguous", "frozen"]


def contiguous(xp: ModuleType, a: object, dtype: type) -> np.ndarray:
    """``a`` as a C-contiguous array of the backend's array module (no copy when it is one
    already; host data is copied to the device on GPU)."""
    if xp is np:
        return np.ascontiguousarray(a, dtype=dtype)
    return xp.ascontiguousarray(xp.asarray(a, dtype=dtype))
