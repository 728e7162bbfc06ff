"""The planner: sharding, tiers, bytes, traffic, fingerprint, errors, rendering, CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rich.console import Console

from embtrain.errors import UserInputError
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from embtrain.plan import (
    FitSuggestion,
    Plan,
    PlanError,
    Topology,
    make_plan,
    smallest_fitting_topology,
)
from embtrain.plan import topology as topology_module
from embtrain.plan.cost import HASH_INDEX_BYTES_PER_ROW, METADATA_BYTES_PER_ROW, RowCost
from embtrain.plan.render import render_plan
from embtrain.plan.topology import gpu_memories, host_memory_bytes
from embtrain.recipe import load_recipe
from embtrain.recipe.kinds import TABLE_DTYPES
from embtrain.recipe.models import Recipe

REPO = Path(__file__).resolve().parents[1]
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40
BIG = Topology(world_size=1, device_memory=None, host_memory=64 * GiB, disk=1 * TiB)


def make_recipe(tables: list[dict[str, Any]], features: list[dict[str, Any]] | None = None, *,
                optimizer: str = "adagrad", batch_size: int = 1024, quantize: str = "none",
                processes: int = 1) -> Recipe:
    """A valid recipe around ``tables``; by default one one-hot feature per table."""
    if features is None:
        features = [{"kind": "categorical", "name": f"f_{t['name']}", "column": t["name"],
                     "table": t["name"]} for t in tables]
    return Recipe.model_validate({
        "version": 1, "name": "test",
        "data": {"train": "x/*.parquet", "batch_size": batch_size},
        "features": features, "tables": tables,
        "optimizer": {"sparse": {"type": optimizer, "lr": 0.1}, "dense": {"type": "adam", "lr": 0.1}},
        "model": {"type": "mlp", "hidden": [8]}, "train": {"steps": 1},
        "distributed": {"processes": processes, "comm": {"quantize": quantize}},
    })


def host_topology(world_size: int, host: int, disk: int = TiB) -> Topology:
    return Topology(world_size=world_size, device_memory=None, host_memory=host, disk=disk)


# --------------------------------------------------------------------------- invariants


def pool_of(tier: str, topology: Topology) -> str:
    return "host" if tier == "device" and not topology.has_device else tier


def check_plan(recipe: Recipe, topology: Topology, plan: Plan) -> None:
    """Every table placed, shards cover rows/columns exactly once, nothing over capacity or budget."""
    w = topology.world_size
    assert [t.name for t in plan.tables] == [t.name for t in recipe.tables]
    used = {r: {"device": 0, "host": 0, "disk": 0} for r in range(w)}
    dense = plan.dense.bytes if plan.dense is not None else 0  # every rank holds the network
    dense_pool = "device" if topology.has_device else "host"
    for spec, table in zip(recipe.tables, plan.tables, strict=True):
        assert table.rows == spec.capacity and table.dim == spec.dim
        if spec.sharding != "auto":
            assert table.sharding == spec.sharding
        shards = table.shards
        assert shards, table.name
        assert all(0 <= s.rank < w for s in shards)
        assert len({s.rank for s in shards}) == len(shards)
        if table.sharding == "data_parallel":
            assert [s.rank for s in shards] == list(range(w))
            assert all((s.rows, s.row_stride, s.col_start, s.col_stop) == (table.rows, 1, 0, table.dim)
                       for s in shards)
        elif table.sharding == "table":
            assert len(shards) == 1
            (s,) = shards
            assert (s.rows, s.row_offset, s.row_stride, s.col_start, s.col_stop) == (
                table.rows, 0, 1, 0, table.dim)
        elif table.sharding == "row":
            assert sum(s.rows for s in shards) == table.rows
            for s in shards:
                assert s.row_offset == s.rank and s.row_stride == w
                assert s.rows == len(range(s.rank, table.rows, w)) > 0
                assert (s.col_start, s.col_stop) == (0, table.dim)
            held = {s.rank for s in shards}
            assert all(len(range(r, table.rows, w)) == 0 for r in range(w) if r not in held)
        else:
            assert table.sharding == "column"
            columns = sorted((s.col_start, s.col_stop) for s in shards)
            assert columns[0][0] == 0 and columns[-1][1] == table.dim
            assert all(a[1] == b[0] for a, b in itertools.pairwise(columns))
            assert all(start < stop for start, stop in columns)
            assert all(s.rows == table.rows and s.row_stride == 1 for s in shards)
        budgets = {t.tier: t.budget for t in spec.storage}
        for s in shards:
            assert s.tiers.total == s.bytes
            for tier in ("device", "host", "disk"):
                amount = s.tiers.get(tier)
                if tier not in budgets:
                    assert amount == 0
                elif budgets[tier] is not None:
                    assert amount <= budgets[tier]
                used[s.rank][pool_of(tier, topology)] += amount
        assert table.bytes == sum(s.bytes for s in shards)
    for r, summary in enumerate(plan.ranks):
        assert summary.rank == r
        assert summary.tiers.total == summary.bytes == sum(used[r].values())
        used[r][dense_pool] += dense
        for pool in ("device", "host", "disk"):
            assert summary.memory.get(pool) == used[r][pool]
            assert used[r][pool] <= topology.capacity(pool)
    assert plan.totals.bytes == sum(t.bytes for t in plan.tables)


# --------------------------------------------------------------------------- unit tests


def test_quickstart_on_one_rank() -> None:
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml")
    plan = make_plan(recipe, BIG)
    check_plan(recipe, BIG, plan)
    assert {t.sharding for t in plan.tables} == {"table"}
    assert all(t.ranks == (0,) for t in plan.tables)
    user = plan.table("user")
    # adagrad: float32 value + float32 accumulator per column, 12 bytes of metadata per row
    rows = recipe.table("user").rows
    assert user.bytes == rows * (16 * 4 + 16 * 4 + 12)
    assert (user.value_bytes, user.optimizer_bytes, user.metadata_bytes) == (
        rows * 64, rows * 64, rows * 12)
    item = plan.table("item")
    assert item.ids_per_sample == 11  # item (1) + history (variable → 10)
    assert any("variable hotness" in n and "history" in n for n in plan.notes)
    assert plan.traffic.ids_bytes == 0  # one rank: nothing crosses ranks
    assert plan.traffic.lookups == 2048 * (1 + 11 + 1)
    assert len(plan.fingerprint) == 64


@pytest.mark.parametrize(("optimizer", "dtype", "per_row"), [
    ("sgd", "float32", 8 * 4),
    ("adagrad", "float32", 8 * 4 + 8 * 4),
    ("rowwise_adagrad", "float16", 8 * 2 + 4),
    ("adam", "bfloat16", 8 * 2 + 2 * 8 * 4),
    ("lazy_adam", "float32", 8 * 4 + 2 * 8 * 4),
    ("ftrl", "float32", 8 * 4 + 2 * 8 * 4),
])
def test_bytes_per_row(optimizer: str, dtype: str, per_row: int) -> None:
    recipe = make_recipe([{"name": "t", "dim": 8, "rows": 1000, "dtype": dtype}], optimizer=optimizer)
    table = make_plan(recipe, BIG).table("t")
    assert table.bytes == 1000 * (per_row + METADATA_BYTES_PER_ROW)


@pytest.mark.parametrize(("optimizer", "dtype", "state", "optimizer_bytes"), [
    ("adagrad", "bfloat16", None, 8 * 4),
    ("adagrad", "bfloat16", "table", 8 * 2),
    ("adam", "float16", "table", 2 * 8 * 2),
    ("rowwise_adagrad", "bfloat16", "table", 2),
])
def test_half_table_values_and_optimizer_state_bytes(optimizer: str, dtype: str, state: str | None,
                                                     optimizer_bytes: int) -> None:
    table = {"name": "t", "dim": 8, "rows": 1000, "dtype": dtype}
    if state is not None:
        table["optimizer_state"] = state
    plan = make_plan(make_recipe([table], optimizer=optimizer), BIG)
    t = plan.table("t")
    assert (t.value_bytes, t.optimizer_bytes) == (1000 * 8 * 2, 1000 * optimizer_bytes)


def test_dynamic_table_counts_capacity_and_hash_index() -> None:
    recipe = make_recipe([{"name": "d", "dim": 4, "dynamic": {"capacity": 5000}}], optimizer="sgd")
    plan = make_plan(recipe, BIG)
    table = plan.table("d")
    assert table.rows == 5000 and table.dynamic
    assert table.metadata_bytes == 5000 * (METADATA_BYTES_PER_ROW + HASH_INDEX_BYTES_PER_ROW)
    assert any("index per row" in n for n in plan.notes)


def test_tiny_tables_are_replicated_and_others_packed_largest_first() -> None:
    tables = [{"name": "tiny", "dim": 4, "rows": 10}] + [
        {"name": f"t{i}", "dim": 16, "rows": 100_000 * (i + 1)} for i in range(4)]
    recipe = make_recipe(tables)
    topology = host_topology(2, 64 * GiB)
    plan = make_plan(recipe, topology)
    check_plan(recipe, topology, plan)
    assert plan.table("tiny").sharding == "data_parallel"
    assert plan.table("tiny").ranks == (0, 1)
    # largest first onto the least-loaded rank: t3 → 0, t2 → 1, t1 → 1, t0 → 0
    assert [plan.table(f"t{i}").ranks for i in range(4)] == [(0,), (1,), (1,), (0,)]
    assert plan.table("tiny").traffic.allreduce_bytes == 10 * (4 + 1) * 4  # sums + touched


def test_table_too_large_for_one_rank_is_split_by_rows() -> None:
    recipe = make_recipe([{"name": "big", "dim": 16, "rows": 1_000_000}])
    topology = host_topology(4, 40 * MiB)  # the table is 137 MB
    plan = make_plan(recipe, topology)
    check_plan(recipe, topology, plan)
    big = plan.table("big")
    assert big.sharding == "row"
    assert [s.rows for s in big.shards] == [250_000] * 4
    assert "fits on no single rank" in big.reason


def dense_bytes(recipe: Recipe, world_size: int) -> int:
    """Bytes of the recipe's dense network on each rank (the plan counts them first)."""
    from embtrain.plan.dense import dense_memory, dense_shape

    return dense_memory(dense_shape(recipe), recipe.data.batch_size, world_size).bytes


def test_few_wide_rows_are_split_by_columns() -> None:
    recipe = make_recipe([{"name": "wide", "dim": 64, "rows": 3}])
    # 1584 bytes do not fit on one rank (besides the dense network every rank holds)
    topology = host_topology(4, 1000 + dense_bytes(recipe, 4))
    plan = make_plan(recipe, topology)
    check_plan(recipe, topology, plan)
    wide = plan.table("wide")
    assert wide.sharding == "column"
    assert [(s.col_start, s.col_stop) for s in wide.shards] == [(0, 16), (16, 32), (32, 48), (48, 64)]


def test_explicit_shardings_are_honoured() -> None:
    tables = [{"name": "r", "dim": 8, "rows": 10, "sharding": "row"},
              {"name": "c", "dim": 8, "rows": 10, "sharding": "column"},
              {"name": "t", "dim": 8, "rows": 10, "sharding": "table"},
              {"name": "d", "dim": 8, "rows": 10_000_000, "sharding": "data_parallel"}]
    recipe = make_recipe(tables)
    for w in (1, 3, 8):
        topology = host_topology(w, 64 * GiB)
        plan = make_plan(recipe, topology)
        check_plan(recipe, topology, plan)
        assert [t.sharding for t in plan.tables] == ["row", "column", "table", "data_parallel"]
        assert all(t.reason == "requested" for t in plan.tables)


def test_column_sharding_needs_dim_at_least_world_size() -> None:
    recipe = make_recipe([{"name": "narrow", "dim": 4, "rows": 10, "sharding": "column"}])
    with pytest.raises(PlanError, match=r"table 'narrow' asks for column sharding but its dim 4 "
                                         r"is less than the world size 8") as info:
        make_plan(recipe, host_topology(8, GiB))
    assert info.value.table == "narrow"
    assert isinstance(info.value, UserInputError) and info.value.exit_code == 2


def test_tiers_fill_in_order_up_to_budgets() -> None:
    storage = [{"tier": "device", "budget": "4MiB"}, {"tier": "host", "budget": "2MiB"},
               {"tier": "disk"}]
    recipe = make_recipe([{"name": "t", "dim": 16, "rows": 100_000, "storage": storage}])
    topology = Topology(world_size=1, device_memory=80 * GiB, host_memory=GiB, disk=TiB)
    plan = make_plan(recipe, topology)
    check_plan(recipe, topology, plan)
    (shard,) = plan.table("t").shards
    assert shard.tiers.device == 4 * MiB and shard.tiers.host == 2 * MiB
    assert shard.tiers.disk == shard.bytes - 6 * MiB
    rank = plan.ranks[0]
    dense = dense_bytes(recipe, 1)  # the dense network lives in device memory too
    assert rank.memory.device == 4 * MiB + dense and rank.memory.disk == shard.tiers.disk
    # without a GPU the device tier is served from host memory
    cpu = Topology(world_size=1, device_memory=None, host_memory=GiB, disk=TiB)
    plan = make_plan(recipe, cpu)
    assert plan.ranks[0].memory.host == 6 * MiB + dense and plan.ranks[0].memory.device == 0
    assert plan.ranks[0].tiers.device == 4 * MiB


def test_last_tier_budget_is_a_limit() -> None:
    storage = [{"tier": "device", "budget": "1MiB"}, {"tier": "host", "budget": "1MiB"}]
    recipe = make_recipe([{"name": "capped", "dim": 16, "rows": 100_000, "storage": storage,
                           "sharding": "table"}])
    with pytest.raises(PlanError, match=r"table 'capped' needs .* per rank .* storage budgets "
                                         r"allow 2\.0 MiB per rank"):
        make_plan(recipe, host_topology(1, 64 * GiB))
    auto = make_recipe([{"name": "capped", "dim": 16, "rows": 100_000, "storage": storage}])
    with pytest.raises(PlanError) as info:
        make_plan(auto, host_topology(1, 64 * GiB))
    suggestion = info.value.suggestion
    assert suggestion is not None and suggestion.by_ranks is not None
    assert suggestion.by_memory is None  # more memory does not lift a budget
    plan = make_plan(auto, suggestion.by_ranks)
    assert plan.table("capped").sharding == "row"


def test_traffic_per_step() -> None:
    features = [{"kind": "categorical", "name": "a", "column": "a", "table": "t", "hotness": 3},
                {"kind": "categorical", "name": "b", "column": "b", "table": "t", "hotness": 2,
                 "combiner": "concat"}]
    recipe = make_recipe([{"name": "t", "dim": 8, "rows": 1_000_000}], features, batch_size=1000)
    plan = make_plan(recipe, host_topology(2, 64 * GiB))
    t = plan.table("t")
    assert t.sharding == "table"
    # half of every exchange crosses ranks on two ranks
    assert t.traffic.ids_bytes == 1000 * 5 * 8 // 2
    assert t.traffic.forward_bytes == 1000 * (8 + 8 * 2) * 4 // 2 == t.traffic.backward_bytes
    assert t.traffic.lookups == 5000
    owner = plan.ranks[t.ranks[0]]
    assert owner.lookups == 5000 and owner.ids_bytes == t.traffic.ids_bytes
    quantized = make_plan(make_recipe([{"name": "t", "dim": 8, "rows": 1_000_000}], features,
                                      batch_size=1000, quantize="int8"), host_topology(2, 64 * GiB))
    assert quantized.table("t").traffic.forward_bytes == t.traffic.forward_bytes // 4
    assert quantized.traffic.element_bytes == 1
    bigger = make_plan(recipe, host_topology(2, 64 * GiB), batch_size=4000)
    assert bigger.traffic.batch_size == 4000
    assert bigger.table("t").traffic.ids_bytes == 4 * t.traffic.ids_bytes


def test_plan_json_is_deterministic_across_processes() -> None:
    recipe_path = REPO / "recipes" / "quickstart.yaml"
    topology = host_topology(3, 8 * GiB)
    plan = make_plan(load_recipe(recipe_path), topology)
    assert plan.to_json() == make_plan(load_recipe(recipe_path), topology).to_json()
    data = json.loads(plan.to_json())
    assert data["fingerprint"] == plan.fingerprint
    assert plan.to_dict() == data
    code = ("from embtrain.recipe import load_recipe; from embtrain.plan import make_plan, Topology;"
            f"print(make_plan(load_recipe({str(recipe_path)!r}), Topology(3, None, {8 * GiB}, "
            f"{TiB})).fingerprint)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=REPO)
    assert out.stdout.strip() == plan.fingerprint
    other = make_plan(load_recipe(recipe_path), host_topology(4, 8 * GiB))
    assert other.fingerprint != plan.fingerprint


def test_table_too_large_for_one_rank_names_it_and_the_smallest_fitting_topology() -> None:
    recipe = make_recipe([{"name": "small", "dim": 8, "rows": 1000},
                          {"name": "big", "dim": 128, "rows": 50_000_000}])
    topology = host_topology(1, 22 * GiB)
    with pytest.raises(PlanError) as info:
        make_plan(recipe, topology)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("plan: table 'big' needs 48.2 GiB (values 23.8 GiB + adagrad "
                              "23.8 GiB + metadata 572.2 MiB) but each of 1 rank(s) has 22.0 GiB "
                              "of host memory")
    assert message.endswith("smallest topology that fits: 3 ranks with 22.0 GiB of host memory "
                            "each, or 1 rank with 49 GiB of host memory")
    error = info.value
    assert error.table == "big" and error.needed == 50_000_000 * (128 * 8 + 12)
    assert error.available == 22 * GiB and error.pool == "host"
    assert error.suggestion is not None
    for fitting in error.suggestion.topologies():
        check_plan(recipe, fitting, make_plan(recipe, fitting))
    assert smallest_fitting_topology(recipe, topology) == error.suggestion


def test_smallest_fitting_topology_of_a_fitting_recipe_is_itself() -> None:
    recipe = make_recipe([{"name": "t", "dim": 8, "rows": 1000}])
    found = smallest_fitting_topology(recipe, BIG)
    assert found == FitSuggestion(BIG, (), BIG, BIG) and found.fits_as_given


def test_device_memory_suggestion() -> None:
    recipe = make_recipe([{"name": f"t{i}", "dim": 64, "rows": 10_000_000} for i in range(4)])
    topology = Topology(world_size=2, device_memory=8 * GiB, host_memory=64 * GiB, disk=TiB)
    found = smallest_fitting_topology(recipe, topology)
    assert found.pools == ("device",)
    assert found.by_ranks is not None and found.by_ranks.device_memory == 8 * GiB
    assert found.by_memory is not None and found.by_memory.world_size == 2
    for fitting in found.topologies():
        make_plan(recipe, fitting)
    smaller = Topology(2, found.by_memory.device_memory - GiB, 64 * GiB, TiB)
    with pytest.raises(PlanError):
        make_plan(recipe, smaller)
    assert "of device memory each" in found.describe()


def test_no_topology_fits_when_a_budget_cannot_be_met() -> None:
    storage = [{"tier": "host", "budget": "1KiB"}]
    recipe = make_recipe([{"name": "pinned", "dim": 8, "rows": 1000, "sharding": "table",
                           "storage": storage}])
    with pytest.raises(PlanError) as info:
        make_plan(recipe, host_topology(2, GiB))
    assert str(info.value) == (
        "plan: table 'pinned' needs 74.2 KiB per rank as table shards (values 31.2 KiB + adagrad "
        "31.2 KiB + metadata 11.7 KiB in all) but its storage budgets allow 1.0 KiB per rank "
        "(host 1.0 KiB); no larger topology fits: raise its storage budgets or let it be split "
        "(sharding: auto)")
    suggestion = info.value.suggestion
    assert suggestion is not None and suggestion.topologies() == ()
    assert suggestion.limit.startswith("table 'pinned' needs 74.2 KiB per rank as table shards")
    # another table's budget blocks every topology: the message names it
    other = make_recipe([{"name": "pinned", "dim": 8, "rows": 1000, "sharding": "table",
                          "storage": storage}, {"name": "big", "dim": 8, "rows": 10**6}])
    with pytest.raises(PlanError, match=r"^plan: table 'big' needs .*; no larger topology fits: "
                                        r"table 'pinned' needs 74\.2 KiB per rank"):
        make_plan(other, host_topology(1, MiB))


def test_more_ranks_and_more_memory_together() -> None:
    # 'split' needs 4 ranks (its budget), 'replica' needs more host memory on every rank
    recipe = make_recipe([
        {"name": "split", "dim": 8, "rows": 1000, "storage": [{"tier": "host", "budget": 12000}]},
        {"name": "replica", "dim": 8, "rows": 2000, "sharding": "data_parallel",
         "storage": [{"tier": "host"}]},
    ], optimizer="sgd")
    topology = host_topology(1, 50_000)
    found = smallest_fitting_topology(recipe, topology)
    assert found.by_ranks is None and found.by_memory is None
    assert found.by_both == host_topology(4, MiB)
    assert found.describe() == "4 ranks with 1 MiB of host memory each"
    check_plan(recipe, found.by_both, make_plan(recipe, found.by_both))


def test_plan_package_is_pure() -> None:
    code = ("import sys, embtrain.plan, embtrain.plan.render, embtrain.cli.plan; "
            "heavy = [m for m in ('tensorflow', 'horovod', 'cupy', 'numba') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO)
    assert out.stdout.strip() == ""


def test_topology_detection(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2048 kB\nMemFree:  100 kB\nMemAvailable:   1024 kB\n")
    assert host_memory_bytes(meminfo) == 1024 * 1024
    meminfo.write_text("MemTotal:       2048 kB\n")
    assert host_memory_bytes(meminfo) == 2048 * 1024
    detected = Topology.detect(2)
    assert detected.world_size == 2 and detected.host_memory > 0 and detected.disk >= 0
    assert detected == Topology.detect(2)  # stable figures: the same plan every time
    assert detected.host_memory % (GiB // 2) == 0
    assert topology_module.usable_host_memory(meminfo) == 0  # 2 MiB is all reserve
    assert detected.device_memory is None or detected.device_memory > 0
    with pytest.raises(ValueError, match="world_size"):
        Topology(0, None, 1, 1)


def test_topology_detection_with_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '81559\\n40960\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(topology_module, "usable_host_memory", lambda: 8 * GiB)
    assert gpu_memories() == [81559 * MiB, 40960 * MiB]
    detected = Topology.detect(8)  # two GPUs here: two local ranks share host memory and disk
    assert detected.device_memory == 40960 * MiB
    assert detected.host_memory == 4 * GiB


def test_render_small_and_large_plans() -> None:
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml")
    plan = make_plan(recipe, host_topology(2, 8 * GiB))
    console = Console(record=True, width=120)
    render_plan(plan, console)
    text = console.export_text()
    for word in ("user", "item", "category", "data_parallel", "Traffic per step", plan.fingerprint,
                 "variable hotness"):
        assert word in text
    many = make_recipe([{"name": f"t{i}", "dim": 8, "rows": 1000 + i} for i in range(80)])
    plan = make_plan(many, host_topology(40, GiB))
    console = Console(record=True, width=120)
    render_plan(plan, console)
    text = console.export_text()
    assert "the 60 largest of 80 tables" in text and "40 ranks summarised" in text
    assert "mean" in text


# ------------------------------------------------------------------------------- speed

# The colossal synthetic model of distributed-embeddings: (count, hotness, rows, dim).
COLOSSAL = [(100, (1, 300), 100_000, 128), (50, (1, 300), 40_000_000, 256),
            (1, (1, 300), 2_000_000_000, 256), (1, (1,), 1_000_000_000, 256),
            (100, (1,), 10, 32), (400, (1,), 10_000, 128), (100, (1,), 100_000, 128),
            (800, (1,), 1_000_000, 128), (450, (1,), 40_000_000, 256)]


def colossal_recipe() -> Recipe:
    tables, features = [], []
    for count, hotness, rows, dim in COLOSSAL:
        for _ in range(count):
            name = f"t{len(tables)}"
            tables.append({"name": name, "dim": dim, "rows": rows})
            features += [{"kind": "categorical", "name": f"{name}_{h}", "column": f"{name}_{h}",
                          "table": name, "hotness": h} for h in hotness]
    return make_recipe(tables, features, batch_size=65536)


def test_planning_the_colossal_model_is_fast() -> None:
    recipe = colossal_recipe()
    assert len(recipe.tables) == 2002
    topology = Topology(world_size=1024, device_memory=80 * GiB, host_memory=512 * GiB, disk=2 * TiB)
    start = time.perf_counter()
    plan = make_plan(recipe, topology)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.5, f"planning 2002 tables on 1024 ranks took {elapsed:.2f} s"
    assert plan.totals.value_bytes > 22_000 * GiB
    assert {t.sharding for t in plan.tables} == {"data_parallel", "table", "row"}
    assert max(r.memory.device for r in plan.ranks) <= 80 * GiB


# ----------------------------------------------------------------------- property tests

TIER_CHOICES = [("device",), ("host",), ("disk",), ("device", "host"), ("host", "disk"),
                ("device", "disk"), ("device", "host", "disk")]


@st.composite
def tables_and_features(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tables, features = [], []
    for i in range(draw(st.integers(1, 5))):
        rows = draw(st.one_of(st.integers(1, 100), st.integers(1, 10**6), st.integers(1, 10**9)))
        table: dict[str, Any] = {
            "name": f"t{i}", "dim": draw(st.integers(1, 256)),
            "dtype": draw(st.sampled_from(TABLE_DTYPES)),
            "sharding": draw(st.sampled_from(["auto", "auto", "auto", "table", "row", "column",
                                              "data_parallel"])),
        }
        if draw(st.booleans()) and rows > 1:
            table["dynamic"] = {"capacity": rows}
        else:
            table["rows"] = rows
        tiers = draw(st.sampled_from(TIER_CHOICES))
        storage = []
        for j, tier in enumerate(tiers):
            entry: dict[str, Any] = {"tier": tier}
            if j < len(tiers) - 1 or draw(st.integers(0, 4)) == 0:
                entry["budget"] = 2 ** draw(st.integers(10, 40))
            storage.append(entry)
        table["storage"] = storage
        tables.append(table)
        for k in range(draw(st.integers(0, 2))):
            hotness = draw(st.one_of(st.integers(1, 20), st.just("variable")))
            combiner = draw(st.sampled_from(["sum", "mean", "concat"]))
            if hotness == "variable" and combiner == "concat":
                combiner = "sum"
            features.append({"kind": "categorical", "name": f"f{i}_{k}", "column": f"c{i}_{k}",
                             "table": f"t{i}", "hotness": hotness, "combiner": combiner})
    if not features:
        features.append({"kind": "dense", "name": "numeric", "columns": ["x"]})
    return tables, features


topologies = st.builds(
    Topology,
    world_size=st.integers(1, 64),
    device_memory=st.one_of(st.none(), st.integers(10, 40).map(lambda k: 2**k)),
    host_memory=st.integers(10, 42).map(lambda k: 2**k),
    disk=st.integers(10, 44).map(lambda k: 2**k),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=tables_and_features(), topology=topologies,
       optimizer=st.sampled_from(OPTIMIZER_NAMES),
       quantize=st.sampled_from(["none", "fp16", "int8"]))
def test_random_recipes_are_planned_or_refused_with_a_fitting_suggestion(
        drawn: tuple[list[dict[str, Any]], list[dict[str, Any]]], topology: Topology,
        optimizer: str, quantize: str) -> None:
    tables, features = drawn
    recipe = make_recipe(tables, features, optimizer=optimizer, quantize=quantize)
    # room for the dense network every rank holds, so that the tables decide what fits
    dense = dense_bytes(recipe, topology.world_size)
    topology = Topology(topology.world_size,
                        None if topology.device_memory is None else topology.device_memory + dense,
                        topology.host_memory + (dense if topology.device_memory is None else 0),
                        topology.disk)
    try:
        plan = make_plan(recipe, topology, max_world_size=4096)  # keeps suggestions quick to check
    except PlanError as error:
        message = str(error)
        assert "\n" not in message and message.startswith("plan: table '")
        assert error.table in {t["name"] for t in tables}
        found = error.suggestion.topologies() if error.suggestion is not None else ()
        event(f"refused, {len(found)} suggestion(s)")
        if error.suggestion is not None:
            for fitting in error.suggestion.topologies():
                assert fitting.world_size >= topology.world_size
                check_plan(recipe, fitting, make_plan(recipe, fitting))
        return
    event("planned: " + ",".join(sorted({t.sharding for t in plan.tables})))
    check_plan(recipe, topology, plan)
    assert plan.to_json() == make_plan(recipe, topology).to_json()
    assert smallest_fitting_topology(recipe, topology).fits_as_given


def test_row_cost_prices_column_ranges_consistently() -> None:
    cost = RowCost.of("float32", "rowwise_adagrad", dynamic=False)
    whole = sum(cost.shard(10, 8))
    halves = sum(cost.shard(10, 4)) * 2
    assert halves - whole == 10 * (4 + METADATA_BYTES_PER_ROW)  # per-row state is per shard


# ------------------------------------------------------------------------------- CLI


def test_cli_plan_json_is_byte_identical(cli: Any) -> None:
    args = ("plan", "recipes/quickstart.yaml", "--json", "--world-size", "2",
            "--device-memory", "none", "--host-memory", "8GiB", "--disk", "1TiB")
    first, second = cli(*args), cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    data = json.loads(first.stdout)
    assert data["topology"] == {"world_size": 2, "device_memory": None, "host_memory": 8 * GiB,
                                "disk": TiB}
    plan = make_plan(load_recipe(REPO / "recipes" / "quickstart.yaml"), host_topology(2, 8 * GiB))
    assert data["fingerprint"] == plan.fingerprint


def test_cli_plan_renders_and_reports_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from embtrain.cli.main import main

    recipe = str(REPO / "recipes" / "quickstart.yaml")
    assert main(["plan", recipe, "--host-memory", "8GiB", "--disk", "1TiB",
                 "--batch-size", "4096"]) == 0
    shown = capsys.readouterr().out
    assert "fingerprint" in shown and "global batch 4096" in shown
    assert main(["plan", recipe, "--host-memory", "lots"]) == 2
    assert capsys.readouterr().err.startswith("--host-memory: cannot read 'lots'")
    assert main(["plan", recipe, "--disk", "1GiB", "--device-memory", "none",
                 "--host-memory", "4900KiB"]) == 2  # the dense network needs 4.7 MiB
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("plan: table 'item' needs")
    assert "smallest topology that fits" in err
