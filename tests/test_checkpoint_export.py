"""Dump (npy, Parquet), incremental export + apply-increments, warm start, and their CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embtrain.checkpoint import (
    CheckpointError,
    CheckpointManager,
    apply_increments,
    dump,
    incremental_export,
    open_bundle,
    read_table,
    warm_start,
)
from tests.support.engines import FakeModel, engine_for, make_engine, tables_of, train
from tests.support.engines import warm_start_recipe as recipe


def array_files(d: Path) -> dict[str, bytes]:
    """Every .npy and state.json of a bundle, by relative path."""
    return {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and (p.suffix == ".npy" or p.name == "state.json")
    }


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with checkpoints at steps 4, 8, 12, 16 (all kept) and a recipe.yaml."""
    run_dir = tmp_path_factory.mktemp("inc") / "run"
    engine, model = make_engine("adam"), FakeModel()
    manager = CheckpointManager(run_dir, keep=10, recipe_fingerprint="fp-inc", fsync=False)
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.yaml").write_text("name: inc\n")
    for step in (4, 8, 12, 16):
        train(engine, model, step - 4, 4)
        manager.save(step, engine, model, (0, step))
    return run_dir


# ------------------------------------------------------------------------------ dump


def test_dump_npy_is_byte_identical_and_self_describing(history: Path, tmp_path: Path):
    out = tmp_path / "export"
    manifest = dump(history, out)
    ck = history / "checkpoints/step-00000016"
    assert array_files(out) == array_files(ck)
    assert (out / "recipe.yaml").read_text() == "name: inc\n"
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["kind"] == "export" and manifest["array_format"] == "npy"
    assert manifest["step"] == 16 and manifest["recipe_fingerprint"] == "fp-inc"
    assert manifest["tables"]["item"] == {
        "rows": 200,
        "dim": 4,
        "dtype": "float32",
        "slots": {"m": [4], "v": [4]},
    }
    ck_fp = json.loads((ck / "manifest.json").read_text())["content_fingerprint"]
    assert manifest["content_fingerprint"] == ck_fp == manifest["source"]["content_fingerprint"]
    assert {f["path"] for f in manifest["files"]} >= {
        "tables/user/values.npy",
        "tables/user/m.npy",
        "dense/weights-000.npy",
        "recipe.yaml",
    }
    with pytest.raises(CheckpointError, match="already exists"):
        dump(history, out)


def test_dump_step_and_parquet(history: Path, tmp_path: Path):
    import pyarrow.parquet as pq

    manifest = dump(history, tmp_path / "pq", step=8, array_format="parquet")
    assert manifest["step"] == 8 and manifest["array_format"] == "parquet"
    table = pq.read_table(tmp_path / "pq/tables/item.parquet")
    assert table.column_names == ["key", "values", "m", "v", "update_count", "last_step"]
    assert str(table.schema.field("values").type) == "fixed_size_list<element: float>[4]"
    ck = open_bundle(history / "checkpoints/step-00000008")
    exp = open_bundle(tmp_path / "pq")
    for name in ("user", "item", "cat"):
        a, b = read_table(ck, name), read_table(exp, name)
        for x, y in [
            (a.keys, b.keys),
            (a.values, b.values),
            (a.slots["v"], b.slots["v"]),
            (a.update_count, b.update_count),
            (a.last_step, b.last_step),
        ]:
            assert x.dtype == y.dtype and np.array_equal(x, y)
    with pytest.raises(CheckpointError, match="no checkpoint at step 7"):
        dump(history, tmp_path / "none", step=7)


def test_dump_refuses_a_corrupt_checkpoint(tmp_path: Path):
    engine = make_engine()
    train(engine, None, 0, 2)
    CheckpointManager(tmp_path / "run", 1, "fp").save(2, engine, None, (0, 2))
    values = tmp_path / "run/checkpoints/step-00000002/tables/item/values.npy"
    data = bytearray(values.read_bytes())
    data[-1] ^= 0x10
    values.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch") as err:
        dump(tmp_path / "run", tmp_path / "out")
    assert str(values) in str(err.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))


# ----------------------------------------------------------------------- increments


def test_base_plus_increments_equals_later_dump(history: Path, tmp_path: Path):
    dump(history, tmp_path / "base", step=4)
    incs = []
    for since, step in ((4, 8), (8, 12), (12, None)):
        out = tmp_path / f"inc-{since}"
        manifest = incremental_export(history, out, str(since), step=step)
        assert manifest["kind"] == "increment" and manifest["base"]["step"] == since
        changed = np.load(out / "tables/item/last_step.npy")
        assert changed.size and (changed >= since).all()
        assert np.load(out / "tables/item/removed_keys.npy").size == 0
        incs.append(out)
    later = tmp_path / "later"
    dump(history, later)
    applied = apply_increments(tmp_path / "base", incs, tmp_path / "applied")
    assert array_files(tmp_path / "applied") == array_files(later)
    assert (
        applied["content_fingerprint"]
        == json.loads((later / "manifest.json").read_text())["content_fingerprint"]
    )
    # One increment over the whole span gives the same result.
    incremental_export(history, tmp_path / "inc-4-16", "4")
    apply_increments(tmp_path / "base", [tmp_path / "inc-4-16"], tmp_path / "applied2")
    assert array_files(tmp_path / "applied2") == array_files(later)


def test_increment_rows_are_exactly_the_changed_ones(history: Path, tmp_path: Path):
    incremental_export(history, tmp_path / "inc", "8", step=12)
    old = open_bundle(history / "checkpoints/step-00000008")
    new = open_bundle(history / "checkpoints/step-00000012")
    inc = open_bundle(tmp_path / "inc")
    for name in ("user", "item", "cat"):
        a, b, d = read_table(old, name), read_table(new, name), read_table(inc, name)
        differs = (a.values != b.values).any(axis=1) | (a.update_count != b.update_count)
        assert np.array_equal(np.flatnonzero(differs), d.keys)


def test_since_time_maps_to_the_newest_checkpoint_before_it(history: Path, tmp_path: Path):
    m8 = json.loads((history / "checkpoints/step-00000008/manifest.json").read_text())
    manifest = incremental_export(history, tmp_path / "t", m8["time_utc"])
    assert manifest["base"]["step"] == 8
    with pytest.raises(CheckpointError, match="no checkpoint was complete"):
        incremental_export(history, tmp_path / "t0", "2000-01-01T00:00:00Z")
    with pytest.raises(CheckpointError, match="no checkpoint at step 5"):
        incremental_export(history, tmp_path / "t5", "5")
    with pytest.raises(CheckpointError, match="expected a step or an ISO-8601 time"):
        incremental_export(history, tmp_path / "tx", "yesterday")


def test_increment_applied_to_the_wrong_base_is_refused(history: Path, tmp_path: Path):
    dump(history, tmp_path / "base4", step=4)
    incremental_export(history, tmp_path / "i8", "4", step=8)
    incremental_export(history, tmp_path / "i12", "8", step=12)
    with pytest.raises(CheckpointError, match="applies to the state at step 8") as err:
        apply_increments(tmp_path / "base4", [tmp_path / "i12"], tmp_path / "out1")
    assert "step 4" in str(err.value)
    with pytest.raises(CheckpointError, match="in order"):
        apply_increments(tmp_path / "base4", [tmp_path / "i12", tmp_path / "i8"], tmp_path / "out2")
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()


def test_increments_survive_pruned_bases(tmp_path: Path):
    """keep=1: the base checkpoint is gone, its fingerprint lives on in the history."""
    run_dir = tmp_path / "run"
    engine = make_engine()
    manager = CheckpointManager(run_dir, keep=1, recipe_fingerprint="fp")
    train(engine, None, 0, 3)
    manager.save(3, engine, None, (0, 3))
    dump(run_dir, tmp_path / "base")
    train(engine, None, 3, 3)
    manager.save(6, engine, None, (0, 6))
    incremental_export(run_dir, tmp_path / "inc", "3")
    dump(run_dir, tmp_path / "later")
    apply_increments(tmp_path / "base", [tmp_path / "inc"], tmp_path / "applied")
    assert array_files(tmp_path / "applied") == array_files(tmp_path / "later")


# ----------------------------------------------------------------------- warm start


@pytest.fixture
def export(tmp_path: Path) -> Path:
    from embtrain.recipe import recipe_fingerprint, recipe_to_yaml

    r = recipe()
    engine, model = engine_for(r), FakeModel()
    train(engine, model, 0, 5)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "recipe.yaml").write_text(recipe_to_yaml(r))
    CheckpointManager(run_dir, 1, recipe_fingerprint(r)).save(5, engine, model, (0, 5))
    dump(run_dir, tmp_path / "export")
    return tmp_path / "export"


def test_warm_start_loads_tables_and_rebases_last_step(export: Path):
    r = recipe()
    engine, model = engine_for(r), FakeModel(seed=4)
    result = warm_start(engine, model, export, r)
    assert result.step == 5 and result.dense_weights and result.dense_optimizer
    saved = open_bundle(export)
    for name in ("user", "item", "cat"):
        want, got = read_table(saved, name), engine.export_table(name)
        assert np.array_equal(want.values, got.values)
        assert np.array_equal(want.slots["accumulator"], got.slots["accumulator"])
        assert np.array_equal(want.update_count, got.update_count)
        assert np.array_equal(np.where(want.last_step >= 0, want.last_step - 5, -1), got.last_step)
    assert (np.load(export / "dense/weights-000.npy") == model.get_weights()[0]).all()


def test_warm_start_lists_every_difference(export: Path):
    r = recipe(user_dim=16, item_rows=300, sparse="adam", lr=0.1, steps=99, cat=False)
    engine = make_engine()
    before = tables_of(engine)
    with pytest.raises(CheckpointError) as err:
        warm_start(engine, FakeModel(), export, r)
    lines = str(err.value).splitlines()
    text = str(err.value)
    assert "does not fit" in lines[0]
    assert "table user: dim 8 in the export, 16 in the recipe" in text
    assert "table item: rows 200 in the export, 300 in the recipe" in text
    assert "table cat: in the export but not in the recipe" in text
    assert "optimizer slots" in text and "adam" in text
    assert "train.steps" in text and "--allow steps" in text
    assert all(line.startswith(str(export)) for line in lines)
    after = tables_of(engine)
    assert all(np.array_equal(before[t][k], after[t][k]) for t in before for k in before[t])


def test_warm_start_allows_compatible_changes(export: Path):
    r = recipe(lr=0.2, steps=50)
    with pytest.raises(CheckpointError, match="--allow lr") as err:
        warm_start(engine_for(r), FakeModel(), export, r)
    assert "--allow steps" in str(err.value)
    result = warm_start(engine_for(r), FakeModel(), export, r, allow="lr,steps")
    assert any("optimizer.sparse.lr" in a for a in result.allowed)
    with pytest.raises(CheckpointError, match="unknown bogus"):
        warm_start(engine_for(r), FakeModel(), export, r, allow="lr,bogus")
