"""What `run`, `load --check` and `plan` refuse before they train to nonsense or run out of
memory: a diverging run (one line, the last good checkpoint kept), ids a static table cannot
hold, processes whose runtime does not fit."""

from __future__ import annotations

from pathlib import Path

from tests.support.tiny import one_line_error, variant

# ----------------------------------------------------------------------- 1. divergence


def test_sparse_lr_huge_diverges_instead_of_training_to_nonsense(cli, tiny):
    root, _ = tiny
    recipe = variant(root, "sparse-huge", **{"lr: 0.1}": "lr: 1e30}"})
    result = cli("run", str(recipe), "--run-dir", str(root / "run-sparse-huge"))
    one_line_error(result, str(recipe), "training diverged", "at step 2", "learning rates",
                   code=1)


def test_exploding_loss_keeps_the_last_good_checkpoint(cli, tiny):
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


# ------------------------------------------------- 9. load --check validates as load does


def test_load_check_refuses_what_load_refuses(cli, tiny, tmp_path: Path):
    from tests.support.tiny import rewrite_column

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


# --------------------------------------------- 11. every process's runtime counts in the plan


def test_plan_names_the_dense_backend_each_process_runs(cli, tiny):
    """`plan`'s runtime line names the library the recipe's dense network runs on."""
    root, _ = tiny
    recipe = variant(root, "jax-dense", **{"train: {steps: 6,": "train: {dense_backend: jax, steps: 6,"})
    result = cli("plan", str(recipe), "--world-size", "1")
    assert result.returncode == 0, result.stderr
    assert "(Python, JAX, numba kernels;" in result.stdout


def test_plan_and_run_count_each_process_runtime(cli, tiny, tmp_path: Path):
    root, recipe = tiny
    # the tables and network take a few KiB: 512 MiB per rank "fit" until the runtime counts
    result = cli("plan", str(recipe), "--world-size", "2", "--host-memory", "512MiB")
    one_line_error(result, str(recipe), "2 processes do not fit", "runtime", "512.0 MiB")
    result = cli("plan", str(recipe), "--world-size", "2", "--host-memory", "2GiB")
    assert result.returncode == 0 and "runtime per process: 1.0 GiB" in result.stdout
    from embtrain.comm.shm import available

    path = "collectives through shared memory" if available() else "Horovod over Gloo"
    assert f"(Python, TensorFlow, numba kernels, {path};" in result.stdout
    one = cli("plan", str(recipe), "--world-size", "1", "--host-memory", "2GiB")
    assert one.returncode == 0, one.stderr
    assert "runtime per process: 1.0 GiB (Python, TensorFlow, numba kernels; " in one.stdout
    assert "Horovod" not in one.stdout and "shared memory" not in one.stdout
    # 1024 ranks on one machine need 1 TiB: refused before any rank starts
    wide = variant(root, "np1024", **{"batch_size: 256": "batch_size: 1024"})
    result = cli("run", str(wide), "--np", "1024", "--run-dir", str(tmp_path / "run"))
    one_line_error(result, str(wide), "1024 processes do not fit", "runtime")
    assert not (tmp_path / "run").exists()
