"""CSV and TSV input: the same rows as text and as Parquet give the same batches and losses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embtrain.data import BatchReader
from embtrain.data.fingerprint import describe_change, split_fingerprint
from embtrain.data.gen import GenConfig, generate
from embtrain.data.textwrite import as_text, write_text
from embtrain.errors import DataError, RecipeError
from embtrain.recipe.loader import load_recipe, parse_recipe_text
from embtrain.recipe.models import Recipe

REPO = Path(__file__).resolve().parents[1]

RECIPE = """
version: 1
data:
  train: {data}/train/*.{ext}
  eval: {data}/eval/*.{ext}
  batch_size: 96
  shuffle: {{window_batches: 3}}
  last_batch: keep{more}
features:
  - {{kind: dense, name: counts, columns: [n1, n2], transform: log1p, fill_null: 0}}
  - {{kind: dense, name: real, columns: [r1], transform: none}}
  - {{kind: categorical, name: u, column: u, table: t, weights: uw}}
  - {{kind: categorical, name: s, column: s, table: t, ids: string, out_of_range: modulo}}
tables:
  - {{name: t, dim: 4, rows: 500}}
optimizer: {{sparse: {{type: sgd, lr: 0.1}}, dense: {{type: sgd, lr: 0.1}}}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: 10, seed: 5}}
"""


def recipe(data: Path, ext: str, more: str = "") -> Recipe:
    return parse_recipe_text(RECIPE.format(data=data, ext=ext, more=more), "r.yaml")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The same generated rows as Parquet, as TSV without a header and as CSV with one."""
    root = tmp_path_factory.mktemp("text")
    config = GenConfig(rows=1000, eval_rows=300, files=3, seed=2)
    out = {}
    for fmt in ("parquet", "tsv", "csv"):
        base = recipe(root / fmt, fmt)
        result = generate(base, root / fmt, config)
        if fmt != "parquet":
            layout = base
            if fmt == "tsv":  # no header: data.columns lists every column in file order
                layout = recipe(root / fmt, fmt, _COLUMNS)
            as_text(result, layout, fmt)
        out[fmt] = root / fmt
    return out["parquet"], out["tsv"], out["csv"]


_COLUMNS = "\n  columns: {label: int, n1: int, n2: int, r1: float, u: int, uw: float, s: string}"


def batches(r: Recipe, split: str, rank: int, world: int, start: int) -> list:
    return list(BatchReader(r, split, rank, world, start_batch=start))


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b, strict=True):
        assert x.size == y.size and x.global_rows == y.global_rows
        assert np.array_equal(x.dense, y.dense) and np.array_equal(x.label, y.label)
        assert x.dense.dtype == y.dense.dtype == np.float32
        for k in x.sparse:
            p, q = x.sparse[k], y.sparse[k]
            assert np.array_equal(p.keys, q.keys) and np.array_equal(p.offsets, q.offsets)
            assert (p.weights is None) == (q.weights is None)
            if p.weights is not None:
                assert np.array_equal(p.weights, q.weights)


@pytest.mark.parametrize("split,rank,world,start", [
    ("train", 0, 1, 0), ("train", 1, 2, 0), ("train", 0, 3, 4), ("eval", 1, 2, 1)])
def test_text_and_parquet_give_the_same_batches(datasets, split: str, rank: int, world: int,
                                                start: int) -> None:
    parquet, tsv, csv = datasets
    want = batches(recipe(parquet, "parquet"), split, rank, world, start)
    for r in (recipe(csv, "csv"), recipe(tsv, "tsv", _COLUMNS)):
        assert_same(batches(r, split, rank, world, start), want)


def _with_empty_lines(src: Path, dst: Path, seed: int, crlf: bool = False) -> Path:
    """A copy of ``src``'s text files with empty lines here and there (runs of them, and at
    the end of every file; with ``crlf`` every line ends in \\r\\n)."""
    import shutil

    rng = np.random.default_rng(seed)
    shutil.copytree(src, dst)
    for path in sorted(dst.rglob("*.?sv")):
        lines = path.read_text().splitlines()
        header = 1 if path.suffix == ".csv" else 0
        out = lines[:header]
        for line in lines[header:]:
            out += [""] * int(rng.choice([0, 0, 0, 1, 3])) + [line]
        end = "\r\n" if crlf else "\n"
        path.write_bytes((end.join(out) + end * 3).encode())
    return dst


@pytest.mark.parametrize("shards,rank,world,start", [(1, 0, 1, 0), (4, 0, 1, 0), (4, 1, 2, 3),
                                                     (1, 0, 3, 4)])
def test_empty_lines_in_text_files_give_the_rows_of_parquet(datasets, tmp_path: Path,
                                                            shards: int, rank: int, world: int,
                                                            start: int) -> None:
    """pyarrow skips empty lines: the row counts, shards and resume positions do too."""
    parquet, tsv, csv = datasets
    more = f"\n  shards: {shards}"
    blank_csv = _with_empty_lines(csv, tmp_path / "csv", 1)
    blank_tsv = _with_empty_lines(tsv, tmp_path / "tsv", 2, crlf=True)
    assert "\n\n\n" in (blank_csv / "train" / "part-00001.csv").read_text()
    for split in ("train", "eval"):
        at = start if split == "train" else 0
        want = batches(recipe(parquet, "parquet", more), split, rank, world, at)
        for r in (recipe(blank_csv, "csv", more), recipe(blank_tsv, "tsv", _COLUMNS + more)):
            assert BatchReader(r, split).total_rows == (1000 if split == "train" else 300)
            assert_same(batches(r, split, rank, world, at), want)


def test_text_with_empty_lines_trains_like_parquet(datasets, tmp_path: Path) -> None:
    """One epoch in four shards: the same steps and losses, bit for bit."""
    from embtrain import api

    parquet, _, csv = datasets
    blank = _with_empty_lines(csv, tmp_path / "csv", 3)
    runs = []
    for data, ext in ((parquet, "parquet"), (blank, "csv")):
        text = RECIPE.format(data=data, ext=ext, more="\n  shards: 4").replace(
            "train: {steps: 10, seed: 5}", "train: {epochs: 1, log_every: 2, eval_every: 100, seed: 5}")
        summary = api.run(parse_recipe_text(text), tmp_path / f"run-{ext}")
        records = [{k: v for k, v in json.loads(line).items() if k not in ("samples_per_s", "seconds")}
                   for line in (tmp_path / f"run-{ext}" / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["kind"] in ("train", "eval")]
        runs.append((summary.steps, summary.final_loss, records))
        # predict reads what run reads: text files too, with their columns kept
        api.predict(tmp_path / f"run-{ext}", str(data / "eval" / f"*.{ext}"),
                    tmp_path / f"{ext}.parquet", keep=["s", "u"])
    assert runs[0][0] == 11  # 1000 rows, batches of 96, the last one kept
    assert runs[1] == runs[0]
    scored = [pq.read_table(tmp_path / f"{ext}.parquet") for ext in ("parquet", "csv")]
    assert scored[0].num_rows == 300
    assert scored[1].column("s").equals(scored[0].column("s"))
    assert scored[1].column("u").to_pylist() == scored[0].column("u").to_pylist()
    assert scored[1].column("probability").equals(scored[0].column("probability"))


def test_a_tsv_written_by_pyarrow_reads_like_parquet(datasets, tmp_path: Path) -> None:
    """pyarrow.csv.write_csv quotes the header names and every string: both are read."""
    import pyarrow.csv as pacsv

    parquet, _, _ = datasets
    for split in ("train", "eval"):
        (tmp_path / split).mkdir()
        for path in sorted((parquet / split).glob("*.parquet")):
            pacsv.write_csv(pq.read_table(path), tmp_path / split / f"{path.stem}.tsv",
                            pacsv.WriteOptions(delimiter="\t"))
    text = (tmp_path / "train" / "part-00000.tsv").read_text()
    assert text.startswith('"n1"\t') and '\t"v' in text
    for split, start in (("train", 0), ("train", 3), ("eval", 0)):
        assert_same(batches(recipe(tmp_path, "tsv"), split, 0, 1, start),
                    batches(recipe(parquet, "parquet"), split, 0, 1, start))


def test_missing_columns_are_one_line_with_the_files_header(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from embtrain.data.check import check_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.tsv").write_text("I1\tI2\tlabel\n1\t2\t0\n")
    r = parse_recipe_text(RECIPE.format(data="d", ext="tsv", more="").replace(
        "{data}/eval/*.{ext}".format(data="d", ext="tsv"), "d/a.tsv").replace(
        "d/train/*.tsv", "d/a.tsv"), "r.yaml")
    with pytest.raises(DataError) as info:
        BatchReader(r, "train")
    want = ("d/a.tsv: 5 columns are missing: 'n1' (feature 'counts'), 'n2' (feature 'counts'), "
            "'r1' (feature 'real'), 'u' (feature 'u'), 's' (feature 's') "
            "(file has 3 columns: 'I1', 'I2', 'label')")
    assert str(info.value) == want
    assert check_data(r) == [want]  # validate --data: the same one line


def test_text_files_hold_what_the_recipe_says(datasets) -> None:
    _, tsv, csv = datasets
    first = (tsv / "train" / "part-00000.tsv").read_text().splitlines()[0].split("\t")
    assert len(first) == 7 and first[6].startswith("v")  # no header: the first row is data
    assert (csv / "train" / "part-00000.csv").read_text().splitlines()[0].split(",")[0] == "n1"
    info = json.loads((tsv / "dataset.json").read_text())
    assert info["files"]["train"] == [f"train/part-0000{i}.tsv" for i in range(3)]
    assert info["format"]["kind"] == "tsv" and info["format"]["header"] is False
    assert not list(tsv.rglob("*.parquet"))
    assert BatchReader(recipe(csv, "csv"), "train").total_rows == 1000


def test_empty_fields_are_nulls_and_text_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    x = np.array([0.1, 1 / 3, -2.5e-38, 3.4e38, 7.0], np.float32)
    table = pa.table({"x": pa.array(x), "c": pa.array([1, None, 3, 4, 5]),
                      "s": pa.array(["NA", "", None, "x", "null"]),
                      "label": pa.array([0, 1, 0, 1, 1], pa.int8())})
    write_text(table, tmp_path / "d" / "a.csv", "csv", header=True)
    text = (tmp_path / "d" / "a.csv").read_text().splitlines()
    assert text[2] == ",,,1" or text[2].endswith(",,,1")  # a null is an empty field
    r = parse_recipe_text("""
version: 1
data: {train: d/*.csv, batch_size: 5, shuffle: {enabled: false}}
features:
  - {kind: dense, name: x, columns: [x]}
  - {kind: categorical, name: c, column: c, table: t, null: skip}
  - {kind: categorical, name: s, column: s, table: t, ids: string, out_of_range: modulo, null: {id: none}}
tables: [{name: t, dim: 4, rows: 10}]
optimizer: {sparse: {type: sgd, lr: 0.1}, dense: {type: sgd, lr: 0.1}}
model: {type: mlp, hidden: [4]}
train: {steps: 1}
""")
    [batch] = list(BatchReader(r, "train"))
    assert np.array_equal(batch.dense[:, 0], x)  # float32 values survive the text exactly
    assert batch.sparse["c"].offsets.tolist() == [0, 1, 1, 2, 3, 4]
    from embtrain.data import hash_strings
    # "NA" and "null" are strings; the empty field (and the null written as one) is a null
    assert batch.sparse["s"].keys.tolist() == (hash_strings(["NA", "none", "none", "x", "null"])
                                               % 10).tolist()


# ------------------------------------------------------------------------------- errors


_ONE = """
version: 1
data: {{train: d/*, batch_size: 2, shuffle: {{enabled: false}}{more}}}
features:
  - {{kind: dense, name: x, columns: [x]}}
  - {{kind: categorical, name: c, column: c, table: t}}
tables: [{{name: t, dim: 4, rows: 10}}]
optimizer: {{sparse: {{type: sgd, lr: 0.1}}, dense: {{type: sgd, lr: 0.1}}}}
model: {{type: mlp, hidden: [4]}}
train: {{steps: 1}}
"""


def _one(tmp_path: Path, name: str, text: str, more: str = "") -> str:
    (tmp_path / "d").mkdir(exist_ok=True)
    (tmp_path / "d" / name).write_text(text)
    r = parse_recipe_text(_ONE.format(more=more))
    with pytest.raises(DataError) as info:
        list(BatchReader(r, "train"))
    return str(info.value)


def test_text_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _one(tmp_path, "a.csv", "x,label\n1,0\n") == (
        "d/a.csv: column 'c' (feature 'c') is missing (file has 2 columns: 'x', 'label')")
    assert _one(tmp_path, "a.csv", "x,c,label\n1,2,0\n1,zz,1\n") == (
        "d/a.csv: column 'c': value 'zz' at row 1 is not an integer")
    assert _one(tmp_path, "a.csv", "x,c,label\n1,2,0\n1,2,1,4\n") == (
        "d/a.csv: row 1 has 4 fields, expected 3 (one per column of the header)")
    assert _one(tmp_path, "a.csv", "") == (
        "d/a.csv: empty file: no header row (set data.header: false and data.columns for files "
        "without one)")
    (tmp_path / "d" / "a.csv").unlink()
    line = _one(tmp_path, "day_0", "0\t1\t2\n")
    assert line.startswith("d/day_0: not a readable Parquet file: ")
    assert line.endswith(" (for CSV or TSV files set data.format: csv or tsv)")
    (tmp_path / "d" / "b.tsv").write_text("0\t1\t2\n")
    assert _one(tmp_path, "c.parquet", "") == (
        "data.train: files of two formats (d/c.parquet is parquet, d/b.tsv is tsv); "
        "set data.format or narrow the glob")


def test_text_faults_name_their_row_and_column(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    rows = "".join(f"{i % 3},{i % 7},{i % 2}\n" for i in range(40))
    # a ragged row far from the start is named at its own row (rows 0-39, then 40, 41)
    assert _one(tmp_path, "a.csv", "x,c,label\n" + rows + "1,2,0\n\n5,6\n") == (
        "d/a.csv: row 41 has 2 fields, expected 3 (one per column of the header)")
    # a byte-order mark is not part of the first column's name
    (tmp_path / "d" / "a.csv").write_text("\ufeffx,c,label\n" + rows, encoding="utf-8")
    r = parse_recipe_text(_ONE.format(more=""))
    assert BatchReader(r, "train").total_rows == 40 and len(list(BatchReader(r, "train"))) == 20
    # a column named twice: one line (a reader would silently take one of them)
    assert _one(tmp_path, "a.csv", "x,c,x,label\n1,2,3,0\n") == (
        "d/a.csv: column 'x' appears 2 times in the file (columns 1, 3); rename all but one")
    (tmp_path / "d" / "a.csv").unlink()
    pq.write_table(pa.Table.from_arrays([pa.array([1.0]), pa.array([1]), pa.array([2.0]),
                                         pa.array([0])], names=["x", "c", "x", "label"]),
                   tmp_path / "d" / "a.parquet")
    with pytest.raises(DataError) as info:
        BatchReader(parse_recipe_text(_ONE.format(more="")), "train")
    assert str(info.value) == ("d/a.parquet: column 'x' appears 2 times in the file (columns 1, "
                               "3); rename all but one")
    (tmp_path / "d" / "a.parquet").unlink()
    # a byte that is not UTF-8 in a string column: its row and column
    (tmp_path / "d" / "a.csv").write_bytes(b"x,c,label\n" + rows.encode().replace(b",", b",v", 1)
                                           + b"1,ok,0\n2,b\xffd,1\n")
    with pytest.raises(DataError) as info:
        list(BatchReader(parse_recipe_text(_ONE.format(more="").replace(
            "table: t}", "table: t, ids: string}")), "train"))
    assert str(info.value) == "d/a.csv: column 'c': row 41 is not UTF-8 text (b'b\\xffd')"


def test_header_false_needs_columns() -> None:
    with pytest.raises(RecipeError, match=r"header: false needs data\.columns"):
        parse_recipe_text(RECIPE.format(data="d", ext="tsv", more="\n  header: false"))
    with pytest.raises(RecipeError, match="tsv files have no list columns"):
        parse_recipe_text(RECIPE.format(data="d", ext="tsv",
                                        more="\n  format: tsv\n  columns: {u: list<int>}"))


def test_data_fingerprint_sees_a_changed_text_file(tmp_path: Path) -> None:
    (tmp_path / "a.tsv").write_text("1\t2\n3\t4\n")
    before = {"train": split_fingerprint(str(tmp_path / "*.tsv"), "data.train")}
    assert before["train"][0][2] == 2  # lines
    (tmp_path / "a.tsv").write_text("1\t2\n3\t5\n")
    after = {"train": split_fingerprint(str(tmp_path / "*.tsv"), "data.train")}
    assert describe_change(before, after) and describe_change(before, before) is None


# ----------------------------------------------------------------------------- training


def test_criteo_tsv_trains_to_the_same_losses_as_parquet(cli, tmp_path: Path) -> None:
    """recipes/criteo_tsv.yaml (smaller tables and batches) on gen-data's TSV and Parquet."""
    text = (REPO / "recipes" / "criteo_tsv.yaml").read_text()
    text = re.sub(r"rows: \d+", "rows: 200", text).replace("batch_size: 4096", "batch_size: 256")
    text = text.replace("train: {epochs: 1, eval_every: 1000, log_every: 100, seed: 0}",
                        "train: {steps: 12, eval_every: 6, log_every: 3, seed: 0}")
    text = text.replace("[256, 64, 16]", "[16]").replace("[256, 128, 1]", "[16, 1]")
    runs = {}
    for fmt in ("tsv", "parquet"):
        r = tmp_path / f"{fmt}.yaml"
        body = text.replace("data/criteo_tsv", str(tmp_path / fmt))
        if fmt == "parquet":
            body = body.replace("*.tsv", "*.parquet").replace("format: tsv", "format: parquet")
        r.write_text(body)
        if fmt == "tsv":  # gen-data writes the TSV (the recipe's data.format says so)
            res = cli("gen-data", "--recipe", str(r), "--out", str(tmp_path / fmt), "--rows",
                      "3000", "--eval-rows", "600", "--files", "2")
            assert res.returncode == 0, res.stderr
        else:  # the same rows as Parquet
            generate(load_recipe(r), tmp_path / fmt, GenConfig(rows=3000, eval_rows=600, files=2))
        res = cli("run", str(r), "--run-dir", str(tmp_path / f"run-{fmt}"))
        assert res.returncode == 0, res.stderr
        runs[fmt] = [{k: v for k, v in json.loads(line).items() if k not in ("samples_per_s", "seconds")}
                     for line in (tmp_path / f"run-{fmt}" / "metrics.jsonl").read_text().splitlines()
                     if json.loads(line)["kind"] in ("train", "eval")]
    assert list((tmp_path / "tsv" / "train").glob("*.tsv"))
    losses = [r["loss"] for r in runs["tsv"] if "loss" in r]
    assert len(losses) >= 4 and all(np.isfinite(losses))
    assert [r["step"] for r in runs["tsv"] if r["kind"] == "eval"] == [6, 12]
    assert runs["tsv"] == runs["parquet"]  # bit for bit: every loss, AUC and logloss


def test_a_row_longer_than_a_block_is_read(datasets, tmp_path: Path) -> None:
    """A 20 MB field (longer than the 4 MiB blocks a text file is first read in) used to stop
    the reader with pyarrow's "try to increase block size" and no setting to do it: the block
    grows until the row fits, and the rows read as the same rows in Parquet do."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from embtrain.data.sources import read_columns

    parquet, _, _ = datasets
    for split in ("train", "eval"):
        (tmp_path / "pq" / split).mkdir(parents=True)
        (tmp_path / "csv" / split).mkdir(parents=True)
        for path in sorted((parquet / split).glob("*.parquet")):
            t = pq.read_table(path)
            if split == "train" and path.name == "part-00001.parquet":
                s = t.column("s").to_pylist()
                s[37] = "v" * (20 << 20)  # one string id of 20 MB
                t = t.set_column(t.schema.get_field_index("s"), "s", pa.array(s))
            pq.write_table(t, tmp_path / "pq" / split / path.name)
            pacsv.write_csv(t, tmp_path / "csv" / split / f"{path.stem}.csv")
    for start in (0, 5):
        assert_same(batches(recipe(tmp_path / "csv", "csv"), "train", 0, 1, start),
                    batches(recipe(tmp_path / "pq", "parquet"), "train", 0, 1, start))
    r = recipe(tmp_path / "csv", "csv")
    got = read_columns(str(tmp_path / "csv" / "train" / "part-00001.csv"), r.data, ["s"])
    assert got.column("s")[37].as_py() == "v" * (20 << 20)  # predict --keep reads it too
