"""`embtrain run` end to end: it learns, it is deterministic, bad data stops it with exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embtrain.train.metrics_log import read_metrics

REPO = Path(__file__).resolve().parents[1]

SMALL = """
version: 1
name: small
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 512}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: tags, column: tags, table: tag, hotness: variable, combiner: mean}}
tables:
  - {{name: user, dim: 8, rows: 500}}
  - {{name: tag, dim: 8, rows: 200}}
optimizer: {{sparse: {{type: adagrad, lr: 0.2}}, dense: {{type: adam, lr: 0.003}}}}
model: {{type: dlrm, bottom: [16, 8], top: [16, 1]}}
train: {{steps: 40, eval_every: 20, log_every: 10, seed: 1}}
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory, ) -> tuple[Path, Path]:
    """A small recipe and its generated data (in a temporary directory)."""
    from tests.support.cli import run_cli

    root = tmp_path_factory.mktemp("small")
    recipe = root / "small.yaml"
    recipe.write_text(SMALL.format(data=root / "data"))
    res = run_cli("gen-data", "--recipe", str(recipe), "--out", str(root / "data"), "--rows", "20000",
                  "--eval-rows", "5000", "--files", "2")
    assert res.returncode == 0, res.stderr
    return root, recipe


def values(run_dir: Path) -> list[dict]:
    """Metrics records without wall-clock fields."""
    out = []
    for rec in read_metrics(run_dir):
        out.append({k: v for k, v in rec.items() if k not in ("samples_per_s", "seconds")})
    return out


def test_run_writes_a_complete_run_directory_and_is_deterministic(cli, small) -> None:
    root, recipe = small
    a, b = root / "run-a", root / "run-b"
    for run_dir in (a, b):
        res = cli("run", str(recipe), "--run-dir", str(run_dir))
        assert res.returncode == 0, res.stderr
        assert "eval AUC" in res.stdout
    for name in ("recipe.yaml", "plan.json", "metrics.jsonl", "summary.json"):
        assert (a / name).is_file(), name
    assert list((a / "tensorboard").glob("events.out.tfevents.*"))
    records = values(a)
    assert records == values(b), "the same recipe run twice must give identical metrics"
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [20, 40]
    # 20 steps of a DLRM are too few to promise better than chance; 40 are not (the initial
    # weights' draw decides the first: 0.39 at step 20 with the NumPy-drawn ones, 0.57 at 40)
    assert all(0 < r["auc"] <= 1 and r["rows"] == 5000 for r in evals)
    assert evals[-1]["auc"] > 0.5
    summary = json.loads((a / "summary.json").read_text())
    assert summary["steps"] == 40
    assert json.loads((a / "plan.json").read_text())["fingerprint"]


def test_seed_and_max_steps_overrides(cli, small) -> None:
    root, recipe = small
    res = cli("run", str(recipe), "--run-dir", str(root / "run-seed"), "--seed", "7", "--max-steps", "5",
              "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["steps"] == 5
    first = next(r for r in values(root / "run-seed") if r["kind"] == "start")
    assert first["seed"] == 7
    again = cli("run", str(recipe), "--run-dir", str(root / "run-seed"))
    assert again.returncode == 2 and "not empty" in again.stderr


def copy_with_bad_file(root: Path, name: str, change) -> Path:
    """A copy of the small data set whose first train file was rewritten by ``change``."""
    data = root / name
    shutil.copytree(root / "data", data)
    first = sorted((data / "train").glob("*.parquet"))[0]
    table = pq.read_table(first)
    pq.write_table(change(table), first)
    return first


def test_id_out_of_range_stops_with_exit_2_naming_everything(cli, small) -> None:
    root, _recipe = small

    def change(table: pa.Table) -> pa.Table:
        ids = table.column("user_id").to_numpy().copy()
        ids[3] = 123456
        return table.set_column(table.schema.get_field_index("user_id"), "user_id", pa.array(ids))

    bad_file = copy_with_bad_file(root, "data-oor", change)
    bad = root / "oor.yaml"
    bad.write_text(SMALL.format(data=root / "data-oor"))
    res = cli("run", str(bad), "--run-dir", str(root / "run-oor"))
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip()
    assert "\n" not in line
    for part in (str(bad_file.name), "user_id", "user", "123456"):
        assert part in line, (part, line)


def test_nan_in_dense_column_is_reported_unless_filled(cli, small) -> None:
    root, _ = small

    def change(table: pa.Table) -> pa.Table:
        col = table.column("I2").to_numpy().astype(np.float32).copy()
        col[5] = np.nan
        return table.set_column(table.schema.get_field_index("I2"), "I2", pa.array(col))

    bad_file = copy_with_bad_file(root, "data-nan", change)
    bad = root / "nan.yaml"
    bad.write_text(SMALL.format(data=root / "data-nan"))
    res = cli("run", str(bad), "--run-dir", str(root / "run-nan"))
    assert res.returncode == 2
    assert bad_file.name in res.stderr and "I2" in res.stderr
    filled = root / "nan-filled.yaml"
    filled.write_text(SMALL.format(data=root / "data-nan").replace(
        "transform: signed_log1p}", "transform: signed_log1p, fill_null: 0.0}"))
    ok = cli("run", str(filled), "--run-dir", str(root / "run-nan-filled"), "--max-steps", "3")
    assert ok.returncode == 0, ok.stderr


def test_tiered_recipe_runs_as_documented(cli, tmp_path: Path) -> None:
    """recipes/tiered.yaml as its header says: gen-data, mkdir the disk tier's directory, run."""
    res = cli("gen-data", "--recipe", str(REPO / "recipes" / "tiered.yaml"), "--out",
              "data/tiered", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    missing = cli("run", str(REPO / "recipes" / "tiered.yaml"), "--run-dir", "r0", cwd=tmp_path)
    assert missing.returncode == 2 and "tables[1].storage[2].path: runs/tiered-store does not " \
        "exist" in missing.stderr, missing.stderr
    assert not (tmp_path / "r0").exists(), "nothing is written for a run that cannot start"
    (tmp_path / "runs" / "tiered-store").mkdir(parents=True)
    run = cli("run", str(REPO / "recipes" / "tiered.yaml"), "--run-dir", "r", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    item = [r["tiers"] for r in records if r.get("kind") == "train"][-1]["item"]
    assert item["evictions"] > 0 and 0 < item["hit_rate"] < 1
    assert (tmp_path / "runs" / "tiered-store" / "item.tier").is_file()


@pytest.mark.slow
def test_quickstart_reaches_the_best_achievable_auc(cli, tmp_path: Path) -> None:
    data = tmp_path / "data" / "quickstart"
    res = cli("gen-data", "--recipe", str(REPO / "recipes/quickstart.yaml"), "--out", str(data),
              "--rows", "800000")
    assert res.returncode == 0, res.stderr
    run = cli("run", str(REPO / "recipes/quickstart.yaml"), "--run-dir", str(tmp_path / "run"), "--json",
              cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    auc, best = summary["evals"][-1]["auc"], summary["best_auc"]
    assert best is not None and best - auc <= 0.02, (auc, best)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["criteo_dlrm.yaml", "criteo_dcn_v2.yaml"])
def test_criteo_models_beat_auc_070(cli, tmp_path_factory, recipe: str) -> None:
    root = tmp_path_factory.getbasetemp() / "criteo"
    if not (root / "data" / "criteo" / "dataset.json").exists():
        res = cli("gen-data", "--preset", "criteo", "--out", str(root / "data" / "criteo"))
        assert res.returncode == 0, res.stderr
    run_dir = root / f"run-{recipe}"
    run = cli("run", str(REPO / "recipes" / recipe), "--run-dir", str(run_dir), cwd=root)
    assert run.returncode == 0, run.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["evals"][-1]["auc"] > 0.70, summary["evals"]
