"""``build_model``: the dense model on this process's Keras backend.

:class:`embtrain.models.model.DenseModel` on TensorFlow, :class:`embtrain.models.dense_jax.
JaxDenseModel` on JAX: the same interface (``train_step``, ``predict``, weights and optimizer
state as NumPy arrays). The backend is the one :func:`embtrain.models.backend.select_backend`
chose for this process (``auto`` where nothing chose yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embtrain.models.backend import current_backend, select_backend
from embtrain.models.slots import FeatureSlot
from embtrain.recipe.models import Label, Recipe


def recipe_arguments(config: Any, labels: Sequence[Label] | None,
                     label_names: Sequence[str] | None, precision: Any, batch_size: int | None
                     ) -> tuple[Any, Sequence[Label] | None, Sequence[str] | None, Any, int | None]:
    """A dense model's arguments from a whole recipe: its ``model`` section, ``data.labels``,
    their names, ``train.mixed_precision`` and ``data.batch_size``, each where not given; a
    ``model`` section and the arguments as they are otherwise."""
    if isinstance(config, Recipe):
        if labels is None and config.data.labels is not None:
            labels = config.data.label_specs()
        label_names = label_names or [lab.name for lab in config.data.label_specs()]
        if precision is None:
            precision = config.train.mixed_precision
        if batch_size is None:
            batch_size = config.data.batch_size
        config = config.model
    return config, labels, label_names, precision, batch_size


def build_model(config: Any, num_dense: int, slots: Sequence[FeatureSlot], seed: int,
                labels: Sequence[Label] | None = None,
                label_names: Sequence[str] | None = None,
                precision: Any = None, batch_size: int | None = None) -> Any:
    """The dense model for a recipe's ``model`` section (or a whole recipe: then with its
    ``data.labels``, ``train.mixed_precision`` and ``data.batch_size``) on this process's
    Keras backend; the arguments are :func:`embtrain.models.model.build_model`'s."""
    config, labels, label_names, precision, batch_size = recipe_arguments(
        config, labels, label_names, precision, batch_size)
    backend = current_backend() or select_backend("auto")
    if backend == "tensorflow":
        from embtrain.models.model import DenseModel

        return DenseModel(config, num_dense, slots, seed, labels, label_names, precision,
                          batch_size)
    from embtrain.models.dense_jax import JaxDenseModel

    return JaxDenseModel(config, num_dense, slots, seed, labels, label_names, precision,
                         batch_size)
