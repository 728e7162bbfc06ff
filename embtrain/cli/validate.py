"""``embtrain validate``: check recipe files and report every problem at once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from embtrain.data.check import CHECK_ROWS
from embtrain.errors import RecipeError
from embtrain.machine import half_precision_note
from embtrain.recipe import Recipe, load_recipe


def validate(
    recipes: list[Path] = typer.Argument(..., help="recipe YAML files"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing on success"),
    data: bool = typer.Option(False, "--data", help="also check the first file of each split: "
                                                    "every column and type, and the values "
                                                    "(nulls, NaN, list shapes, ids, labels) of "
                                                    "its first --rows rows"),
    rows: Annotated[int, typer.Option("--rows", min=0, metavar="N",
                                      help="with --data: rows of each first file whose values "
                                           "are checked; 0: every row")] = CHECK_ROWS,
) -> None:
    """Validate recipes: every error as file:line:col: field: message, exit code 2.

    A `type: keras` recipe's module (model.build, found in model.path) is imported and its
    builder run, so validate runs that Python code: validate only recipes you trust."""
    console = Console(highlight=False, soft_wrap=True)
    problems: list[str] = []
    for path in recipes:
        try:
            recipe = load_recipe(path)
        except RecipeError as exc:
            problems.extend(exc.lines)
            continue
        if recipe.model.type == "keras":
            problem = _check_keras(path, recipe)
            if problem:
                problems.append(problem)
                continue
        checked: list[str] = []
        if data:
            from embtrain.data.check import check_data

            found = check_data(recipe, rows or None, checked)
            if found:
                problems.extend(found)
                continue
        if not quiet:
            tables = len(recipe.tables)
            feats = len(recipe.features)
            console.print(f"ok: {path} ({recipe.name}: {feats} features, {tables} tables, "
                          f"model {recipe.model.type})")
            note = (half_precision_note(recipe.train.mixed_precision)
                    if recipe.train.device != "gpu" else None)
            if note:
                console.print(f"note: {path}: {note}")
            for line in checked:
                console.print(f"data: {line}")
    if problems:
        raise RecipeError(problems)


def _build_position(path: Path) -> str:
    """``line:col`` of ``model.build`` in the recipe file (``1:1`` when it cannot be told)."""
    import yaml

    try:
        root = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
        for section in (root.value if isinstance(root, yaml.MappingNode) else []):
            if section[0].value == "model" and isinstance(section[1], yaml.MappingNode):
                for key, value in section[1].value:
                    if key.value == "build":
                        return f"{value.start_mark.line + 1}:{value.start_mark.column + 1}"
                return f"{section[1].start_mark.line + 1}:{section[1].start_mark.column + 1}"
    except (OSError, yaml.YAMLError):
        pass
    return "1:1"


def _check_keras(path: Path, recipe: Recipe) -> str | None:
    """Build a keras model on a dummy batch: None, or the problem as one located line."""
    from embtrain.models.keras_model import KerasModelError, check_recipe_model
    from embtrain.recipe.models import KerasModel

    assert isinstance(recipe.model, KerasModel)
    dims = {t.name: t.dim for t in recipe.tables}
    features = []
    for f in recipe.categorical_features:
        hot = int(f.hotness) if f.combiner == "concat" and f.hotness != "variable" else 1
        features.append((f.name, dims[f.table] * hot))
    num_dense = sum(len(f.columns) for f in recipe.dense_features)
    labels = [lab.name for lab in recipe.data.label_specs()]
    try:
        check_recipe_model(recipe.model, features, num_dense, labels)
    except KerasModelError as exc:
        return f"{path}:{_build_position(path)}: {exc}"
    return None
