"""What the data layer hands to training: one :class:`Batch` per step, plus the reader's position."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embtrain.embedding.config import SparseInput

__all__ = ["Batch", "ReaderPosition", "SparseInput"]


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
