"""The recipe's optimizers: learning-rate schedules, the sparse (embedding) and dense optimizers
(re-exported by :mod:`embtrain.recipe.models`)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from embtrain.recipe.base import (
    Decay,
    Epsilon,
    LearningRate,
    NonNegativeInt,
    PositiveInt,
    Strict,
)

# ----------------------------------------------------------------------- optimizers


class Schedule(Strict):
    """The learning rate over the steps: ``lr × factor(step)`` (step counted from 0).

    Linear warm-up over ``warmup_steps`` (factor ``(step + 1) / warmup_steps``), then
    ``constant`` (1), ``cosine`` (from 1 down to ``min_ratio`` over ``decay_steps``, then
    ``min_ratio``) or ``step`` (``decay_rate`` to the power of the number of whole
    ``decay_steps`` since the warm-up). A function of the step alone: a resumed run continues it.
    """

    warmup_steps: NonNegativeInt = 0
    decay: Literal["constant", "cosine", "step"] = "constant"
    decay_steps: PositiveInt | None = Field(None, description="cosine: its length; step: the interval")
    decay_rate: Annotated[float, Field(gt=0, lt=1)] = 0.5
    min_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.0

    @model_validator(mode="after")
    def _decay_needs_steps(self) -> Schedule:
        if self.decay != "constant" and self.decay_steps is None:
            raise ValueError(f"decay: {self.decay} needs decay_steps")
        return self

    def factor(self, step: int) -> float:
        """The multiplier of ``lr`` at ``step`` (0-based), in float64."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        since = step - self.warmup_steps
        if self.decay == "cosine":
            u = min(1.0, since / float(self.decay_steps or 1))
            return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * u))
        if self.decay == "step":
            return self.decay_rate ** (since // int(self.decay_steps or 1))
        return 1.0


class Scheduled(Strict):
    """An optimizer with an optional learning-rate ``schedule`` (none: constant ``lr``)."""

    schedule: Schedule | None = None

    @model_serializer(mode="wrap")
    def _drop_unset_schedule(self, handler: SerializerFunctionWrapHandler) -> dict:
        """No ``schedule`` key without one: older recipes keep their fingerprints."""
        out = handler(self)
        if out.get("schedule") is None:
            out.pop("schedule", None)
        return out


class SparseSGD(Scheduled):
    type: Literal["sgd"]
    lr: LearningRate


class SparseAdagrad(Scheduled):
    type: Literal["adagrad"]
    lr: LearningRate
    initial_accumulator_value: Annotated[float, Field(ge=0)] = 0.1
    epsilon: Epsilon = 1e-7


class SparseRowwiseAdagrad(Scheduled):
    type: Literal["rowwise_adagrad"]
    lr: LearningRate
    initial_accumulator_value: Annotated[float, Field(ge=0)] = 0.1
    epsilon: Epsilon = 1e-7


class SparseAdam(Scheduled):
    """Moments decayed for skipped steps; see docs/OPTIMIZERS.md for the exact semantics."""

    type: Literal["adam"]
    lr: LearningRate
    beta1: Decay = 0.9
    beta2: Decay = 0.999
    epsilon: Epsilon = 1e-7


class SparseLazyAdam(Scheduled):
    type: Literal["lazy_adam"]
    lr: LearningRate
    beta1: Decay = 0.9
    beta2: Decay = 0.999
    epsilon: Epsilon = 1e-7


class SparseFtrl(Scheduled):
    type: Literal["ftrl"]
    lr: LearningRate
    learning_rate_power: Annotated[float, Field(le=0)] = -0.5
    initial_accumulator_value: Annotated[float, Field(gt=0)] = 0.1
    l1: Annotated[float, Field(ge=0)] = 0.0
    l2: Annotated[float, Field(ge=0)] = 0.0
    l2_shrinkage: Annotated[float, Field(ge=0)] = 0.0
    beta: Annotated[float, Field(ge=0)] = 0.0


class SparseSGDMomentum(Scheduled):
    """``v = momentum·v + g; w -= lr·v`` on the rows a batch touches."""

    type: Literal["sgd_momentum"]
    lr: LearningRate
    momentum: Decay = 0.9


SparseOptimizer = Annotated[
    SparseSGD | SparseAdagrad | SparseRowwiseAdagrad | SparseAdam | SparseLazyAdam | SparseFtrl
    | SparseSGDMomentum,
    Field(discriminator="type"),
]


class DenseSGD(Scheduled):
    type: Literal["sgd"]
    lr: LearningRate
    momentum: Decay = 0.0


class DenseAdam(Scheduled):
    type: Literal["adam"]
    lr: LearningRate
    beta1: Decay = 0.9
    beta2: Decay = 0.999
    epsilon: Epsilon = 1e-7


class DenseAdagrad(Scheduled):
    type: Literal["adagrad"]
    lr: LearningRate
    initial_accumulator_value: Annotated[float, Field(ge=0)] = 0.1
    epsilon: Epsilon = 1e-7


DenseOptimizer = Annotated[DenseSGD | DenseAdam | DenseAdagrad, Field(discriminator="type")]


class Optimizers(Strict):
    """The sparse optimizer (embedding tables) and the dense one (the network)."""

    sparse: SparseOptimizer
    dense: DenseOptimizer
