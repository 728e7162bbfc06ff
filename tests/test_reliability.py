"""The promises of docs/RELIABILITY.md, one test (or a few) per promise.

Each test reproduces a way a user could lose work or get a traceback (issue 21) and checks
the refusal: one line on stderr naming the file, field or column, exit code 2, nothing
written earlier lost.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from embtrain.checkpoint import CheckpointManager
from tests.support.engines import FakeModel, make_engine, train
from tests.support.tiny import TINY, one_line_error, rewrite_column, variant

SHM = Path("/dev/shm")


# ------------------------------------------------------------ 1. exports across file systems


@pytest.fixture
def other_fs(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on another file system than ``tmp_path`` (tmpfs /dev/shm)."""
    if not SHM.is_dir() or os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the temporary directory")
    path = SHM / f"embtrain-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_dump_increments_and_apply_across_file_systems(cli, tmp_path: Path, other_fs: Path):
    run = tmp_path / "run"
    engine, model = make_engine(), FakeModel()
    manager = CheckpointManager(run, keep=5, recipe_fingerprint="fp-xfs")
    for step in (3, 6):
        train(engine, model, step - 3, 3)
        manager.save(step, engine, model, (0, step))
    result = cli("dump", str(run), str(other_fs / "d3"), "--step", "3")
    assert result.returncode == 0, result.stderr
    result = cli("dump", str(run), str(other_fs / "d6"))
    assert result.returncode == 0, result.stderr
    result = cli("incremental-export", str(run), str(other_fs / "i6"), "--since", "3")
    assert result.returncode == 0, result.stderr
    # and back: base and increment on tmpfs, the result on the disk
    result = cli("apply-increments", str(other_fs / "d3"), str(other_fs / "i6"),
                 "--out", str(tmp_path / "a6"))
    assert result.returncode == 0, result.stderr
    for p in (other_fs / "d6").rglob("*.npy"):
        assert (tmp_path / "a6" / p.relative_to(other_fs / "d6")).read_bytes() == p.read_bytes()
    # the exports are complete and verified: a second dump of the tmpfs export reads them back
    from embtrain.checkpoint import open_bundle, verify_bundle

    verify_bundle(open_bundle(other_fs / "d6"))


def test_copy_fd_streams_when_the_kernel_cannot(tmp_path: Path, other_fs: Path):
    from embtrain.checkpoint.bundle_write import copy_fd

    data = os.urandom(3 * (1 << 20) + 17)
    (tmp_path / "src").write_bytes(data)
    src = os.open(tmp_path / "src", os.O_RDONLY)
    dst = os.open(other_fs / "dst", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        assert copy_fd(src, dst, len(data)) == len(data)
    finally:
        os.close(src)
        os.close(dst)
    assert (other_fs / "dst").read_bytes() == data


# ---------------------------------------------------------------- 2. labels outside [0, 1]


@pytest.mark.parametrize("bad", [2.0, -1.0])
def test_train_labels_outside_0_1_name_file_column_row_value(tiny, bad: float):
    from embtrain.data import BatchReader
    from embtrain.errors import DataError
    from embtrain.recipe import load_recipe

    root, _ = tiny
    recipe = variant(root, f"label{int(bad)}")
    first = sorted((recipe.parent / f"data-label{int(bad)}" / "train").glob("*.parquet"))[0]

    def change(y):
        y[7] = bad
        return y

    rewrite_column(first, "label", change)
    with pytest.raises(DataError) as info:
        for _ in BatchReader(load_recipe(recipe), "train", prefetch=0):
            pass
    message = str(info.value)
    for part in (str(first), "'label'", "row 7", f"value {int(bad)}", "[0, 1]"):
        assert part in message, (part, message)


def test_eval_labels_outside_0_1_stop_the_run_with_exit_2(cli, tiny):
    root, _ = tiny
    recipe = variant(root, "label3")
    for path in (recipe.parent / "data-label3" / "eval").glob("*.parquet"):
        rewrite_column(path, "label", lambda y: y * 0 + 3)
    result = cli("run", str(recipe), "--run-dir", str(root / "run-label3"))
    one_line_error(result, "eval", "'label'", "value 3", "outside [0, 1]")


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run directory (but the lock file) by relative path."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ------------------------------------------------------------ 3. one process per run directory


def test_run_dir_lock_is_exclusive_and_released(tmp_path: Path):
    from embtrain.train.rundir_lock import RunDirBusy, lock_run_dir

    first = lock_run_dir(tmp_path)
    with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
        lock_run_dir(tmp_path)
    first.release()
    again = lock_run_dir(tmp_path)
    again.release()


def test_stale_lock_of_a_dead_process_is_taken_over(cli, tmp_path: Path):
    import subprocess
    import sys

    # a process that takes the lock and dies without releasing it (kill -9)
    code = ("import sys, time; from embtrain.train.rundir_lock import lock_run_dir; "
            "held = lock_run_dir(sys.argv[1]); print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        from embtrain.train.rundir_lock import RunDirBusy, lock_run_dir

        with pytest.raises(RunDirBusy, match=f"pid {proc.pid}"):
            lock_run_dir(tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert f"pid {proc.pid}" in (tmp_path / ".lock").read_text()  # left behind
    lock = lock_run_dir(tmp_path)
    assert lock.stale_owner is not None and f"pid {proc.pid}" in lock.stale_owner
    lock.release()


def test_second_resume_of_a_busy_run_dir_is_refused_and_changes_nothing(cli, tiny_run: Path,
                                                                        tmp_path: Path):
    from embtrain.train.rundir_lock import lock_run_dir

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = snapshot(run)
    lock = lock_run_dir(run)  # this test process trains there, as far as embtrain can tell
    try:
        result = cli("run", "--resume", str(run), "--from-step", "2")
        one_line_error(result, str(run), "another embtrain process", f"pid {os.getpid()}")
    finally:
        lock.release()
    assert snapshot(run) == before


# ------------------------------------------- 8. validate refuses what run would crash on


@pytest.mark.parametrize(("old", "new", "where", "why"), [
    ("dim: 4,", "dim: true,", "tables[0].dim", "expected an integer, got the boolean true"),
    ("dim: 4,", 'dim: "4",', "tables[0].dim", "got the string '4'; write numbers without quotes"),
    ("rows: 100}", "rows: 1e29}", "tables[0].rows", "less than or equal to 281474976710656"),
    ("seed: 1,", "seed: -1,", "train.seed", "greater than or equal to 0"),
    ("seed: 1,", f"seed: {2**70},", "train.seed", "less than or equal to 4294967295"),
    ("lr: 0.1}", 'lr: "0.1"}', "optimizer.sparse.lr", "got the string '0.1'"),
    ("steps: 6,", "steps: 6.5,", "train.steps", "got 6.5, which is not a whole number"),
    ("lr: 0.1}", "lr: .inf}", "optimizer.sparse.lr", "finite number"),
])
def test_validate_is_strict_and_bounded(cli, tmp_path: Path, old: str, new: str, where: str,
                                        why: str):
    text = TINY.format(data=tmp_path)
    assert old in text
    (tmp_path / "bad.yaml").write_text(text.replace(old, new, 1))
    for command in (("validate",), ("plan", "--device-memory", "none")):
        result = cli(*command, str(tmp_path / "bad.yaml"))
        line = one_line_error(result, f"{tmp_path / 'bad.yaml'}:", f": {where}: ", why)
        assert line.split(":")[1].isdigit(), line  # file:line:col


def test_an_exponent_without_a_dot_is_a_number(tmp_path: Path):
    from embtrain.recipe import parse_recipe_text

    recipe = parse_recipe_text(TINY.format(data=tmp_path).replace("lr: 0.1}", "lr: 1e-1}"))
    assert recipe.optimizer.sparse.lr == 0.1


def test_seed_overrides_are_checked_like_the_recipe(cli, tiny, tmp_path: Path):
    _, recipe = tiny
    for seed in ("-1", str(2**70)):
        result = cli("run", str(recipe), "--run-dir", str(tmp_path / "r"), "--seed", seed)
        one_line_error(result, "--seed", seed, "[0, 4294967295]")
        result = cli("load", str(tmp_path), "--recipe", str(recipe), "--seed", seed)
        one_line_error(result, "--seed", seed)
    assert not (tmp_path / "r").exists()
    for option, value in (("--rows", "0"), ("--files", "-3"), ("--seed", str(2**70)),
                          ("--alpha", "nan")):
        result = cli("gen-data", "--recipe", str(recipe), "--out", str(tmp_path / "g"),
                     option, value)
        one_line_error(result, option, value)
    assert not (tmp_path / "g").exists()


# ------------------------------------------------------------------ 9. recipes not in UTF-8


def test_recipe_not_utf8_is_one_line_and_other_files_still_checked(cli, tmp_path: Path):
    text = TINY.format(data=tmp_path)
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes(text.replace("name: tiny", "name: tiny  # caf\u00e9").encode("latin-1"))
    other = tmp_path / "other.yaml"
    other.write_text(text.replace("dim: 4,", "dim: 0,"))
    result = cli("validate", str(latin), str(other))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(f"{latin}:3:") and "not UTF-8" in lines[0] and "0xe9" in lines[0]
    assert lines[1].startswith(f"{other}:") and "tables[0].dim" in lines[1]
    one_line_error(cli("run", str(latin), "--run-dir", str(tmp_path / "r")), "not UTF-8")


# ------------------------------------------------------ 10. file-system errors: one line each


@pytest.mark.slow
def test_run_dir_that_is_a_file_or_under_a_file(cli, tiny, tmp_path: Path):
    _, recipe = tiny
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    for run_dir in (a_file, a_file / "run"):
        result = cli("run", str(recipe), "--run-dir", str(run_dir))
        one_line_error(result, str(a_file), "Not a directory", code=1)
    assert a_file.read_text() == "not a directory\n"


def test_dump_under_a_file(cli, tiny_run: Path, tmp_path: Path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out in (a_file / "out", a_file / "deeper" / "out"):
        one_line_error(cli("dump", str(tiny_run), str(out)), str(out), "not written",
                       "Not a directory", code=1)
    assert a_file.read_text() == "x"


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nothing can be written in: a read-only tmpfs mount as root, else mode 0555."""
    import subprocess

    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                                 capture_output=True).returncode == 0
        if not mounted:
            pytest.skip("root, but cannot mount a read-only tmpfs here")
        try:
            yield path
        finally:
            subprocess.run(["umount", str(path)], check=True)
        return
    path.chmod(0o555)
    try:
        yield path
    finally:
        path.chmod(0o755)


@pytest.mark.slow
def test_read_only_targets(cli, tiny, tiny_run: Path, read_only_dir: Path):
    _, recipe = tiny
    result = cli("run", str(recipe), "--run-dir", str(read_only_dir / "run"))
    one_line_error(result, str(read_only_dir / "run"), code=1)
    result = cli("dump", str(tiny_run), str(read_only_dir / "out"))
    one_line_error(result, str(read_only_dir / "out"), "not written", code=1)
    result = cli("gen-data", "--recipe", str(recipe), "--out", str(read_only_dir / "data"),
                 "--rows", "10")
    one_line_error(result, str(read_only_dir / "data"), code=1)


@pytest.mark.slow
def test_disk_full_while_checkpointing_keeps_the_last_checkpoint(tiny, tmp_path: Path):
    """Writes beyond a file-size limit fail (EFBIG) as they would on a full disk (ENOSPC)."""
    import resource
    import subprocess
    import sys

    from embtrain.checkpoint import list_checkpoints, open_bundle, verify_bundle

    root, _ = tiny
    recipe = variant(root, "bigtable", **{"rows: 100}": "rows: 20000}"})
    run = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "embtrain", "run"]
    first = subprocess.run([*command, str(recipe), "--run-dir", str(run), "--max-steps", "4"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    before = snapshot(run / "checkpoints")

    def limit() -> None:  # values.npy of the 20000-row table is 320 kB
        resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))

    result = subprocess.run([*command, "--resume", str(run)], capture_output=True, text=True,
                            env=env, timeout=300, preexec_fn=limit)
    line = one_line_error(result, str(run / "checkpoints" / "step-00000006"), "not written",
                          "File too large", "step-00000004 is intact", "--resume", code=1)
    assert "Traceback" not in line
    assert [s for s, _ in list_checkpoints(run)] == [2, 4]
    assert snapshot(run / "checkpoints") == before
    verify_bundle(open_bundle(run / "checkpoints" / "step-00000004"))
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]


# ------------------------------------------------------------------------- 11. smaller ones


def test_diverging_run_is_one_line_with_step_and_hint(cli, tiny):
    root, _ = tiny
    recipe = variant(root, "diverge", **{"lr: 0.1}": "lr: 1e30}", "lr: 0.01}": "lr: 1e30}"})
    result = cli("run", str(recipe), "--run-dir", str(root / "run-diverge"))
    one_line_error(result, str(recipe), "diverged", "at step 2", "learning rates", code=1)


def forge(checkpoint: Path) -> None:
    """Swap a table's values for an array of another shape and fix its manifest entry only."""
    import hashlib
    import json

    import numpy as np

    values = checkpoint / "tables" / "user" / "values.npy"
    np.save(values, np.zeros((7, 4), np.float32))
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    data = values.read_bytes()
    for entry in manifest["files"]:
        if entry["path"] == "tables/user/values.npy":
            entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), shape=[7, 4])
            entry.pop("crc32", None)
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def test_forged_checkpoint_is_refused_by_resume_load_and_dump(cli, tiny, tiny_run: Path,
                                                              tmp_path: Path):
    _, recipe = tiny
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    checkpoint = run / "checkpoints" / "step-00000006"
    forge(checkpoint)
    manifest = str(checkpoint / "manifest.json")
    one_line_error(cli("dump", str(run), str(tmp_path / "out")), "content fingerprint")
    one_line_error(cli("run", "--resume", str(run)), manifest, "content fingerprint")
    one_line_error(cli("load", str(checkpoint), "--recipe", str(recipe), "--run-dir",
                       str(tmp_path / "new")), manifest, "content fingerprint")
    assert not (tmp_path / "new").exists()


def test_bundle_kind_messages_use_the_right_article(cli, tiny_run: Path, tmp_path: Path):
    result = cli("incremental-export", str(tiny_run), str(tmp_path / "inc"), "--since", "4")
    assert result.returncode == 0, result.stderr
    line = one_line_error(cli("dump", str(tmp_path / "inc"), str(tmp_path / "out")))
    assert "is an increment, expected a checkpoint or an export" in line, line


@pytest.mark.parametrize("existed", [False, True])
def test_run_failing_before_its_first_checkpoint_leaves_the_run_dir_reusable(cli, tiny,
                                                                            tmp_path: Path,
                                                                            existed: bool):
    root, _ = tiny
    recipe = variant(root, "late-bad-label",
                     **{"checkpoint: {every: 2, keep: 2}": "checkpoint: {keep: 2}"})
    last = sorted((recipe.parent / "data-late-bad-label" / "train").glob("*.parquet"))[-1]

    def change(y):
        y[-1] = 5
        return y

    rewrite_column(last, "label", change)
    run = tmp_path / "run"
    if existed:
        run.mkdir()
    result = cli("run", str(recipe), "--run-dir", str(run))
    one_line_error(result, str(last), "value 5")
    assert run.is_dir() == existed and (not existed or not any(run.iterdir()))


def test_ctrl_c_says_what_was_kept(tiny, tmp_path: Path):
    import signal
    import subprocess
    import sys
    import time

    root, _ = tiny
    recipe = variant(root, "long", **{"steps: 6,": "steps: 1000000,"})
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "embtrain", "run", str(recipe), "--run-dir",
                             str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        deadline = time.monotonic() + 240
        while not list((run / "checkpoints").glob("step-*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("step ")
             and not line.startswith("eval @")]
    # the graceful stop acknowledges the signal, then says what was kept and how to continue
    assert len(lines) == 2 and "Traceback" not in err, err[-2000:]
    assert lines[0].startswith("SIGINT: stopping after this step"), lines[0]
    assert "checkpoint written" in lines[1] and f"--resume {run}" in lines[1], lines[1]


# --------------------------------------------------------------------------- 12. engine edges


def test_read_slot_checks_the_row_range_like_read_rows():
    import numpy as np

    engine = make_engine()  # user (120 rows, dim 8) is first in its group; cat follows item
    for table, bad in (("user", -1), ("user", 120), ("cat", -1), ("item", 200)):
        with pytest.raises(IndexError, match="out of range"):
            engine.read_slot(table, "accumulator", np.array([0, bad]))
        with pytest.raises(IndexError, match="out of range"):
            engine.read_rows(table, np.array([bad]))
    assert engine.read_slot("cat", "accumulator", np.array([0, 6])).shape == (2, 4)


def test_failed_import_changes_nothing():
    import numpy as np

    from embtrain.embedding.engine import TableState

    engine = make_engine()
    train(engine, None, 0, 3)
    before = engine.export_table("item")
    n = before.keys.size
    bad_slot = TableState(keys=before.keys, values=np.ones((n, 4), np.float32),
                          slots={"accumulator": np.ones((n, 3), np.float32)},
                          update_count=None, last_step=None)
    unknown = TableState(keys=before.keys, values=np.ones((n, 4), np.float32),
                         slots={"momentum": np.ones((n, 4), np.float32)},
                         update_count=None, last_step=None)
    bad_meta = TableState(keys=before.keys, values=np.ones((n, 4), np.float32), slots={},
                          update_count=np.ones(n - 1, np.int64), last_step=None)
    for state in (bad_slot, unknown, bad_meta):
        with pytest.raises(ValueError, match="table 'item'"):
            engine.import_table("item", state)
        after = engine.export_table("item")
        assert np.array_equal(after.values, before.values)
        assert np.array_equal(after.slots["accumulator"], before.slots["accumulator"])


def test_the_job_keeps_only_a_window_of_losses(tiny, tmp_path: Path):
    from embtrain.recipe import load_recipe
    from embtrain.train import RunOptions, TrainJob

    _, recipe = tiny
    job = TrainJob(load_recipe(recipe), str(recipe),
                   RunOptions(run_dir=tmp_path / "run", tensorboard=False))
    summary = job.run()
    assert summary.steps == 6
    assert len(job._losses) == 2  # log_every, not 6


# ------------------------------------------------------- 4. gen-data does not overwrite data


def test_gen_data_refuses_a_non_empty_target_unless_overwrite(cli, tiny, tmp_path: Path):
    _, recipe = tiny
    out = tmp_path / "data"
    args = ("gen-data", "--recipe", str(recipe), "--out", str(out), "--eval-rows", "64")
    assert cli(*args, "--rows", "256", "--files", "3").returncode == 0
    before = snapshot(out)
    one_line_error(cli(*args, "--rows", "128", "--files", "1"), str(out), "not empty",
                   "--overwrite")
    assert snapshot(out) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    one_line_error(cli("gen-data", "--recipe", str(recipe), "--out", str(mine)), "not empty")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    result = cli(*args, "--rows", "128", "--files", "1", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (out / "train").iterdir()) == ["part-00000.parquet"]


# ---------------------------------------- 5. eval data checked before step 1, kept work after


def test_eval_glob_typo_or_corrupt_eval_file_stops_before_step_1(cli, tiny, tmp_path: Path):
    root, _ = tiny
    typo = variant(root, "eval-typo", **{"/eval/*.parquet": "/evl/*.parquet"})
    result = cli("run", str(typo), "--run-dir", str(tmp_path / "typo"))
    one_line_error(result, "data.eval", "no file matches", "/evl/*.parquet")
    recipe = variant(root, "eval-corrupt")
    bad = recipe.parent / "data-eval-corrupt" / "eval" / "part-00001.parquet"
    bad.write_bytes(b"PAR1" + os.urandom(200))
    result = cli("run", str(recipe), "--run-dir", str(tmp_path / "corrupt"))
    one_line_error(result, str(bad), "not a readable Parquet file")
    # refused before training: nothing was trained, nothing is left behind
    assert not (tmp_path / "typo").exists() and not (tmp_path / "corrupt").exists()


def test_failure_at_evaluation_time_checkpoints_the_trained_steps(cli, tiny, tmp_path: Path):
    from embtrain.checkpoint import list_checkpoints, open_bundle, verify_bundle

    root, _ = tiny
    recipe = variant(root, "eval-late-bad", **{"checkpoint: {every: 2, keep: 2}":
                                               "checkpoint: {every: 4, keep: 2}"})
    for path in (recipe.parent / "data-eval-late-bad" / "eval").glob("*.parquet"):
        rewrite_column(path, "label", lambda y: y * 0 + 3)  # read only when evaluating
    run = tmp_path / "run"
    one_line_error(cli("run", str(recipe), "--run-dir", str(run)), "value 3")
    assert [s for s, _ in list_checkpoints(run)] == [3]  # eval_every 3: the steps are kept
    verify_bundle(open_bundle(run / "checkpoints" / "step-00000003"))


def test_eval_split_without_rows_is_said(cli, tiny, tmp_path: Path):
    import pyarrow.parquet as pq

    root, _ = tiny
    recipe = variant(root, "eval-empty")
    for path in (recipe.parent / "data-eval-empty" / "eval").glob("*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.slice(0, 0), path)
    result = cli("run", str(recipe), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "data.eval: the 2 file(s) hold no rows" in result.stderr
    assert "every evaluation of this run is skipped" in result.stderr


# ------------------------------------------------------ 6. a finished run stays finished


def test_resuming_a_finished_run_changes_nothing(cli, tiny_run: Path, tmp_path: Path):
    import json

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = snapshot(run)
    result = cli("run", "--resume", str(run), "--json")
    assert result.returncode == 0, result.stderr
    assert "finished at step 6; nothing to resume" in result.stderr
    assert snapshot(run) == before
    stored = json.loads((run / "summary.json").read_text())
    assert json.loads(result.stdout[result.stdout.index("{"):]) == stored


def test_throughput_of_a_resumed_part_counts_its_own_samples(cli, tiny_run: Path,
                                                             tmp_path: Path):
    import json

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    result = cli("run", "--resume", str(run), "--from-step", "4", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["steps"] == 6
    samples = summary["samples_per_s"] * summary["seconds"]
    assert samples == pytest.approx(2 * 256, rel=1e-6), samples  # steps 5 and 6 only
    finals = [e for e in summary["evals"] if e["step"] == 6]
    assert len(finals) == 1


# ------------------------------------------------------------- 7. resume notices changed data


@pytest.mark.slow
def test_resume_refuses_changed_data_unless_allowed(cli, tiny, tmp_path: Path):
    root, _ = tiny
    recipe = variant(root, "fingerprint")
    run = tmp_path / "run"
    result = cli("run", str(recipe), "--run-dir", str(run), "--max-steps", "4")
    assert result.returncode == 0, result.stderr
    before = snapshot(run)
    train = recipe.parent / "data-fingerprint" / "train"
    removed = sorted(train.glob("*.parquet"))[-1]
    kept = removed.read_bytes()
    removed.unlink()
    result = cli("run", "--resume", str(run))
    one_line_error(result, str(run), "data.train", removed.name, "was removed",
                   "step-00000004", "--allow data")
    assert snapshot(run) == before
    removed.write_bytes(kept)
    rewrite_column(removed, "I1", lambda x: x[:] * 0)  # same rows, other values and size
    one_line_error(cli("run", "--resume", str(run)), "changed")
    result = cli("run", "--resume", str(run), "--allow", "data")
    assert result.returncode == 0, result.stderr
    assert "warning: data.train:" in result.stderr and "--allow data" in result.stderr
    one_line_error(cli("run", "--resume", str(run), "--allow", "lr"), "--allow", "only 'data'")


# ------------------------------------------------ the plan counts the dense network's memory


@pytest.mark.parametrize("model", [
    "{type: mlp, hidden: [8]}",
    "{type: mlp, hidden: [16, 8, 1]}",
    "{type: dlrm, bottom: [8, 4], top: [8, 1]}",
    "{type: dlrm, bottom: [8, 4], top: [8], interaction: cat}",
    "{type: dlrm, bottom: [4], top: [8, 1], self_interaction: true}",
    "{type: dcn_v2, cross_layers: 2, deep: [8]}",
    "{type: dcn_v2, cross_layers: 2, low_rank: 3, deep: [8, 4], structure: parallel}",
    "{type: deepfm, deep: [8, 4]}",
    "{type: wide_deep, deep: [8], wide_features: [user]}",
])
def test_dense_parameters_are_counted_exactly(tmp_path: Path, model: str):
    import numpy as np

    from embtrain.embedding import EmbeddingEngine
    from embtrain.embedding.from_recipe import (
        feature_configs,
        sparse_optimizer_config,
        table_configs,
    )
    from embtrain.models import build_model
    from embtrain.models.slots import feature_slots
    from embtrain.plan.dense import dense_shape
    from embtrain.recipe import parse_recipe_text

    text = TINY.format(data=tmp_path).replace("{type: mlp, hidden: [8]}", model)
    text = text.replace("  - {kind: categorical, name: user, column: user_id, table: user}",
                        "  - {kind: categorical, name: user, column: user_id, table: user}\n"
                        "  - {kind: categorical, name: pair, column: p, table: user, "
                        "hotness: 2, combiner: concat}"
                        if "dlrm" not in model and "deepfm" not in model else
                        "  - {kind: categorical, name: user, column: user_id, table: user}\n"
                        "  - {kind: categorical, name: item, column: i, table: user}")
    recipe = parse_recipe_text(text)
    engine = EmbeddingEngine(table_configs(recipe), feature_configs(recipe),
                             sparse_optimizer_config(recipe.optimizer.sparse), seed=0)
    network = build_model(recipe.model, num_dense=2, slots=feature_slots(recipe, engine.layout),
                          seed=0)
    real = sum(int(np.prod(w.shape)) for w in network.get_weights())
    assert dense_shape(recipe).parameters == real


def test_plan_refuses_a_dense_network_that_does_not_fit(cli, tmp_path: Path):
    text = TINY.format(data=tmp_path).replace("dim: 4,", "dim: 1000000,").replace(
        "batch_size: 256", "batch_size: 4096")
    (tmp_path / "wide.yaml").write_text(text)
    args = ("plan", str(tmp_path / "wide.yaml"), "--device-memory", "none", "--disk", "1TiB")
    one_line_error(cli(*args, "--host-memory", "8GiB"), "the dense network",
                   "activations of 4096 samples", "8.0 GiB of host memory")
    result = cli(*args, "--host-memory", "64GiB", "--json")
    assert result.returncode == 0, result.stderr
    import json

    plan = json.loads(result.stdout)
    dense = plan["dense"]
    assert dense["parameters"] == (2 + 1_000_000) * 8 + 8 + 8 + 1
    assert plan["ranks"][0]["memory"]["host"] == plan["ranks"][0]["bytes"] + dense["bytes"]


def test_command_line_errors_are_one_line(cli, tiny, tmp_path: Path):
    _, recipe = tiny
    one_line_error(cli("run", str(recipe), "--max-steps", "0"), "embtrain run:", "--max-steps",
                   "greater than or equal to 1", "--help")
    one_line_error(cli("run", str(recipe), "--bogus"), "No such option: --bogus")
    one_line_error(cli("plan", str(recipe), "--world-size", str(10**11)), "--world-size",
                   "65536")
    one_line_error(cli("plan", str(recipe), "--batch-size", str(10**25)), "--batch-size")
    one_line_error(cli("dump", str(tmp_path)), "Missing argument 'OUT'")
    result = cli("run", "--help")
    assert result.returncode == 0 and "--resume" in result.stdout
