"""The recipe language: validated, frozen description of a training job."""

from embtrain.recipe.loader import (
    fingerprint_matches,
    load_recipe,
    parse_recipe_text,
    recipe_fingerprint,
    recipe_to_yaml,
)
from embtrain.recipe.models import CURRENT_VERSION, Recipe

__all__ = [
    "CURRENT_VERSION",
    "Recipe",
    "fingerprint_matches",
    "load_recipe",
    "parse_recipe_text",
    "recipe_fingerprint",
    "recipe_to_yaml",
]
