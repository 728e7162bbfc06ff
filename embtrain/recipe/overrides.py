"""Command-line overrides of recipe values, checked by the same rules as the recipe."""

from __future__ import annotations

from pydantic import ValidationError

from embtrain.errors import UserInputError
from embtrain.recipe.models import Recipe, Train


def check_seed(seed: int | None, flag: str = "--seed") -> None:
    """Refuse a seed the recipe's ``train.seed`` would refuse (one line naming ``flag``)."""
    if seed is None:
        return
    from embtrain.recipe.models import MAX_SEED

    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UserInputError(f"{flag}: {seed} is not a seed: give an integer in [0, {MAX_SEED}]")


def with_seed(recipe: Recipe, seed: int, flag: str = "--seed") -> Recipe:
    """``recipe`` with ``train.seed = seed``, validated like a recipe's own seed."""
    check_seed(seed, flag)
    try:
        train = Train.model_validate({**recipe.train.model_dump(), "seed": seed})
    except ValidationError as exc:  # pragma: no cover - check_seed covers the bounds
        raise UserInputError(f"{flag}: {exc.errors()[0]['msg']}") from None
    return recipe.model_copy(update={"train": train})
