"""The recipe language's ground: bounds, constrained scalar types and :class:`Strict`, the base
of every recipe model (:mod:`embtrain.recipe.models` and the modules it assembles)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Union, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
)

CURRENT_VERSION = 1

# Bounds: every count, size and seed has one, so a typo (rows: 1e29) is a validation error
# rather than an overflow deep inside the planner or the engine.
MAX_INT = 2**31 - 1  # steps, batch sizes, dims, layer widths, cadences
MAX_SEED = 2**32 - 1  # what NumPy's and TensorFlow's seeding takes
MAX_EPOCHS = 1e6

Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$", min_length=1, max_length=128)]
PositiveInt = Annotated[int, Field(gt=0, le=MAX_INT)]
NonNegativeInt = Annotated[int, Field(ge=0, le=MAX_INT)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
# a learning rate is a normal float32 number (the kernels' type): a subnormal one is 0 or
# imprecise in float32 (a NumPy warning, then a run that trains nothing)
MIN_LR = 1.1754943508222875e-38  # numpy.finfo(numpy.float32).tiny
MAX_LR = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max


def _normal_float32(value: float) -> float:
    if value > 0 and not MIN_LR <= value <= MAX_LR:
        raise ValueError(f"{value!r} is outside the float32 range of a learning rate "
                         f"[{MIN_LR:.4g}, {MAX_LR:.4g}]; give a normal number")
    return value


LearningRate = Annotated[float, Field(gt=0), AfterValidator(_normal_float32)]
Decay = Annotated[float, Field(ge=0, lt=1)]
Epsilon = Annotated[float, Field(gt=0)]


class Strict(BaseModel):
    """Base for every recipe model: immutable, unknown keys are errors, no type coercion.

    Strict: a boolean is not an integer, a quoted ``"8"`` is not a number (counts and byte
    sizes still read unit strings such as ``25M``); infinities and NaN are refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def model_type(model: type[Strict]) -> str:
    """The ``type`` a member of a tagged union accepts (its ``type: Literal[...]``)."""
    return get_args(model.model_fields["type"].annotation)[0]


def registry_of(models: Iterable[type[Strict]],
                names: Sequence[str] | None = None) -> dict[str, type[Strict]]:
    """``models`` by their ``type``; given ``names`` (another registry's, e.g. the kernels'
    optimizers), in their order, and ValueError naming what one has and the other lacks."""
    by_type = {model_type(m): m for m in models}
    if names is None:
        return by_type
    if set(by_type) != set(names):
        raise ValueError(f"recipe models {sorted(by_type)} and registered names "
                         f"{sorted(names)} differ")
    return {name: by_type[name] for name in names}


def tagged_union(models: Iterable[type[Strict]]) -> Any:
    """The recipe type accepting any of ``models``, told apart by their ``type``."""
    return Annotated[Union[tuple(models)], Field(discriminator="type")]  # noqa: UP007
