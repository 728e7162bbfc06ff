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

from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from embtrain.recipe.base import (
    Decay,
    Epsilon,
    LearningRate,
    NonNegativeInt,
    PositiveInt,
    Strict,
    registry_of,
    tagged_union,
)

# ----------------------------------------------------------------------- optimizers


class Schedule(Strict):
    """The learning rate over the steps: ``lr × factor(step)`` (step counted from 0).

    Linear warm-up over ``warmup_steps`` (factor ``(step + 1) / warmup_steps``), then
    ``constant`` (1), ``cosine`` (from 1 down to ``min_ratio`` over ``decay_steps``, then
    ``min_ratio``) or ``step`` (``decay_rate`` to the power of the number of whole
    ``decay_steps`` since the warm-up). A function of the step alone: a resumed run continues it.
    """

    warmup_steps: NonNegativeInt = Field(
        0, description="steps of linear warm-up: factor (step + 1) / warmup_steps")
    decay: Literal["constant", "cosine", "step"] = Field(
        "constant", description="after the warm-up: constant (1), cosine (from 1 down to "
                                "min_ratio over decay_steps) or step (× decay_rate every "
                                "decay_steps)")
    decay_steps: PositiveInt | None = Field(
        None, description="cosine: its length; step: the interval; required unless constant")
    decay_rate: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.5, description="step decay: the factor applied every decay_steps")
    min_ratio: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0, description="cosine decay: the factor it ends at (and keeps)")

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

    schedule: Schedule | None = Field(
        None, description="learning-rate schedule; none: constant lr")

    @model_serializer(mode="wrap")
    def _drop_unset_schedule(self, handler: SerializerFunctionWrapHandler) -> dict:
        """No ``schedule`` key without one: older recipes keep their fingerprints."""
        out = handler(self)
        if out.get("schedule") is None:
            out.pop("schedule", None)
        return out


class SparseSGD(Scheduled):
    """``var -= lr·g`` on the rows a batch touches."""

    type: Literal["sgd"] = Field(description="sparse optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")


class SparseAdagrad(Scheduled):
    """``acc += g²; var -= lr·g / (sqrt(acc) + epsilon)`` on the rows a batch touches."""

    type: Literal["adagrad"] = Field(description="sparse optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")
    initial_accumulator_value: Annotated[float, Field(ge=0)] = Field(
        0.1, description="the accumulator's starting value")
    epsilon: Epsilon = Field(1e-7, description="added to the denominator")


class SparseRowwiseAdagrad(Scheduled):
    """Adagrad with one accumulator per row: ``acc += mean(g²)``."""

    type: Literal["rowwise_adagrad"] = Field(description="sparse optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")
    initial_accumulator_value: Annotated[float, Field(ge=0)] = Field(
        0.1, description="the accumulator's starting value")
    epsilon: Epsilon = Field(1e-7, description="added to the denominator")


class SparseAdam(Scheduled):
    """Moments decayed for skipped steps; see docs/OPTIMIZERS.md for the exact semantics."""

    type: Literal["adam"] = Field(description="sparse optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")
    beta1: Decay = Field(0.9, description="decay of the first moment")
    beta2: Decay = Field(0.999, description="decay of the second moment")
    epsilon: Epsilon = Field(1e-7, description="added to the denominator")


class SparseLazyAdam(Scheduled):
    """Adam on the rows a batch touches, ignoring the steps a row was not used."""

    type: Literal["lazy_adam"] = Field(description="sparse optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")
    beta1: Decay = Field(0.9, description="decay of the first moment")
    beta2: Decay = Field(0.999, description="decay of the second moment")
    epsilon: Epsilon = Field(1e-7, description="added to the denominator")


class SparseFtrl(Scheduled):
    """TensorFlow's FTRL-proximal (``ResourceSparseApplyFtrlV2``)."""

    type: Literal["ftrl"] = Field(description="sparse optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")
    learning_rate_power: Annotated[float, Field(le=0)] = Field(
        -0.5, description="power of the accumulator in the per-coordinate rate")
    initial_accumulator_value: Annotated[float, Field(gt=0)] = Field(
        0.1, description="the accumulator's starting value")
    l1: Annotated[float, Field(ge=0)] = Field(0.0, description="L1 regularization strength")
    l2: Annotated[float, Field(ge=0)] = Field(0.0, description="L2 regularization strength")
    l2_shrinkage: Annotated[float, Field(ge=0)] = Field(
        0.0, description="L2 shrinkage regularization strength")
    beta: Annotated[float, Field(ge=0)] = Field(
        0.0, description="Keras' beta: enters as l2 + beta / (2·lr)")


class SparseSGDMomentum(Scheduled):
    """``v = momentum·v + g; w -= lr·v`` on the rows a batch touches."""

    type: Literal["sgd_momentum"] = Field(description="sparse optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")
    momentum: Decay = Field(0.9, description="μ in v = μ·v + g; untouched rows' momentum does "
                                             "not decay")


#: The recipe model of each sparse optimizer, in the order of the optimizers' registry
#: (:data:`embtrain.kernels.optimizer_spec.SPARSE_OPTIMIZERS`); importing fails while the two
#: name different optimizers.
SPARSE_OPTIMIZER_MODELS: dict[str, type[Strict]] = registry_of(
    (SparseSGD, SparseAdagrad, SparseRowwiseAdagrad, SparseAdam, SparseLazyAdam, SparseFtrl,
     SparseSGDMomentum),
    OPTIMIZER_NAMES)

SparseOptimizer = tagged_union(SPARSE_OPTIMIZER_MODELS.values())


class DenseSGD(Scheduled):
    """Keras' SGD, with optional momentum."""

    type: Literal["sgd"] = Field(description="dense optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")
    momentum: Decay = Field(0.0, description="Keras' SGD momentum; 0: plain SGD")


class DenseAdam(Scheduled):
    """Keras' Adam."""

    type: Literal["adam"] = Field(description="dense optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")
    beta1: Decay = Field(0.9, description="decay of the first moment")
    beta2: Decay = Field(0.999, description="decay of the second moment")
    epsilon: Epsilon = Field(1e-7, description="added to the denominator")


class DenseAdagrad(Scheduled):
    """Keras' Adagrad."""

    type: Literal["adagrad"] = Field(description="dense optimizer")
    lr: LearningRate = Field(description="learning rate (times the schedule's factor when there is one)")
    initial_accumulator_value: Annotated[float, Field(ge=0)] = Field(
        0.1, description="the accumulator's starting value")
    epsilon: Epsilon = Field(1e-7, description="added to the denominator")


DenseOptimizer = Annotated[DenseSGD | DenseAdam | DenseAdagrad, Field(discriminator="type")]


class Optimizers(Strict):
    """The sparse optimizer (embedding tables) and the dense one (the network)."""

    sparse: SparseOptimizer = Field(
        description="updates the embedding rows a batch touches, fused into the backward pass "
                    "(see docs/OPTIMIZERS.md)")
    dense: DenseOptimizer = Field(description="updates the dense network's weights (Keras)")
