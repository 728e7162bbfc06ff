"""An environment without Horovod (what `bash scripts/bootstrap.sh`, the quickstart's set-up,
installs): one process trains, and a job of several processes stops in one line naming the
command that installs Horovod, before any rank starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.cli import REPO
from tests.support.tiny import one_line_error

WORKER = REPO / "tests" / "workers" / "cli_with_blocked_imports.py"


def without_horovod(*args: str) -> subprocess.CompletedProcess[str]:
    """``embtrain ARGS`` in a process where ``import horovod`` fails."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(WORKER), "horovod", *args], capture_output=True,
                          text=True, timeout=600, cwd=REPO, env=env)


def test_one_process_trains_without_horovod(tiny, tmp_path: Path) -> None:
    _, recipe = tiny
    run = tmp_path / "run"
    result = without_horovod("run", str(recipe), "--run-dir", str(run), "--max-steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_several_processes_without_horovod_name_the_command_that_installs_it(
        tiny, tmp_path: Path) -> None:
    _, recipe = tiny
    run = tmp_path / "run"
    result = without_horovod("run", str(recipe), "--np", "2", "--run-dir", str(run))
    one_line_error(result, "2 processes need Horovod", "bash scripts/bootstrap.sh --horovod")
    assert not run.exists()


def test_plan_of_several_processes_says_horovod_is_missing(tiny) -> None:
    _, recipe = tiny
    two = without_horovod("plan", str(recipe), "--world-size", "2", "--host-memory", "4GiB")
    assert two.returncode == 0, two.stderr[-3000:]
    line = next(ln for ln in two.stdout.splitlines() if ln.startswith("runtime per process"))
    assert "Horovod is not installed, and 2 processes need it" in line
    assert "bash scripts/bootstrap.sh --horovod" in line
    one = without_horovod("plan", str(recipe), "--world-size", "1", "--host-memory", "4GiB")
    assert one.returncode == 0 and "Horovod" not in one.stdout
