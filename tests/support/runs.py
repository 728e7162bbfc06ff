"""Runs in subprocesses and what they leave: the sharded recipe of the multi-rank tests, a run
started in the background until its first checkpoint, a run directory's losses, evaluations
and dumped tables, the processes of a rank."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from embtrain.train.metrics_log import read_metrics
from tests.support.cli import run_cli

#: every sharding mode (user: column by default), a list feature, checkpoints every 10 steps
SHARDED_RECIPE = """
version: 1
name: dist
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 512}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
  - {{kind: categorical, name: tags, column: tags, table: tag, hotness: variable, combiner: mean}}
  - {{kind: categorical, name: category, column: category, table: category}}
tables:
  - {{name: user, dim: 8, rows: 500, sharding: {user}}}
  - {{name: item, dim: 8, rows: 301, sharding: row}}
  - {{name: tag, dim: 8, rows: 200, sharding: table}}
  - {{name: category, dim: 8, rows: 50, sharding: data_parallel}}
optimizer: {{sparse: {{type: {optimizer}, lr: 0.05}}, dense: {{type: adam, lr: 0.003}}}}
model: {{type: dlrm, bottom: [16, 8], top: [16, 1]}}
train: {{steps: {steps}, eval_every: 10, log_every: 1, seed: 1, checkpoint: {{every: 10, keep: 5}}}}
distributed: {{comm: {{quantize: {quantize}}}}}
"""


def train_losses(run_dir: Path) -> dict[int, float]:
    """Each logged step's training loss, from the run's metrics.jsonl."""
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"}


def evals(run_dir: Path) -> list[tuple[int, float, float, int]]:
    """Each evaluation of the run: (step, AUC, log loss, rows)."""
    return [(r["step"], r["auc"], r["logloss"], r["rows"])
            for r in read_metrics(run_dir) if r["kind"] == "eval"]


def dump(run_dir: Path, out: Path) -> dict[str, np.ndarray]:
    """`embtrain dump RUN_DIR OUT`, then every array it wrote by relative path."""
    res = run_cli("dump", str(run_dir), str(out))
    assert res.returncode == 0, res.stderr
    return {str(p.relative_to(out)): np.load(p) for p in sorted(out.rglob("*.npy"))}


def start_until_checkpoint(argv: list[str], run_dir: Path) -> subprocess.Popen[str]:
    """``embtrain ARGV`` in the background, returned once ``run_dir`` holds a checkpoint."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "embtrain", *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not list((run_dir / "checkpoints").glob("step-*")) and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate())
        time.sleep(0.2)
    return proc


def start_two_ranks(recipe: Path, run_dir: Path) -> subprocess.Popen[str]:
    """``embtrain run RECIPE --np 2`` in the background, returned once a checkpoint exists."""
    return start_until_checkpoint(["run", str(recipe), "--np", "2", "--run-dir", str(run_dir)],
                                  run_dir)


def rank_pids(launcher: int, rank: int) -> list[int]:
    """The processes the launcher ``launcher`` started as rank ``rank``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == launcher and f"HOROVOD_RANK={rank}".encode() in env:
            pids.append(int(entry.name))
    return pids

