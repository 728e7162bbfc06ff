"""Issue 29, items 12-21: errors are one line, with the right exit code, and JSON when asked.

Each test reproduces one item of the issue's "Errors" section on real files and a real
`embtrain` subprocess (several ranks through the real launcher where the item is about ranks).
docs/RELIABILITY.md lists these promises with their tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_reliability import TINY, one_line_error

# ------------------------------------------------- 18. counts and learning rates that lie


@pytest.mark.parametrize(("old", "new", "where", "why"), [
    ("rows: 100}", "rows: '1.0001K'}", "tables[0].rows", "not a whole count"),
    ("rows: 100}", "rows: 100.5}", "tables[0].rows", "not a whole count"),
    ("lr: 0.1}", "lr: 1e-320}", "optimizer.sparse.lr", "float32 range"),
    ("lr: 0.01}", "lr: 1.0e-39}", "optimizer.dense.lr", "float32 range"),
    ("lr: 0.1}", "lr: 0}", "optimizer.sparse.lr", "greater than 0"),
    ("lr: 0.1}", "lr: 1e39}", "optimizer.sparse.lr", "float32 range"),
])
def test_non_integral_rows_and_subnormal_lr_are_refused(tmp_path: Path, old: str, new: str,
                                                       where: str, why: str):
    from embtrain.errors import RecipeError
    from embtrain.recipe import parse_recipe_text

    text = TINY.format(data=tmp_path)
    assert old in text
    with pytest.raises(RecipeError) as info:
        parse_recipe_text(text.replace(old, new, 1), "r.yaml")
    assert len(info.value.lines) == 1, info.value.lines
    line = info.value.lines[0]
    assert line.startswith("r.yaml:") and f": {where}: " in line and why in line, line


def test_whole_counts_with_units_still_read(tmp_path: Path):
    from embtrain.recipe import parse_recipe_text

    text = TINY.format(data=tmp_path)
    recipe = parse_recipe_text(text.replace("rows: 100}", "rows: 1.5K}").replace(
        "lr: 0.1}", "lr: 1.0e-30}"))
    assert recipe.tables[0].rows == 1500 and recipe.optimizer.sparse.lr == 1e-30


# --------------------------------------------- 19. validate and plan refuse what run refuses


@pytest.mark.parametrize(("old", "new", "where"), [
    ("rows: 100}", "rows: 100, dtype: float16}", "tables[0].dtype"),
    ("rows: 100}", "rows: 100, dtype: bfloat16}", "tables[0].dtype"),
    ("seed: 1,", "seed: 1, mixed_precision: bf16,", "train.mixed_precision"),
])
def test_half_precision_is_refused_by_validate_like_run(tmp_path: Path, old: str, new: str,
                                                       where: str):
    from embtrain.errors import RecipeError
    from embtrain.recipe import parse_recipe_text

    text = TINY.format(data=tmp_path)
    assert old in text
    with pytest.raises(RecipeError) as info:
        parse_recipe_text(text.replace(old, new, 1), "r.yaml")
    assert len(info.value.lines) == 1, info.value.lines
    assert f": {where}: " in info.value.lines[0] and "not supported yet" in info.value.lines[0]


def test_validate_and_plan_refuse_a_half_precision_table(cli, tmp_path: Path):
    bad = tmp_path / "half.yaml"
    bad.write_text(TINY.format(data=tmp_path).replace("rows: 100}", "rows: 100, dtype: float16}"))
    for command in (("validate",), ("plan", "--device-memory", "none")):
        line = one_line_error(cli(*command, str(bad)), f"{bad}:", ": tables[0].dtype: ",
                              "float16 tables are not supported yet")
        assert line.split(":")[1].isdigit(), line


# ------------------------------------------------------------- 21. YAML nested very deep


def test_yaml_nested_100000_deep_is_one_line_with_position(cli, tmp_path: Path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("version: 1\nname: " + "[" * 100_000 + "]" * 100_000 + "\n")
    line = one_line_error(cli("validate", str(deep)), f"{deep}:2:", "nested deeper than")
    assert "RecursionError" not in line and "internal error" not in line
