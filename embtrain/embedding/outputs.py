"""The dtypes of the engine's pooled outputs and of the gradients it takes back.

float32 everywhere; besides, where the backend's kernels can (``half_outputs``: the CPU's),
the half type a network computes in (bfloat16/float16, :data:`~embtrain.kernels.codes.HALF_OUTPUTS`):
the pooling kernel narrows to nearest, ties to even, as the network's cast on entry would, and
the backward reads bfloat16 gradients as they are (exactly their float32 widening).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embtrain.embedding.halves import half_numpy_dtype
from embtrain.embedding.kernel_inputs import contiguous
from embtrain.kernels.codes import HALF_OUTPUTS, VAL_BF16, half_code

__all__ = ["check_output", "gradient_array", "output_dtype", "output_dtypes"]


def output_dtypes(backend: Any) -> tuple[str, ...]:
    """The half dtypes ``backend``'s forward writes besides float32 (none on the cuda one)."""
    return tuple(HALF_OUTPUTS) if getattr(backend, "half_outputs", False) else ()


def output_dtype(backend: Any, dtype: np.dtype | type | str) -> np.dtype:
    """``dtype`` (a NumPy dtype or a name: ``bfloat16`` is ml_dtypes') if ``backend`` writes
    it, else ``ValueError``."""
    if isinstance(dtype, str) and dtype in HALF_OUTPUTS:
        dtype = half_numpy_dtype(dtype)
    dt = np.dtype(dtype)
    if dt != np.float32 and dt.name not in output_dtypes(backend):
        raise ValueError(f"the {backend.name} engine writes float32 outputs"
                         + "".join(f" or {d}" for d in output_dtypes(backend))
                         + f", not {dt.name}")
    return dt


def check_output(backend: Any, dst: Any, shape: tuple[int, int], index: int) -> None:
    """``ValueError`` unless ``dst`` is a C-contiguous ``shape`` array ``backend`` writes."""
    if dst.shape != shape or not dst.flags.c_contiguous or (
            dst.dtype != np.float32 and dst.dtype.name not in output_dtypes(backend)):
        raise ValueError(f"out[{index}] must be C-contiguous float32 {shape}"
                         + "".join(f" (or {d})" for d in output_dtypes(backend)))


def gradient_array(backend: Any, grad: Any) -> Any:
    """``grad`` as the backward takes it: bfloat16 as it is where ``backend`` reads it, any
    other dtype widened to float32; C-contiguous, on the backend."""
    keep = half_code(grad) == VAL_BF16 and "bfloat16" in output_dtypes(backend)
    return contiguous(backend.xp, grad, grad.dtype if keep else np.float32)
