"""Half-precision inputs: every 16-bit pattern, the values at every rounding decision, random
float32 patterns; NumPy's and ml_dtypes' own widening as the reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from embtrain.kernels.codes import VAL_F16

ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def numpy_widen(h: np.ndarray, kind: int) -> np.ndarray:
    """Half patterns ``h`` (``kind``: VAL_F16 or VAL_BF16) widened by NumPy / ml_dtypes."""
    dt = np.float16 if kind == VAL_F16 else ml_dtypes.bfloat16
    return h.view(dt).astype(np.float32)


def rounding_edges(kind: int) -> np.ndarray:
    """Every half value, the midpoints between neighbours, one float32 ulp either side of
    both, ±0, ±inf, NaNs with payloads, float32 subnormals and values past the largest half."""
    v = numpy_widen(ALL16, kind)
    v = np.sort(v[np.isfinite(v) & (v >= 0)])
    mids = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)
    pts = np.concatenate([v, mids])
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)),
                          np.nextafter(pts, np.float32(0))])
    special = np.array([0x7F800000, 0x7FC00000, 0x7F800001, 0x7F812345, 0x7FFFFFFF,
                        0x00000001, 0x00007FFF, 0x00008000, 0x00008001, 0x007FFFFF,
                        0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x477FF000, 0x477FEFFF,
                        0x47800000, 0x33000000, 0x33000001, 0x32FFFFFF], np.uint32)
    pts = np.concatenate([pts, special.view(np.float32)])
    return np.concatenate([pts, -pts]).astype(np.float32)


def random_floats(n: int, seed: int) -> np.ndarray:
    """Random float32 bit patterns (every exponent, NaNs included) and random values of the
    magnitudes tables hold."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(n) * 10.0 ** rng.uniform(-9, 5, n)).astype(np.float32)
    return np.concatenate([raw, scaled])
