"""The checkpoint commands as a user runs them: exit codes and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embtrain.checkpoint import CheckpointManager
from tests.support.engines import FakeModel, make_engine, train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("cli") / "run"
    engine, model = make_engine(), FakeModel()
    manager = CheckpointManager(run, keep=5, recipe_fingerprint="fp-cli")
    for step in (3, 6, 9):
        train(engine, model, step - 3, 3)
        manager.save(step, engine, model, (0, step))
    return run


def _one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_dump_incremental_apply(cli, run_dir: Path, tmp_path: Path):
    result = cli("dump", str(run_dir), str(tmp_path / "d3"), "--step", "3", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["step"] == 3
    assert cli("dump", str(run_dir), str(tmp_path / "d9")).returncode == 0
    result = cli(
        "incremental-export", str(run_dir), str(tmp_path / "i6"), "--since", "3", "--step", "6"
    )
    assert result.returncode == 0 and "changed rows" in result.stdout, result.stderr
    assert (
        cli("incremental-export", str(run_dir), str(tmp_path / "i9"), "--since", "6").returncode
        == 0
    )
    result = cli(
        "apply-increments",
        str(tmp_path / "d3"),
        str(tmp_path / "i6"),
        str(tmp_path / "i9"),
        "--out",
        str(tmp_path / "a9"),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    for p in (tmp_path / "d9").rglob("*.npy"):
        assert (tmp_path / "a9" / p.relative_to(tmp_path / "d9")).read_bytes() == p.read_bytes()
    result = cli(
        "apply-increments",
        str(tmp_path / "d3"),
        str(tmp_path / "i9"),
        "--out",
        str(tmp_path / "bad"),
    )
    _one_line_error(result, str(tmp_path / "i9"), "applies to the state at step 6", "step 3")
    assert not (tmp_path / "bad").exists()
    result = cli("dump", str(run_dir), str(tmp_path / "pq"), "--format", "parquet")
    assert result.returncode == 0 and (tmp_path / "pq/tables/item.parquet").is_file()


def test_corrupt_checkpoint_exit_2_one_line(cli, tmp_path: Path):
    engine = make_engine()
    train(engine, None, 0, 2)
    run = tmp_path / "run"
    CheckpointManager(run, 1, "fp").save(2, engine, None, (0, 2))
    ck = run / "checkpoints/step-00000002"
    acc = ck / "tables/user/accumulator.npy"
    data = bytearray(acc.read_bytes())
    data[len(data) // 2] ^= 0x04
    acc.write_bytes(bytes(data))
    _one_line_error(cli("dump", str(run), str(tmp_path / "o1")), str(acc), "checksum mismatch")
    acc.unlink()
    _one_line_error(cli("dump", str(run), str(tmp_path / "o2")), str(acc), "missing")
    manifest = ck / "manifest.json"
    manifest.write_text(manifest.read_text()[:100])
    # A step directory with a broken manifest is still taken as a checkpoint (it was renamed
    # into place complete): loading it must fail clearly, naming the manifest.
    _one_line_error(cli("dump", str(ck), str(tmp_path / "o3")), str(manifest), "invalid manifest")
    assert not any((tmp_path / f"o{i}").exists() for i in (1, 2, 3))


def test_no_checkpoint_and_bad_arguments(cli, tmp_path: Path):
    (tmp_path / "empty").mkdir()
    _one_line_error(
        cli("dump", str(tmp_path / "empty"), str(tmp_path / "o")), "no complete checkpoint"
    )
    result = cli("dump", str(tmp_path / "empty"), str(tmp_path / "o"), "--format", "csv")
    _one_line_error(result, "--format")


def test_load_check_lists_differences(cli, tmp_path: Path):
    from embtrain.checkpoint import dump
    from embtrain.recipe import recipe_fingerprint, recipe_to_yaml
    from tests.support.engines import engine_for
    from tests.support.engines import warm_start_recipe as recipe

    r = recipe()
    engine = engine_for(r)
    train(engine, None, 0, 2)
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text(recipe_to_yaml(r))
    CheckpointManager(run, 1, recipe_fingerprint(r)).save(2, engine, FakeModel(), (0, 2))
    dump(run, tmp_path / "export")
    new = recipe(user_dim=16, lr=0.5)
    (tmp_path / "new.yaml").write_text(recipe_to_yaml(new))
    result = cli(
        "load", str(tmp_path / "export"), "--recipe", str(tmp_path / "new.yaml"), "--check"
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert "2 difference(s)" in lines[0] or "difference(s)" in lines[0]
    assert any("table user: dim 8 in the export, 16 in the recipe" in line for line in lines)
    assert any("--allow lr" in line for line in lines)
    same = recipe(lr=0.5)
    (tmp_path / "same.yaml").write_text(recipe_to_yaml(same))
    result = cli(
        "load",
        str(tmp_path / "export"),
        "--recipe",
        str(tmp_path / "same.yaml"),
        "--check",
        "--allow",
        "lr",
    )
    assert result.returncode == 0, result.stderr
    assert "fits" in result.stdout
