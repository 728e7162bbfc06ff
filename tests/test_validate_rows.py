"""``validate --data`` says how many rows of each split's first file it checked, and checks
more (``--rows N``) or all (``--rows 0``) when told."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embtrain.errors import RecipeError

RECIPE = """
version: 1
name: rows
data: {train: d/train/*.parquet, batch_size: 64}
features:
  - {kind: dense, name: x, columns: [x]}
  - {kind: categorical, name: a, column: a, table: t}
tables:
  - {name: t, dim: 4, rows: 100}
optimizer: {sparse: {type: sgd, lr: 0.1}, dense: {type: sgd, lr: 0.1}}
model: {type: mlp, hidden: [8]}
train: {steps: 2, seed: 0}
"""


def test_validate_data_says_how_many_rows_it_checked_and_checks_more_when_told(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from embtrain.cli.validate import validate

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d" / "train").mkdir(parents=True)
    rng = np.random.default_rng(3)
    x = rng.normal(size=12_000)
    x[11_000] = np.nan  # past the first 10,000 rows
    pq.write_table(pa.table({"x": x, "a": rng.integers(0, 100, 12_000),
                             "label": rng.integers(0, 2, 12_000).astype(np.int8)}),
                   tmp_path / "d" / "train" / "p.parquet")
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    validate([path], quiet=False, data=True)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("data: data.train: checked the first 10,000 rows of d/train/p.parquet "
                       "(--rows 0: every row)")
    want = ["d/train/p.parquet: column 'x' (feature 'x'): NaN at row 11000 and the feature "
            "has no fill_null"]
    for rows in (0, 11_001):
        with pytest.raises(RecipeError) as info:
            validate([path], quiet=True, data=True, rows=rows)
        assert info.value.lines == want
    validate([path], quiet=False, data=True, rows=11_000)
    assert capsys.readouterr().out.splitlines()[-1].startswith(
        "data: data.train: checked the first 11,000 rows")
    x[11_000] = 0.5
    pq.write_table(pa.table({"x": x, "a": rng.integers(0, 100, 12_000),
                             "label": rng.integers(0, 2, 12_000).astype(np.int8)}),
                   tmp_path / "d" / "train" / "p.parquet")
    validate([path], quiet=False, data=True, rows=0)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "data: data.train: checked every row of d/train/p.parquet (12,000 rows)")
