"""Exact resume with the real engine, dense model and reader: 2N steps == N + resume + N.

``test_library_resume_is_bit_exact`` drives the pieces with the same calls the training loop
makes (see the integration notes in ``embtrain/checkpoint/manager.py``). The CLI tests run
``embtrain run --resume`` and skip until ``TrainJob`` has the ``resume`` option.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embtrain.checkpoint import CheckpointManager, latest_checkpoint

RECIPE = """
version: 1
name: resume
data:
  train: {data}/train/*.parquet
  eval: {data}/eval/*.parquet
  label: label
  batch_size: 256
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
  - {{kind: categorical, name: history, column: history, table: item, hotness: variable, combiner: mean}}
tables:
  - {{name: user, dim: 8, rows: 500}}
  - {{name: item, dim: 4, rows: 800}}
optimizer:
  sparse: {{type: adam, lr: 0.02}}
  dense: {{type: adam, lr: 0.01}}
model: {{type: mlp, hidden: [16, 8]}}
train:
  steps: 16
  eval_every: 4
  eval_max_batches: 2
  log_every: 2
  checkpoint: {{every: 4, keep: 2}}
  seed: 3
"""


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resume")
    path = root / "resume.yaml"
    path.write_text(RECIPE.format(data=root / "data"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "embtrain",
            "gen-data",
            "--recipe",
            str(path),
            "--out",
            str(root / "data"),
            "--rows",
            "2600",
            "--eval-rows",
            "600",
            "--files",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        pytest.skip(f"gen-data unavailable: {result.stderr.strip()[-300:]}")
    return path


def _job(recipe_path: Path) -> Any:
    from embtrain.recipe import load_recipe
    from embtrain.train import TrainJob

    job = TrainJob(load_recipe(recipe_path), str(recipe_path))
    job._build()
    return job


def _loop(job: Any, manager: CheckpointManager, until: int, resume: bool) -> dict[str, Any]:
    """The training loop's checkpoint calls, as the integration notes describe them.

    The run is 16 steps long; ``until`` < 16 stops early like a killed process.
    """
    recipe = job.recipe
    step, losses, evals = 0, [], []
    if resume:
        state = manager.restore(job.engine, job.model)
        step, losses, evals = state.step, list(state.extra["losses"]), list(state.extra["evals"])
        epoch, start = state.epoch, state.batch
    else:
        epoch, start = 0, 0
    while step < until:
        reader = job._reader_cls(recipe, "train", epoch=epoch, start_batch=start)
        for batch in reader:
            groups = job.engine.forward(batch.sparse)
            loss, grads = job.model.train_step(batch.dense, groups, batch.label)
            job.engine.backward_update(grads, step)
            step += 1
            losses.append(loss)
            if step % recipe.train.eval_every == 0:
                evals.append(_evaluate(job))
            if manager.due(step, 16):
                position = divmod(step, job.batches_per_epoch)
                manager.save(
                    step,
                    job.engine,
                    job.model,
                    position,
                    {"losses": losses, "evals": evals},
                    seed=job.seed,
                )
            if step == until:
                break
        epoch, start = epoch + 1, 0
    return {"losses": losses, "evals": evals}


def _evaluate(job: Any) -> list[float]:
    from embtrain.metrics import auc, logloss

    labels, scores = [], []
    for i, batch in enumerate(job._reader_cls(job.recipe, "eval")):
        if i >= job.recipe.train.eval_max_batches:
            break
        scores.append(job.model.predict(batch.dense, job.engine.forward(batch.sparse)))
        labels.append(batch.label)
    y, p = np.concatenate(labels), np.concatenate(scores)
    return [float(auc(y, p)), float(logloss(y, p))]


def _state(job: Any) -> list[np.ndarray]:
    arrays = []
    for name in job.engine.table_names:
        st = job.engine.export_table(name)
        arrays += [st.values, *st.slots.values(), st.update_count, st.last_step]
    return arrays + job.model.get_weights() + job.model.optimizer_state()


def test_library_resume_is_bit_exact(recipe_path: Path, tmp_path: Path):
    straight_job = _job(recipe_path)
    assert straight_job.batches_per_epoch < 16  # the run crosses an epoch boundary
    straight = _loop(
        straight_job,
        CheckpointManager.for_recipe(tmp_path / "a", straight_job.recipe),
        16,
        resume=False,
    )
    first = _job(recipe_path)
    _loop(first, CheckpointManager.for_recipe(tmp_path / "b", first.recipe), 10, resume=False)
    assert latest_checkpoint(tmp_path / "b").name == "step-00000008"
    del first
    resumed_job = _job(recipe_path)
    resumed = _loop(
        resumed_job,
        CheckpointManager.for_recipe(tmp_path / "b", resumed_job.recipe),
        16,
        resume=True,
    )
    assert resumed["losses"] == straight["losses"]
    assert resumed["evals"] == straight["evals"]
    for a, b in zip(_state(straight_job), _state(resumed_job), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_library_resume_of_half_tables_is_bit_exact(recipe_path: Path, tmp_path: Path):
    """A bfloat16 table (stochastic rounding) and a float16 one with its optimizer state in
    float16: checkpoints keep the 16-bit patterns and the dtypes, the resumed run equals the
    uninterrupted one bit for bit."""
    half = tmp_path / "half.yaml"
    half.write_text(recipe_path.read_text().replace(
        "rows: 500}", "rows: 500, dtype: bfloat16}").replace(
        "rows: 800}", "rows: 800, dtype: float16, optimizer_state: table}"))
    straight_job = _job(half)
    straight = _loop(straight_job, CheckpointManager.for_recipe(tmp_path / "a", straight_job.recipe),
                     16, resume=False)
    first = _job(half)
    _loop(first, CheckpointManager.for_recipe(tmp_path / "b", first.recipe), 10, resume=False)
    del first
    resumed_job = _job(half)
    resumed = _loop(resumed_job, CheckpointManager.for_recipe(tmp_path / "b", resumed_job.recipe),
                    16, resume=True)
    assert resumed["losses"] == straight["losses"]
    for a, b in zip(_state(straight_job), _state(resumed_job), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert straight_job.engine.export_table("user").values.dtype == np.uint16
    manifest = json.loads((latest_checkpoint(tmp_path / "b") / "manifest.json").read_text())
    assert manifest["tables"]["user"]["dtype"] == "bfloat16"
    assert manifest["tables"]["item"]["dtype"] == "float16"
    assert manifest["tables"]["item"]["state_dtype"] == "float16"


# --------------------------------------------------------------------------- the CLI


def _resume_wired() -> bool:
    from embtrain.train import RunOptions

    return "resume" in getattr(RunOptions, "__dataclass_fields__", {})


needs_resume = pytest.mark.skipif(not _resume_wired(), reason="TrainJob has no resume option yet")


def _run(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "embtrain", "run", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    return json.loads(out[out.index("{") if out.startswith("{") else out.index("\n{") + 1 :])


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Train and eval records without the timing fields."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["kind"] in ("train", "eval")]
    return [{k: v for k, v in r.items() if k != "samples_per_s"} for r in records]


def _final_arrays(run_dir: Path) -> dict[str, bytes]:
    ck = latest_checkpoint(run_dir)
    assert ck is not None
    return {str(p.relative_to(ck)): p.read_bytes() for p in ck.rglob("*.npy")}


@pytest.fixture(scope="module")
def straight(
    recipe_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """An uninterrupted 16-step run."""
    run_dir = tmp_path_factory.mktemp("straight") / "a"
    return run_dir, _run(str(recipe_path), "--run-dir", str(run_dir))


@needs_resume
@pytest.mark.slow
def test_cli_resume_matches_straight_run(recipe_path: Path, straight, tmp_path: Path):
    a, summary = straight
    _run(str(recipe_path), "--run-dir", str(tmp_path / "b"), "--max-steps", "8")
    resumed = _run("--resume", str(tmp_path / "b"))
    assert resumed["steps"] == summary["steps"] == 16
    assert resumed["final_loss"] == summary["final_loss"]
    assert resumed["evals"] == summary["evals"]
    assert _metrics(tmp_path / "b") == _metrics(a)
    assert _final_arrays(tmp_path / "b") == _final_arrays(a)


@needs_resume
@pytest.mark.slow
def test_cli_sigkill_during_checkpoint_then_resume(recipe_path: Path, straight, tmp_path: Path):
    from tests.support.checkpoint_delay import delayed_env

    a, summary = straight
    run_dir = tmp_path / "b"
    proc = subprocess.Popen(
        [sys.executable, "-m", "embtrain", "run", str(recipe_path), "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=delayed_env(0.2),
    )
    tmp = run_dir / "checkpoints/.tmp-step-00000008"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (
        tmp.is_dir() and any(p.is_file() for p in tmp.rglob("*"))
    ):
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert latest_checkpoint(run_dir).name == "step-00000004"
    resumed = _run("--resume", str(run_dir))
    assert resumed["final_loss"] == summary["final_loss"] and resumed["evals"] == summary["evals"]
    assert _metrics(run_dir) == _metrics(a)
    assert _final_arrays(run_dir) == _final_arrays(a)


@needs_resume
@pytest.mark.slow
def test_cli_load_warm_starts_a_new_run(recipe_path: Path, straight, tmp_path: Path):
    a, _ = straight
    dump = subprocess.run(
        [sys.executable, "-m", "embtrain", "dump", str(a), str(tmp_path / "export")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dump.returncode == 0, dump.stderr
    changed = tmp_path / "changed.yaml"
    changed.write_text(
        recipe_path.read_text().replace("steps: 16", "steps: 4").replace("lr: 0.02", "lr: 0.01")
    )
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "embtrain",
            "load",
            str(tmp_path / "export"),
            "--recipe",
            str(changed),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert "--allow lr" in refused.stderr and "--allow steps" in refused.stderr
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "embtrain",
            "load",
            str(tmp_path / "export"),
            "--recipe",
            str(changed),
            "--allow",
            "lr,steps",
            "--run-dir",
            str(tmp_path / "c"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    fresh, warm = _metrics(a), _metrics(tmp_path / "c")
    first = next(r["loss"] for r in fresh if r["kind"] == "train")
    warm_first = next(r["loss"] for r in warm if r["kind"] == "train")
    assert warm_first < first  # it starts from the trained tables and dense model
