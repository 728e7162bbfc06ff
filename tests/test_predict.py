"""`embtrain predict`: the run's checkpoint scores Parquet rows as evaluation does.

Predicting a run's eval split reproduces the run's last evaluation (AUC and logloss to 1e-6)
at 1 and 2 ranks, for static, dynamic and tiered tables; the output has one row per input row,
in input order, with the --keep columns; bad input is one line and exit 2.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.support.cli import run_cli
from tests.support.serving import ALL_KINDS, TIERED, eval_glob, make_run_from


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("predict")
    return {"all": make_run_from(root, "all", ALL_KINDS)}


@pytest.fixture(scope="module")
def tiered_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run_from(tmp_path_factory.mktemp("predict-tiered"), "tiered", TIERED)


def _evals(run: Path) -> dict[int, dict]:
    summary = json.loads((run / "summary.json").read_text())
    return {int(e["step"]): e for e in summary["evals"]}


def _predict(run: Path, out: Path, *extra: str) -> dict:
    result = run_cli("predict", str(run), "--data", eval_glob(run), "--out", str(out), "--json",
                     *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _metrics_of(out: Path, run: Path) -> tuple[float, float]:
    """AUC and logloss of the written probabilities against the input's labels, in order."""
    from embtrain.metrics import auc, logloss

    files = sorted(Path(p) for p in glob.glob(eval_glob(run)))
    labels = np.concatenate([pq.read_table(f, columns=["label"])["label"].to_numpy()
                             for f in files])
    probs = pq.read_table(out)["probability"].to_numpy()
    assert probs.shape == labels.shape
    return auc(labels, probs), logloss(labels, probs)


def _check_reproduces(run: Path, out: Path, summary: dict, step: int | None = None) -> None:
    evals = _evals(run)
    want = evals[max(evals) if step is None else step]
    got_auc, got_logloss = _metrics_of(out, run)
    assert abs(got_auc - want["auc"]) <= 1e-6, (got_auc, want)
    assert abs(got_logloss - want["logloss"]) <= 1e-6, (got_logloss, want)
    assert summary["rows"] == want["rows"]
    assert abs(summary["auc"] - want["auc"]) <= 1e-6
    table = pq.read_table(out)
    assert table.schema.field("probability").type == "float"
    assert table.schema.field("logit").type == "float"
    p = table["probability"].to_numpy()
    logit = table["logit"].to_numpy()
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-logit.astype(np.float64))), atol=1e-6)


def test_predict_reproduces_the_last_eval_static_and_dynamic(runs, tmp_path: Path):
    run = runs["all"]
    out = tmp_path / "pred.parquet"
    summary = _predict(run, out, "--keep", "user_id,city")
    _check_reproduces(run, out, summary)
    assert summary["step"] == 8
    # one row per input row, in input order: the kept columns equal the input's
    files = sorted(glob.glob(eval_glob(run)))
    table = pq.read_table(out)
    assert table.column_names == ["user_id", "city", "probability", "logit"]
    for col in ("user_id", "city"):
        want = np.concatenate([pq.read_table(f, columns=[col])[col].to_numpy() for f in files])
        assert (table[col].to_numpy() == want).all()
    assert not list(tmp_path.glob(".*tmp*")), "no temporary file left behind"


def test_predict_two_ranks_reproduce_the_eval_and_one_rank(runs, tmp_path: Path):
    run = runs["all"]
    one, two = tmp_path / "one.parquet", tmp_path / "two.parquet"
    _predict(run, one)
    summary = _predict(run, two, "--np", "2", "--keep", "item_id")
    _check_reproduces(run, two, summary)
    a, b = pq.read_table(one), pq.read_table(two)
    assert b.column_names == ["item_id", "probability", "logit"]
    np.testing.assert_allclose(a["probability"].to_numpy(), b["probability"].to_numpy(),
                               atol=1e-6)


def test_predict_unlabelled_rows_with_a_request_id(runs, tmp_path: Path):
    """Rows without the label column (and with a request id) score as the labelled ones."""
    import pyarrow as pa

    run = runs["all"]
    labelled = tmp_path / "labelled.parquet"
    _predict(run, labelled)
    files = sorted(glob.glob(eval_glob(run)))
    (tmp_path / "in").mkdir()
    start = 0
    for i, f in enumerate(files):
        table = pq.read_table(f).drop_columns(["label"])
        ids = pa.array([f"req-{start + j}" for j in range(table.num_rows)])
        pq.write_table(table.append_column("request_id", ids), tmp_path / "in" / f"{i}.parquet")
        start += table.num_rows
    out = tmp_path / "unlabelled.parquet"
    result = run_cli("predict", str(run), "--data", str(tmp_path / "in" / "*.parquet"), "--out",
                     str(out), "--keep", "request_id", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["auc"] is None and summary["logloss"] is None
    got, want = pq.read_table(out), pq.read_table(labelled)
    assert got["request_id"].to_pylist() == [f"req-{j}" for j in range(start)]
    np.testing.assert_array_equal(got["probability"].to_numpy(), want["probability"].to_numpy())


def test_predict_chosen_checkpoint(runs, tmp_path: Path):
    run = runs["all"]
    out = tmp_path / "pred4.parquet"
    summary = _predict(run, out, "--checkpoint", "4")
    assert summary["step"] == 4
    _check_reproduces(run, out, summary, step=4)


def test_predict_tiered_table_reads_through_its_tiers(tiered_run: Path, tmp_path: Path):
    store = Path(str(tiered_run).replace("run-tiered", "store-tiered"))
    before = {p.name: p.stat().st_mtime_ns for p in store.iterdir()}
    out = tmp_path / "pred.parquet"
    summary = _predict(tiered_run, out)
    _check_reproduces(tiered_run, out, summary)
    # the run's own tier files are left alone; the scoring tiers are removed afterwards
    assert {p.name: p.stat().st_mtime_ns for p in store.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".embtrain-predict")]


def _one_line_error(result: tuple[int, str], *parts: str) -> None:
    code, err = result
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for part in parts:
        assert part in lines[0], (part, lines[0])


def test_predict_bad_input_is_one_line_exit_2(runs, tmp_path: Path, capsys):
    from embtrain.cli.main import main

    def cli(*args: str) -> tuple[int, str]:  # in this process: the checks come before any rank
        capsys.readouterr()
        code = main(["predict", *args])
        return code, capsys.readouterr().err

    run = runs["all"]
    data = eval_glob(run)
    out = str(tmp_path / "p.parquet")
    _one_line_error(cli(str(tmp_path / "nope"), "--data", data, "--out", out),
                    "nope", "no such run directory")
    _one_line_error(cli(str(tmp_path), "--data", data, "--out", out), "not a run directory")
    _one_line_error(cli(str(run), "--data", data, "--out", out, "--checkpoint", "5"),
                    "no checkpoint at step 5", "4, 8")
    _one_line_error(cli(str(run), "--data", str(tmp_path / "*.parquet"), "--out", out),
                    "--data", "no file matches")
    _one_line_error(cli(str(run), "--data", data, "--out", out, "--keep", "request_id"),
                    "--keep column 'request_id' is missing")
    (tmp_path / "exists.parquet").write_bytes(b"x")
    _one_line_error(cli(str(run), "--data", data, "--out", str(tmp_path / "exists.parquet")),
                    "already exists")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    _one_line_error(cli(str(run), "--data", str(bad), "--out", out), str(bad))
    assert not (tmp_path / "p.parquet").exists()
    # the same through the real command line: one line, exit 2
    result = run_cli("predict", str(run), "--data", data, "--out", out, "--checkpoint", "5")
    _one_line_error((result.returncode, result.stderr), "no checkpoint at step 5")
