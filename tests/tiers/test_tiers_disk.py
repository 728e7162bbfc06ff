"""Tiered tables over the disk tier's file: equal to all in memory, through the engine and
through `run` (with a kill -9 and a resume), and the disk path checks at start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embtrain.embedding.config import (
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
    TierConfig,
)
from embtrain.embedding.engine import EmbeddingEngine
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from tests.support.cli import REPO

OPTIMIZERS = OPTIMIZER_NAMES  # every registered sparse optimizer


def _engines(opt: str, path: Path, cache_rows: int = 120, eviction: str = "lru"):
    tables = [TableConfig("a", 600, 8), TableConfig("b", 300, 8), TableConfig("c", 40, 16)]
    feats = [FeatureConfig("fa", "a", "sum", None), FeatureConfig("fa2", "a", "mean", None),
             FeatureConfig("fb", "b", "sqrtn", None), FeatureConfig("fc", "c", "concat", 2)]
    cfg = SparseOptimizerConfig(opt, lr=0.05)
    tiered = [replace(t, tier=TierConfig(cache_rows, store="disk", path=str(path),
                                         eviction=eviction)) if t.name != "c" else t
              for t in tables]
    return (EmbeddingEngine(tables, feats, cfg, 7), EmbeddingEngine(tiered, feats, cfg, 7),
            feats)


def _inputs(rng: np.random.Generator, feats: list[FeatureConfig], batch: int = 32):
    out = {}
    rows = {"fa": 600, "fa2": 600, "fb": 300, "fc": 40}
    for f in feats:
        if f.combiner == "concat":
            out[f.name] = SparseInput.fixed_hotness(rng.integers(0, 40, (batch, 2)))
            continue
        lens = rng.integers(0, 4, batch)
        keys = (rng.zipf(1.2, int(lens.sum())) - 1) % rows[f.name]
        offs = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        out[f.name] = SparseInput(keys.astype(np.int64), offs,
                                  rng.uniform(0.5, 1.5, keys.size).astype(np.float32))
    return out


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_disk_tier_equals_in_memory_bit_for_bit(tmp_path: Path, opt: str) -> None:
    rng = np.random.default_rng(11)
    plain, tiered, feats = _engines(opt, tmp_path, eviction="lru" if opt != "adam" else "lfu")
    for step in range(20):
        inputs = _inputs(rng, feats)
        if step % 5 == 4:
            for x, y in zip(plain.forward(inputs, training=False),
                            tiered.forward(inputs, training=False), strict=True):
                np.testing.assert_array_equal(x, y)
        a, b = plain.forward(inputs), tiered.forward(inputs)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        grads = [rng.standard_normal(x.shape).astype(np.float32) for x in a]
        plain.backward_update(grads, step)
        tiered.backward_update(grads, step)
    for name in ("a", "b", "c"):
        x, y = plain.export_table(name), tiered.export_table(name)
        np.testing.assert_array_equal(x.keys, y.keys)
        assert x.values.tobytes() == y.values.tobytes()
        for s in x.slots:
            assert x.slots[s].tobytes() == y.slots[s].tobytes()
        np.testing.assert_array_equal(x.update_count, y.update_count)
        np.testing.assert_array_equal(x.last_step, y.last_step)
    m = tiered.tier_metrics()
    assert m["a"]["evictions"] > 0 and m["a"]["rows_read"] > 0 and m["a"]["bytes_written"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tier", "b.tier"]


# --------------------------------------------------------------------------------- run

RECIPE = """\
version: 1
name: disk-tiers
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 512}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
tables:
  - {{name: user, dim: 8, rows: 2000}}
  - name: item
    dim: 16
    rows: 50000
{storage}
optimizer: {{sparse: {{type: {optimizer}, lr: 0.01}}, dense: {{type: adam, lr: 0.001}}}}
model: {{type: mlp, hidden: [16]}}
train: {{steps: {steps}, eval_every: 10, log_every: 1, seed: 0, checkpoint: {{every: 10}}}}
"""


def _write(root: Path, name: str, storage: str, optimizer: str = "adagrad",
           steps: int = 20) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(RECIPE.format(data=root / "data", storage=storage, optimizer=optimizer,
                                  steps=steps))
    return path


def _disk(path: Path) -> str:
    return f"    storage: [{{tier: device, budget: 512KiB}}, {{tier: disk, path: {path}}}]"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.cli import run_cli

    root = tmp_path_factory.mktemp("disk-tiers")
    res = run_cli("gen-data", "--recipe", str(_write(root, "gen", "")), "--out",
                  str(root / "data"), "--rows", "40000", "--eval-rows", "2000")
    assert res.returncode == 0, res.stderr
    return root


def _dump(run_dir: Path, out: Path) -> dict[str, np.ndarray]:
    from tests.support.cli import run_cli

    res = run_cli("dump", str(run_dir), str(out))
    assert res.returncode == 0, res.stderr
    return {str(p.relative_to(out)): np.load(p) for p in sorted(out.rglob("*.npy"))}


def _losses(run_dir: Path) -> list[float]:
    from embtrain.train.metrics_log import read_metrics

    return [r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"]


def test_run_through_the_disk_tier_equals_all_in_memory(data: Path, tmp_path: Path) -> None:
    from embtrain.train.metrics_log import read_metrics
    from tests.support.cli import run_cli

    store = tmp_path / "store"
    store.mkdir()
    runs = {}
    for name, storage in (("disk", _disk(store)), ("plain", "")):
        runs[name] = tmp_path / name
        res = run_cli("run", str(_write(data, f"{name}-{tmp_path.name}", storage)),
                      "--run-dir", str(runs[name]))
        assert res.returncode == 0, res.stderr
    assert _losses(runs["disk"]) == _losses(runs["plain"]) and len(_losses(runs["plain"])) == 20
    da, db = _dump(runs["disk"], tmp_path / "da"), _dump(runs["plain"], tmp_path / "db")
    assert da.keys() == db.keys()
    for key in db:
        np.testing.assert_array_equal(da[key], db[key], err_msg=key)
    item = [r["tiers"] for r in read_metrics(runs["disk"]) if r["kind"] == "train"][-1]["item"]
    assert item["evictions"] > 0 and item["rows_read"] > 0 and 0 < item["hit_rate"] < 1
    assert (store / "item.tier").is_file()


def test_kill_9_then_resume_equals_the_uninterrupted_run(data: Path, tmp_path: Path) -> None:
    from tests.support.cli import run_cli

    store = tmp_path / "store"
    store.mkdir()
    plain = tmp_path / "plain"
    res = run_cli("run", str(_write(data, "plain60", "", steps=60)), "--run-dir", str(plain))
    assert res.returncode == 0, res.stderr
    run = tmp_path / "tiered"
    recipe = _write(data, "tiered60", _disk(store), steps=60)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "embtrain", "run", str(recipe), "--run-dir",
                             str(run)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    try:  # kill -9 once a checkpoint past the first is complete, mid-run
        while time.time() < deadline and proc.poll() is None:
            if len(_losses(run) if (run / "metrics.jsonl").exists() else []) >= 25:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    res = run_cli("run", "--resume", str(run))
    assert res.returncode == 0, res.stderr
    want = _losses(plain)
    got = _losses(run)
    assert got[-40:] == want[-40:]
    da, db = _dump(run, tmp_path / "da"), _dump(plain, tmp_path / "db")
    for key in db:
        np.testing.assert_array_equal(da[key], db[key], err_msg=key)


@pytest.mark.parametrize("case", ["missing", "not writable"])
def test_bad_disk_path_stops_the_run_at_start_with_one_line(data: Path, tmp_path: Path,
                                                            case: str) -> None:
    from tests.support.cli import run_cli

    path = tmp_path / "nope" if case == "missing" else Path("/proc")
    res = run_cli("run", str(_write(data, f"bad-{case.replace(' ', '')}", _disk(path))),
                  "--run-dir", str(tmp_path / "r"))
    assert res.returncode == 2
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "tables[1].storage[1].path: " in lines[0], res.stderr
    assert not (tmp_path / "r").exists()
