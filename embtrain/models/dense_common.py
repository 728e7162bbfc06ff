"""What the dense model does alike on every Keras backend.

:class:`embtrain.models.model.DenseModel` (TensorFlow) and
:class:`embtrain.models.dense_jax.JaxDenseModel` (JAX) differ in how they trace, differentiate
and hold their weights; the network they build from a recipe, its heads, the loss scale of a
step and the Keras optimizer made from the recipe's dense optimizer are the same, and are
here. Imported by those two modules only, after the Keras backend is chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from embtrain.models.networks import ModelConfig, build_network
from embtrain.models.precision import Precision
from embtrain.models.slots import FeatureSlot, group_widths, validate_slots
from embtrain.recipe.models import (
    DenseAdagrad,
    DenseAdam,
    DenseSGD,
    Label,
    Optimizers,
    Recipe,
    Schedule,
)

DenseOptimizerConfig = DenseSGD | DenseAdam | DenseAdagrad


class DenseNetworkParts:
    """The recipe's network on this backend, its inputs and its heads: what both dense models
    set up first (``precision`` already resolved by the caller)."""

    def __init__(self, config: ModelConfig, num_dense: int, slots: Sequence[FeatureSlot],
                 seed: int, labels: Sequence[Label] | None, label_names: Sequence[str] | None,
                 precision: Precision):
        validate_slots(slots)
        self.precision = precision
        self.config = config
        self.num_dense = int(num_dense)
        self.slots = list(slots)
        self.seed = int(seed)
        self.labels: list[Label] | None = list(labels) if labels else None
        self.heads = len(self.labels) if self.labels else 1
        self.group_widths: list[int | None] = group_widths(self.slots)
        names = list(label_names) if label_names else (
            [lab.name for lab in self.labels] if self.labels else ["label"])
        self.network, self._variables = build_network(config, self.num_dense, self.slots, seed,
                                                      self.heads, names, self.precision)

    def _heads(self, logits: Any) -> Any:
        """``[batch, heads]`` logits (one head: a column of its ``[batch]`` logits)."""
        return logits[:, None] if self.heads == 1 else logits


class RecipeScheduleBase(keras.optimizers.schedules.LearningRateSchedule):
    """A recipe :class:`~embtrain.recipe.models.Schedule` as a Keras schedule of the
    optimizer's iteration count; each backend computes ``__call__`` in its own ops."""

    def __init__(self, lr: float, schedule: Schedule):
        self.lr = float(lr)
        self.schedule = schedule

    def get_config(self) -> dict[str, Any]:
        return {"lr": self.lr, "schedule": self.schedule.model_dump(mode="json")}


def loss_scale_factor(batch: int, global_batch_size: int | None, loss_scale: float | None
                      ) -> float:
    """What a step multiplies its summed loss by: ``loss_scale`` as given, else one over the
    global batch (several ranks), else one over this batch."""
    if global_batch_size is not None and loss_scale is not None:
        raise ValueError("give global_batch_size or loss_scale, not both")
    if loss_scale is not None:
        return float(loss_scale)
    if global_batch_size is not None:
        if global_batch_size <= 0:
            raise ValueError(f"global_batch_size must be > 0, got {global_batch_size}")
        return 1.0 / global_batch_size
    return 1.0 / max(batch, 1)


def dense_optimizer_config(config: DenseOptimizerConfig | Optimizers | Recipe
                           ) -> DenseOptimizerConfig:
    """The dense optimizer of a recipe, of its ``optimizer`` section, or itself."""
    if isinstance(config, Recipe):
        config = config.optimizer
    if isinstance(config, Optimizers):
        config = config.dense
    return config


def keras_optimizer(config: DenseOptimizerConfig | Optimizers | Recipe,
                    schedule: type[RecipeScheduleBase]
                    ) -> keras.optimizers.Optimizer:
    """A Keras 3 optimizer for the recipe's dense optimizer (not yet built); a learning-rate
    schedule becomes ``schedule(lr, recipe_schedule)`` (the backend's own)."""
    config = dense_optimizer_config(config)
    lr: Any = config.lr if config.schedule is None else schedule(config.lr, config.schedule)
    if isinstance(config, DenseSGD):
        return keras.optimizers.SGD(learning_rate=lr, momentum=config.momentum)
    if isinstance(config, DenseAdam):
        return keras.optimizers.Adam(learning_rate=lr, beta_1=config.beta1,
                                     beta_2=config.beta2, epsilon=config.epsilon)
    if isinstance(config, DenseAdagrad):
        return keras.optimizers.Adagrad(learning_rate=lr,
                                        initial_accumulator_value=config.initial_accumulator_value,
                                        epsilon=config.epsilon)
    raise TypeError(f"not a dense optimizer config: {type(config).__name__}")
