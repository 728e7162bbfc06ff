"""``embtrain schema``: write the recipe language's JSON Schema, or (``--markdown``) its
reference page docs/RECIPE.md."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from embtrain.recipe.models import Recipe
from embtrain.recipe.reference import recipe_reference_markdown

DEFAULT_PATH = Path("schemas/recipe.schema.json")
MARKDOWN_PATH = Path("docs/RECIPE.md")


def recipe_json_schema() -> str:
    """The JSON Schema of a recipe, as stable text (sorted keys, trailing newline)."""
    schema = Recipe.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "embtrain recipe"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def schema(
    out: Path | None = typer.Option(
        None, "--out", "-o",
        help=f"where to write; '-' prints it [default: {DEFAULT_PATH}, or {MARKDOWN_PATH} "
             "with --markdown]"),
    markdown: bool = typer.Option(
        False, "--markdown", help="write the recipe reference in Markdown instead"),
) -> None:
    """Write the JSON Schema of the recipe language (for editors and CI), or with --markdown
    its reference page (docs/RECIPE.md)."""
    text = recipe_reference_markdown() if markdown else recipe_json_schema()
    if out is None:
        out = MARKDOWN_PATH if markdown else DEFAULT_PATH
    if str(out) == "-":
        typer.echo(text, nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {out}")
