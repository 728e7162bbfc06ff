"""Checkpoints, restores, dumps and increments of tiered tables stream: a table is moved in
key-ordered chunks, never whole in memory, and the files are byte for byte those of the
all-in-memory run (same manifest entries, same content fingerprint)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embtrain.checkpoint import CheckpointManager, dump, incremental_export, open_bundle
from embtrain.checkpoint import layout as layout_mod
from embtrain.checkpoint.bundle import verify_bundle
from embtrain.checkpoint.bundle_format import CheckpointError
from embtrain.checkpoint.layout import read_table
from embtrain.embedding.config import (
    DynamicConfig,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
    TierConfig,
)
from embtrain.embedding.engine import EmbeddingEngine
from tests.support.cli import REPO


def _tables() -> list[TableConfig]:
    """Two static tables and a dynamic one (count admission, evicting: it holds 30 of the
    ~400 keys it sees), all tiered in the tiered engine except ``c``."""
    return [TableConfig("a", 500, 8), TableConfig("b", 300, 8), TableConfig("c", 40, 16),
            TableConfig("d", 30, 8, dynamic=DynamicConfig(eviction="lfu", admission="count",
                                                           min_count=2))]


def _features() -> list[FeatureConfig]:
    return [FeatureConfig("fa", "a", "sum", None), FeatureConfig("fb", "b", "mean", None),
            FeatureConfig("fc", "c", "sum", None), FeatureConfig("fd", "d", "sum", None)]


def _tier(store: str, path: Path, cache_rows: int) -> TierConfig:
    if store == "disk":
        return TierConfig(cache_rows, store="disk", path=str(path))
    return TierConfig(cache_rows)


def _engine(opt: str, store: str | None, path: Path, seed: int = 7) -> EmbeddingEngine:
    tables = [replace(t, tier=_tier(store, path, 20 if t.name == "d" else 120))
              if store and t.name != "c" else t for t in _tables()]
    return EmbeddingEngine(tables, _features(), SparseOptimizerConfig(opt, lr=0.05), seed)


def _inputs(rng: np.random.Generator, batch: int = 32) -> dict[str, SparseInput]:
    out = {}
    for name, rows in (("fa", 500), ("fb", 300), ("fc", 40), ("fd", 400)):
        lens = rng.integers(0, 2 if name == "fd" else 4, batch)
        keys = (rng.zipf(1.2, int(lens.sum())) - 1) % rows
        if name == "fd":  # signed, sparse dynamic keys
            keys = keys * 7919 - 1_000_000
        offs = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        out[name] = SparseInput(keys.astype(np.int64), offs,
                                rng.uniform(0.5, 1.5, keys.size).astype(np.float32))
    return out


def _train(engines: list[EmbeddingEngine], steps: range, seed: int = 1) -> None:
    rng = np.random.default_rng(seed + steps.start)
    for step in steps:
        inputs = _inputs(rng)
        outs = [e.forward(inputs) for e in engines]
        grads = [rng.standard_normal(x.shape).astype(np.float32) for x in outs[0]]
        for e in engines:
            e.backward_update(grads, step)


def _files(manifest: dict) -> dict[str, dict]:
    return {f["path"]: f for f in manifest["files"] if f["path"] != "state.json"}


def _same_tables(x: EmbeddingEngine, y: EmbeddingEngine) -> None:
    for name in x.table_names:
        a, b = x.export_table(name), y.export_table(name)
        np.testing.assert_array_equal(a.keys, b.keys)
        assert a.values.tobytes() == b.values.tobytes(), name
        for s in a.slots:
            assert a.slots[s].tobytes() == b.slots[s].tobytes(), (name, s)
        np.testing.assert_array_equal(a.update_count, b.update_count)
        np.testing.assert_array_equal(a.last_step, b.last_step)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Chunks of 37 rows: every tiered table of these tests is many chunks."""
    monkeypatch.setattr(layout_mod, "CHUNK_ROWS", 37)
    return 37


@pytest.mark.parametrize(("store", "opt"), [("memory", "adagrad"), ("memory", "adam"),
                                            ("disk", "adagrad"), ("disk", "ftrl")])
def test_tiered_checkpoint_equals_in_memory_and_restores_both_ways(
        tmp_path: Path, small_chunks: int, store: str, opt: str) -> None:
    plain, tiered = _engine(opt, None, tmp_path), _engine(opt, store, tmp_path)
    assert tiered.streams("a") and not plain.streams("a")
    _train([plain, tiered], range(8))
    saved = {}
    for name, engine in (("plain", plain), ("tiered", tiered)):
        path = CheckpointManager(tmp_path / name, fsync=False).save(8, engine, None, (0, 8))
        saved[name] = json.loads((path / "manifest.json").read_text())
    assert saved["tiered"]["content_fingerprint"] == saved["plain"]["content_fingerprint"]
    assert _files(saved["tiered"]) == _files(saved["plain"])  # digests, dtypes, shapes, sizes
    assert saved["tiered"]["tables"] == saved["plain"]["tables"]
    verify_bundle(open_bundle(tmp_path / "tiered" / "checkpoints" / "step-00000008"))
    # the tiered checkpoint into an all-in-memory engine, the in-memory one into a tiered
    # engine: both continue exactly as the uninterrupted engines (the run's seed: keys new to
    # the dynamic table start from it)
    into_plain = _engine(opt, None, tmp_path)
    CheckpointManager(tmp_path / "tiered").restore(into_plain, None)
    (tmp_path / "again").mkdir()
    into_tiered = _engine(opt, store, tmp_path / "again")
    CheckpointManager(tmp_path / "plain").restore(into_tiered, None)
    _same_tables(into_plain, plain)
    _same_tables(into_tiered, plain)
    _train([plain, tiered, into_plain, into_tiered], range(8, 14))
    for other in (tiered, into_plain, into_tiered):
        _same_tables(other, plain)


def _reference_parquet(bundle_path: Path, name: str, out: Path, group: int) -> bytes:
    """The whole-table Parquet file the in-memory path writes (one pyarrow call)."""
    import pyarrow.parquet as pq

    from embtrain.checkpoint.export import _arrow_table

    table = _arrow_table(read_table(open_bundle(bundle_path), name))
    pq.write_table(table, out, row_group_size=group, compression="none", use_dictionary=False,
                   write_statistics=False)
    return out.read_bytes()


def test_dump_parquet_and_increment_of_a_tiered_run_equal_the_in_memory_path(
        tmp_path: Path, small_chunks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from embtrain.checkpoint import apply_increments
    from embtrain.checkpoint import export as export_mod
    from embtrain.checkpoint.bundle_write import write_bundle
    from embtrain.checkpoint.layout import table_files

    monkeypatch.setattr(export_mod, "ROW_GROUP_ROWS", 50)
    plain, tiered = _engine("adagrad", None, tmp_path), _engine("adagrad", "disk", tmp_path)
    managers = {n: CheckpointManager(tmp_path / n, fsync=False) for n in ("plain", "tiered")}
    _train([plain, tiered], range(6))
    for n, e in (("plain", plain), ("tiered", tiered)):
        managers[n].save(6, e, None, (0, 6))
    _train([plain, tiered], range(6, 9))
    for n, e in (("plain", plain), ("tiered", tiered)):
        managers[n].save(9, e, None, (0, 9))
    ckpt = tmp_path / "tiered" / "checkpoints" / "step-00000009"
    got = dump(tmp_path / "tiered", tmp_path / "pq", array_format="parquet", fsync=False)
    want = dump(tmp_path / "plain", tmp_path / "pq-plain", array_format="parquet", fsync=False)
    assert got["content_fingerprint"] == want["content_fingerprint"]
    for name in ("a", "b", "c", "d"):
        ref = _reference_parquet(ckpt, name, tmp_path / f"{name}.parquet", 50)
        assert (tmp_path / "pq" / "tables" / f"{name}.parquet").read_bytes() == ref, name
    # the increment since step 6: the changed rows, selected chunk by chunk
    inc = incremental_export(tmp_path / "tiered", tmp_path / "inc", since="6", fsync=False)
    inc_plain = incremental_export(tmp_path / "plain", tmp_path / "inc-plain", since="6",
                                   fsync=False)
    assert _files(inc) == _files(inc_plain) and inc["tables"] == inc_plain["tables"]
    files = []
    base = tmp_path / "tiered" / "checkpoints" / "step-00000006"
    for name in ("a", "b", "c", "d"):
        data = read_table(open_bundle(ckpt), name)
        changed = data.take(np.flatnonzero(data.last_step >= 6))
        changed.removed_keys = np.setdiff1d(read_table(open_bundle(base), name).keys,
                                            data.keys)
        assert inc["tables"][name]["changed"] == changed.rows > 0
        files += list(table_files(name, changed))
    ref = write_bundle(tmp_path / "ref", files, lambda entries: {"kind": "ref"}, fsync=False)
    tables = {p: f for p, f in _files(inc).items() if p.startswith("tables/")}
    assert tables == _files(ref)
    # and it applies onto the dump of the base into the target's exact arrays
    dump(tmp_path / "tiered", tmp_path / "base", step=6, fsync=False)
    out = apply_increments(tmp_path / "base", [tmp_path / "inc"], tmp_path / "applied",
                           fsync=False)
    assert out["content_fingerprint"] == open_bundle(ckpt).fingerprint


def test_a_corrupt_checkpoint_fails_the_streamed_exports(tmp_path: Path,
                                                        small_chunks: int) -> None:
    tiered = _engine("adagrad", "memory", tmp_path)
    _train([tiered], range(3))
    path = CheckpointManager(tmp_path / "run", fsync=False).save(3, tiered, None, (0, 3))
    values = path / "tables" / "a" / "values.npy"
    raw = bytearray(values.read_bytes())
    raw[-5] ^= 0xFF
    values.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"values\.npy: checksum mismatch"):
        dump(tmp_path / "run", tmp_path / "pq", array_format="parquet", fsync=False)
    assert not (tmp_path / "pq").exists()
    with pytest.raises(CheckpointError, match=r"values\.npy: checksum mismatch"):
        CheckpointManager(tmp_path / "run").restore(_engine("adagrad", "memory", tmp_path), None)


def test_checkpoint_and_restore_of_a_large_tiered_table_hold_a_chunk_not_the_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2M rows x dim 16 + Adagrad (~260 MB with metadata): the peak of Python and NumPy
    allocations while checkpointing, restoring, dumping to Parquet and exporting an increment
    stays far below the table (the whole-table path held it at least once)."""
    monkeypatch.setattr(layout_mod, "CHUNK_ROWS", 1 << 15)
    from embtrain.checkpoint import export as export_mod

    monkeypatch.setattr(export_mod, "ROW_GROUP_ROWS", 1 << 15)
    rows, dim = 2_000_000, 16
    table = TableConfig("big", rows, dim, tier=TierConfig(4096))
    feats = [FeatureConfig("f", "big", "sum", None)]
    opt = SparseOptimizerConfig("adagrad", lr=0.05)
    engine = EmbeddingEngine([table], feats, opt, 3)
    rng = np.random.default_rng(0)
    for step in range(3):
        keys = rng.integers(0, rows, 1000)
        out = engine.forward({"f": SparseInput.one_hot(keys)})
        engine.backward_update([np.ones_like(o) for o in out], step)
    table_bytes = rows * (2 * dim * 4 + 16)
    bound = table_bytes // 4
    manager = CheckpointManager(tmp_path / "run", fsync=False)
    peaks = {}

    def peak(what: str, fn: Callable[[], object]) -> None:
        tracemalloc.start()
        try:
            fn()
            peaks[what] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak("checkpoint", lambda: manager.save(3, engine, None, (0, 3)))
    fresh = EmbeddingEngine([table], feats, opt, 4)
    peak("restore", lambda: CheckpointManager(tmp_path / "run").restore(fresh, None))
    peak("parquet", lambda: dump(tmp_path / "run", tmp_path / "pq", array_format="parquet",
                                 fsync=False))
    out = engine.forward({"f": SparseInput.one_hot(np.arange(10))})
    engine.backward_update([np.ones_like(o) for o in out], 3)
    manager.save(4, engine, None, (0, 4))
    peak("increment", lambda: incremental_export(tmp_path / "run", tmp_path / "inc", "3",
                                                 fsync=False))
    assert all(p < bound for p in peaks.values()), (peaks, bound)
    back = fresh.export_range("big", rows - 5, rows)
    want = engine.export_range("big", rows - 5, rows)
    np.testing.assert_array_equal(back.values, want.values)
    assert json.loads((tmp_path / "inc" / "manifest.json").read_text())["tables"]["big"][
        "changed"] == 10


@pytest.mark.distributed
def test_two_ranks_stream_the_same_checkpoint_as_one_process(tmp_path: Path) -> None:
    """Real Horovod ranks (Gloo): see tests/workers/dist_tiers_stream_worker.py."""
    import sys

    from embtrain.comm.launch import LaunchSpec, launch

    code = launch([sys.executable, str(REPO / "tests" / "workers" / "dist_tiers_stream_worker.py"),
                   str(tmp_path)], LaunchSpec(2))
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text())
               for r in range(2) if (tmp_path / f"rank-{r}.json").exists()]
    problems = [p for rep in reports for p in rep["problems"]]
    assert not problems, "\n".join(problems[:10])
    assert code == 0 and len(reports) == 2
    assert all(rep["checks"] == ["table_stream", "same checkpoint", "failed write", "restore"]
               for rep in reports)


RECIPE = """\
version: 1
name: stream
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
tables:
  - {{name: user, dim: 8, rows: 2000}}
  - name: item
    dim: 16
    rows: 20000
{storage}
optimizer: {{sparse: {{type: adagrad, lr: 0.01}}, dense: {{type: adam, lr: 0.001}}}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: 12, eval_every: 6, eval_max_batches: 2, log_every: 1, seed: 0,
         checkpoint: {{every: 6}}}}
"""


def test_resume_of_a_tiered_run_streams_and_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    """Through `embtrain run` with chunks of 997 rows (the item table is 21 chunks): resumed
    from its step-6 checkpoint, the run repeats its losses and writes the same step-12
    checkpoint byte for byte."""
    from embtrain.train.metrics_log import read_metrics
    from tests.support.cli import run_cli

    env = {layout_mod.CHUNK_ENV: "997"}
    recipe = tmp_path / "tiered.yaml"
    recipe.write_text(RECIPE.format(data=tmp_path / "data", storage=(
        f"    storage: [{{tier: device, budget: 256KiB}}, {{tier: disk, path: {tmp_path}}}]")))
    res = run_cli("gen-data", "--recipe", str(recipe), "--out", str(tmp_path / "data"),
                  "--rows", "4000", "--eval-rows", "512")
    assert res.returncode == 0, res.stderr
    run = tmp_path / "run"
    res = run_cli("run", str(recipe), "--run-dir", str(run), env=env)
    assert res.returncode == 0, res.stderr

    def losses() -> list[float]:
        return [r["loss"] for r in read_metrics(run) if r["kind"] == "train"]

    def fingerprint(path: Path) -> str:
        return json.loads((path / "manifest.json").read_text())["content_fingerprint"]

    want, final = losses(), fingerprint(run / "checkpoints" / "step-00000012")
    res = run_cli("run", "--resume", str(run), "--from-step", "6", env=env)
    assert res.returncode == 0, res.stderr
    assert len(want) == 12 and losses()[-6:] == want[-6:]
    assert fingerprint(run / "checkpoints" / "step-00000012") == final
    superseded = [p for p in (run / "checkpoints").iterdir() if ".superseded-" in p.name]
    assert len(superseded) == 1 and fingerprint(superseded[0]) == final


def test_load_of_a_dump_into_a_tiered_engine_imports_chunks(tmp_path: Path,
                                                           small_chunks: int) -> None:
    """`embtrain load`'s import (warm start: last_step re-based) of an in-memory run's dump
    into tiered tables, chunk by chunk, equals the same import into in-memory tables."""
    from embtrain.checkpoint.load_export import shift_last_step
    from embtrain.checkpoint.manager import import_bundle

    plain = _engine("adam", None, tmp_path)
    _train([plain], range(5))
    CheckpointManager(tmp_path / "run", fsync=False).save(5, plain, None, (0, 5))
    dump(tmp_path / "run", tmp_path / "export", fsync=False)
    bundle = open_bundle(tmp_path / "export")
    into = [_engine("adam", None, tmp_path, seed=9), _engine("adam", "disk", tmp_path, seed=9)]
    for engine in into:
        import_bundle(bundle, engine, None, transform=shift_last_step(bundle.step))
    _same_tables(into[1], into[0])
    assert into[0].export_table("a").last_step.max() == -1  # re-based on the new run's step 0


@pytest.mark.parametrize("array_format", ["npy", "parquet"])
def test_a_refused_streamed_import_changes_nothing(tmp_path: Path, small_chunks: int,
                                                   array_format: str) -> None:
    """Keys of a dynamic table that do not fit a static tiered table: one line naming the
    table and key, found before the first chunk is imported."""
    from embtrain.checkpoint.manager import import_bundle
    from embtrain.embedding.config import DynamicConfig

    dyn = EmbeddingEngine([TableConfig("a", 400, 8, dynamic=DynamicConfig())],
                          [FeatureConfig("fa", "a", "sum", None)],
                          SparseOptimizerConfig("sgd", lr=0.1), 1)
    keys = np.concatenate([np.arange(300), [100_000]]).astype(np.int64)
    out = dyn.forward({"fa": SparseInput.one_hot(keys)})
    dyn.backward_update([np.ones_like(o) for o in out], 0)
    CheckpointManager(tmp_path / "run", fsync=False).save(1, dyn, None, (0, 1))
    dump(tmp_path / "run", tmp_path / "export", array_format=array_format, fsync=False)
    tiered = EmbeddingEngine([TableConfig("a", 500, 8, tier=TierConfig(50))],
                             [FeatureConfig("fa", "a", "sum", None)],
                             SparseOptimizerConfig("sgd", lr=0.1), 1)
    before = tiered.export_table("a").values.copy()
    with pytest.raises(CheckpointError, match="table a: key 100000 does not fit a static "
                                              "table of 500 rows"):
        import_bundle(open_bundle(tmp_path / "export"), tiered, None)
    np.testing.assert_array_equal(tiered.export_table("a").values, before)
