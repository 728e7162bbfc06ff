"""What the data layer hands to training: one :class:`Batch` per step, plus the reader's position."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Batch", "ReaderPosition", "SparseInput"]


@dataclass(frozen=True)
class SparseInput:
    """One feature's batch as CSR bags: sample ``i`` holds ``keys[offsets[i]:offsets[i+1]]``.

    ``keys`` int64[nnz], ``offsets`` int64[batch+1] (``offsets[0] == 0``,
    ``offsets[-1] == nnz``), ``weights`` float32[nnz] or ``None`` (all ones).
    One-hot input: ``offsets = arange(batch + 1)``.

    ``bag_size`` > 0 promises that every bag holds exactly that many keys
    (``offsets == arange(0, nnz + 1, bag_size)``, as :meth:`one_hot` and
    :meth:`fixed_hotness` build it): the kernels then compute bag bounds instead of reading
    ``offsets`` (less memory traffic per step). 0: bags may differ in size.
    """

    keys: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray | None = None
    bag_size: int = 0

    @property
    def batch_size(self) -> int:
        """Number of samples (bags)."""
        return int(self.offsets.shape[0]) - 1

    @staticmethod
    def one_hot(keys: np.ndarray) -> SparseInput:
        """One key per sample."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        return SparseInput(keys, np.arange(keys.shape[0] + 1, dtype=np.int64), bag_size=1)

    @staticmethod
    def fixed_hotness(keys_2d: np.ndarray, weights_2d: np.ndarray | None = None) -> SparseInput:
        """``hotness`` keys per sample from a ``[batch, hotness]`` array."""
        batch, hot = keys_2d.shape
        keys = np.ascontiguousarray(keys_2d, dtype=np.int64).reshape(-1)
        offsets = np.arange(0, batch * hot + 1, hot, dtype=np.int64)
        weights = (
            None
            if weights_2d is None
            else np.ascontiguousarray(weights_2d, dtype=np.float32).reshape(-1)
        )
        return SparseInput(keys, offsets, weights, bag_size=hot)


@dataclass(frozen=True)
class Batch:
    """This rank's rows of one global batch.

    ``dense``: float32[size, n_dense], every dense feature's columns in recipe order with the
    feature's ``fill_null`` and ``transform`` applied; ``label``: float32[size]
    (``[size, labels]`` with ``data.labels``, in recipe order);
    ``sparse``: one :class:`SparseInput` (CSR keys/offsets/weights) per categorical feature name;
    ``global_size``: rows of the global batch that this rank's slice is part of.
    """

    size: int
    dense: np.ndarray
    label: np.ndarray
    sparse: dict[str, SparseInput]
    global_size: int = -1  # rows of the global batch this slice belongs to (-1: ``size``)

    @property
    def global_rows(self) -> int:
        """Rows of the global batch (all ranks together)."""
        return self.size if self.global_size < 0 else self.global_size


@dataclass(frozen=True, order=True)
class ReaderPosition:
    """Where a reader stands: the next batch it will yield is batch ``batch`` of epoch ``epoch``."""

    epoch: int
    batch: int
