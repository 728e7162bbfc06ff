"""``embtrain gen-data``: write deterministic synthetic Parquet data for a recipe or a preset."""

from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from embtrain.errors import UserInputError

if TYPE_CHECKING:
    from embtrain.recipe.models import Recipe


def gen_data(
    out: Annotated[Path, typer.Option("--out", help="output folder (train/, eval/, dataset.json)")],
    recipe: Annotated[Path | None, typer.Option("--recipe", help="recipe whose columns to write")] = None,
    preset: Annotated[str | None, typer.Option(
        "--preset", help="built-in data set: criteo, criteo-multihot, sparse-ids (int64 ids "
                         "for dynamic tables) or sparse-ids-dense (the same, ids remapped "
                         "to 0..n-1)")] = None,
    rows: Annotated[int, typer.Option("--rows", help="training rows")] = 200_000,
    eval_rows: Annotated[int, typer.Option("--eval-rows", help="evaluation rows")] = 50_000,
    files: Annotated[int, typer.Option("--files", help="Parquet files per split")] = 4,
    alpha: Annotated[float, typer.Option("--alpha", help="power-law exponent of id frequencies")] = 1.05,
    seed: Annotated[int, typer.Option("--seed", help="random seed")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="print dataset.json instead of a summary")] = False,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="replace the data set in a non-empty --out")] = False,
    file_format: Annotated[str | None, typer.Option(
        "--format", help="parquet, csv or tsv (default: the recipe's data.format, else the "
                         "extension of its data.train glob)")] = None,
) -> None:
    """Write synthetic CTR data (labels from a hidden ground-truth model) as Parquet, CSV or TSV."""
    from embtrain.data.gen import generate
    from embtrain.data.gen_plan import GenConfig, GenPlan
    from embtrain.data.presets import preset_plan, preset_recipe
    from embtrain.recipe.loader import load_recipe, recipe_fingerprint

    if (recipe is None) == (preset is None):
        raise UserInputError("gen-data: give exactly one of --recipe or --preset")
    if out.exists() and not out.is_dir():
        raise UserInputError(f"{out}: --out is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserInputError(
            f"{out}: exists and is not empty; choose another --out, or pass --overwrite to "
            "replace the data set there"
        )
    if recipe is not None:
        loaded = load_recipe(recipe)
        source = {"recipe": loaded.name or recipe.stem, "fingerprint": recipe_fingerprint(loaded)}
        plan: GenPlan | None = None
    else:
        assert preset is not None
        loaded = preset_recipe(preset, str(out))
        source = {"preset": preset}
        plan = preset_plan(preset, loaded)
    fmt = _output_format(file_format, loaded)
    from embtrain.data.publish import locked, publish, sweep, temporary

    with locked(out):  # one writer per --out; the data set appears whole or not at all
        if out.is_dir() and any(out.iterdir()) and not overwrite:
            raise UserInputError(f"{out}: exists and is not empty; choose another --out, or "
                                 "pass --overwrite to replace the data set there")
        sweep(out)
        tmp = temporary(out)
        try:
            result = generate(loaded, tmp, GenConfig(rows, eval_rows, files, alpha, seed),
                              source, plan)
            if loaded.data.labels is not None:  # the further labels, derived from the click
                from embtrain.data.labels_gen import add_labels

                add_labels([str(tmp / p) for p in (*result.train_files, *result.eval_files)],
                           loaded, seed)
            if fmt != "parquet":
                from embtrain.data.textwrite import as_text

                result = as_text(result, loaded, fmt)
            publish(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if json_out:
        typer.echo((out / "dataset.json").read_text(encoding="utf-8").rstrip())
        return
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    written = [str(out / p) for p in result.train_files]
    patterns = loaded.data.train if isinstance(loaded.data.train, list) else [loaded.data.train]
    if recipe is not None and written and not any(
            fnmatch.fnmatch(os.path.normpath(written[0]), os.path.normpath(p)) for p in patterns):
        typer.echo(f"note: the recipe's data.train ({', '.join(patterns)}) does not match "
                   f"{written[0]}", err=True)
    typer.echo(f"wrote {result.rows} train rows in {len(result.train_files)} files and "
               f"{result.eval_rows} eval rows in {len(result.eval_files)} files to {out} "
               f"({result.seconds:.1f} s)")
    typer.echo(f"click rate {result.ctr_train:.3f}; best achievable AUC {result.best_auc:.4f}, "
               f"log loss {result.best_logloss:.4f} (true probabilities on the eval split)")
    typer.echo(f"details: {out / 'dataset.json'}")


def _output_format(option: str | None, recipe: Recipe) -> str:
    """``--format``, else what the recipe's reader would take its files for."""
    from embtrain.data.sources import file_format

    if option is not None:
        if option not in ("parquet", "csv", "tsv"):
            raise UserInputError(f"gen-data: --format {option}: give parquet, csv or tsv")
        return option
    data = recipe.data
    first = data.train if isinstance(data.train, str) else data.train[0]
    return file_format(first, data.format)
