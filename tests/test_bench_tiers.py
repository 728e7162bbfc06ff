"""`bench --host-memory --disk`: the budget split, the tier setup and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from embtrain.bench.synthetic import build_recipe, load_model
from embtrain.bench.tiers import parse_host_memory, tier_setup
from embtrain.errors import UserInputError
from embtrain.plan import Topology, make_plan

REPO = Path(__file__).resolve().parents[1]
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
    out = _bench("--host-memory", "0.2", "--disk", str(tmp_path), "--steps", "3", "--warmup",
                 "1", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ran"] is True, doc.get("reason")
    tiers = doc["tiers"]
    assert tiers["tiered_tables"] > 0 and tiers["disk"] == str(tmp_path)
    assert set(tiers["disk_rates"]["random_4k_reads_per_s"]) == {"1", "4", "16"}
    side = doc["results"]["embtrain"]["tiers"]
    assert 0 < side["hit_rate"] < 1 and side["rows_read_per_step"] >= 0
    assert side["wait_seconds_per_step"] >= 0  # 0 when every miss was read ahead
    text = _bench("--host-memory", "0.2", "--disk", str(tmp_path), "--steps", "2", "--warmup",
                  "1")
    assert text.returncode == 0 and "tiers: hit rate" in text.stdout, text.stderr


@pytest.mark.parametrize("args, message", [
    (["--host-memory", "0.1"], "--host-memory and --disk go together"),
    (["--host-memory", "7", "--disk", "."], "--host-memory: 7: give a size"),
    (["--host-memory", "0.3", "--disk", "/nonexistent/x"], "--disk: /nonexistent/x: does not "
                                                            "exist"),
    (["--host-memory", "0.3", "--disk", "/proc"], "--disk: /proc: is not writable"),
])
def test_bad_tier_flags_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = _bench(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
