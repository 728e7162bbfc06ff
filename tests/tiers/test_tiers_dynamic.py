"""Dynamic tables behind a cache: the key directory decides rows exactly as the all-in-memory
dynamic table does (admission, eviction, TTL), the cache over a store holds the rows, and
every forward, table, slot, metadata, admission state and metric equals all in memory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embtrain.embedding.config import (
    DynamicConfig,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
    TierConfig,
)
from embtrain.embedding.engine import EmbeddingEngine
from embtrain.train.metrics_log import read_metrics

OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam", "lazy_adam", "ftrl"]
POLICIES = {
    "lru": DynamicConfig(),
    "lfu-ttl-initial": DynamicConfig(eviction="lfu", ttl_steps=12, missing="initial"),
    "count-ttl": DynamicConfig(eviction="lfu", admission="count", min_count=2, ttl_steps=6,
                               missing="initial"),
    "bloom": DynamicConfig(admission="bloom", bloom_capacity=1000, ttl_steps=4),
    "probability": DynamicConfig(admission="probability", p=0.5),
}


def _engines(opt: str, dyn: DynamicConfig, store: str = "memory", path: str | None = None):
    tables = [TableConfig("d", 500, 8, dynamic=dyn), TableConfig("s", 300, 8)]
    feats = [FeatureConfig("f1", "d", "sum", None), FeatureConfig("f2", "d", "mean", None),
             FeatureConfig("fs", "s", "sum", None)]
    cfg = SparseOptimizerConfig(opt, lr=0.05)
    tiered = [replace(t, tier=TierConfig(200, store=store, path=path, eviction="lfu"))
              for t in tables]
    return EmbeddingEngine(tables, feats, cfg, 7), EmbeddingEngine(tiered, feats, cfg, 7)


def _inputs(rng: np.random.Generator, batch: int = 32) -> dict[str, SparseInput]:
    """Power-law keys: a static table's rows, and signed dynamic keys from a universe four
    times the dynamic table's capacity (so its directory evicts)."""
    out = {}
    for f in ("f1", "f2", "fs"):
        lens = rng.integers(0, 4, batch)
        n = int(lens.sum())
        if f == "fs":
            keys = (rng.zipf(1.2, n) - 1) % 300
        else:
            keys = ((rng.zipf(1.1, n) - 1) * 7919 - 5000) % 2000 - 1000
        offs = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        out[f] = SparseInput(keys.astype(np.int64), offs,
                             rng.uniform(0.5, 1.5, n).astype(np.float32))
    return out


def _train(engines: tuple[EmbeddingEngine, ...], rng: np.random.Generator,
           steps: range) -> None:
    for step in steps:
        inputs = _inputs(rng)
        if step % 5 == 4:  # an evaluation between steps reads the same values
            ref = engines[0].forward(inputs, training=False)
            for e in engines[1:]:
                for x, y in zip(ref, e.forward(inputs, training=False), strict=True):
                    assert x.tobytes() == y.tobytes(), f"evaluation at step {step}"
        outs = [e.forward(inputs) for e in engines]
        for o in outs[1:]:
            for x, y in zip(outs[0], o, strict=True):
                assert x.tobytes() == y.tobytes(), f"forward at step {step}"
        grads = [rng.standard_normal(x.shape).astype(np.float32) for x in outs[0]]
        for e in engines:
            e.backward_update(grads, step)


def _assert_tables_equal(a: EmbeddingEngine, b: EmbeddingEngine) -> None:
    for name in ("d", "s"):
        x, y = a.export_table(name), b.export_table(name)
        np.testing.assert_array_equal(x.keys, y.keys)
        assert x.values.tobytes() == y.values.tobytes(), name
        for s in x.slots:
            assert x.slots[s].tobytes() == y.slots[s].tobytes(), (name, s)
        np.testing.assert_array_equal(x.update_count, y.update_count)
        np.testing.assert_array_equal(x.last_step, y.last_step)
        assert sorted(x.extra) == sorted(y.extra)
        for k in x.extra:
            np.testing.assert_array_equal(x.extra[k], y.extra[k])
    assert a.dynamic_metrics() == b.dynamic_metrics()


CASES = [(opt, "lfu-ttl-initial") for opt in OPTIMIZERS] + [
    ("adagrad", p) for p in sorted(POLICIES) if p != "lfu-ttl-initial"]


@pytest.mark.parametrize(("opt", "policy"), CASES)
def test_tiered_dynamic_equals_in_memory(opt: str, policy: str) -> None:
    """Every optimizer with eviction at both levels and TTL; every admission policy."""
    plain, tiered = _engines(opt, POLICIES[policy])
    _train((plain, tiered), np.random.default_rng(3), range(20))
    _assert_tables_equal(plain, tiered)
    m, t = tiered.dynamic_metrics()["d"], tiered.tier_metrics()["d"]
    assert m["inserts"] > 0 and 0 < t["hit_rate"] < 1
    if policy in ("lru", "lfu-ttl-initial"):  # both levels evict: the directory and the cache
        assert m["evictions"] > 0 and t["evictions"] > 0 and t["rows_read"] > 0


def test_disk_store_equals_in_memory(tmp_path: Path) -> None:
    plain, tiered = _engines("adagrad", POLICIES["lfu-ttl-initial"], "disk", str(tmp_path))
    _train((plain, tiered), np.random.default_rng(4), range(20))
    _assert_tables_equal(plain, tiered)
    t = tiered.tier_metrics()["d"]
    assert t["rows_read"] > 0 and t["bytes_written"] > 0 and (tmp_path / "d.tier").is_file()


def test_state_moves_between_tiered_and_in_memory_and_training_goes_on_equal() -> None:
    rng = np.random.default_rng(5)
    dyn = DynamicConfig(admission="count", min_count=2, ttl_steps=9)
    plain, tiered = _engines("adagrad", dyn)
    _train((plain, tiered), rng, range(10))
    plain2, tiered2 = _engines("adagrad", dyn)
    for name in ("d", "s"):
        state = tiered.export_table(name)
        plain2.import_table(name, state)
        tiered2.import_table(name, state)
    _train((plain, tiered, plain2, tiered2), rng, range(10, 20))
    for other in (tiered, plain2, tiered2):
        x, y = plain.export_table("d"), other.export_table("d")
        np.testing.assert_array_equal(x.keys, y.keys)
        assert x.values.tobytes() == y.values.tobytes()


def test_chunks_of_a_tiered_dynamic_table_are_the_table() -> None:
    plain, tiered = _engines("adam", POLICIES["count-ttl"])
    _train((plain, tiered), np.random.default_rng(6), range(8))
    whole = plain.export_table("d")
    assert tiered.streams("d") and tiered.export_rows("d") == whole.keys.size
    parts = list(tiered.export_chunks("d", 17))
    assert len(parts) > 2 and set(parts[0].extra) == {"admission_keys", "admission_counts"}
    np.testing.assert_array_equal(np.concatenate([p.keys for p in parts]), whole.keys)
    assert np.concatenate([p.values for p in parts]).tobytes() == whole.values.tobytes()


# --------------------------------------------------------------------------------- run

RECIPE = """\
version: 1
name: dyn-tiers
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 256}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
tables:
  - name: user
    dim: 8
    sharding: row
    dynamic: {{capacity: {capacity}, eviction: lru{policy}}}
{storage}
  - {{name: item, dim: 8, rows: 2000}}
optimizer: {{sparse: {{type: adagrad, lr: 0.05}}, dense: {{type: adam, lr: 0.003}}}}
model: {{type: dlrm, bottom: [16, 8], top: [16, 1]}}
train: {{steps: 20, eval_every: 10, log_every: 1, seed: 1, checkpoint: {{every: 10, keep: 5}}}}
"""


ADMIT_AND_EXPIRE = ", admission: {type: count, min_count: 2}, ttl_steps: 12, missing: initial"


def _recipe(root: Path, name: str, store: Path | None, capacity: int = 400,
            budget: str = "80KiB", policy: str = ADMIT_AND_EXPIRE) -> Path:
    """The user table (``capacity`` keys) in memory, or with ``budget`` of host memory for
    its key directory and cache over a disk tier under ``store``."""
    storage = "" if store is None else (
        f"    storage: [{{tier: host, budget: {budget}}}, {{tier: disk, path: {store}}}]")
    path = root / f"{name}.yaml"
    path.write_text(RECIPE.format(data=root / "data", storage=storage, capacity=capacity,
                                  policy=policy))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.cli import run_cli

    root = tmp_path_factory.mktemp("dyn-tiers")
    res = run_cli("gen-data", "--recipe", str(_recipe(root, "gen", None)), "--out",
                  str(root / "data"), "--rows", "8000", "--eval-rows", "2000", "--files", "2")
    assert res.returncode == 0, res.stderr
    return root


def _run(*args: str) -> None:
    from tests.support.cli import run_cli

    res = run_cli("run", *args, timeout=600)
    assert res.returncode == 0, res.stderr


def _train_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["kind"] == "train"]


def _dump(run_dir: Path, out: Path) -> dict[str, np.ndarray]:
    from tests.support.cli import run_cli

    res = run_cli("dump", str(run_dir), str(out))
    assert res.returncode == 0, res.stderr
    return {str(p.relative_to(out)): np.load(p) for p in sorted(out.rglob("*.npy"))}


def test_run_resume_and_dump_equal_all_in_memory(data: Path, tmp_path: Path) -> None:
    """`run` with the user table on disk behind a cache, 10 steps + resume + 10, equals the
    all-in-memory run (losses, the table's state in the metrics, dumped tables)."""
    store = tmp_path / "store"
    store.mkdir()
    tiered, plain = _recipe(data, f"t-{tmp_path.name}", store), _recipe(data, "plain", None)
    _run(str(plain), "--run-dir", str(tmp_path / "plain"))
    _run(str(tiered), "--run-dir", str(tmp_path / "half"), "--max-steps", "10")
    _run("--resume", str(tmp_path / "half"))
    ref, got = _train_records(tmp_path / "plain"), _train_records(tmp_path / "half")
    assert len(ref) == 20
    assert [r["loss"] for r in got] == [r["loss"] for r in ref]
    # counters start again at a resume; the table's state does not
    kept = ("rows", "capacity", "admissions_pending", "load_factor")
    for step in (9, 19):
        assert ({k: got[step]["dynamic_tables"]["user"][k] for k in kept}
                == {k: ref[step]["dynamic_tables"]["user"][k] for k in kept}), step
    assert got[9]["dynamic_tables"] == ref[9]["dynamic_tables"]  # before the resume: all
    assert ref[-1]["dynamic_tables"]["user"]["expired"] > 0
    assert ref[-1]["dynamic_tables"]["user"]["evictions"] > 0
    cache = got[19]["tiers"]["user"]  # the resumed half evicts, reads back, reads ahead
    assert cache["evictions"] > 0 and cache["rows_read"] > 0 and cache["rows_ahead"] > 0
    assert cache["cache_rows"] < 400
    want, dumped = _dump(tmp_path / "plain", tmp_path / "d0"), _dump(tmp_path / "half",
                                                                     tmp_path / "d1")
    assert "tables/user/admission_keys.npy" in want and sorted(dumped) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(dumped[key], want[key], err_msg=key)


@pytest.mark.distributed
def test_two_ranks_tiered_equal_one_rank_in_memory(data: Path, tmp_path: Path) -> None:
    """Row sharding by key hash: each rank's shard of the dynamic table has its own key
    directory and cache over its own file; losses and dumps equal one process in memory
    (a capacity without evictions: eviction is per shard; every key admitted, so that a
    shard holds more keys than its cache)."""
    store = tmp_path / "store"
    store.mkdir()
    _run(str(_recipe(data, "plain-1000", None, 1000, policy="")), "--run-dir", str(tmp_path / "one"))
    _run(str(_recipe(data, f"t2-{tmp_path.name}", store, 1000, "80KiB", "")), "--np", "2", "--run-dir",
         str(tmp_path / "two"))
    a, b = _train_records(tmp_path / "one"), _train_records(tmp_path / "two")
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=1e-5,
                               atol=1e-6)
    assert sorted(p.name for p in store.iterdir()) == ["user.rows0of2.col0.tier",
                                                        "user.rows1of2.col0.tier"]
    cache = _train_records(tmp_path / "two")[-1]["tiers"]["user"]
    assert cache["evictions"] > 0 and cache["rows_read"] > 0
    assert cache["rows_ahead"] > 0  # the owners read ahead: the next batch's ids came early
    want, got = _dump(tmp_path / "one", tmp_path / "d1"), _dump(tmp_path / "two", tmp_path / "d2")
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
