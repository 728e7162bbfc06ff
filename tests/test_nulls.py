"""Categorical nulls (``null: error | skip | {id: VALUE}``) and the hints of id errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embtrain.data import BatchReader, hash_strings
from embtrain.errors import DataError, RecipeError
from embtrain.recipe.loader import parse_recipe_text, recipe_fingerprint
from embtrain.recipe.models import Recipe

RECIPE = """
version: 1
data: {{train: d/*.parquet, label: y, batch_size: 4, prefetch: 0, shuffle: {{enabled: false}}}}
features:
  - {{kind: categorical, name: f, column: c, table: t{extra}}}
tables:
  - {{name: t, dim: 4, rows: 10}}
optimizer: {{sparse: {{type: sgd, lr: 0.1}}, dense: {{type: sgd, lr: 0.1}}}}
model: {{type: mlp, hidden: [4]}}
train: {{epochs: 1}}
"""


def recipe(extra: str = "") -> Recipe:
    return parse_recipe_text(RECIPE.format(extra=extra), "r.yaml")


def read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str, columns: dict) -> list:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir(exist_ok=True)
    y = pa.array([0, 1, 0, 1][:len(next(iter(columns.values())))], pa.int8())
    pq.write_table(pa.table({**columns, "y": y}), tmp_path / "d" / "p.parquet")
    return list(BatchReader(recipe(extra), "train"))


def bags(batch, name: str = "f") -> list[list[int]]:
    s = batch.sparse[name]
    return [s.keys[s.offsets[i]:s.offsets[i + 1]].tolist() for i in range(batch.size)]


def weights(batch, name: str = "f") -> list[float]:
    return batch.sparse[name].weights.tolist()


# ------------------------------------------------------------------------------ the recipe


def test_null_rules_parse_and_the_default_keeps_old_fingerprints() -> None:
    assert recipe().categorical_features[0].null == "error"
    assert recipe(", null: skip").categorical_features[0].null == "skip"
    assert recipe(", null: {id: 3}").categorical_features[0].null.id == 3
    assert recipe(", ids: string, null: {id: none}").categorical_features[0].null.id == "none"
    # the default rule is not written out: recipes from before the field keep their fingerprint
    assert "null" not in recipe().model_dump(mode="json")["features"][0]
    assert recipe_fingerprint(recipe()) == recipe_fingerprint(recipe(", null: error"))
    assert recipe_fingerprint(recipe()) != recipe_fingerprint(recipe(", null: skip"))


@pytest.mark.parametrize("extra,line", [
    (", null: {id: x}", "r.yaml:5:62: features[0].null.id: id 'x' must be an integer (ids: int)"),
    (", ids: string, null: {id: 3}",
     "r.yaml:5:75: features[0].null.id: id 3 must be a string (ids: string)"),
    (", null: {id: 10}",
     "r.yaml:5:62: features[0].null.id: id 10 is outside table 't' rows [0, 10) "
     "(or set out_of_range: modulo)"),
])
def test_bad_null_id_is_one_located_line(extra: str, line: str) -> None:
    with pytest.raises(RecipeError) as info:
        recipe(extra)
    assert info.value.lines == [line]


def test_null_id_outside_rows_is_fine_with_modulo() -> None:
    assert recipe(", out_of_range: modulo, null: {id: 12}").categorical_features[0].null.id == 12


# ------------------------------------------------------------------------- one-hot columns


def test_one_hot_skip_gives_an_empty_bag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [batch] = read(tmp_path, monkeypatch, ", null: skip", {"c": pa.array([1, None, 3, None])})
    assert bags(batch) == [[1], [], [3], []]


def test_one_hot_skip_without_nulls_reads_every_id(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    [batch] = read(tmp_path, monkeypatch, ", null: skip", {"c": pa.array([1, 2, 3, 4])})
    assert bags(batch) == [[1], [2], [3], [4]]


def test_one_hot_id_fills_the_null(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [batch] = read(tmp_path, monkeypatch, ", null: {id: 0}",
                   {"c": pa.array([1, None, 3, None], pa.int32())})
    assert bags(batch) == [[1], [0], [3], [0]]


def test_string_ids_id_rule_hashes_the_value(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    [batch] = read(tmp_path, monkeypatch, ", ids: string, out_of_range: modulo, null: {id: none}",
                   {"c": pa.array(["a", None, "none", "b"])})
    expect = (hash_strings(["a", "none", "none", "b"]) % 10).tolist()
    assert bags(batch) == [[k] for k in expect]


def test_weights_of_skipped_ids_are_dropped_and_filled_ids_weigh_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cols = {"c": pa.array([1, None, 3, None]), "w": pa.array([0.5, None, 2.0, 7.0])}
    [batch] = read(tmp_path, monkeypatch, ", weights: w, null: skip", cols)
    assert bags(batch) == [[1], [], [3], []]
    assert weights(batch) == [0.5, 2.0]
    [batch] = read(tmp_path, monkeypatch, ", weights: w, null: {id: 9}", cols)
    assert bags(batch) == [[1], [9], [3], [9]]
    assert weights(batch) == [0.5, 1.0, 2.0, 1.0]


# ---------------------------------------------------------------------------- list columns


LISTS = pa.array([[1, None, 2], None, [None], [4]], pa.list_(pa.int64()))
LIST_WEIGHTS = pa.array([[0.5, 9.0, 2.0], None, [None], [3.0]], pa.list_(pa.float32()))


def test_list_skip_drops_null_elements_and_null_lists(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    [batch] = read(tmp_path, monkeypatch, ", hotness: variable, weights: w, null: skip",
                   {"c": LISTS, "w": LIST_WEIGHTS})
    assert bags(batch) == [[1, 2], [], [], [4]]
    assert weights(batch) == [0.5, 2.0, 3.0]


def test_list_id_fills_null_elements_and_null_lists(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    [batch] = read(tmp_path, monkeypatch, ", hotness: 3, combiner: concat, weights: w, null: {id: 7}",
                   {"c": LISTS, "w": LIST_WEIGHTS})
    assert bags(batch) == [[1, 7, 2], [7], [7], [4]]
    assert weights(batch) == [0.5, 1.0, 2.0, 1.0, 1.0, 3.0]


def test_one_hot_list_column_with_skip_reads_an_empty_list_as_no_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [batch] = read(tmp_path, monkeypatch, ", null: skip",
                   {"c": pa.array([[1], [], None, [4]], pa.list_(pa.int64()))})
    assert bags(batch) == [[1], [], [], [4]]


# ------------------------------------------------------------------------- the exact lines


@pytest.mark.parametrize("extra,column,line", [
    ("", pa.array([1, None, 3, 4]),
     "d/p.parquet: column 'c' (feature 'f'): null id at row 1; set null: skip or "
     "null: {id: VALUE} on the feature to read it"),
    (", hotness: variable", pa.array([[1], None, [3], [4]]),
     "d/p.parquet: column 'c' (feature 'f'): null list at row 1; set null: skip or "
     "null: {id: VALUE} on the feature to read it"),
    (", hotness: variable", pa.array([[1], [2], [3, None], [4]]),
     "d/p.parquet: column 'c' (feature 'f'): null list element at row 2; set null: skip or "
     "null: {id: VALUE} on the feature to read it"),
    ("", pa.array([1, 2, 30, 4]),
     "d/p.parquet: column 'c' (feature 'f'): id 30 outside table 't' rows [0, 10); set "
     "out_of_range: modulo on the feature or give the table a dynamic block"),
    (", ids: string", pa.array(["a", "b", "c", "d"]),
     f"d/p.parquet: column 'c' (feature 'f'): id 'a' (hashed to {int(hash_strings(['a'])[0])}) "
     "outside table 't' rows [0, 10); set out_of_range: modulo on the feature or give the "
     "table a dynamic block"),
    ("", pa.array([[1], [2], [3, 5, 6], [4]]),
     "d/p.parquet: column 'c' (feature 'f'): row 2 has 3 ids, hotness 1 needs exactly one; "
     "set hotness: variable for a list of ids"),
    ("", pa.array([[1], [], [3], [4]], pa.list_(pa.int64())),
     "d/p.parquet: column 'c' (feature 'f'): row 1 has 0 ids, hotness 1 needs exactly one; "
     "set null: skip to read an empty list as no id"),
    (", null: {id: 300}, out_of_range: modulo", pa.array([1, None, 3, 4], pa.int8()),
     "d/p.parquet: column 'c' (feature 'f'): null: id 300 does not fit the column's type int8"),
])
def test_id_errors_are_one_exact_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      extra: str, column: pa.Array, line: str) -> None:
    with pytest.raises(DataError) as info:
        read(tmp_path, monkeypatch, extra, {"c": column})
    assert str(info.value) == line


# ----------------------------------------------------------------------------- training


TRAIN = """
version: 1
name: nulls
data: {{train: {data}/train.parquet, eval: {data}/eval.parquet, label: y, batch_size: 256}}
features:
  - {{kind: dense, name: x, columns: [x]}}
  - {{kind: categorical, name: a, column: a, table: ta, null: skip}}
  - {{kind: categorical, name: b, column: b, table: tb, null: {{id: 0}}}}
  - {{kind: categorical, name: s, column: s, table: ts, ids: string, null: {{id: ""}}}}
  - {{kind: categorical, name: l, column: l, table: tb, hotness: variable, null: skip}}
tables:
  - {{name: ta, dim: 8, rows: 100}}
  - {{name: tb, dim: 8, rows: 50}}
  - {{name: ts, dim: 8, dynamic: {{capacity: 1000}}}}
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adam, lr: 0.02}}}}
model: {{type: mlp, hidden: [16]}}
train: {{steps: 60, eval_at_end: true, log_every: 10, seed: 3}}
"""


def _null_heavy(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 20, n)
    b = rng.integers(0, 10, n)
    s = rng.integers(0, 300, n)
    logit = np.where(a % 2, 2.0, -2.0) + np.where(b % 2, 1.5, -1.5)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int8)
    null = lambda: rng.random(n) < 0.6  # noqa: E731
    lists = [None if rng.random() < 0.2 else
             [None if rng.random() < 0.3 else int(v) for v in rng.integers(0, 50, rng.integers(0, 4))]
             for _ in range(n)]
    return pa.table({
        "x": pa.array(rng.normal(size=n).astype(np.float32)),
        "a": pa.array(a, mask=null()), "b": pa.array(b, mask=null()),
        "s": pa.array([f"k{v}" for v in s], mask=null()),
        "l": pa.array(lists, pa.list_(pa.int64())), "y": pa.array(y)})


def test_a_null_heavy_dataset_trains_with_skip_and_id(cli, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(_null_heavy(8192, 1), data / "train.parquet")
    pq.write_table(_null_heavy(2048, 2), data / "eval.parquet")
    path = tmp_path / "nulls.yaml"
    path.write_text(TRAIN.format(data=data))
    res = cli("run", str(path), "--run-dir", str(tmp_path / "run"), "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 60
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert evals and 0.7 < evals[-1]["auc"] <= 1  # it learned from the ids that are there


# --------------------------------------------------------------------------- validate --data


PLANTED = """
version: 1
data: {train: d/train/*.parquet, eval: d/eval/*.csv, label: y, batch_size: 4}
features:
  - {kind: dense, name: x, columns: [x, gone]}
  - {kind: categorical, name: a, column: a, table: t}
  - {kind: categorical, name: b, column: b, table: t}
  - {kind: categorical, name: c, column: c, table: t}
  - {kind: categorical, name: s, column: s, table: t, ids: string}
  - {kind: categorical, name: w, column: w, table: t, hotness: 2}
tables:
  - {name: t, dim: 4, rows: 10}
optimizer: {sparse: {type: sgd, lr: 0.1}, dense: {type: sgd, lr: 0.1}}
model: {type: mlp, hidden: [4]}
train: {steps: 1}
"""


def test_validate_data_finds_every_planted_mistake_in_one_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from embtrain.cli.validate import validate

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d" / "train").mkdir(parents=True)
    (tmp_path / "d" / "eval").mkdir()
    pq.write_table(pa.table({
        "x": pa.array([1.0, float("nan"), 2.0]),
        "a": pa.array([1, None, 2]),                      # a null id without a null rule
        "b": pa.array([[1], [2, 3], [4]]),                # several ids with hotness 1
        "c": pa.array([1.5, 2.5, 3.5]),                   # floats for integer ids
        "s": pa.array(["p", "q", "r"]),                   # strings outside a static table
        "w": pa.array([[1, 2, 3], [1], [2]]),             # more ids than hotness 2
        "y": pa.array([0, 2, 1]),                         # a label outside [0, 1]
    }), tmp_path / "d" / "train" / "p.parquet")
    (tmp_path / "d" / "eval" / "e.csv").write_text("x,gone,a,b,c,s,w,y\n1,1,1,1,1,p,,0\n")
    path = tmp_path / "r.yaml"
    path.write_text(PLANTED)
    with pytest.raises(RecipeError) as info:
        validate([path], quiet=True, data=True)
    h = int(hash_strings(["p"])[0])
    assert info.value.lines == [
        "d/train/p.parquet: column 'gone' (feature 'x') is missing (file has 7 columns: "
        "'x', 'a', 'b', 'c', 's', 'w', 'y')",
        "d/train/p.parquet: column 'c' (feature 'c'): type double, expected an integer column "
        "or a list of integers (ids: int, hotness: 1)",
        "d/train/p.parquet: column 'x' (feature 'x'): NaN at row 1 and the feature has no "
        "fill_null",
        "d/train/p.parquet: column 'y' (label): value 2 at row 1 is outside [0, 1] (a label is "
        "a click 0/1 or a probability)",
        "d/train/p.parquet: column 'a' (feature 'a'): null id at row 1; set null: skip or "
        "null: {id: VALUE} on the feature to read it",
        "d/train/p.parquet: column 'b' (feature 'b'): row 1 has 2 ids, hotness 1 needs exactly "
        "one; set hotness: variable for a list of ids",
        f"d/train/p.parquet: column 's' (feature 's'): id 'p' (hashed to {h}) outside table 't' "
        "rows [0, 10); set out_of_range: modulo on the feature or give the table a dynamic block",
        "d/train/p.parquet: column 'w' (feature 'w'): row 0 has 3 ids, more than hotness 2",
        "d/eval/e.csv: column 'w' (feature 'w'): type int64, expected a list of integers "
        "(ids: int, hotness: 2)",
        f"d/eval/e.csv: column 's' (feature 's'): id 'p' (hashed to {h}) outside table 't' "
        "rows [0, 10); set out_of_range: modulo on the feature or give the table a dynamic block",
    ]
