"""`predict`'s scratch directory for a run's disk tiers: named by its owner, removed by the next
predict when a killed one left it, and removed on SIGTERM (one line, exit 143)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embtrain.checkpoint.tmpdirs import make_owned_dir
from embtrain.train.predict import TIER_PREFIX
from tests.support.cli import REPO
from tests.support.serving import TIERED, eval_glob, make_run_from


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_owned_directories_of_dead_owners_are_swept(tmp_path: Path) -> None:
    host = socket.gethostname()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = tmp_path / f"{TIER_PREFIX}-{_dead_pid()}-abc123@{host}"
        alive = tmp_path / f"{TIER_PREFIX}-{live.pid}-abc123@{host}"
        remote = tmp_path / f"{TIER_PREFIX}-{_dead_pid()}-abc123@another-host"
        other = tmp_path / f".tmp-1-{_dead_pid()}-abc123@{host}"  # an export's: not ours
        for d in (dead, alive, remote, other):
            d.mkdir()
            (d / "item.tier").write_bytes(b"x")
        mine = make_owned_dir(tmp_path, TIER_PREFIX)
        assert mine.name.startswith(f"{TIER_PREFIX}-{os.getpid()}-") and mine.is_dir()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            p.name for p in (alive, remote, other, mine))
    finally:
        live.kill()
        live.wait()


@pytest.fixture(scope="module")
def tiered_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run_from(tmp_path_factory.mktemp("predict-cleanup"), "tiered", TIERED)


def _start(run: Path, out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen([sys.executable, "-m", "embtrain", "predict", str(run), "--data",
                             eval_glob(run), "--out", str(out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_scratch(proc: subprocess.Popen[str], folder: Path) -> Path:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = [p for p in folder.iterdir() if p.name.startswith(TIER_PREFIX)]
        if found:
            return found[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("predict made no scratch directory")


def test_sigterm_and_kill_leave_no_scratch_directory(tiered_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "scores.parquet"
    proc = _start(tiered_run, out)
    scratch = _wait_for_scratch(proc, tmp_path)
    assert f"-{proc.pid}-" in scratch.name
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == (
        f"predict stopped by SIGTERM; {out} was not written (its temporary files are removed)")
    assert list(tmp_path.iterdir()) == []

    proc = _start(tiered_run, out)
    scratch = _wait_for_scratch(proc, tmp_path)
    proc.kill()
    proc.wait()
    assert scratch.is_dir()  # SIGKILL cannot be caught: the next predict removes it
    done = _start(tiered_run, out)
    _, err = done.communicate(timeout=600)
    assert done.returncode == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
