"""The recipe reference: every field of the recipe's models is described, and the checked-in
docs/RECIPE.md is what ``embtrain schema --markdown`` writes from them."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from embtrain.cli.schema import recipe_json_schema
from embtrain.recipe.base import Strict
from embtrain.recipe.reference import missing_descriptions, recipe_reference_markdown

REPO = Path(__file__).resolve().parents[1]
REGENERATE = "run `embtrain schema && embtrain schema --markdown` to regenerate"


def test_every_recipe_field_has_a_description() -> None:
    assert missing_descriptions() == [], "describe these fields: Field(description=...)"
    schema = json.loads(recipe_json_schema())
    bare = [f"{name}.{prop}"
            for name, model in [*schema["$defs"].items(), ("Recipe", schema)]
            for prop, spec in model.get("properties", {}).items()
            if not spec.get("description", "").strip()]
    assert bare == []


def test_a_field_without_description_is_found() -> None:
    class Example(Strict):
        described: int = Field(1, description="has one")
        bare: int = 2

    assert missing_descriptions([Example]) == ["Example.bare"]


def test_checked_in_recipe_reference_is_current() -> None:
    checked_in = (REPO / "docs" / "RECIPE.md").read_text(encoding="utf-8")
    assert checked_in == recipe_reference_markdown(), REGENERATE


def test_recipe_reference_has_a_section_per_model_and_every_field() -> None:
    text = recipe_reference_markdown()
    schema = json.loads(recipe_json_schema())
    for name, model in [*schema["$defs"].items(), ("Recipe", schema)]:
        head = f"\n## {name}\n"
        assert head in text, name
        section = text.split(head, 1)[1].split("\n## ", 1)[0]
        for prop, spec in model["properties"].items():
            row = next((line for line in section.splitlines()
                        if line.startswith(f"| `{prop}` |")), None)
            assert row is not None, f"{name}.{prop}"
            # allowed values appear in the row
            for value in spec.get("enum", []):
                assert f"`{value}`" in row, f"{name}.{prop}: {value}"
    # a default and a bound as validation has them
    assert "| `keep` | integer (> 0, ≤ 2^31 - 1) | `3` |" in text
    assert "| `scale` | number (> 0) | `0.05` |" in text


def test_schema_markdown_command_prints_the_reference(cli) -> None:
    res = cli("schema", "--markdown", "--out", "-")
    assert res.returncode == 0, res.stderr
    assert res.stdout == recipe_reference_markdown()
