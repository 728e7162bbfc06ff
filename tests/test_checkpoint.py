"""Checkpoints: format, atomic save, verified restore, corruption, pruning, kill during a write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from embtrain.checkpoint import (
    CheckpointError,
    CheckpointManager,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    open_bundle,
    rng_from_state,
    rng_state,
)
from embtrain.embedding import (
    EmbeddingEngine,
    FeatureConfig,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.errors import UserInputError
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from tests.support.checkpoint_delay import DELAY_ENV
from tests.support.engines import FakeModel, make_engine, tables_of, train

REPO = Path(__file__).resolve().parents[1]


def assert_same_tables(a: EmbeddingEngine, b: EmbeddingEngine) -> None:
    ta, tb = tables_of(a), tables_of(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].keys() == tb[name].keys()
        for k in ta[name]:
            assert ta[name][k].dtype == tb[name][k].dtype
            assert np.array_equal(ta[name][k], tb[name][k]), (name, k)


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, EmbeddingEngine, FakeModel, CheckpointManager]:
    """A run directory with checkpoints at steps 5 and 10 (keep 3)."""
    engine, model = make_engine(), FakeModel()
    manager = CheckpointManager(tmp_path / "run", keep=3, recipe_fingerprint="fp-test", fsync=False)
    train(engine, model, 0, 5)
    manager.save(5, engine, model, (0, 5), {"losses": [1.5]}, seed=0)
    train(engine, model, 5, 5)
    manager.save(10, engine, model, (1, 2), {"losses": [0.25, float("nan")]}, seed=0)
    return tmp_path / "run", engine, model, manager


# ----------------------------------------------------------------------------- format


def test_layout_and_manifest(run):
    run_dir, engine, _, _ = run
    ck = latest_checkpoint(run_dir)
    assert ck is not None and ck.name == "step-00000010"
    files = sorted(str(p.relative_to(ck)) for p in ck.rglob("*") if p.is_file())
    assert "manifest.json" in files and "state.json" in files
    for name in ("user", "item", "cat"):
        for stem in ("keys", "values", "accumulator", "update_count", "last_step"):
            assert f"tables/{name}/{stem}.npy" in files
    assert "dense/weights-000.npy" in files and "dense/optimizer-002.npy" in files
    manifest = json.loads((ck / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["kind"] == "checkpoint"
    assert manifest["recipe_fingerprint"] == "fp-test" and manifest["step"] == 10
    assert manifest["time_utc"].endswith("Z")
    assert manifest["tables"]["user"] == {
        "rows": 120,
        "dim": 8,
        "dtype": "float32",
        "slots": {"accumulator": [8]},
    }
    assert manifest["dense"]["weight_names"] == ["w", "b"]
    assert [h["step"] for h in manifest["history"]] == [5]
    entry = next(f for f in manifest["files"] if f["path"] == "tables/item/values.npy")
    assert entry["dtype"] == "float32" and entry["shape"] == [200, 4]
    assert entry["bytes"] == (ck / entry["path"]).stat().st_size
    # Plain .npy files any tool can read, without pickle.
    values = np.load(ck / "tables/item/values.npy", allow_pickle=False)
    assert np.array_equal(values, engine.export_table("item").values)
    assert not list(ck.parent.glob(".tmp-*"))


def test_load_checkpoint_returns_everything(run):
    run_dir, engine, model, _ = run
    ck = load_checkpoint(latest_checkpoint(run_dir))
    assert ck.step == 10
    for name, table in ck.tables.items():
        st = engine.export_table(name)
        assert np.array_equal(table.values, st.values)
        assert np.array_equal(table.slots["accumulator"], st.slots["accumulator"])
        assert np.array_equal(table.last_step, st.last_step)
    assert all(
        np.array_equal(a, b) for a, b in zip(ck.dense_weights, model.get_weights(), strict=True)
    )
    assert ck.state["reader"] == {"epoch": 1, "batch": 2}
    assert ck.state["extra"]["losses"][0] == 0.25 and np.isnan(ck.state["extra"]["losses"][1])


@pytest.mark.parametrize("kind", OPTIMIZER_NAMES)
def test_every_optimizer_round_trips(tmp_path: Path, kind: str):
    engine = make_engine(kind)
    train(engine, None, 0, 4)
    manager = CheckpointManager(tmp_path, keep=1, recipe_fingerprint="x")
    manager.save(4, engine, None, (0, 4))
    fresh = make_engine(kind, seed=7)
    state = CheckpointManager(tmp_path, keep=1, recipe_fingerprint="x").restore(fresh, None)
    assert state.step == 4
    assert_same_tables(engine, fresh)


# ---------------------------------------------------------------------- exact resume


def test_resume_continues_bit_for_bit(tmp_path: Path):
    """2N steps == N steps, checkpoint, restore into fresh objects, N more steps."""
    straight, straight_model = make_engine("adam"), FakeModel()
    losses = train(straight, straight_model, 0, 12)

    first, first_model = make_engine("adam"), FakeModel()
    head = train(first, first_model, 0, 6)
    rng = np.random.default_rng(42)
    rng.random(3)
    manager = CheckpointManager(tmp_path, keep=2, recipe_fingerprint="fp")
    manager.save(
        6, first, first_model, (0, 6), {"losses": head}, seed=0, rng={"shuffle": rng_state(rng)}
    )
    expected_draw = rng.random(4)
    del first, first_model

    resumed, resumed_model = make_engine("adam", seed=99), FakeModel(seed=99)
    state = CheckpointManager(tmp_path, keep=2, recipe_fingerprint="fp").restore(
        resumed, resumed_model
    )
    assert (state.step, state.epoch, state.batch) == (6, 0, 6)
    assert np.array_equal(rng_from_state(state.rng["shuffle"]).random(4), expected_draw)
    tail = train(resumed, resumed_model, state.step, 6)
    assert state.extra["losses"] + tail == losses
    assert_same_tables(straight, resumed)
    for a, b in zip(
        straight_model.get_weights() + straight_model.optimizer_state(),
        resumed_model.get_weights() + resumed_model.optimizer_state(),
        strict=True,
    ):
        assert np.array_equal(a, b)


def test_restore_refuses_other_recipe_and_shapes(run, tmp_path: Path):
    run_dir, _, _, _ = run
    with pytest.raises(CheckpointError, match="recipe"):
        CheckpointManager(run_dir, 3, "other-fp").restore(make_engine(), FakeModel())
    other = EmbeddingEngine(
        [TableConfig("user", 121, 8), TableConfig("item", 200, 5)],
        [FeatureConfig("user", "user"), FeatureConfig("item", "item")],
        SparseOptimizerConfig("adam", 0.05),
        seed=0,
    )
    with pytest.raises(CheckpointError) as err:
        CheckpointManager(run_dir, 3, "fp-test").restore(other, FakeModel())
    msg = str(err.value)
    assert "120 rows" in msg and "dim 4" in msg and "slots" in msg and "cat" in msg


# ------------------------------------------------------------------ keep and history


def test_prune_keeps_newest_and_ignores_temp_dirs(tmp_path: Path):
    engine = make_engine()
    manager = CheckpointManager(tmp_path, keep=2, recipe_fingerprint="fp")
    for step in (2, 4, 6, 8):
        train(engine, None, step - 2, 2)
        manager.save(step, engine, None, (0, step))
    assert [s for s, _ in list_checkpoints(tmp_path)] == [6, 8]
    history = json.loads((tmp_path / "checkpoints/step-00000008/manifest.json").read_text())[
        "history"
    ]
    assert [h["step"] for h in history] == [2, 4, 6]
    # A half-written newer checkpoint (temp dir, or a step dir without manifest) is not "latest".
    (tmp_path / "checkpoints/.tmp-step-00000010/tables").mkdir(parents=True)
    (tmp_path / "checkpoints/step-00000012").mkdir()
    assert latest_checkpoint(tmp_path).name == "step-00000008"
    manager.save(10, engine, None, (0, 10))
    assert not (tmp_path / "checkpoints/.tmp-step-00000010").exists()
    assert latest_checkpoint(tmp_path).name == "step-00000010"


def test_restore_older_step_supersedes_newer(run):
    run_dir, _, _, _ = run
    manager = CheckpointManager(run_dir, 3, "fp-test")
    state = manager.restore(make_engine(), FakeModel(), step=5)
    assert state.step == 5 and state.extra == {"losses": [1.5]}
    assert [s for s, _ in list_checkpoints(run_dir)] == [5]
    assert len(list((run_dir / "checkpoints").glob("step-00000010.superseded-*"))) == 1
    assert [h["step"] for h in manager.history] == [5]


# ------------------------------------------------------------------- corruption


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


ARRAY_FILES = [
    "tables/user/keys.npy",
    "tables/user/values.npy",
    "tables/item/accumulator.npy",
    "tables/cat/update_count.npy",
    "tables/cat/last_step.npy",
    "dense/weights-000.npy",
    "dense/optimizer-001.npy",
]


@pytest.mark.parametrize("rel", [*ARRAY_FILES, "state.json"])
def test_flipped_byte_is_refused_and_nothing_loaded(run, rel: str):
    run_dir, _, _, _ = run
    ck = latest_checkpoint(run_dir)
    size = (ck / rel).stat().st_size
    _flip(ck / rel, size - 3)
    engine, model = make_engine(seed=5), FakeModel(seed=5)
    before, before_w = tables_of(engine), model.get_weights()
    with pytest.raises(CheckpointError) as err:
        CheckpointManager(run_dir, 3, "fp-test").restore(engine, model)
    msg = str(err.value)
    assert "\n" not in msg and str(ck / rel) in msg and "checksum mismatch" in msg
    after = tables_of(engine)
    assert all(np.array_equal(before[t][k], after[t][k]) for t in before for k in before[t])
    assert all(np.array_equal(a, b) for a, b in zip(before_w, model.get_weights(), strict=True))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(ck)


def test_flipped_header_byte_is_refused(run):
    ck = latest_checkpoint(run[0])
    _flip(ck / "tables/item/values.npy", 20)  # inside the .npy header text
    with pytest.raises(CheckpointError, match=r"tables/item/values\.npy"):
        load_checkpoint(ck)


def test_missing_truncated_and_invalid(run):
    ck = latest_checkpoint(run[0])
    values = ck / "tables/user/values.npy"
    data = values.read_bytes()
    values.write_bytes(data[:-8])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as err:
        load_checkpoint(ck)
    assert str(values) in str(err.value)
    values.unlink()
    with pytest.raises(CheckpointError, match="missing") as err:
        load_checkpoint(ck)
    assert str(values) in str(err.value)
    manifest = ck / "manifest.json"
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])
    with pytest.raises(CheckpointError, match="invalid manifest") as err:
        load_checkpoint(ck)
    assert str(manifest) in str(err.value) and "\n" not in str(err.value)
    manifest.unlink()
    with pytest.raises(CheckpointError, match=r"manifest\.json: missing"):
        load_checkpoint(ck)
    assert issubclass(CheckpointError, UserInputError)


@pytest.mark.parametrize("bad", ["../outside.npy", "/etc/passwd", "tables/../../x.npy", "symlink"])
def test_manifest_paths_may_not_escape(run, tmp_path: Path, bad: str):
    ck = latest_checkpoint(run[0])
    manifest = json.loads((ck / "manifest.json").read_text())
    entry = next(f for f in manifest["files"] if f["path"] == "tables/user/values.npy")
    if bad == "symlink":
        outside = tmp_path / "outside.npy"
        outside.write_bytes((ck / entry["path"]).read_bytes())
        (ck / entry["path"]).unlink()
        (ck / entry["path"]).symlink_to(outside)
    else:
        entry["path"] = bad
    (ck / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="outside the directory") as err:
        open_bundle(ck)
    assert "\n" not in str(err.value)


def test_object_arrays_are_refused(run):
    ck = latest_checkpoint(run[0])
    rel = "tables/cat/keys.npy"
    np.save(ck / rel, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    manifest = json.loads((ck / "manifest.json").read_text())
    entry = next(f for f in manifest["files"] if f["path"] == rel)
    entry["bytes"] = (ck / rel).stat().st_size
    (ck / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"object arrays are refused|holds object"):
        load_checkpoint(ck)


# ---------------------------------------------------------------- kill during write

_WRITER = textwrap.dedent("""
    import os
    import sys
    sys.path.insert(0, {tests!r})
    from checkpoint_delay import install
    from tests.support.engines import FakeModel, make_engine, train
    install()
    from embtrain.checkpoint import CheckpointManager
    engine, model = make_engine(), FakeModel()
    manager = CheckpointManager({run!r}, keep=1, recipe_fingerprint="fp")
    train(engine, model, 0, 3)
    manager.save(3, engine, model, (0, 3))
    train(engine, model, 3, 3)
    os.environ[{env!r}] = "0.3"
    print("writing", flush=True)
    manager.save(6, engine, model, (0, 6))
    print("finished", flush=True)
""")


def test_sigkill_during_write_leaves_previous_checkpoint(tmp_path: Path):
    run_dir = tmp_path / "run"
    script = _WRITER.format(run=str(run_dir), env=DELAY_ENV, tests=str(REPO / "tests" / "support"))
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "NUMBA_NUM_THREADS": "1"},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "writing"
    tmp = run_dir / "checkpoints/.tmp-step-00000006"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
        tmp.exists() and any(p.is_file() for p in tmp.rglob("*"))
    ):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert tmp.exists() and not (tmp / "manifest.json").exists()
    assert latest_checkpoint(run_dir).name == "step-00000003"
    engine, model = make_engine(seed=3), FakeModel(seed=3)
    state = CheckpointManager(run_dir, 1, "fp").restore(engine, model)
    assert state.step == 3
    reference = make_engine()
    train(reference, FakeModel(), 0, 3)
    assert_same_tables(reference, engine)
    # The run goes on: the next save replaces the stale temporary directory.
    train(engine, model, 3, 3)
    CheckpointManager(run_dir, 1, "fp").save(6, engine, model, (0, 6))
    assert latest_checkpoint(run_dir).name == "step-00000006" and not tmp.exists()


def test_same_slot_names_other_shapes_are_refused_up_front(tmp_path: Path):
    """adagrad and rowwise_adagrad share the slot name 'accumulator' but not its shape."""
    engine = make_engine("adagrad")
    train(engine, None, 0, 2)
    CheckpointManager(tmp_path, 1, "x", fsync=False).save(2, engine, None, (0, 2))
    rowwise = make_engine("rowwise_adagrad")
    before = tables_of(rowwise)
    with pytest.raises(CheckpointError, match="optimizer slots"):
        CheckpointManager(tmp_path, 1, "x").restore(rowwise, None)
    after = tables_of(rowwise)
    assert all(np.array_equal(before[t][k], after[t][k]) for t in before for k in before[t])
