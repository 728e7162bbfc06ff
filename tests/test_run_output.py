"""`embtrain run` as a long job sees it: progress in a log file, clean ``--json``, graceful stop.

The interrupted run is started once (module fixture) with stdout redirected to a file; the
test reads progress lines from that file while the run is going, then sends SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from embtrain.checkpoint import latest_checkpoint, load_checkpoint
from embtrain.train.metrics_log import read_metrics
from embtrain.train.signals import GracefulStop, StopNow
from tests.support.checkpoint_delay import delayed_env

RECIPE = """
version: 1
name: long
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: tags, column: tags, table: tag, hotness: variable, combiner: mean}}
tables:
  - {{name: user, dim: 8, rows: 500}}
  - {{name: tag, dim: 8, rows: 200}}
optimizer: {{sparse: {{type: adagrad, lr: 0.2}}, dense: {{type: adam, lr: 0.003}}}}
model: {{type: dlrm, bottom: [16, 8], top: [16, 1]}}
train:
  steps: 1500
  eval_every: 500
  eval_max_batches: 2
  log_every: 20
  checkpoint: {{every: 500, keep: 3}}
  seed: 4
"""

LINE = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) step (\d+)/(\d+)  loss (\d+\.\d{4})  "
    r"lr (\S+)/(\S+)  [\d,]+ samples/s"
)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **extra}


def _start(args: list[str], stdout: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with stdout.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "embtrain", *args],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=env or _env(),
        )


def _progress(path: Path) -> list[re.Match[str]]:
    return [m for m in map(LINE.match, path.read_text().splitlines()) if m]


def _wait_for(what: Any, proc: subprocess.Popen, timeout: float = 240) -> Any:
    """Poll ``what()`` until it returns something true; fail if the process ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        assert proc.poll() is None, f"the run ended first: {proc.stderr.read()[-2000:]}"
        time.sleep(0.02)
    raise AssertionError("timed out")


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Train and eval records without the wall-clock fields."""
    return [
        {k: v for k, v in r.items() if k != "samples_per_s"}
        for r in read_metrics(run_dir)
        if r["kind"] in ("train", "eval")
    ]


def _final_arrays(run_dir: Path) -> dict[str, bytes]:
    ck = latest_checkpoint(run_dir)
    assert ck is not None
    return {str(p.relative_to(ck)): p.read_bytes() for p in ck.rglob("*.npy")}


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.cli import run_cli

    root = tmp_path_factory.mktemp("long")
    path = root / "long.yaml"
    path.write_text(RECIPE.format(data=root / "data"))
    res = run_cli("gen-data", "--recipe", str(path), "--out", str(root / "data"), "--rows",
                  "20000", "--eval-rows", "2000", "--files", "2")
    assert res.returncode == 0, res.stderr
    return path


@pytest.fixture(scope="module")
def interrupted(recipe: Path) -> dict[str, Any]:
    """A run with stdout to a file, sent SIGTERM once its log shows step 60 or later."""
    run_dir = recipe.parent / "interrupted"
    log = recipe.parent / "interrupted.log"
    proc = _start(["run", str(recipe), "--run-dir", str(run_dir)], log)
    seen = _wait_for(lambda: [m for m in _progress(log) if int(m.group(2)) >= 60], proc)
    while_running = _progress(log)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    return {
        "run_dir": run_dir,
        "log": log,
        "while_running": while_running,
        "signalled_after": int(seen[-1].group(2)),
        "returncode": proc.returncode,
        "stderr": stderr,
    }


def test_progress_lines_reach_a_log_file_while_the_run_goes(interrupted: dict[str, Any]) -> None:
    lines = interrupted["while_running"]
    assert [int(m.group(2)) for m in lines[:3]] == [20, 40, 60]
    assert all(m.group(3) == "1500" for m in lines)
    # The loss shown is the windowed mean metrics.jsonl records for that step, the learning
    # rates (sparse/dense) those it records.
    recorded = {r["step"]: r for r in read_metrics(interrupted["run_dir"])
                if r["kind"] == "train"}
    for m in _progress(interrupted["log"]):
        r = recorded[int(m.group(2))]
        assert m.group(4) == f"{r['loss']:.4f}", m.group(0)
        assert (m.group(5), m.group(6)) == (f"{r['lr_sparse']:.4g}", f"{r['lr_dense']:.4g}")


def test_sigterm_finishes_the_step_checkpoints_and_exits_143(interrupted: dict[str, Any]) -> None:
    assert interrupted["returncode"] == 143, interrupted["stderr"][-2000:]
    run_dir = interrupted["run_dir"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] == "signal"
    steps = summary["steps"]
    assert interrupted["signalled_after"] <= steps < 1500
    ck = latest_checkpoint(run_dir)
    assert ck is not None and ck.name == f"step-{steps:08d}"
    assert load_checkpoint(ck).step == steps  # complete and verified
    end = read_metrics(run_dir)[-1]
    assert end["kind"] == "end" and end["stopped"] == "signal" and end["step"] == steps
    assert f"--resume {run_dir}" in interrupted["stderr"]


@pytest.mark.slow
def test_resume_after_sigterm_matches_an_uninterrupted_run(
    recipe: Path, interrupted: dict[str, Any], tmp_path: Path
) -> None:
    from tests.support.cli import run_cli

    straight = run_cli("run", str(recipe), "--run-dir", str(tmp_path / "straight"), "--json")
    assert straight.returncode == 0, straight.stderr[-2000:]
    run_dir = interrupted["run_dir"]
    resumed = run_cli("run", "--resume", str(run_dir), "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = json.loads(straight.stdout), json.loads(resumed.stdout)
    assert b["steps"] == a["steps"] == 1500 and b["stopped"] is None
    assert b["final_loss"] == a["final_loss"] and b["evals"] == a["evals"]
    assert _metrics(run_dir) == _metrics(tmp_path / "straight")
    assert _final_arrays(run_dir) == _final_arrays(tmp_path / "straight")


@pytest.mark.slow
def test_second_signal_stops_at_once_and_keeps_the_previous_checkpoint(
    recipe: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "twice"
    # Slow checkpoint writes (a test hook) leave time to signal while one is being written:
    # 1 s a file, so that on a loaded machine the second signal still lands before the
    # checkpoint is complete (0.3 s once let step 502's finish first, with two test workers)
    proc = _start(["run", str(recipe), "--run-dir", str(run_dir)], tmp_path / "log",
                  env=delayed_env(1.0, _env()))
    first = run_dir / "checkpoints" / "step-00000500"
    _wait_for(first.is_dir, proc)
    proc.send_signal(signal.SIGTERM)

    def writing() -> bool:
        tmps = [p for p in (run_dir / "checkpoints").glob(".tmp-step-*") if p.name != first.name]
        return any(f.is_file() for t in tmps for f in t.rglob("*"))

    _wait_for(writing, proc)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-2000:]
    assert time.monotonic() - t0 < 4, "the second signal must not wait for the checkpoint"
    assert latest_checkpoint(run_dir) == first
    assert load_checkpoint(first).step == 500  # intact: every checksum verified
    assert not (run_dir / "summary.json").exists()


def test_graceful_stop_flag_then_stop_now() -> None:
    previous = signal.getsignal(signal.SIGINT)
    with GracefulStop() as stop:
        assert not stop.requested and stop.exit_code is None
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs between bytecodes of the main thread
        assert stop.requested and stop.exit_code == 130 and stop.signal_name == "SIGINT"
        with pytest.raises(StopNow) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert info.value.exit_code == 143
    assert signal.getsignal(signal.SIGINT) is previous


@pytest.mark.slow
def test_every_json_command_prints_only_json(recipe: Path, tmp_path: Path) -> None:
    from tests.support.cli import run_cli

    short = tmp_path / "short.yaml"
    short.write_text(recipe.read_text().replace("every: 500", "every: 3"))
    t = str(tmp_path)
    commands = [
        ("gen-data", "--recipe", str(short), "--out", f"{t}/data", "--rows", "2000",
         "--eval-rows", "500", "--files", "1", "--json"),
        ("plan", str(short), "--json"),
        ("run", str(short), "--run-dir", f"{t}/run", "--max-steps", "6", "--json"),
        ("dump", f"{t}/run", f"{t}/d3", "--step", "3", "--json"),
        ("incremental-export", f"{t}/run", f"{t}/i6", "--since", "3", "--json"),
        ("apply-increments", f"{t}/d3", f"{t}/i6", "--out", f"{t}/a6", "--json"),
        ("load", f"{t}/d3", "--recipe", str(short), "--check", "--json"),
        ("load", f"{t}/d3", "--recipe", str(short), "--run-dir", f"{t}/warm", "--max-steps",
         "2", "--json"),
        ("bench", "--model", "colossal", "--json"),
    ]
    for args in commands:
        res = run_cli(*args)
        assert res.returncode == 0, (args, res.stderr[-2000:])
        assert isinstance(json.loads(res.stdout), dict), (args, res.stdout[:500])


def test_a_run_killed_before_its_first_checkpoint_says_how_to_start_over(
        recipe: Path, tmp_path: Path) -> None:
    """kill -9 before the first checkpoint: --resume and a new run into the same directory
    each say, in one line, how to start over."""
    from tests.support.cli import run_cli

    run_dir = tmp_path / "killed"
    log = tmp_path / "killed.log"
    proc = _start(["run", str(recipe), "--run-dir", str(run_dir)], log)
    _wait_for(lambda: _progress(log), proc)  # training, its first checkpoint 500 steps away
    proc.kill()
    proc.communicate(timeout=60)
    assert latest_checkpoint(run_dir) is None and (run_dir / "recipe.yaml").is_file()
    again = (f"start over with `embtrain run {run_dir / 'recipe.yaml'} --run-dir NEW_DIR`, "
             f"or remove it (`rm -r {run_dir}`) and run again")
    res = run_cli("run", "--resume", str(run_dir))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert lines[0] == (f"{run_dir}: no complete checkpoint in {run_dir / 'checkpoints'}; "
                        f"it stopped before its first checkpoint, so nothing can be resumed: "
                        + again)
    res = run_cli("run", str(recipe), "--run-dir", str(run_dir))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert lines[0] == (f"{run_dir}: run directory exists and is not empty; it holds a run "
                        "that stopped before its first checkpoint, so nothing can be resumed: "
                        + again)
