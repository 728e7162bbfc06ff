"""The dense network on Keras 3 (TensorFlow or JAX): recipe model types, train step, metrics.

``FeatureSlot``, the aligned buffers and the metrics need no Keras; ``build_model`` (the
model on this process's Keras backend, :mod:`embtrain.models.build`) and ``DenseModel`` (the
TensorFlow one) import it on first use, so ``import embtrain.models`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embtrain.metrics import auc, logloss
from embtrain.models.buffers import aligned_empty, aligned_zeros, is_aligned
from embtrain.models.slots import FeatureSlot

if TYPE_CHECKING:
    from embtrain.models.build import build_model
    from embtrain.models.model import DenseModel

__all__ = [
    "DenseModel",
    "FeatureSlot",
    "aligned_empty",
    "aligned_zeros",
    "auc",
    "build_model",
    "is_aligned",
    "logloss",
]


def __getattr__(name: str) -> Any:
    if name == "build_model":
        from embtrain.models.build import build_model

        return build_model
    if name == "DenseModel":
        from embtrain.models.model import DenseModel

        return DenseModel
    raise AttributeError(f"module 'embtrain.models' has no attribute {name!r}")
