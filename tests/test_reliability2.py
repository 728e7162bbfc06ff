"""The promises of docs/RELIABILITY.md added by issue 29 ("Hardening, round two"), items 1-11.

Each test reproduces a way the earlier code lost work or said something false, through the
real CLI (several ranks through the real launcher, `embtrain run --np 2`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_reliability import one_line_error, tiny, tiny_run, variant  # noqa: F401

# ----------------------------------------------------------------------- 1. divergence


def test_sparse_lr_huge_diverges_instead_of_training_to_nonsense(cli, tiny):  # noqa: F811
    root, _ = tiny
    recipe = variant(root, "sparse-huge", **{"lr: 0.1}": "lr: 1e30}"})
    result = cli("run", str(recipe), "--run-dir", str(root / "run-sparse-huge"))
    one_line_error(result, str(recipe), "training diverged", "at step 2", "learning rates",
                   code=1)


def test_exploding_loss_keeps_the_last_good_checkpoint(cli, tiny):  # noqa: F811
    from embtrain.checkpoint import list_checkpoints

    root, _ = tiny
    recipe = variant(root, "dense-huge", **{"lr: 0.01}": "lr: 30}",
                                            "every: 2, keep: 2": "every: 1, keep: 1"})
    run = root / "run-dense-huge"
    result = cli("run", str(recipe), "--run-dir", str(run))
    # step 3's loss is the first verdict on the state after step 2: that checkpoint is set
    # aside, the one at step 1 (keep: 1 would have pruned it) is the last good one
    one_line_error(result, "training diverged", "at step 3",
                   "the last good checkpoint step-00000001 is kept", code=1)
    assert [s for s, _ in list_checkpoints(run)] == [1]
    assert (run / "checkpoints" / "step-00000002.diverged" / "manifest.json").is_file()


# ----------------------------------------------------------------------------- helpers


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


# --------------------------------------------------------- 8. dynamic counters across resumes


def dynamic_records(run: Path) -> dict[int, dict]:
    from embtrain.train.metrics_log import read_metrics

    return {r["step"]: r["dynamic_tables"]["user"] for r in read_metrics(run)
            if r["kind"] == "train"}


def test_dynamic_table_counters_survive_resumes(cli, tiny, tmp_path: Path):  # noqa: F811
    root, _ = tiny
    recipe = variant(root, "dyn-counters", **{
        "{name: user, dim: 4, rows: 100}":
            "{name: user, dim: 4, dynamic: {capacity: 80, eviction: lru}}"})
    straight, parts = tmp_path / "straight", tmp_path / "parts"
    assert cli("run", str(recipe), "--run-dir", str(straight)).returncode == 0
    result = cli("run", str(recipe), "--run-dir", str(parts), "--max-steps", "3")
    assert result.returncode == 0, result.stderr
    result = cli("run", "--resume", str(parts))
    assert result.returncode == 0, result.stderr
    want, got = dynamic_records(straight), dynamic_records(parts)
    assert want[6]["evictions"] > 0 and want[6]["inserts"] > 80, want
    assert got[6] == want[6]


# ------------------------------------------------- 9. load --check validates as load does


def test_load_check_refuses_what_load_refuses(cli, tiny, tmp_path: Path):  # noqa: F811
    from tests.test_reliability import rewrite_column

    root, _ = tiny
    dynamic = variant(root, "dyn-keys", **{
        "{name: user, dim: 4, rows: 100}":
            "{name: user, dim: 4, dynamic: {capacity: 80, eviction: lru}}"})
    for path in (root / "data-dyn-keys").rglob("*.parquet"):  # 63-bit ids
        rewrite_column(path, "user_id", lambda v: v.astype("int64") * 1000003 + 2**62)
    run, export = tmp_path / "run", tmp_path / "export"
    result = cli("run", str(dynamic), "--run-dir", str(run), "--max-steps", "2")
    assert result.returncode == 0, result.stderr
    assert cli("dump", str(run), str(export)).returncode == 0
    static = tmp_path / "static.yaml"
    static.write_text(dynamic.read_text().replace(
        "dynamic: {capacity: 80, eviction: lru}", "rows: 100"))
    checked = cli("load", str(export), "--recipe", str(static), "--check")
    loaded = cli("load", str(export), "--recipe", str(static), "--run-dir", str(tmp_path / "l"))
    # `--check` refuses with the line `load` gives (before it imports anything)
    lines = [one_line_error(r, f"{export}: table user: key 46116860", "does not fit a static "
                            "table of 100 rows", "make the table dynamic")
             for r in (checked, loaded)]
    assert lines[0] == lines[1]
    assert not (tmp_path / "l").exists()


# ------------------------------------------- 7. gen-data: whole or nothing, one writer at once


def test_gen_data_killed_leaves_nothing_valid_looking_and_one_writer_at_once(
        cli, tiny, tmp_path: Path):  # noqa: F811
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
    from checkpoint_delay import delayed_env

    env = delayed_env(0.3, {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    proc = subprocess.Popen([sys.executable, "-m", "embtrain", "dump", str(run), str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(out.parent.glob(".tmp-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    time.sleep(0.3)
    return proc


def test_stopped_dump_leaves_no_temporaries(cli, tiny_run: Path, tmp_path: Path):  # noqa: F811
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
        cli, tiny, tmp_path: Path):  # noqa: F811
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


# ------------------------------------------- 2. a rewritten data file is not called unchanged


def test_resume_sees_two_swapped_labels(cli, tiny, tmp_path: Path):  # noqa: F811
    import pyarrow.parquet as pq

    from embtrain.data.fingerprint import split_fingerprint
    from tests.test_reliability import rewrite_column

    root, _ = tiny
    recipe = variant(root, "swap-labels")
    train = sorted((root / "data-swap-labels" / "train").glob("*.parquet"))
    rewrite_column(train[0], "I1", lambda x: x)  # written as the swap below will write it
    run = tmp_path / "run"
    assert cli("run", str(recipe), "--run-dir", str(run), "--max-steps", "2").returncode == 0
    before = split_fingerprint(str(train[0]), "data.train")[0]
    labels = pq.read_table(train[0]).column("label").to_numpy()
    i, j = 0, int((labels != labels[0]).argmax())

    def swap(y):
        y[i], y[j] = y[j], y[i]
        return y

    rewrite_column(train[0], "label", swap)
    after = split_fingerprint(str(train[0]), "data.train")[0]
    assert after[:4] == before[:4]  # same size, rows and footer: the old rule saw no change
    one_line_error(cli("run", "--resume", str(run)), str(run), train[0].name, "changed",
                   "--allow data")


# --------------------------------------------- 11. every process's runtime counts in the plan


def test_plan_and_run_count_each_process_runtime(cli, tiny, tmp_path: Path):  # noqa: F811
    root, recipe = tiny
    # the tables and network take a few KiB: 512 MiB per rank "fit" until the runtime counts
    result = cli("plan", str(recipe), "--world-size", "2", "--host-memory", "512MiB")
    one_line_error(result, str(recipe), "2 processes do not fit", "runtime", "512.0 MiB")
    result = cli("plan", str(recipe), "--world-size", "2", "--host-memory", "2GiB")
    assert result.returncode == 0 and "runtime per process: 1.0 GiB" in result.stdout
    # 1024 ranks on one machine need 1 TiB: refused before any rank starts
    wide = variant(root, "np1024", **{"batch_size: 256": "batch_size: 1024"})
    result = cli("run", str(wide), "--np", "1024", "--run-dir", str(tmp_path / "run"))
    one_line_error(result, str(wide), "1024 processes do not fit", "runtime")
    assert not (tmp_path / "run").exists()
