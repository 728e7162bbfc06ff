"""Errors are one line, with the right exit code, and JSON when asked (issue 29, items 12-21).

Each test reproduces one item of the issue's "Errors" section on real files and a real
`embtrain` subprocess (several ranks through the real launcher where the item is about ranks).
docs/RELIABILITY.md lists these promises with their tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.runs import rank_pids, start_two_ranks
from tests.support.tiny import TINY, TWO, one_line_error, rewrite_column


def json_document(text: str) -> object:
    """The one JSON document ``text`` holds (strict: ``NaN`` and ``Infinity`` are refused)."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------- 18. counts and learning rates that lie


@pytest.mark.parametrize(("old", "new", "where", "why"), [
    ("rows: 100}", "rows: '1.0001K'}", "tables[0].rows", "not a whole count"),
    ("rows: 100}", "rows: 100.5}", "tables[0].rows", "not a whole count"),
    ("lr: 0.1}", "lr: 1e-320}", "optimizer.sparse.lr", "float32 range"),
    ("lr: 0.01}", "lr: 1.0e-39}", "optimizer.dense.lr", "float32 range"),
    ("lr: 0.1}", "lr: 0}", "optimizer.sparse.lr", "greater than 0"),
    ("lr: 0.1}", "lr: 1e39}", "optimizer.sparse.lr", "float32 range"),
])
def test_non_integral_rows_and_subnormal_lr_are_refused(tmp_path: Path, old: str, new: str,
                                                       where: str, why: str):
    from embtrain.errors import RecipeError
    from embtrain.recipe import parse_recipe_text

    text = TINY.format(data=tmp_path)
    assert old in text
    with pytest.raises(RecipeError) as info:
        parse_recipe_text(text.replace(old, new, 1), "r.yaml")
    assert len(info.value.lines) == 1, info.value.lines
    line = info.value.lines[0]
    assert line.startswith("r.yaml:") and f": {where}: " in line and why in line, line


def test_whole_counts_with_units_still_read(tmp_path: Path):
    from embtrain.recipe import parse_recipe_text

    text = TINY.format(data=tmp_path)
    recipe = parse_recipe_text(text.replace("rows: 100}", "rows: 1.5K}").replace(
        "lr: 0.1}", "lr: 1.0e-30}"))
    assert recipe.tables[0].rows == 1500 and recipe.optimizer.sparse.lr == 1e-30


# --------------------------------------------- 19. validate and plan refuse what run refuses


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_tables_validate(tmp_path: Path, dtype: str):
    from embtrain.recipe import parse_recipe_text

    text = TINY.format(data=tmp_path).replace(
        "rows: 100}", f"rows: 100, dtype: {dtype}, rounding: nearest, optimizer_state: table}}")
    table = parse_recipe_text(text, "r.yaml").tables[0]
    assert (table.dtype, table.rounding_mode, table.state_dtype) == (dtype, "nearest", dtype)


def test_rounding_on_a_float32_table_is_refused_in_one_line(cli, tmp_path: Path):
    bad = tmp_path / "half.yaml"
    bad.write_text(TINY.format(data=tmp_path).replace("rows: 100}", "rows: 100, rounding: nearest}"))
    for command in (("validate",), ("plan", "--device-memory", "none")):
        line = one_line_error(cli(*command, str(bad)), f"{bad}:", ": tables[0].rounding: ",
                              "float16/bfloat16 tables only")
        assert line.split(":")[1].isdigit(), line


# ------------------------------------------------------------- 21. YAML nested very deep


def test_yaml_nested_100000_deep_is_one_line_with_position(cli, tmp_path: Path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("version: 1\nname: " + "[" * 100_000 + "]" * 100_000 + "\n")
    line = one_line_error(cli("validate", str(deep)), f"{deep}:2:", "nested deeper than")
    assert "RecursionError" not in line and "internal error" not in line


# ------------------------------------------------- 12-14. ranks: one line, the right exit code


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recipe that trains (almost) forever on 2 ranks, over tiny generated data."""
    from tests.support.cli import run_cli

    root = tmp_path_factory.mktemp("two")
    recipe = root / "two.yaml"
    recipe.write_text(TWO.format(data=root / "data"))
    result = run_cli("gen-data", "--recipe", str(recipe), "--out", str(root / "data"),
                     "--rows", "1024", "--eval-rows", "256", "--files", "1")
    assert result.returncode == 0, result.stderr
    return recipe


def _start_two_ranks(recipe: Path, run_dir: Path):
    """`embtrain run RECIPE --np 2` in the background, returned once a checkpoint exists."""
    return start_two_ranks(recipe, run_dir)


def _rank(launcher: int, rank: int) -> int:
    pids = rank_pids(launcher, rank)
    assert len(pids) == 1, pids
    return pids[0]


@pytest.mark.distributed
def test_a_second_multi_rank_resume_and_a_killed_rank_are_one_line_each(cli, two: Path,
                                                                       tmp_path: Path):
    import os
    import signal

    run_dir = tmp_path / "run"
    proc = _start_two_ranks(two, run_dir)
    try:
        # 14. a second job on the same run directory: the lock's cause, exit 2, one line
        second = cli("run", "--resume", str(run_dir), "--np", "2", "--json")
        line = one_line_error(second, "rank 0", "another embtrain process", str(run_dir))
        assert "internal error" not in line
        assert json_document(second.stdout) == {"error": line, "exit_code": 2}  # 16.
        # 12. kill -9 of one rank: one line, which rank and how
        os.kill(_rank(proc.pid, 1), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("embtrain: rank 1 failed (killed by SIGKILL)"), lines
    assert "operations.cc" not in err and "internal error" not in err


@pytest.mark.distributed
def test_sigterm_to_one_rank_stops_the_job_gracefully_with_143(two: Path, tmp_path: Path):
    import os
    import signal

    run_dir = tmp_path / "run"
    proc = _start_two_ranks(two, run_dir)
    try:
        os.kill(_rank(proc.pid, 1), signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "failed" not in err and "internal error" not in err, err
    assert "stopped by a signal to another rank" in err, err
    assert "resumable" in out
    summary = __import__("json").loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] == "signal"
    assert (run_dir / "checkpoints" / f"step-{summary['steps']:08d}").is_dir()


# ----------------------------------------------------------------- 15. a host that is not


@pytest.mark.distributed
def test_unknown_host_is_one_line_exit_2(cli, two: Path, tmp_path: Path):
    result = cli("run", str(two), "--np", "2", "-H", "nonexistent-host:2", "--run-dir",
                 str(tmp_path / "run"))
    one_line_error(result, "nonexistent-host", "cannot resolve")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------- 16. JSON when asked, errors too


def test_every_command_with_json_prints_one_json_document_on_error(cli, tmp_path: Path):
    missing = tmp_path / "missing"
    half = tmp_path / "half.yaml"
    half.write_text(TINY.format(data=tmp_path).replace("rows: 100}", "rows: 100, rounding: nearest}"))
    cases = [
        ("run", str(missing / "r.yaml")),
        ("run", str(half), "--np", "2"),
        ("run", "--resume", str(missing)),
        ("plan", str(half)),
        ("dump", str(missing), str(tmp_path / "out")),
        ("load", str(missing), "--recipe", str(half)),
        ("gen-data", "--recipe", str(half), "--out", str(tmp_path / "g"), "--rows", "0"),
        ("bench", "--model", "nope"),
        ("incremental-export", str(missing), str(tmp_path / "inc")),
        ("apply-increments", str(missing), str(tmp_path / "inc")),
    ]
    for args in cases:
        result = cli(*args, "--json")
        assert result.returncode in (1, 2), (args, result.stderr)
        line = one_line_error(result, code=result.returncode)
        assert json_document(result.stdout) == {"error": line, "exit_code": result.returncode}, (
            args, result.stdout)


def test_one_class_eval_auc_is_null_with_the_reason(cli, two: Path, tmp_path: Path):
    data = tmp_path / "data"
    shutil.copytree(two.parent / "data", data)
    for path in (data / "eval").glob("*.parquet"):
        rewrite_column(path, "label", lambda y: y * 0)
    recipe = tmp_path / "one-class.yaml"
    recipe.write_text(two.read_text().replace(str(two.parent / "data"), str(data)).replace(
        "steps: 100000", "steps: 2"))
    run_dir = tmp_path / "run"
    result = cli("run", str(recipe), "--run-dir", str(run_dir), "--json")
    assert result.returncode == 0, result.stderr
    for doc in (json_document(result.stdout),
                json_document((run_dir / "summary.json").read_text())):
        last = doc["evals"][-1]
        assert last["auc"] is None, last
        assert "undefined" in last["auc_note"] and "one class" in last["auc_note"], last
        assert last["logloss"] > 0
    text = cli("run", str(recipe), "--run-dir", str(tmp_path / "run-text"))
    assert "eval AUC undefined (AUC is undefined: all 256 eval rows are negative" in " ".join(
        text.stdout.split()), text.stdout


# ------------------------------------------------ 20. paths: name what is wrong, exit 1


def test_a_dangling_symlink_or_a_file_in_the_way_is_named(cli, two: Path, tmp_path: Path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere" / "run")
    one_line_error(cli("run", str(two), "--run-dir", str(link), "--max-steps", "2"),
                   str(link), "symbolic link", str(tmp_path / "nowhere" / "run"),
                   "does not exist", code=1)
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    one_line_error(cli("schema", "--out", str(a_file / "schema.json")), str(a_file),
                   "is a file, not a directory", code=1)
    assert a_file.read_text() == "x"


@pytest.fixture
def read_only_run(cli, two: Path, tmp_path: Path):
    """A resumable run directory on a read-only file system (as root: a tmpfs remounted
    read-only; otherwise mode 0555, which root would ignore)."""
    import os
    import subprocess

    run = tmp_path / "run"
    result = cli("run", str(two), "--run-dir", str(run), "--max-steps", "2")
    assert result.returncode == 0, result.stderr
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        shutil.copytree(run, ro / "run")
        for path in (ro / "run", *(ro / "run").rglob("*")):
            if path.is_dir():
                path.chmod(0o555)
        yield ro / "run"
        for path in (ro / "run", *(ro / "run").rglob("*")):
            if path.is_dir():
                path.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(ro)],
                      capture_output=True).returncode != 0:
        pytest.skip("root, but cannot mount a tmpfs here")
    try:
        shutil.copytree(run, ro / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        yield ro / "run"
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_resume_of_a_read_only_run_dir_is_an_environment_failure(cli, read_only_run: Path):
    result = cli("run", "--resume", str(read_only_run), "--max-steps", "4")
    one_line_error(result, str(read_only_run), "cannot write", code=1)


# ----------------------------------------------- 17. tiers: the full disk and a damaged header

TIERED = """
version: 1
name: tfull
data: {{train: {data}/train/*.parquet, batch_size: 512}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
tables:
  - name: user
    dim: 16
    rows: 20000
    storage: [{{tier: host, budget: 128KiB}}, {{tier: disk, path: {store}}}]
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: 20, log_every: 10, seed: 1}}
"""


def test_disk_full_in_a_tiered_run_names_the_tier_file(cli, tmp_path: Path):
    """Writes beyond a file-size limit fail as they would on a full disk (see
    test_reliability's checkpoint case); the tier file fills first."""
    import os
    import resource
    import subprocess
    import sys

    store = tmp_path / "store"
    store.mkdir()
    recipe = tmp_path / "tiered.yaml"
    recipe.write_text(TIERED.format(data=tmp_path / "data", store=store))
    made = cli("gen-data", "--recipe", str(recipe), "--out", str(tmp_path / "data"), "--rows",
               "10240", "--eval-rows", "0", "--files", "1")
    assert made.returncode == 0, made.stderr

    def limit() -> None:  # the tier file outgrows 64 KiB after a few steps' evictions
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))

    result = subprocess.run(
        [sys.executable, "-m", "embtrain", "run", str(recipe), "--run-dir",
         str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, preexec_fn=limit)
    tier_file = next(store.glob("*.tier"))
    one_line_error(result, f"{tier_file}: ", "free some space", code=1)


def test_a_damaged_tier_file_header_says_what_to_do(tmp_path: Path):
    from embtrain.storage import RowFile, TierFileError
    from tests.support.storage import row_layout

    path = tmp_path / "t.tier"
    layout = row_layout()
    RowFile.create(path, layout, "run-1").close()
    raw = bytearray(path.read_bytes())
    raw[12:20] = b"\xff" * 8  # the header's JSON, after the tier-file mark
    path.write_bytes(bytes(raw))
    with pytest.raises(TierFileError) as info:
        RowFile.open(path, layout, "run-1")
    assert "header is damaged" in str(info.value) and "rebuilds" in str(info.value)
    RowFile.create(path, layout, "run-2").close()  # a run rebuilds it, as a damaged body
    RowFile.open(path, layout, "run-2").close()
    raw = bytearray(path.read_bytes())
    raw[0:4] = b"\x00\x01\x02\x03"  # the mark itself: it may not be a tier file at all
    path.write_bytes(bytes(raw))
    with pytest.raises(TierFileError) as info:
        RowFile.create(path, layout, "run-3")
    line = str(info.value)
    assert "\n" not in line and str(path) in line
    assert "delete it and run again" in line and "rebuilt from the checkpoint" in line
