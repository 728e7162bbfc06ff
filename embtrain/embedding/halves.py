"""Host-side conversions of half tables' arrays (float16 / bfloat16 held as ``np.uint16`` bit
patterns, :mod:`embtrain.kernels.rules.halves`).

A table's arrays, as the engine exports them (:class:`~embtrain.embedding.rowspace.TableState`)
and checkpoints keep them, are in the table's *stored* form: float32 for a float32 table, the
16-bit patterns for a half table (``TableState.dtype`` / ``state_dtype`` say which). Imports
accept either form: float values are narrowed to nearest (ties to even), patterns of the
table's own dtype are taken as they are.
"""

from __future__ import annotations

import numpy as np

from embtrain.kernels import codes

_U32 = np.uint32

#: ``codes.VAL_*`` of each table dtype.
DTYPE_CODES = {"float32": codes.VAL_F32, "bfloat16": codes.VAL_BF16, "float16": codes.VAL_F16}


def half_numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a float type by name: ``bfloat16`` is ml_dtypes' (TensorFlow's own,
    so arrays of it cross to TensorFlow as bfloat16 tensors)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _check_half(code: int) -> None:
    if code not in (codes.VAL_BF16, codes.VAL_F16):
        raise ValueError(f"not a half kind: {code}")


def widen(bits: np.ndarray, code: int) -> np.ndarray:
    """float32 values of the uint16 half patterns ``bits``."""
    _check_half(code)
    h = np.asarray(bits, dtype=np.uint16)
    if code == codes.VAL_F16:
        return h.view(np.float16).astype(np.float32)
    return (h.astype(_U32) << _U32(16)).view(np.float32)


def narrow_nearest(x: np.ndarray, code: int) -> np.ndarray:
    """uint16 patterns of float32 ``x`` rounded to nearest (ties to even)."""
    _check_half(code)
    x = np.asarray(x, dtype=np.float32)
    if code == codes.VAL_F16:
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(np.float16).view(np.uint16)
    b = x.view(_U32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16))
    nan = (np.uint64(0x7FC0) | ((b >> np.uint64(16)) & np.uint64(0x8000)))
    return np.where(np.isnan(x), nan, rounded).astype(np.uint16)


def half_pattern(value: float, code: int) -> np.uint16:
    """The half pattern of ``value`` rounded to nearest (``code``: ``VAL_BF16``/``VAL_F16``)."""
    return narrow_nearest(np.array([value], np.float32), code)[0]


def stored_as(array: object, code: int, what: str = "array") -> np.ndarray:
    """``array`` in the stored form of ``code``: float32 for ``VAL_F32``, else uint16 patterns.

    Float input is narrowed to nearest; uint16 input must already be patterns of ``code``
    (a float32 table refuses them: their half kind is not known); ``np.float16`` input is
    taken as float16 values.
    """
    a = np.asarray(array)
    if code == codes.VAL_F32:
        if a.dtype == np.uint16:
            raise ValueError(f"{what}: 16-bit patterns for a float32 table (convert them to "
                             "float32 first)")
        return np.ascontiguousarray(a, dtype=np.float32)
    if a.dtype == np.uint16:
        return np.ascontiguousarray(a)
    if a.dtype == np.float16 and code == codes.VAL_F16:
        return np.ascontiguousarray(a).view(np.uint16)
    return narrow_nearest(np.asarray(a, dtype=np.float32), code)


def to_float32(array: np.ndarray, code: int) -> np.ndarray:
    """Stored arrays of ``code`` as float32 values (exact; float32 input returned as is)."""
    if code == codes.VAL_F32:
        return np.asarray(array, dtype=np.float32)
    return widen(np.asarray(array, dtype=np.uint16), code)


def converted(array: object, source: str | None, code: int, what: str = "array") -> np.ndarray:
    """``array``, stored as dtype ``source`` (None: not said), in the stored form of ``code``:
    16-bit patterns of another half type (or for a float32 table) are widened first (exact),
    then :func:`stored_as` narrows to nearest where ``code`` is a half type."""
    a = np.asarray(array)
    src = DTYPE_CODES.get(source or "")
    if a.dtype == np.uint16 and src not in (None, codes.VAL_F32, code):
        a = widen(a, src)
    return stored_as(a, code, what)
