"""Jobs stopped or killed midway (SIGTERM, kill -9, a launcher killed) leave nothing
half-written and nothing running, and carry on from where they stopped: `gen-data`, `dump`,
and a run of 2 ranks through the real launcher (`embtrain run --np 2`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.runs import start_until_checkpoint
from tests.support.tiny import one_line_error, variant

# ------------------------------------------- 7. gen-data: whole or nothing, one writer at once


def test_gen_data_killed_leaves_nothing_valid_looking_and_one_writer_at_once(
        cli, tiny, tmp_path: Path):
    _, recipe = tiny
    out = tmp_path / "data"
    args = ["gen-data", "--recipe", str(recipe), "--out", str(out), "--eval-rows", "10"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    first = subprocess.Popen([sys.executable, "-m", "embtrain", *args, "--rows", "4000000",
                              "--files", "16"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".data.gen-data-tmp-*/train/part-00001.parquet")):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = cli(*args, "--rows", "1000")  # at the same time, into the same --out
        one_line_error(second, str(out), "another gen-data", f"pid {first.pid}")
        first.kill()  # kill -9 mid-way
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    assert not out.exists() or not any(out.iterdir())  # no partial data set under OUT
    again = cli(*args, "--rows", "1000")
    assert again.returncode == 0, again.stderr
    assert (out / "dataset.json").is_file()
    assert not list(tmp_path.glob(".data.gen-data-tmp-*"))  # the killed one's swept


# ------------------------------------------ 10. dump: no temporaries left by a stopped dump


def start_dump(run: Path, out: Path) -> subprocess.Popen[str]:
    """A slowed-down `embtrain dump RUN OUT`, returned once its temporary directory exists."""
    from tests.support.checkpoint_delay import delayed_env

    env = delayed_env(0.3, {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    proc = subprocess.Popen([sys.executable, "-m", "embtrain", "dump", str(run), str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(out.parent.glob(".tmp-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    time.sleep(0.3)
    return proc


def test_stopped_dump_leaves_no_temporaries(cli, tiny_run: Path, tmp_path: Path):
    exports = tmp_path / "exports"
    exports.mkdir()
    term = start_dump(tiny_run, exports / "a")
    term.send_signal(signal.SIGTERM)
    _, err = term.communicate(timeout=60)
    assert term.returncode == 143, err
    assert "dump stopped by SIGTERM" in err
    assert sorted(p.name for p in exports.iterdir()) == []
    killed = start_dump(tiny_run, exports / "b")
    killed.kill()  # SIGKILL: nothing can clean up now ...
    killed.wait()
    assert list(exports.glob(".tmp-b-*"))
    result = cli("dump", str(tiny_run), str(exports / "c"))  # ... the next write sweeps it
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in exports.iterdir()) == ["c"]


# ------------------- 3 and 4. a stopped 2-rank run resumes on 2; ranks die with their launcher


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.distributed
def test_stopped_two_rank_run_resumes_on_two_and_ranks_die_with_their_launcher(
        cli, tiny, tmp_path: Path):
    from embtrain.checkpoint import list_checkpoints

    root, _ = tiny
    recipe = variant(root, "np2-long", **{"steps: 6,": "steps: 2000,"})
    run = tmp_path / "run"
    # 3. SIGTERM to `run --np 2`: the hint names the process count ...
    proc = start_until_checkpoint(["run", str(recipe), "--np", "2", "--run-dir", str(run)], run)
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert f"continue with: embtrain run --resume {run} --np 2\n" in err, err
    stopped = list_checkpoints(run)[-1][0]
    # ... and `run --resume RUN` without --np starts 2 ranks again
    launcher = subprocess.Popen([sys.executable, "-m", "embtrain", "run", "--resume", str(run)],
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while list_checkpoints(run)[-1][0] <= stopped:
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
            time.sleep(0.1)
        ranks = children(launcher.pid)
        assert len(ranks) == 2, ranks
        # 4. kill -9 of the launcher: its ranks die with it
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 30
        while any(alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in ranks), "ranks outlived their launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    last = list_checkpoints(run)[-1][0]
    result = cli("run", "--resume", str(run), "--max-steps", str(last + 2))  # no --np
    assert result.returncode == 0, result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["processes"], summary["steps"]) == (2, last + 2)
