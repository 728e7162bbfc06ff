"""A run whose every label is a regression (``loss: mse``) label reports each label's MSE and
no AUC: no "one class" note, no ``eval AUC`` line, no logloss, in the run's output,
``summary.json``, ``metrics.jsonl`` and ``predict --json``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embtrain.recipe.loader import parse_recipe_text

RECIPE = """
version: 1
name: dwell
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256{labels}}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
tables:
  - {{name: user, dim: 8, rows: 300}}
optimizer: {{sparse: {{type: adagrad, lr: 0.2}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: mlp, hidden: [16]}}
train: {{steps: 20, eval_every: 10, log_every: 10, seed: 1}}
"""


def test_mse_labels_only_report_their_mse_and_no_auc(cli, tmp_path: Path) -> None:
    from embtrain.data.gen import GenConfig, generate

    data = tmp_path / "data"
    generate(parse_recipe_text(RECIPE.format(data=data, labels="")), data,
             GenConfig(rows=2560, eval_rows=512, files=1, seed=2))
    rng = np.random.default_rng(0)
    for path in sorted(data.glob("*/*.parquet")):
        t = pq.read_table(path)
        i1 = t.column("I1").to_numpy(zero_copy_only=False).astype(np.float64)
        dwell = np.sign(i1) * np.log1p(np.abs(i1)) + rng.normal(0, 0.3, len(i1))
        pq.write_table(t.append_column("dwell", pa.array(dwell.astype(np.float32))), path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(data=data,
                                    labels=", labels: {dwell: {column: dwell, loss: mse}}"))
    res = cli("run", str(recipe), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    assert "one class" not in res.stdout + res.stderr and "AUC" not in res.stdout
    assert "logloss" not in res.stdout
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
             .splitlines() if json.loads(line)["kind"] == "eval"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for record in (*evals, summary["evals"][-1]):
        assert record["auc"] is None and record["auc_note"] is None and record["logloss"] is None
        assert set(record["labels"]) == {"dwell"} and record["labels"]["dwell"]["mse"] > 0
    mse = summary["evals"][-1]["labels"]["dwell"]["mse"]
    assert res.stdout.splitlines()[-1] == f"eval dwell: MSE {mse:.4f}"
    assert f"eval @ step 10: dwell MSE {evals[0]['labels']['dwell']['mse']:.4f}" in res.stdout

    res = cli("predict", str(tmp_path / "run"), "--data", str(data / "eval" / "*.parquet"),
              "--out", str(tmp_path / "scores.parquet"), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["auc"] is None and out["logloss"] is None
    assert set(out["labels"]) == {"dwell"}
    assert out["labels"]["dwell"]["mse"] == pytest.approx(mse, rel=1e-4)
