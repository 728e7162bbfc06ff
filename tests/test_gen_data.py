"""``embtrain gen-data``: deterministic synthetic Parquet data with a learnable ground truth."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embtrain.cli.main import main
from embtrain.data import BatchReader
from embtrain.data.columns import read_spec
from embtrain.data.gen import generate
from embtrain.data.gen_ids import ENCODINGS, encode_ids, logical_ids
from embtrain.data.gen_plan import GenConfig
from embtrain.data.gen_sampling import power_law, stage_universe
from embtrain.data.presets import (
    CRITEO_CATEGORICAL,
    CRITEO_DENSE,
    MULTIHOT_LISTS,
    SPARSE_COLUMNS,
    SPARSE_STAGES,
    SPARSE_TABLES,
    preset_columns,
    preset_plan,
    preset_recipe,
    preset_recipe_yaml,
)
from embtrain.metrics import auc
from embtrain.recipe.loader import parse_recipe_text
from embtrain.recipe.models import Recipe

RECIPE = """
version: 1
data: {train: out/train/*.parquet, eval: out/eval/*.parquet, label: y, batch_size: 128}
features:
  - {kind: dense, name: counts, columns: [a, b], transform: log1p, fill_null: 0}
  - {kind: dense, name: signed, columns: [s], transform: signed_log1p}
  - {kind: categorical, name: user, column: user, table: user}
  - {kind: categorical, name: tags, column: tags, table: tag, hotness: 4, weights: tag_w}
  - {kind: categorical, name: hist, column: hist, table: item, hotness: variable}
  - {kind: categorical, name: item, column: item, table: item}
  - {kind: categorical, name: city, column: city, table: city, ids: string}
  - {kind: categorical, name: dyn, column: dyn, table: dyn}
tables:
  - {name: user, dim: 4, rows: 1000}
  - {name: tag, dim: 4, rows: 30}
  - {name: item, dim: 4, rows: 5000}
  - {name: city, dim: 4, dynamic: {capacity: 500}}
  - {name: dyn, dim: 4, dynamic: {capacity: 2000}}
optimizer: {sparse: {type: sgd, lr: 0.1}, dense: {type: sgd, lr: 0.1}}
model: {type: mlp, hidden: [8]}
train: {epochs: 1}
"""


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return parse_recipe_text(RECIPE, "gen.yaml")


@pytest.fixture(scope="module")
def generated(recipe: Recipe, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gen")
    generate(recipe, root / "out", GenConfig(rows=3000, eval_rows=1000, files=2, seed=5))
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_arguments_give_identical_bytes(recipe: Recipe, generated: Path, tmp_path: Path) -> None:
    generate(recipe, tmp_path / "out", GenConfig(rows=3000, eval_rows=1000, files=2, seed=5))
    first, second = _files(generated / "out"), _files(tmp_path / "out")
    assert sorted(first) == ["dataset.json", "eval/part-00000.parquet", "eval/part-00001.parquet",
                             "train/part-00000.parquet", "train/part-00001.parquet"]
    assert first == second
    generate(recipe, tmp_path / "other", GenConfig(rows=3000, eval_rows=1000, files=2, seed=6))
    assert _files(tmp_path / "other")["train/part-00000.parquet"] != first["train/part-00000.parquet"]


def test_columns_are_exactly_what_the_recipe_reads(recipe: Recipe, generated: Path) -> None:
    table = pq.read_table(generated / "out/train/part-00000.parquet")
    assert set(table.column_names) == set(read_spec(recipe).columns)
    types = {f.name: f.type for f in table.schema}
    assert types["user"] == pa.int64() and types["city"] == pa.string()
    assert types["tags"] == pa.list_(pa.int64()) and types["tag_w"] == pa.list_(pa.float32())
    assert types["a"] == pa.int64() and types["s"] == pa.float32() and types["y"] == pa.int8()
    info = json.loads((generated / "out/dataset.json").read_text())
    assert info["columns"]["tags"] == "list<int>" and info["columns"]["city"] == "string"
    assert info["rows"] == {"train": 3000, "eval": 1000} and info["seed"] == 5


def test_values_follow_the_recipe(generated: Path) -> None:
    t = pa.concat_tables([pq.read_table(p) for p in sorted((generated / "out/train").glob("*"))])
    assert t.num_rows == 3000
    # nulls only where the feature has a fill_null
    assert 0.02 < t.column("a").null_count / 3000 < 0.09
    assert t.column("s").null_count == 0
    assert (np.asarray(t.column("a").drop_null()) >= 0).all()
    assert (np.asarray(t.column("s")) < 0).any()
    # list lengths: hotness 4 -> 1..4, variable -> 1..20; weights shaped like ids
    tags = t.column("tags").combine_chunks()
    lengths = np.diff(np.asarray(tags.offsets))
    assert lengths.min() == 1 and lengths.max() == 4
    np.testing.assert_array_equal(np.asarray(t.column("tag_w").combine_chunks().offsets),
                                  np.asarray(tags.offsets))
    hist = np.diff(np.asarray(t.column("hist").combine_chunks().offsets))
    assert hist.min() == 1 and 15 <= hist.max() <= 20
    # ids within the static tables, power law: id 0 is the most frequent
    user = np.asarray(t.column("user"))
    assert user.min() >= 0 and user.max() < 1000
    counts = np.bincount(user, minlength=1000)
    assert counts[0] == counts.max() and counts[0] > counts[50]
    # string ids and scrambled dynamic ids
    assert all(re.fullmatch(r"v\d+", s) for s in t.column("city").to_pylist()[:100])
    dyn = np.asarray(t.column("dyn"))
    assert (dyn < 0).any() and (dyn > 2**40).any()
    labels = np.asarray(t.column("y"))
    assert set(np.unique(labels)) <= {0, 1} and 0.15 < labels.mean() < 0.35


def test_reader_reads_generated_data(recipe: Recipe, generated: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(generated)
    modulo = recipe.model_copy(update={"features": [
        f.model_copy(update={"out_of_range": "modulo"}) if f.name == "city" else f
        for f in recipe.features]})
    batches = list(BatchReader(modulo, "train"))
    assert len(batches) == 3000 // 128 and batches[0].dense.shape == (128, 3)
    assert sum(b.size for b in BatchReader(modulo, "eval")) == 1000


def test_power_law_frequencies() -> None:
    rng = np.random.default_rng(0)
    for n in (50, 3_000_000):  # exact CDF, and exact head with an approximate tail
        k = power_law(rng, 400_000, n, 1.05)
        assert k.min() >= 0 and k.max() < n
        counts = np.bincount(k[k < 4], minlength=4)
        np.testing.assert_allclose(counts[0] / counts[1], 2**1.05, rtol=0.03)
        np.testing.assert_allclose(counts[1] / counts[3], 2**1.05, rtol=0.05)
    tail = power_law(rng, 400_000, 3_000_000, 1.05)
    assert (tail > 1 << 20).mean() > 0.02


def test_exact_auc_matches_pairwise_definition() -> None:
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 6, 300).astype(float)  # many ties
    labels = rng.random(300) < 0.4
    pos, neg = scores[labels], scores[~labels]
    brute = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum())
    assert auc(labels, scores) == pytest.approx(brute / (pos.size * neg.size))


def test_presets_are_valid_recipes_with_documented_columns() -> None:
    for name in ("criteo", "criteo-multihot"):
        recipe = preset_recipe(name)
        assert recipe.data.train == f"data/{name}/train/*.parquet"
        assert recipe.dense_features[0].columns == list(CRITEO_DENSE)
        assert recipe.dense_features[0].fill_null == 0.0
        tables = {t.name: t.rows for t in recipe.tables}
        assert all(tables[c.lower()] == rows for c, rows in CRITEO_CATEGORICAL)
        assert "CRITEO" not in preset_recipe_yaml(name)
    assert len(CRITEO_CATEGORICAL) == 26
    assert set(preset_columns("criteo-multihot")) - set(preset_columns("criteo")) == {
        c for c, _, _ in MULTIHOT_LISTS}


def test_cli_preset_prints_best_auc_and_reads_back(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "criteo"
    code = main(["gen-data", "--preset", "criteo-multihot", "--out", str(out), "--rows", "20000",
                 "--eval-rows", "20000", "--files", "2"])
    assert code == 0, capsys.readouterr().err
    assert "best achievable AUC" in capsys.readouterr().out
    info = json.loads((out / "dataset.json").read_text())
    assert 0.7 < info["best_auc"] < 0.9
    assert 0.3 < info["best_logloss"] < 0.6
    assert info["source"] == {"preset": "criteo-multihot"}
    assert info["columns"] == preset_columns("criteo-multihot")
    reader = BatchReader(preset_recipe("criteo-multihot", str(out)), "eval")
    batch = next(iter(reader))
    assert batch.dense.shape == (8192, 13) and set(batch.sparse) >= {"C1", "C26", "M1", "M3"}


def test_cli_needs_exactly_one_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in ([], ["--preset", "criteo", "--recipe", "x.yaml"]):
        assert main(["gen-data", "--out", str(tmp_path), *args]) == 2
        assert capsys.readouterr().err.strip() == "gen-data: give exactly one of --recipe or --preset"
    assert main(["gen-data", "--out", str(tmp_path), "--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err


def test_cli_with_recipe_writes_where_the_recipe_reads(cli, tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(RECIPE)
    res = cli("gen-data", "--recipe", "r.yaml", "--out", "out", "--rows", "500", "--eval-rows",
              "100", "--files", "1", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["source"]["recipe"] == "r" and len(info["source"]["fingerprint"]) == 16
    assert info["files"]["train"] == ["train/part-00000.parquet"]
    assert "note" not in res.stderr


# ------------------------------------------------------------------- sparse-ids preset

SPARSE_ARGS = ["--rows", "6000", "--eval-rows", "2000", "--files", "3", "--seed", "3"]
UNIVERSE = {t: u for t, u, _ in SPARSE_TABLES}
ENCODING = {t: e for t, _, e in SPARSE_TABLES}


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sparse")
    for name in ("sparse-ids", "sparse-ids-dense"):
        assert main(["gen-data", "--preset", name, "--out", str(root / name), *SPARSE_ARGS]) == 0
    return root


def _split(root: Path, split: str) -> list[pa.Table]:
    return [pq.read_table(p) for p in sorted((root / split).glob("part-*.parquet"))]


def _flat(column: pa.ChunkedArray) -> np.ndarray:
    arr = column.combine_chunks()
    return np.asarray(arr.values if pa.types.is_list(arr.type) else arr)


def test_sparse_ids_are_sparse_int64(sparse: Path) -> None:
    t = pa.concat_tables(_split(sparse / "sparse-ids", "train"))
    assert t.num_rows == 6000
    assert t.schema.field("item_history").type == pa.list_(pa.int64())
    for column, table, _ in SPARSE_COLUMNS:
        ids = _flat(t.column(column))
        assert ids.dtype == np.int64
        assert (np.abs(ids[ids != np.iinfo(np.int64).min]) > 2**32).mean() > 0.99
        if ENCODING[table] == "uint63":  # database-like: non-negative 63-bit ids
            assert ids.min() >= 0 and ids.max() > 2**62
        else:  # hashed crosses: all of int64
            assert 0.3 < (ids < 0).mean() < 0.7
    info = json.loads((sparse / "sparse-ids/dataset.json").read_text())
    assert info["source"] == {"preset": "sparse-ids"}
    assert info["columns"] == preset_columns("sparse-ids")
    assert info["ids"]["ad_id"] == {"table": "ad", "encoding": "int64",
                                    "universe": UNIVERSE["ad"], "stages": SPARSE_STAGES}
    assert 0.7 < info["best_auc"] < 0.9  # labels depend on the ids: something to learn


def test_sparse_ids_are_deterministic(sparse: Path, tmp_path: Path) -> None:
    assert main(["gen-data", "--preset", "sparse-ids", "--out", str(tmp_path / "a"),
                 *SPARSE_ARGS]) == 0
    assert _files(tmp_path / "a") == _files(sparse / "sparse-ids")
    other = [*SPARSE_ARGS[:-1], "4"]
    assert main(["gen-data", "--preset", "sparse-ids", "--out", str(tmp_path / "b"), *other]) == 0
    assert (_files(tmp_path / "b")["train/part-00000.parquet"]
            != _files(sparse / "sparse-ids")["train/part-00000.parquet"])


def test_sparse_ids_new_ids_appear_over_time(sparse: Path) -> None:
    sparse_parts = _split(sparse / "sparse-ids", "train")
    dense_parts = _split(sparse / "sparse-ids-dense", "train")
    for column, table, _ in SPARSE_COLUMNS:
        first = _flat(dense_parts[0].column(column))
        # file 0 holds the first third of the rows: stages 0..2 of 8
        assert first.max() < stage_universe(UNIVERSE[table], SPARSE_STAGES, 2)
        last = _flat(dense_parts[-1].column(column))
        assert last.max() >= stage_universe(UNIVERSE[table], SPARSE_STAGES, 5)
        seen = set(_flat(sparse_parts[0].column(column)).tolist())
        for part in sparse_parts[1:]:  # every later file brings ids never seen before
            ids = set(_flat(part.column(column)).tolist())
            assert len(ids - seen) > 0.2 * len(ids)
            seen |= ids


def test_sparse_ids_dense_twin_is_the_same_data_remapped(sparse: Path) -> None:
    pairs: dict[str, dict[int, int]] = {t: {} for t in UNIVERSE}
    for split in ("train", "eval"):
        s_parts = _split(sparse / "sparse-ids", split)
        d_parts = _split(sparse / "sparse-ids-dense", split)
        assert len(s_parts) == len(d_parts) == 3
        for a, b in zip(s_parts, d_parts, strict=True):
            assert a.schema == b.schema and a.num_rows == b.num_rows
            for name in ("I1", "I2", "I3", "I4", "label"):
                assert a.column(name).equals(b.column(name))
            for column, table, _ in SPARSE_COLUMNS:
                ca, cb = a.column(column).combine_chunks(), b.column(column).combine_chunks()
                if pa.types.is_list(ca.type):  # the same list lengths
                    np.testing.assert_array_equal(np.asarray(ca.offsets), np.asarray(cb.offsets))
                s_ids, d_ids = _flat(a.column(column)), _flat(b.column(column))
                assert d_ids.min() >= 0 and d_ids.max() < UNIVERSE[table]
                np.testing.assert_array_equal(logical_ids(s_ids, table, ENCODING[table]), d_ids)
                pairs[table].update(zip(s_ids.tolist(), d_ids.tolist(), strict=True))
    for table, mapping in pairs.items():  # one map per table over files, splits, columns
        assert len(set(mapping.values())) == len(mapping)
        keys = np.fromiter(mapping, np.int64)
        values = np.fromiter(mapping.values(), np.int64)
        np.testing.assert_array_equal(encode_ids(values, table, ENCODING[table]), keys)


def test_sparse_presets_recipes() -> None:
    dynamic, static = preset_recipe("sparse-ids"), preset_recipe("sparse-ids-dense")
    assert {t.name: t.dynamic.capacity for t in dynamic.tables if t.dynamic} == UNIVERSE
    assert {t.name: t.rows for t in static.tables} == UNIVERSE
    assert dynamic.features == static.features
    assert preset_plan("sparse-ids", dynamic).interactions == preset_plan(
        "sparse-ids-dense", static).interactions
    assert "sparse_ids_dense" in preset_recipe_yaml("sparse-ids-dense")
    assert set(preset_columns("sparse-ids")) == {"I1", "I2", "I3", "I4", "label",
                                                 *(c for c, _, _ in SPARSE_COLUMNS)}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50),
       st.sampled_from(["user", "ad", "x"]))
def test_encodings_are_bijections(values: list[int], table: str) -> None:
    ids = np.array(values, dtype=np.int64)
    for encoding in ENCODINGS:
        v = ids if encoding != "uint63" else ids & np.int64(2**63 - 1)
        np.testing.assert_array_equal(encode_ids(logical_ids(v, table, encoding), table,
                                                 encoding), v)
        np.testing.assert_array_equal(logical_ids(encode_ids(v, table, encoding), table,
                                                  encoding), v)
