"""`bench --host-memory --disk`: the budget split, the tier setup and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embtrain.bench.synthetic import build_recipe, load_model
from embtrain.bench.tiers import parse_host_memory, tier_setup
from embtrain.errors import UserInputError
from embtrain.plan import Topology, make_plan
from tests.support.cli import REPO

GiB = 2**30


def test_host_memory_is_a_size_or_a_fraction() -> None:
    assert parse_host_memory("4GiB", 10) == 4 * GiB
    assert parse_host_memory("0.25", 1000) == 250
    assert parse_host_memory("1", 1000) == 1000
    for bad in ("0", "2", "-0.1", "nan", "lots"):
        with pytest.raises(UserInputError, match=r"^--host-memory: "):
            parse_host_memory(bad, 1000)


def test_the_budget_goes_to_the_most_used_rows_of_any_table(tmp_path: Path) -> None:
    model = load_model("tiny")
    setup = tier_setup(model, scale=0.01, optimizer="adagrad", batch=512,
                       budget=20 * 2**20, disk=str(tmp_path), alpha=1.05)
    cache = sum(t.cache_rows * t.row_bytes for t in setup.tables)
    assert 0.99 * 20 * 2**20 <= cache <= 20 * 2**20
    small = [t for t in setup.tables if t.rows <= 1000]
    assert small and all(not t.tiered for t in small)  # tiny tables stay whole in memory
    assert 0 < setup.expected_hit_rate < 1
    recipe = build_recipe(model, scale=0.01, storage_by_table=setup.storage())
    plan = make_plan(recipe, Topology(1, None, 64 * GiB, 1024 * GiB))
    for t in setup.tables:
        tp = plan.table(t.name)
        if t.tiered:
            assert [s.tier for s in tp.storage] == ["host", "disk"]
            assert tp.groups[0].tier_rows.host == t.cache_rows
        else:
            assert len(tp.storage) == 1


def test_a_budget_below_one_batch_of_rows_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"^--host-memory: .* cannot hold the rows one batch"):
        tier_setup(load_model("tiny"), scale=0.01, optimizer="adagrad", batch=65536,
                   budget=2**20, disk=str(tmp_path), alpha=1.05)


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "embtrain", "bench", "--model", "tiny",
                           "--scale", "0.01", "--batch", "1024", "--baseline", "none", *args],
                          capture_output=True, text=True, env=env)


def test_bench_runs_a_model_through_the_tiers(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    # one invocation: the report on stdout, the JSON document in --out
    text = _bench("--host-memory", "0.2", "--disk", str(disk), "--steps", "3", "--warmup",
                  "1", "--out", str(tmp_path / "bench.json"))
    assert text.returncode == 0, text.stderr
    assert "tiers: hit rate" in text.stdout, text.stdout
    assert "tiers vs the offline oracle" in text.stdout and "tier targets:" in text.stdout
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["ran"] is True, doc.get("reason")
    tiers = doc["tiers"]
    assert tiers["tiered_tables"] > 0 and tiers["disk"] == str(disk)
    assert set(tiers["disk_rates"]["random_4k_reads_per_s"]) == {"1", "4", "16"}
    side = doc["results"]["embtrain"]["tiers"]
    assert 0 < side["hit_rate"] < 1 and side["rows_read_per_step"] >= 0
    oracle = side["oracle"]  # distinct rows per step, the same batches and cache rows
    assert oracle["eviction"] == "lru" and oracle["timed"]["lookups"] > 0
    assert 0 < oracle["timed"]["cache_hit_rate"] <= 1 and 0 < oracle["timed"]["oracle_hit_rate"] <= 1
    assert oracle["all_steps"]["oracle_cold_hit_rate"] <= oracle["all_steps"]["oracle_hit_rate"]
    assert tiers["judged"]["hit_rate_within_3_points_of_oracle"] == oracle["within_target"]
    assert side["wait_seconds_per_step"] >= 0  # 0 when every miss was read ahead


@pytest.mark.parametrize("args, message", [
    (["--host-memory", "0.1"], "--host-memory and --disk go together"),
    (["--host-memory", "7", "--disk", "."], "--host-memory: 7: give a size"),
    (["--host-memory", "0.3", "--disk", "/nonexistent/x"], "--disk: /nonexistent/x: does not "
                                                            "exist"),
    (["--host-memory", "0.3", "--disk", "/proc"], "--disk: /proc: is not writable"),
    (["--eviction", "lfu"], "--eviction chooses the tier caches' replacement: it needs"),
    (["--host-memory", "0.3", "--disk", ".", "--eviction", "fifo"], "--eviction: fifo: one of "
                                                                    "lru, lfu"),
])
def test_bad_tier_flags_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = _bench(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_cache_hit_rate_is_counted_as_the_oracle_counts() -> None:
    """Distinct rows per step, by hand: cache of 2 rows; steps read {1, 2}, {1, 3}, {1, 2}.
    The cache misses 1, 2 (cold), then 3 (evicting 2, the row not read), then 2: 4 of 6.
    The oracle keeps rows 1 (3 steps) and 2 (2 steps): 5 of 6 hit, 3 of 6 starting empty."""
    from embtrain.bench.tiers import TableTier, TierSetup, cache_vs_oracle
    from embtrain.embedding.config import (
        FeatureConfig,
        SparseInput,
        SparseOptimizerConfig,
        TableConfig,
        TierConfig,
    )
    from embtrain.embedding.engine import EmbeddingEngine

    ids = np.array([[1, 1, 2], [1, 3, 3], [2, 1, 1]], np.int64)[:, :, None]  # [step, batch, 1]
    engine = EmbeddingEngine([TableConfig("t", 10, 4, tier=TierConfig(2))],
                             [FeatureConfig("f", "t", "sum", 1)],
                             SparseOptimizerConfig("sgd", lr=0.1), 0)
    counts = []
    for step in range(3):
        counts.append({k: dict(v) for k, v in engine.tier_metrics().items()})
        out = engine.forward({"f": SparseInput.fixed_hotness(ids[step])})
        engine.backward_update([np.ones_like(o) for o in out], step)
    end = engine.tier_metrics()
    assert end["t"]["distinct_misses"] == 4 and end["t"]["misses"] == 6  # 6 key occurrences
    setup = TierSetup(1, "/x", 1.05, (TableTier("t", 10, 4, 2, 100, 3, 0.5),))
    doc = cache_vs_oracle(setup, ["t"], [ids], 0, 3, {"warmup": counts[0], "end": end})
    a = doc["all_steps"]
    assert a["lookups"] == 6 and a["cache_hit_rate"] == pytest.approx(2 / 6)
    assert a["oracle_hit_rate"] == pytest.approx(5 / 6)
    assert a["oracle_cold_hit_rate"] == pytest.approx(3 / 6)
    assert a["points_below_oracle"] == pytest.approx(50.0) and not doc["within_target"]
    # rows 0 and 1 (the most likely under bench's power law): row 1, in all 3 steps, the first
    # a miss when starting empty
    assert a["likely_rows_hit_rate"] == pytest.approx(3 / 6)
    assert a["likely_rows_cold_hit_rate"] == pytest.approx(2 / 6)
    # timed = steps 1, 2 after one warm-up step: the cache hits row 1 twice (2 of 4); the
    # oracle keeps 1 (2 steps) and 2 (1 step, the lower id of the ties): 3 of 4; only row 3
    # is new to the run
    doc = cache_vs_oracle(setup, ["t"], [ids], 1, 2, {"warmup": counts[1], "end": end})
    t = doc["timed"]
    assert (t["lookups"], t["cache_misses"]) == (4, 2)
    assert t["oracle_hit_rate"] == pytest.approx(3 / 4)
    assert t["first_touch_share"] == pytest.approx(1 / 4)
    assert t["oracle_cold_hit_rate"] == pytest.approx(3 / 4)


def test_eviction_reaches_the_cache_and_is_kept_out_of_old_fingerprints() -> None:
    from embtrain.embedding.from_recipe import tier_config
    from embtrain.recipe import models as rm

    def table(*tiers: rm.Tier) -> rm.Table:
        return rm.Table(name="t", dim=4, rows=10**6, storage=list(tiers))

    lfu = table(rm.Tier(tier="host", budget=2**20, eviction="lfu"), rm.Tier(tier="disk", path="/x"))
    plain = table(rm.Tier(tier="host", budget=2**20), rm.Tier(tier="disk", path="/x"))
    assert tier_config(lfu, "sgd").eviction == "lfu"
    assert tier_config(plain, "sgd").eviction == "lru"
    assert "eviction" not in plain.model_dump(mode="json")["storage"][0]  # fingerprints as before



def test_read_clock_counts_overlapping_reads_once() -> None:
    import time

    from embtrain.storage.disk import BusyClock

    clock = BusyClock()
    with clock:
        with clock:  # a second file reading at the same time
            time.sleep(0.05)
        time.sleep(0.05)
    assert 0.1 <= clock.seconds < 0.15
    time.sleep(0.02)
    assert clock.seconds < 0.15  # idle time does not count


def test_tier_targets_from_one_invocation() -> None:
    from embtrain.bench.results import tier_targets

    tiers = {"disk_rates": {"random_4k_reads_per_s": {"1": 10_000.0, "4": 30_000.0,
                                                      "16": 50_000.0}}}
    emb = {"step_ms": {"median": 1100.0},
           "tiers": {"read_blocks_per_step": 45_000.0, "read_busy_seconds_per_step": 1.0,
                     "oracle": {"timed": {"points_below_oracle": 2.0}, "within_target": True}}}
    memory = {"step_ms": {"median": 400.0}}
    got = tier_targets(tiers, emb, memory)
    assert got["tier_read_share_of_raw"] == pytest.approx(0.9)  # 45k blocks/s vs 50k at 16
    assert got["tier_reads_at_least_0_8x_raw"] and got["hit_rate_within_3_points_of_oracle"]
    assert got["overlap_bound_ms"] == pytest.approx(900.0)  # reads 45k ÷ 50k/s > 400 ms
    assert got["step_over_bound"] == pytest.approx(1100 / 900) and not got["overlap_within_15pct"]
    assert tier_targets(tiers, emb, None)["overlap_within_15pct"] is None  # no in-memory side
