"""Tiered static tables: a small cache in front of a backing store computes exactly what an
all-in-memory table computes (forward outputs, tables, slots and metadata bit for bit)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from embtrain.embedding.config import (
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
    TierConfig,
)
from embtrain.embedding.engine import EmbeddingEngine, KeyOutOfRangeError
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES

OPTIMIZERS = OPTIMIZER_NAMES  # every registered sparse optimizer


def _engines(opt: str, cache_rows: int, eviction: str = "lru"):
    tables = [TableConfig("a", 500, 8), TableConfig("b", 300, 8), TableConfig("c", 40, 16)]
    feats = [FeatureConfig("fa", "a", "sum", None), FeatureConfig("fa2", "a", "mean", None),
             FeatureConfig("fb", "b", "sqrtn", None), FeatureConfig("fc", "c", "concat", 2)]
    cfg = SparseOptimizerConfig(opt, lr=0.05)
    tiered = [replace(t, tier=TierConfig(cache_rows, eviction=eviction)) if t.name != "c"
              else t for t in tables]
    return (EmbeddingEngine(tables, feats, cfg, 7), EmbeddingEngine(tiered, feats, cfg, 7),
            feats)


def _inputs(rng, feats, batch=32):
    out = {}
    rows = {"fa": 500, "fa2": 500, "fb": 300, "fc": 40}
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
def test_tiered_equals_in_memory(opt):
    rng = np.random.default_rng(1)
    plain, tiered, feats = _engines(opt, cache_rows=150, eviction="lru" if opt != "ftrl" else "lfu")
    for step in range(20):
        inputs = _inputs(rng, feats)
        if step % 5 == 4:  # an evaluation between steps: reads the same values
            for a, b in zip(plain.forward(inputs, training=False),
                            tiered.forward(inputs, training=False), strict=True):
                np.testing.assert_array_equal(a, b)
        a, b = plain.forward(inputs), tiered.forward(inputs)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        grads = [rng.standard_normal(x.shape).astype(np.float32) for x in a]
        plain.backward_update(grads, step)
        tiered.backward_update(grads, step)
    for name in ("a", "b", "c"):
        x, y = plain.export_table(name), tiered.export_table(name)
        np.testing.assert_array_equal(x.keys, y.keys)
        np.testing.assert_array_equal(x.values, y.values)
        for s in x.slots:
            np.testing.assert_array_equal(x.slots[s], y.slots[s])
        np.testing.assert_array_equal(x.update_count, y.update_count)
        np.testing.assert_array_equal(x.last_step, y.last_step)
    m = tiered.tier_metrics()
    assert set(m) == {"a", "b"} and m["a"]["evictions"] > 0 and m["a"]["rows_read"] > 0
    assert 0 < m["a"]["hit_rate"] < 1 and m["a"]["cached"] <= 150


def test_import_into_tiered_then_train_equals_in_memory():
    rng = np.random.default_rng(2)
    plain, tiered, feats = _engines("adagrad", cache_rows=150)
    for step in range(3):
        inputs = _inputs(rng, feats)
        outs = plain.forward(inputs)
        plain.backward_update([np.ones_like(o) for o in outs], step)
    for name in ("a", "b", "c"):
        tiered.import_table(name, plain.export_table(name))
    for step in range(3, 8):
        inputs = _inputs(rng, feats)
        a, b = plain.forward(inputs), tiered.forward(inputs)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        g = [rng.standard_normal(x.shape).astype(np.float32) for x in a]
        plain.backward_update(g, step)
        tiered.backward_update(g, step)
    np.testing.assert_array_equal(plain.export_table("a").values, tiered.export_table("a").values)


def test_tiered_key_out_of_range():
    _, tiered, _ = _engines("sgd", cache_rows=10)
    inputs = {"fa": SparseInput.one_hot(np.array([1, 500])),
              "fa2": SparseInput.one_hot(np.array([0, 0])),
              "fb": SparseInput.one_hot(np.array([0, 0])),
              "fc": SparseInput.fixed_hotness(np.zeros((2, 2), np.int64))}
    with pytest.raises(KeyOutOfRangeError, match="key 500 is out of range of table 'a'"):
        tiered.forward(inputs)


def test_cache_smaller_than_a_batch_is_one_clear_error():
    _, tiered, _ = _engines("sgd", cache_rows=10)
    inputs = {"fa": SparseInput.one_hot(np.arange(20)), "fa2": SparseInput.one_hot(np.arange(20)),
              "fb": SparseInput.one_hot(np.arange(20)),
              "fc": SparseInput.fixed_hotness(np.zeros((20, 2), np.int64))}
    with pytest.raises(Exception, match=r"one batch reads 20 rows .* raise tables\[\]\.storage"):
        tiered.forward(inputs)


# ----------------------------------------------------------------------- through `run`

RECIPE = """
version: 1
name: tiers
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
train: {{steps: 20, eval_every: 10, log_every: 1, seed: 0, checkpoint: {{every: 10}}}}
"""

TIERS = "    storage: [{tier: device, budget: 512KiB}, {tier: host}]"


def _write(root, name, storage, optimizer="adam"):
    path = root / f"{name}.yaml"
    path.write_text(RECIPE.format(data=root / "data", storage=storage, optimizer=optimizer))
    return path


@pytest.fixture(scope="module")
def tier_data(tmp_path_factory):
    from tests.support.cli import run_cli

    root = tmp_path_factory.mktemp("tiers")
    res = run_cli("gen-data", "--recipe", str(_write(root, "gen", "")), "--out",
                  str(root / "data"), "--rows", "20000", "--eval-rows", "2000")
    assert res.returncode == 0, res.stderr
    return root


def _dump(run_dir, out):
    from tests.support.cli import run_cli

    res = run_cli("dump", str(run_dir), str(out))
    assert res.returncode == 0, res.stderr
    return {str(p.relative_to(out)): np.load(p) for p in sorted(out.rglob("*.npy"))}


@pytest.mark.parametrize("optimizer", ["adam", "ftrl"])
def test_run_with_tiers_equals_all_in_memory(tier_data, tmp_path, optimizer):
    from embtrain.train.metrics_log import read_metrics
    from tests.support.cli import run_cli

    runs = {}
    for name, storage in (("tiered", TIERS), ("plain", "")):
        runs[name] = tmp_path / name
        res = run_cli("run", str(_write(tier_data, f"{name}-{optimizer}", storage, optimizer)),
                      "--run-dir", str(runs[name]))
        assert res.returncode == 0, res.stderr
    a = [r["loss"] for r in read_metrics(runs["tiered"]) if r["kind"] == "train"]
    b = [r["loss"] for r in read_metrics(runs["plain"]) if r["kind"] == "train"]
    assert a == b and len(a) == 20
    da, db = _dump(runs["tiered"], tmp_path / "da"), _dump(runs["plain"], tmp_path / "db")
    for key in db:
        np.testing.assert_array_equal(da[key], db[key], err_msg=key)
    tiers = [r["tiers"] for r in read_metrics(runs["tiered"]) if r["kind"] == "train"][-1]
    item = tiers["item"]
    assert item["cache_rows"] < 50000 and item["evictions"] > 0 and 0 < item["hit_rate"] < 1
    # resume from the checkpoint at step 10: the cache starts empty, the results do not change
    res = run_cli("run", "--resume", str(runs["tiered"]), "--from-step", "10")
    assert res.returncode == 0, res.stderr
    again = [r["loss"] for r in read_metrics(runs["tiered"]) if r["kind"] == "train"]
    assert again[-10:] == b[-10:]


def test_memory_tiers_smaller_than_a_batch_stop_at_start(tier_data, tmp_path):
    from tests.support.cli import run_cli

    recipe = _write(tier_data, "small", TIERS.replace("512KiB", "64KiB"))
    res = run_cli("run", str(recipe), "--run-dir", str(tmp_path / "r"))
    assert res.returncode == 2
    line = [x for x in res.stderr.splitlines() if "storage" in x]
    assert len(line) == 1 and "one batch can read 512" in line[0], res.stderr
    assert not (tmp_path / "r").exists()


def test_a_cache_breaks_lfu_ties_by_recency_and_lru_ties_by_count():
    """A dynamic table's victims are the smallest (score, key); a cache (whose choice never
    changes results) breaks score ties by the other score first."""
    from embtrain.embedding.config import DynamicConfig
    from embtrain.embedding.dynamic import DynamicTable
    from embtrain.embedding.tiers import MemoryStore

    meta = np.array([[1, 9], [1, 3], [2, 1], [1, 5], [3, 0], [1, 4]], np.int32)
    for eviction, cache_victims in (("lfu", [1, 5]), ("lru", [2, 4])):
        t = DynamicTable(TableConfig("c", 6, 2, dynamic=DynamicConfig(eviction=eviction)), 0)
        t.upsert(np.array([5, 4, 3, 2, 1, 0]))  # row r holds key 5 - r
        plain = t.victims(meta, 2, 99).tolist()
        t.store = MemoryStore(6, 2, [])
        assert t.victims(meta, 2, 99).tolist() == cache_victims
        if eviction == "lfu":
            assert plain == [3, 5]  # count 1, then the smallest keys (2 and 0)
