"""Storage tiers in the plan (rows per tier, expected hit rates) and the disk tier checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embtrain.data.gen_plan import GenConfig
from embtrain.data.gen_sampling import power_law
from embtrain.errors import UserInputError
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from embtrain.plan import Topology, make_plan
from embtrain.plan.cost import DEFAULT_ID_ALPHA, HASH_INDEX_BYTES_PER_ROW, RowCost
from embtrain.plan.hitrate import EXACT_HEAD, harmonic, top_mass
from embtrain.plan.objects import TierSpec
from embtrain.plan.planner import tier_rows
from embtrain.recipe.models import Recipe
from embtrain.storage.checks import check_disk_tiers, disk_tier_problems, shard_file_bytes
from embtrain.storage.disk import RowFile, RowLayout, max_file_bytes, tier_file_name
from tests.support.cli import REPO

MiB, GiB, TiB = 2**20, 2**30, 2**40
BIG = Topology(world_size=1, device_memory=None, host_memory=64 * GiB, disk=1024 * TiB)


def _recipe(tables: list[dict[str, Any]], optimizer: str = "adagrad") -> Recipe:
    return Recipe.model_validate({
        "version": 1, "name": "tiers",
        "data": {"train": "x/*.parquet", "batch_size": 1024},
        "features": [{"kind": "categorical", "name": f"f_{t['name']}", "column": t["name"],
                      "table": t["name"]} for t in tables],
        "tables": tables,
        "optimizer": {"sparse": {"type": optimizer, "lr": 0.1},
                      "dense": {"type": "adam", "lr": 0.1}},
        "model": {"type": "mlp", "hidden": [8]}, "train": {"steps": 1},
    })


def test_default_alpha_is_gen_datas() -> None:
    assert GenConfig().alpha == DEFAULT_ID_ALPHA


@pytest.mark.parametrize("seed", range(4))
def test_harmonic_sums_equal_plain_sums(seed: int) -> None:
    rng = np.random.default_rng(seed)
    alpha = float(rng.choice([0.5, 1.0, 1.05, 1.3, 2.0]))
    for m in [0, 1, int(rng.integers(2, 5000)), EXACT_HEAD, int(rng.integers(EXACT_HEAD, 3 << 20))]:
        plain = float(np.sum(np.arange(1, m + 1, dtype=np.float64) ** -alpha))
        assert harmonic(m, alpha) == pytest.approx(plain, rel=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 0.9, 1.05, 1.4])
def test_top_mass_matches_sampled_ids(alpha: float) -> None:
    rng = np.random.default_rng(int(alpha * 100))
    rows = 2_000_000
    ids = (power_law(rng, 400_000, rows, alpha) if alpha > 0
           else rng.integers(0, rows, 400_000))
    for cached in (0, 10, 5000, 300_000, rows):
        assert top_mass(rows, alpha, cached) == pytest.approx(np.mean(ids < cached), abs=0.004)


def test_rows_per_tier_are_whole_rows_of_one_cache_within_the_budgets() -> None:
    storage = (TierSpec("device", 1 * MiB), TierSpec("host", 4 * MiB), TierSpec("disk", None))
    per_row = 140 + HASH_INDEX_BYTES_PER_ROW
    assert tier_rows(500_000, 140, storage) == (
        MiB // per_row, 5 * MiB // per_row - MiB // per_row, 500_000 - 5 * MiB // per_row)
    assert tier_rows(1000, 140, storage) == (1000, 0, 0)
    assert tier_rows(10_000, 140, storage[:2]) == (MiB // per_row, 10_000 - MiB // per_row)
    assert tier_rows(10_000, 140, storage[2:]) == (10_000,)


def test_plan_cache_rows_equal_the_engines() -> None:
    from embtrain.embedding.from_recipe import tier_config

    storage = [{"tier": "device", "budget": "1MiB"}, {"tier": "host", "budget": "3MiB"},
               {"tier": "disk", "path": "x"}]
    for opt in OPTIMIZER_NAMES:
        recipe = _recipe([{"name": "a", "dim": 24, "rows": 400_000, "storage": storage}], opt)
        rows = make_plan(recipe, BIG).table("a").groups[0].tier_rows
        cfg = tier_config(recipe.tables[0], opt)
        assert cfg is not None and rows.device + rows.host == cfg.cache_rows


def test_plan_shows_rows_and_hit_rates_of_tiered_tables() -> None:
    storage = [{"tier": "device", "budget": "1MiB"}, {"tier": "host", "budget": "4MiB"},
               {"tier": "disk", "path": "x"}]
    recipe = _recipe([{"name": "a", "dim": 16, "rows": 500_000, "storage": storage},
                      {"name": "b", "dim": 8, "rows": 100}])
    plan = make_plan(recipe, BIG, id_alpha=1.1)
    a, b = plan.tables
    row = sum(RowCost.of("float32", "adagrad", False).shard(1, 16)) + HASH_INDEX_BYTES_PER_ROW
    assert a.groups[0].tier_rows.to_dict() == {"device": MiB // row,
                                               "host": 5 * MiB // row - MiB // row,
                                               "disk": 500_000 - 5 * MiB // row}
    assert a.hit_rates == pytest.approx((top_mass(500_000, 1.1, MiB // row),
                                         top_mass(500_000, 1.1, 5 * MiB // row), 1.0), abs=1e-6)
    assert a.hit_rate == a.hit_rates[1]
    assert b.hit_rate is None and b.hit_rates == ()
    body = json.loads(plan.to_json())
    assert body["id_alpha"] == 1.1 and body["tables"][0]["hit_rates"][2] == 1.0
    assert any("power-law with alpha 1.1" in n for n in plan.notes)


def test_row_sharded_tier_caches_the_keys_below_world_times_cache_rows() -> None:
    recipe = _recipe([{"name": "a", "dim": 16, "rows": 4_000_000, "sharding": "row",
                       "storage": [{"tier": "host", "budget": "8MiB"},
                                   {"tier": "disk", "path": "x"}]}])
    plan = make_plan(recipe, Topology(4, None, 64 * GiB, 1024 * TiB))
    t = plan.table("a")
    cached = sum(g.ranks * g.tier_rows.host for g in t.groups)
    assert cached == 4 * (8 * MiB // (sum(RowCost.of("float32", "adagrad", False).shard(1, 16))
                                      + HASH_INDEX_BYTES_PER_ROW))
    assert t.hit_rate == pytest.approx(top_mass(4_000_000, DEFAULT_ID_ALPHA, cached), abs=1e-6)


def test_cli_plan_prints_tier_rows_and_hit_rate_and_reads_alpha_from_the_data(
        tmp_path: Path) -> None:
    recipe = (REPO / "recipes" / "tiered.yaml").read_text().replace(
        "data/tiered", str(tmp_path / "data"))
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "dataset.json").write_text(json.dumps({"alpha": 1.3}))
    path = tmp_path / "r.yaml"
    path.write_text(recipe)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"}
    args = [sys.executable, "-m", "embtrain", "plan", str(path), "--host-memory", "8GiB",
            "--disk", "100GiB", "--device-memory", "none"]
    out = subprocess.run([*args, "--json"], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout)["id_alpha"] == 1.3
    out = subprocess.run([*args, "--alpha", "1.05"], capture_output=True, text=True, env=env,
                         check=True)
    assert "rows/tier" in out.stdout and "4.7K/18.6K/476.7K" in out.stdout
    assert "83.2%" in out.stdout


# ----------------------------------------------------------------------------- disk checks


def _disk_recipe(path: str | None, rows: int = 1000, dim: int = 16) -> Recipe:
    disk: dict[str, Any] = {"tier": "disk"}
    if path is not None:
        disk["path"] = path
    return _recipe([{"name": "u", "dim": 4, "rows": 10},
                    {"name": "big", "dim": dim, "rows": rows,
                     "storage": [{"tier": "host", "budget": "1MiB"}, disk]}])


def test_disk_tier_checks_pass_on_a_writable_directory(tmp_path: Path) -> None:
    recipe = _disk_recipe(str(tmp_path))
    assert disk_tier_problems(recipe, make_plan(recipe, BIG)) == []
    assert not list(tmp_path.iterdir())  # the probe is gone


@pytest.mark.parametrize("case", ["none", "missing", "file", "read-only"])
def test_bad_disk_paths_are_one_line_naming_the_field(tmp_path: Path, case: str) -> None:
    path = {"none": None, "missing": str(tmp_path / "nope"), "file": str(tmp_path / "f"),
            "read-only": "/proc"}[case]
    (tmp_path / "f").write_text("x")
    recipe = _disk_recipe(path)
    with pytest.raises(UserInputError) as err:
        check_disk_tiers(recipe, make_plan(recipe, BIG), "r.yaml")
    line = str(err.value)
    assert "\n" not in line and line.startswith("r.yaml: tables[1].storage[1].path: ")
    assert {"none": "needs a path", "missing": "does not exist", "file": "not a directory",
            "read-only": "not writable"}[case] in line
    assert err.value.exit_code == 2


def test_a_disk_too_small_for_the_table_is_one_line(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    rows = 2 * free // 4096 * 16  # rows of 256 bytes: over twice the free space
    recipe = _disk_recipe(str(tmp_path), rows=rows, dim=31)
    problems = disk_tier_problems(recipe, make_plan(recipe, BIG))
    assert len(problems) == 1
    assert problems[0].startswith("tables[1].storage[1].path: ") and "free but the disk tier "\
        "of table 'big' needs up to" in problems[0]


def test_shard_file_bytes_is_what_a_tier_file_can_reach(tmp_path: Path) -> None:
    from embtrain.embedding.config import SparseOptimizerConfig, TableConfig

    lay = RowLayout.of(TableConfig("t", 3000, 10), SparseOptimizerConfig(kind="adam", lr=0.1), 0)
    assert shard_file_bytes(3000, 10, "adam") == max_file_bytes(lay)
    rng = np.random.default_rng(0)
    with RowFile.create(tmp_path / tier_file_name("t"), lay, "run") as f:
        for _ in range(40):
            f.write(f.read(rng.choice(3000, 1500, replace=False)))
    assert (tmp_path / "t.tier").stat().st_size <= shard_file_bytes(3000, 10, "adam")


@pytest.mark.parametrize("seed", range(5))
def test_split_cache_is_the_greedy_knapsack_by_draws_per_byte(seed: int) -> None:
    from embtrain.plan.hitrate import split_cache

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    rows = [int(r) for r in rng.integers(1, 3000, n)]
    row_bytes = [int(b) for b in rng.choice([44, 76, 140, 268], n)]
    draws = [float(d) for d in rng.integers(0, 50_000, n)]
    alpha = float(rng.choice([0.7, 1.05, 1.5]))
    budget = int(rng.uniform(0, 1.1) * sum(r * b for r, b in zip(rows, row_bytes, strict=True)))
    got = split_cache(rows, row_bytes, draws, budget, alpha)
    assert sum(c * b for c, b in zip(got, row_bytes, strict=True)) <= budget
    # plain greedy: every (table, row) by expected draws per byte, taken while they fit
    items = sorted(((draws[t] * (k + 1) ** -alpha / harmonic(rows[t], alpha) / row_bytes[t], t)
                    for t in range(n) for k in range(rows[t])), reverse=True)
    want = [0] * n
    left = budget
    for _, t in items:
        if row_bytes[t] > left:
            break
        want[t] += 1
        left -= row_bytes[t]
    # equal up to rows sitting exactly at the cutoff (one row per table)
    assert all(abs(a - b) <= 1 for a, b in zip(got, want, strict=True)), (got, want)
    mass = sum(d * top_mass(r, alpha, c) for r, d, c in zip(rows, draws, got, strict=True))
    best = sum(d * top_mass(r, alpha, c) for r, d, c in zip(rows, draws, want, strict=True))
    assert mass >= best * (1 - 1e-3)


def test_a_tiny_tiered_table_is_not_replicated_and_data_parallel_tiers_are_refused() -> None:
    # a tiered table's rows live in a cache over its store: replicas would not see one another
    from embtrain.train.support import unsupported_fields

    storage = [{"tier": "host", "budget": "4KiB"}, {"tier": "host"}]
    recipe = _recipe([{"name": "tiny", "dim": 8, "rows": 60, "storage": storage},
                      {"name": "flat", "dim": 8, "rows": 60}])
    plan = make_plan(recipe, Topology(world_size=2, device_memory=None, host_memory=64 * GiB,
                                      disk=1024 * TiB))
    assert plan.table("flat").sharding == "data_parallel"
    assert plan.table("tiny").sharding != "data_parallel"
    pinned = _recipe([{"name": "tiny", "dim": 8, "rows": 60, "storage": storage,
                       "sharding": "data_parallel"}])
    assert any("tiered table cannot be data_parallel" in p
               for p in unsupported_fields(pinned, 2))
