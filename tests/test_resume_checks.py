"""`embtrain run --resume` continues what was trained: a dynamic table's counters as if the
run had never stopped, and a data file rewritten since (two labels swapped) is noticed."""

from __future__ import annotations

from pathlib import Path

from tests.support.tiny import one_line_error, variant

# --------------------------------------------------------- 8. dynamic counters across resumes


def dynamic_records(run: Path) -> dict[int, dict]:
    from embtrain.train.metrics_log import read_metrics

    return {r["step"]: r["dynamic_tables"]["user"] for r in read_metrics(run)
            if r["kind"] == "train"}


def test_dynamic_table_counters_survive_resumes(cli, tiny, tmp_path: Path):
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


# ------------------------------------------- 2. a rewritten data file is not called unchanged


def test_resume_sees_two_swapped_labels(cli, tiny, tmp_path: Path):
    import pyarrow.parquet as pq

    from embtrain.data.fingerprint import split_fingerprint
    from tests.support.tiny import rewrite_column

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
