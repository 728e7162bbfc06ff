"""Command-line overrides of recipe values, checked by the same rules as the recipe."""

from __future__ import annotations

from embtrain.errors import UserInputError


def check_seed(seed: int | None, flag: str = "--seed") -> None:
    """Refuse a seed the recipe's ``train.seed`` would refuse (one line naming ``flag``)."""
    if seed is None:
        return
    from embtrain.recipe.models import MAX_SEED

    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UserInputError(f"{flag}: {seed} is not a seed: give an integer in [0, {MAX_SEED}]")
