"""The recipe language: examples validate, errors are reported at once with positions."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from embtrain.cli.schema import recipe_json_schema
from embtrain.errors import RecipeError
from embtrain.recipe import load_recipe, parse_recipe_text, recipe_fingerprint
from embtrain.recipe.units import format_bytes, parse_bytes, parse_count

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))

GOOD = textwrap.dedent("""\
    version: 1
    data: {train: d/*.parquet, batch_size: 64}
    features:
      - {kind: dense, name: num, columns: [a, b]}
      - {kind: categorical, name: c, column: c, table: t}
      - {kind: categorical, name: c2, column: c2, table: t}
    tables:
      - {name: t, dim: 8, rows: 100}
    optimizer: {sparse: {type: adagrad, lr: 0.1}, dense: {type: adam, lr: 0.001}}
    model: {type: dlrm, bottom: [16, 8], top: [16, 1]}
    train: {steps: 10}
    """)


def errors_of(text: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        parse_recipe_text(text, "r.yaml")
    return info.value.lines


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_example_recipe_validates(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.name
    assert recipe.version == 1


def test_examples_cover_the_promised_kinds() -> None:
    recipes = [load_recipe(p) for p in RECIPES]
    models = {r.model.type for r in recipes}
    assert {"dlrm", "dcn_v2", "deepfm"} <= models
    assert any(t.dynamic for r in recipes for t in r.tables)
    assert any(len(t.storage) > 1 for r in recipes for t in r.tables)
    assert any(r.distributed.processes == 2 for r in recipes)


def test_good_recipe_parses_with_defaults() -> None:
    recipe = parse_recipe_text(GOOD)
    assert recipe.table("t").storage[0].tier == "device"
    assert [f.name for f in recipe.features_of("t")] == ["c", "c2"]
    assert recipe.optimizer.sparse.initial_accumulator_value == 0.1


def test_three_planted_mistakes_give_exactly_three_lines() -> None:
    text = GOOD.replace("batch_size: 64}", "batch_size: 64, bogus: 1}")
    text = text.replace("column: c2, table: t}", "column: c2, table: missing}")
    text = text.replace("dim: 8, rows", "dim: -8, rows")
    lines = errors_of(text)
    assert len(lines) == 3, lines
    assert lines[0].startswith("r.yaml:2:") and "data.bogus: unknown key" in lines[0]
    assert lines[1].startswith("r.yaml:6:") and "features[2].table: no table named 'missing'" in lines[1]
    assert lines[2].startswith("r.yaml:8:") and "tables[0].dim" in lines[2] and "greater than 0" in lines[2]


def test_malformed_yaml_is_one_line_with_position() -> None:
    lines = errors_of("version: 1\ndata: {train: [a\n  b: c\n")
    assert len(lines) == 1
    assert lines[0].startswith("r.yaml:3:") and "yaml:" in lines[0]


@pytest.mark.parametrize(("change", "expect"), [
    (("rows: 100}", "rows: 100, dynamic: {capacity: 10}}"), "tables[0].rows: a dynamic table has no 'rows'"),
    (("rows: 100}", "rows: 100, storage: [{tier: host, budget: 1GiB}, {tier: device}]}"),
     "tier 'device' after a slower tier"),
    (("rows: 100}", "rows: 100, storage: [{tier: host}, {tier: host}]}"), "tier 'host' appears twice"),
    (("rows: 100}", "rows: 100, storage: [{tier: device}, {tier: disk}]}"), "needs a budget"),
    (("rows: 100}", "rows: 100, storage: [{tier: host, budget: 1GiB}, "
                    "{tier: disk, path: /x, eviction: lfu}]}"), "eviction belongs to a tier above"),
    (("bottom: [16, 8]", "bottom: [16, 4]"), "the dot interaction needs them equal"),
    (("column: c2, table: t}", "column: c2, table: t, dim: 4}"), "shared tables have one dim"),
    (("column: c2, table: t}", "column: c2, table: t, combiner: concat, hotness: variable}"),
     "needs a fixed hotness"),
    (("steps: 10}", "steps: 10, epochs: 1}"), "exactly one of 'steps' or 'epochs'"),
    (("type: adagrad, lr: 0.1", "type: adagrad, lr: -1"), "optimizer.sparse.lr"),
    (("type: adam, lr: 0.001", "type: rmsprop, lr: 0.001"), "optimizer.dense"),
    (("name: c2, column", "name: c, column"), "duplicate name 'c'"),
    (("rows: 100}", "rows: 12Q}"), "cannot read '12Q' as a count"),
])
def test_cross_field_and_field_errors(change: tuple[str, str], expect: str) -> None:
    lines = errors_of(GOOD.replace(*change))
    assert any(expect in line for line in lines), lines
    assert all(line.startswith("r.yaml:") for line in lines)


def test_deepfm_needs_equal_widths() -> None:
    text = GOOD.replace("model: {type: dlrm, bottom: [16, 8], top: [16, 1]}", "model: {type: deepfm, deep: [8]}")
    text = text.replace("tables:\n", "tables:\n  - {name: u, dim: 4, rows: 10}\n").replace(
        "column: c2, table: t}", "column: c2, table: u}")
    assert any("DeepFM" in line for line in errors_of(text))


def test_newer_version_is_refused_and_duplicate_keys_reported() -> None:
    assert "newer than" in errors_of(GOOD.replace("version: 1", "version: 7"))[0]
    lines = errors_of(GOOD.replace("train: {steps: 10}", "train: {steps: 10}\ntrain: {steps: 5}"))
    assert any("train: duplicate key" in line for line in lines)


def test_units() -> None:
    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("1.5 MB") == 1_500_000
    assert parse_bytes(10) == 10
    assert parse_count("25M") == 25_000_000
    assert parse_count("10k") == 10_000
    assert format_bytes(4.2 * 2**30) == "4.2 GiB"
    with pytest.raises(ValueError):
        parse_bytes("2 parsecs")


def test_fingerprint_is_stable_and_sensitive() -> None:
    a, b = parse_recipe_text(GOOD), parse_recipe_text(GOOD)
    assert recipe_fingerprint(a) == recipe_fingerprint(b)
    c = parse_recipe_text(GOOD.replace("lr: 0.1", "lr: 0.2"))
    assert recipe_fingerprint(a) != recipe_fingerprint(c)


def test_recipe_is_frozen() -> None:
    recipe = parse_recipe_text(GOOD)
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError on frozen models
        recipe.train.steps = 5  # type: ignore[misc]


def test_checked_in_schema_is_current() -> None:
    checked_in = (REPO / "schemas" / "recipe.schema.json").read_text()
    assert checked_in == recipe_json_schema(), "run `embtrain schema` to regenerate schemas/"
    assert json.loads(checked_in)["title"] == "embtrain recipe"


def test_cli_validate_exit_codes(cli, tmp_path: Path) -> None:
    ok = cli("validate", *map(str, RECIPES))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("ok:") == len(RECIPES)
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("dim: 8", "dim: 0"))
    res = cli("validate", str(bad))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "tables[0].dim" in res.stderr
    missing = cli("validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read recipe" in missing.stderr


def test_plan_of_criteo_recipe_on_8_ranks_is_complete_and_stable(cli) -> None:
    args = ("plan", "recipes/criteo_dlrm.yaml", "--world-size", "8", "--device-memory", "none",
            "--host-memory", "4GiB", "--disk", "100GiB", "--json")
    first, second = cli(*args), cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    plan = json.loads(first.stdout)
    assert len(plan["tables"]) == 26
    assert {t["name"] for t in plan["tables"]} == {f"c{i}" for i in range(1, 27)}
    for rank in plan["ranks"]:
        used = rank["memory"]
        assert all(v <= 4 * 2**30 for v in used.values() if isinstance(v, int)), used


@pytest.mark.parametrize("stem,name", [("2024ctr", "_2024ctr"), ("my recipe", "my_recipe"),
                                       ("..", "recipe"), ("ctr-v2.1", "ctr-v2.1")])
def test_a_recipe_without_name_is_named_validly_after_its_file(tmp_path: Path, stem: str,
                                                               name: str) -> None:
    """Its saved copy (a run's recipe.yaml) then loads again, whatever the file's name."""
    from embtrain.recipe.loader import recipe_to_yaml

    text = (Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml").read_text()
    path = tmp_path / f"{stem}.yaml"
    path.write_text(text.replace("name: quickstart\n", ""))
    recipe = load_recipe(path)
    assert recipe.name == name
    saved = tmp_path / "saved.yaml"
    saved.write_text(recipe_to_yaml(recipe))
    assert load_recipe(saved) == recipe


def test_a_run_of_a_file_named_dots_stays_under_runs_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`...yaml` (stem `..`): run, resume and predict accept what run wrote, under runs/."""
    from embtrain import api
    from embtrain.data.gen import GenConfig, generate

    monkeypatch.chdir(tmp_path)
    text = (Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml").read_text()
    text = text.replace("name: quickstart\n", "").replace("data/quickstart", str(tmp_path / "d"))
    text = text.replace("batch_size: 2048", "batch_size: 64").replace(
        "epochs: 4\n  eval_every: 500\n  log_every: 250", "steps: 4\n  eval_every: 2\n  log_every: 2")
    path = tmp_path / "...yaml"
    path.write_text(text)
    generate(load_recipe(path), tmp_path / "d", GenConfig(rows=600, eval_rows=128, files=1))
    first = api.run(str(path), max_steps=2)
    run_dir = Path(first.run_dir)
    assert run_dir.parent == Path("runs") / "recipe" and run_dir.resolve().is_relative_to(
        tmp_path / "runs")
    assert api.resume(run_dir).steps == 4
    scored = api.predict(run_dir, str(tmp_path / "d" / "eval" / "*.parquet"), tmp_path / "p.parquet")
    assert scored.rows == 128
