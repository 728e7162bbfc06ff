"""A rank dies under plain `horovodrun` (no embtrain launcher to filter the lines): the
surviving rank says in one line that it lost its peers, and Horovod's own C++ line
(`operations.cc … Connection closed by peer`) is not printed (issue 29)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embtrain.comm.launch import LOST_PEER, _cause, lost_peer_line

REPO = Path(__file__).resolve().parents[1]


def test_lost_peer_line_only_for_horovod_shut_down():
    shut = RuntimeError("{{function_node x}} Horovod has been shut down. This was caused by ...")
    line = lost_peer_line(shut)
    assert line is not None and line.startswith(LOST_PEER)
    assert lost_peer_line(ValueError("Connection refused")) is None


def test_lost_peer_line_for_the_collective_in_flight_when_the_peer_died():
    # the in-flight collective gets Gloo's exception as an UnknownError (Horovod's
    # PerformOperation), inside TensorFlow's graph error when it ran in a graph
    for why in ("Connection closed by peer [127.0.0.1]:41234",
                "Read error [127.0.0.1]:41234: Connection reset by peer",
                "Write error [127.0.0.1]:41234: Broken pipe"):
        exc = RuntimeError("Graph execution error:\n\nDetected at node HorovodAllreduce_x\n"
                           "[/tmp/pip/horovod/third_party/gloo/gloo/transport/tcp/pair.cc:598] "
                           + why)
        line = lost_peer_line(exc)
        assert line is not None and line.startswith(LOST_PEER), why
    # the same words without Gloo's transport are not a lost peer
    assert lost_peer_line(OSError("Read error: Connection reset by peer")) is None


def test_the_rank_that_lost_its_peers_is_never_named_as_the_cause():
    # rank 0 lost its peers (exit 1), rank 1 failed with an error (exit 1): rank 1 is named
    assert _cause({0: 1, 1: 1}, frozenset({0})) == 1
    assert _cause({0: 1, 1: 1}) == 0  # without that knowledge: the lowest rank
    assert _cause({0: 1, 1: -9}, frozenset({0})) == 1  # a death by a signal comes first
    assert _cause({0: 1, 1: 1}, frozenset({0, 1})) == 0


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (str(run_dir).encode() in cmdline and b"embtrain" in cmdline
                and f"HOROVOD_RANK={rank}".encode() in env):
            return int(entry.name)
    return None


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_killed_under_horovodrun_leaves_one_line_per_survivor(tmp_path: Path):
    from tests.support.cli import run_cli
    from tests.support.tiny import TWO

    horovodrun = Path(sys.executable).parent / "horovodrun"
    if not horovodrun.exists():
        pytest.skip("horovodrun is not installed next to this interpreter")
    recipe = tmp_path / "two.yaml"
    recipe.write_text(TWO.format(data=tmp_path / "data"))
    res = run_cli("gen-data", "--recipe", str(recipe), "--out", str(tmp_path / "data"),
                  "--rows", "1024", "--eval-rows", "256", "--files", "1")
    assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    env.pop("HOROVOD_LOG_LEVEL", None)
    proc = subprocess.Popen(
        [str(horovodrun), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, "-m",
         "embtrain", "run", str(recipe), "--run-dir", str(run_dir)],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        pid = None
        while time.monotonic() < deadline:  # training: a checkpoint exists
            if proc.poll() is not None:
                raise AssertionError(proc.communicate())
            if list((run_dir / "checkpoints").glob("step-*")):
                pid = _rank_pid(run_dir, 1)
                if pid is not None:
                    break
            time.sleep(0.2)
        assert pid is not None, "rank 1 did not start training"
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "operations.cc" not in err and "Connection closed by peer" not in err, err[-3000:]
    rank0 = [ln for ln in err.splitlines() if ln.startswith("[0]<stderr>:")]
    assert len(rank0) <= 2, err[-3000:]  # its line, and the shell's "Terminated" if it was
    assert any(LOST_PEER in ln for ln in rank0), err[-3000:]
    assert "internal error" not in err, err[-3000:]
