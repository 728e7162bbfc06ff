"""Host-side conversions of half tables' arrays (float16 / bfloat16 held as ``np.uint16`` bit
patterns, :mod:`embtrain.kernels.rules.halfs`).

A table's arrays, as the engine exports them (:class:`~embtrain.embedding.rowspace.TableState`)
and checkpoints keep them, are in the table's *stored* form: float32 for a float32 table, the
16-bit patterns for a half table (``TableState.dtype`` / ``state_dtype`` say which). Imports
accept either form: float values are narrowed to nearest (ties to even), patterns of the
table's own dtype are taken as they are.
"""

from __future__ import annotations

import numpy as np

from embtrain.embedding.reference_halfs import narrow_nearest_ref, widen_ref
from embtrain.kernels import codes

__all__ = ["DTYPE_CODES", "converted", "half_numpy_dtype", "half_pattern", "stored_as",
           "to_float32", "widen_ref"]

#: ``codes.VAL_*`` of each table dtype.
DTYPE_CODES = {"float32": codes.VAL_F32, "bfloat16": codes.VAL_BF16, "float16": codes.VAL_F16}


def half_numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a float type by name: ``bfloat16`` is ml_dtypes' (TensorFlow's own,
    so arrays of it cross to TensorFlow as bfloat16 tensors)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def half_pattern(value: float, code: int) -> np.uint16:
    """The half pattern of ``value`` rounded to nearest (``code``: ``VAL_BF16``/``VAL_F16``)."""
    return narrow_nearest_ref(np.array([value], np.float32), code)[0]


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
    return narrow_nearest_ref(np.asarray(a, dtype=np.float32), code)


def to_float32(array: np.ndarray, code: int) -> np.ndarray:
    """Stored arrays of ``code`` as float32 values (exact; float32 input returned as is)."""
    if code == codes.VAL_F32:
        return np.asarray(array, dtype=np.float32)
    return widen_ref(np.asarray(array, dtype=np.uint16), code)


def converted(array: object, source: str | None, code: int, what: str = "array") -> np.ndarray:
    """``array``, stored as dtype ``source`` (None: not said), in the stored form of ``code``:
    16-bit patterns of another half type (or for a float32 table) are widened first (exact),
    then :func:`stored_as` narrows to nearest where ``code`` is a half type."""
    a = np.asarray(array)
    src = DTYPE_CODES.get(source or "")
    if a.dtype == np.uint16 and src not in (None, codes.VAL_F32, code):
        a = widen_ref(a, src)
    return stored_as(a, code, what)
