"""`embtrain bench`: the synthetic models, plan-before-allocate, identical batches, JSON output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embtrain.bench.inputs import Batches, generate, power_law_ids
from embtrain.bench.measure import digest
from embtrain.bench.results import DISTURBED_PCT, disturbed_sides, summarize
from embtrain.bench.runner import BenchOptions, plan_and_check
from embtrain.bench.synthetic import LEARNING_RATES, build_recipe, load_model, model_names
from embtrain.plan import Topology
from embtrain.recipe.models import CategoricalFeature, DenseFeature

GiB = 2**30
REPO = Path(__file__).resolve().parents[1]

# The published table of distributed-embeddings' synthetic models: tables, fp32 GiB.
PUBLISHED = {
    "tiny": (55, 4.2),
    "small": (107, 26.3),
    "medium": (311, 206.2),
    "large": (612, 773.8),
    "jumbo": (1022, 3109.5),
    "colossal": (2002, 22327.4),
}
SMALL_RUN = [
    "--model",
    "tiny",
    "--scale",
    "0.001",
    "--batch",
    "512",
    "--steps",
    "2",
    "--warmup",
    "1",
    "--batches",
    "2",
]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_table_counts_and_bytes(name: str) -> None:
    model = load_model(name)
    tables, gib = PUBLISHED[name]
    assert model.num_tables == tables
    assert round(model.table_bytes() / GiB, 1) == gib
    recipe = build_recipe(model)
    assert len(recipe.tables) == tables
    assert sum(t.rows * t.dim * 4 for t in recipe.tables) == model.table_bytes()


def test_package_data_has_every_model() -> None:
    assert model_names() == ["criteo", "tiny", "small", "medium", "large", "jumbo", "colossal"]
    with pytest.raises(KeyError, match="unknown synthetic model"):
        load_model("huge")


def test_tiny_recipe_matches_the_published_model() -> None:
    model = load_model("tiny")
    assert model.num_inputs == 58
    recipe = build_recipe(model, optimizer="adagrad")
    cats = recipe.categorical_features
    assert len(cats) == 58
    assert all(f.combiner == "sum" for f in cats)
    shared = {
        t.name: recipe.features_of(t.name)
        for t in recipe.tables
        if len(recipe.features_of(t.name)) > 1
    }
    assert len(shared) == 3
    for feats in shared.values():
        assert sorted(f.hotness for f in feats) == [1, 10]
    assert {(recipe.table(n).rows, recipe.table(n).dim) for n in shared} == {
        (10_000, 8),
        (1_000_000, 16),
        (25_000_000, 16),
    }
    [dense] = recipe.dense_features
    assert isinstance(dense, DenseFeature) and len(dense.columns) == 10
    assert recipe.model.type == "mlp" and recipe.model.hidden == [256, 128]
    assert recipe.data.batch_size == 65536
    assert recipe.optimizer.sparse.type == "adagrad"
    assert recipe.optimizer.sparse.lr == LEARNING_RATES["adagrad"]
    assert isinstance(cats[0], CategoricalFeature)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_optimizer_flag_sets_both_optimizers(kind: str) -> None:
    recipe = build_recipe(load_model("criteo"), optimizer=kind)
    assert recipe.optimizer.sparse.type == kind == recipe.optimizer.dense.type
    assert recipe.optimizer.sparse.lr == LEARNING_RATES[kind]


def test_scale_multiplies_rows_and_keeps_one_row() -> None:
    recipe = build_recipe(load_model("tiny"), scale=0.001)
    rows = sorted({t.rows for t in recipe.tables})
    assert rows == [1, 10, 100, 1000, 25000]


def test_power_law_ids_follow_the_distribution() -> None:
    rng = np.random.default_rng(0)
    ids = power_law_ids(rng, 50, 1.05, 400_000)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 50
    p = np.arange(1, 51, dtype=np.float64) ** -1.05
    p /= p.sum()
    freq = np.bincount(ids, minlength=50) / ids.size
    assert np.abs(freq - p).max() < 0.005
    # The tail beyond the exact head: mass of the upper half of a 10M-row table.
    big = power_law_ids(rng, 10_000_000, 1.05, 400_000)
    assert big.max() < 10_000_000
    k = np.arange(1, 10_000_001, dtype=np.float64) ** -1.05
    expected = k[5_000_000:].sum() / k.sum()
    assert abs((big >= 5_000_000).mean() - expected) < 0.003
    uniform = power_law_ids(rng, 10, 0.0, 100_000)
    assert np.abs(np.bincount(uniform) / 100_000 - 0.1).max() < 0.01


def test_batches_are_reproducible_and_round_trip(tmp_path: Path) -> None:
    model = load_model("tiny")
    inputs = model.inputs(0.001)
    a = generate(inputs, model.numerical, 64, 2, 1.05, seed=3)
    b = generate(inputs, model.numerical, 64, 2, 1.05, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a.ids, b.ids, strict=True))
    assert [x.shape for x in a.ids[:6]] == [(2, 64, 1), (2, 64, 10)] * 3
    for spec, ids in zip(inputs, a.ids, strict=True):
        assert ids.max() < spec.rows
    a.save(tmp_path / "b")
    c = Batches.load(tmp_path / "b")
    assert digest([*a.ids, a.dense, a.labels]) == digest([*c.ids, c.dense, c.labels])


def test_summary_statistics() -> None:
    s = summarize([0.1, 0.2, 0.3, 0.4, 0.5])
    assert s["median"] == pytest.approx(300.0)
    assert s["min"] == pytest.approx(100.0) and s["max"] == pytest.approx(500.0)
    assert s["p10"] == pytest.approx(140.0) and s["p90"] == pytest.approx(460.0)


# ------------------------------------------------------------- plan before allocating


def test_model_that_does_not_fit_is_not_run() -> None:
    top = Topology(world_size=1, device_memory=None, host_memory=24 * GiB, disk=100 * GiB)
    outcome, _, _ = plan_and_check(BenchOptions(model="small"), topology=top, available=24 * GiB)
    doc = outcome.doc
    assert doc["ran"] is False
    assert doc["needed_bytes"] > 26 * GiB
    assert "t" in doc["reason"] and "host memory" in doc["reason"]
    smallest = doc["smallest_topology"]
    assert smallest["description"]
    assert smallest["by_memory"]["host_memory"] >= doc["needed_bytes"]


def test_baseline_that_does_not_fit_is_refused() -> None:
    top = Topology(world_size=1, device_memory=None, host_memory=24 * GiB, disk=100 * GiB)
    opts = BenchOptions(model="tiny", scale=0.5, batch=1024)
    plan_only, _, _ = plan_and_check(opts, topology=top, available=24 * GiB)
    check = plan_only.doc["memory_check"]
    assert check["baseline_bytes"] > 2 * load_model("tiny").table_bytes(0.5)
    between = (check["embtrain_bytes"] + check["baseline_bytes"]) // 2
    if check["embtrain_bytes"] < check["baseline_bytes"]:
        outcome, _, _ = plan_and_check(opts, topology=top, available=between)
        assert outcome.doc["ran"] is False and "--baseline none" in outcome.doc["reason"]
        alone, _, _ = plan_and_check(
            BenchOptions(model="tiny", scale=0.5, batch=1024, baseline="none"),
            topology=top,
            available=between,
        )
        assert "ran" not in alone.doc
    outcome, _, _ = plan_and_check(opts, topology=top, available=1 * GiB)
    assert outcome.doc["ran"] is False and outcome.doc["needed_bytes"] > 1 * GiB


def test_half_tables_that_fit_run_alone_where_float32_does_not() -> None:
    """--precision bf16 on DE small (26.3 GiB of float32 tables) with 24 GiB: the half side
    is planned in its dtype and fits; the float32 side does not and is left out, saying why."""
    top = Topology(world_size=1, device_memory=None, host_memory=24 * GiB, disk=100 * GiB)
    opts = BenchOptions(model="small", optimizer="sgd", precision="bf16", baseline="none",
                        batch=16384)
    outcome, _, _ = plan_and_check(opts, topology=top, available=23 * GiB)
    doc = outcome.doc
    assert "ran" not in doc, doc.get("reason")
    assert doc["plan"]["totals"]["bytes"] < 17 * GiB
    assert "float32 side" in doc["float32_side_not_run"]
    fits, _, _ = plan_and_check(BenchOptions(model="tiny", scale=0.01, batch=1024,
                                             precision="bf16", baseline="none"),
                                topology=top, available=23 * GiB)
    assert "float32_side_not_run" not in fits.doc


def test_pooled_models_are_plan_only() -> None:
    top = Topology(world_size=1, device_memory=None, host_memory=24 * GiB, disk=100 * GiB)
    outcome, _, _ = plan_and_check(
        BenchOptions(model="medium", scale=1e-5, batch=256), topology=top, available=24 * GiB
    )
    assert outcome.doc["ran"] is False
    assert "interact_stride" in outcome.doc["reason"]


def test_colossal_prints_its_plan_without_running(cli) -> None:
    # How fast it plans is a benchmark figure (docs/PERFORMANCE.md), not a timed unit test.
    result = cli("bench", "--model", "colossal", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ran"] is False and doc["model"] == "colossal"
    assert doc["needed_bytes"] > 22000 * GiB
    assert doc["smallest_topology"]["description"]
    human = cli("bench", "--model", "colossal")
    assert human.returncode == 0
    assert "smallest topology" in human.stdout and "not run" in human.stdout


def test_bad_arguments_exit_2(cli) -> None:
    assert cli("bench", "--model", "nope").returncode == 2
    assert cli("bench", "--optimizer", "ftrl").returncode == 2
    assert cli("bench", "--baseline", "torch").returncode == 2


# ------------------------------------------------------------------------ small runs


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m embtrain ARGS`` (the ``cli`` fixture is function-scoped)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-m", "embtrain", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    out = tmp_path_factory.mktemp("bench") / "result.json"
    result = _run_cli("bench", *SMALL_RUN, "--json", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), json.loads(out.read_text())


def test_small_run_json(small_run: tuple[dict, dict]) -> None:
    doc, written = small_run
    assert doc == written
    assert doc["ran"] is True and doc["model"] == "tiny" and doc["batch"] == 512
    for side in ("embtrain", "native-tf"):
        r = doc["results"][side]
        assert set(r["step_ms"]) == {"median", "p10", "p90", "min", "max"}
        assert r["step_ms"]["median"] > 0 and r["samples_per_s"] > 0
        assert set(r["phases_ms"]) == {
            "input",
            "embedding_forward",
            "dense",
            "embedding_update",
            "communication",
        }
        assert r["phases_ms"]["communication"] == 0
        assert r["embedding_ms"]["median"] > 0
        assert r["peak_rss_bytes"] > 0
        assert np.isfinite(r["loss_first"]) and np.isfinite(r["loss_last"])
    native = doc["results"]["native-tf"]  # a TensorFlow baseline: its step is a tf.function
    assert native["fused_runs"] == "one tf.function"
    assert native["step_source"].startswith("one tf.function per step")
    assert set(doc["ratios"]) >= {"step", "embedding", "peak_memory"}
    assert set(doc["targets"]) == {
        "embedding_at_least_3x",
        "step_at_least_1_3x",
        "memory_not_higher",
    }
    assert doc["environment"]["versions"]["python"]
    assert isinstance(doc["disturbed"], dict)
    assert doc["targets_judged"] is (not doc["disturbed"])


def test_disturbed_sides_are_named() -> None:
    """A side that lost more than DISTURBED_PCT % of the CPU (steal + other processes) is named
    with its share; missing /proc/stat figures never count as disturbed."""
    reports = {
        "embtrain": {"cpu_steal_pct": 0.4, "cpu_others_pct": 1.0},
        "native-tf": {"cpu_steal_pct": 30.46, "cpu_others_pct": 0.2},
        "quiet-at-limit": {"cpu_steal_pct": DISTURBED_PCT, "cpu_others_pct": 0.0},
        "unknown": {"cpu_steal_pct": None, "cpu_others_pct": None},
        "busy": {"cpu_steal_pct": None, "cpu_others_pct": 12.0},
    }
    assert disturbed_sides(reports) == {"native-tf": 30.7, "busy": 12.0}


def test_both_sides_see_identical_batches(small_run: tuple[dict, dict]) -> None:
    doc, _ = small_run
    assert doc["identical_batches"] is True
    digests = {doc["batches"]["digest"]} | {r["batch_digest"] for r in doc["results"].values()}
    assert len(digests) == 1


def test_embtrain_alone_best_of_two(cli, tmp_path: Path) -> None:
    out = tmp_path / "alone.json"
    result = cli("bench", *SMALL_RUN, "--baseline", "none", "--repeat", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "embtrain" in result.stdout and "native-tf" not in result.stdout
    doc = json.loads(out.read_text())
    assert list(doc["results"]) == ["embtrain"] and "ratios" not in doc
    rounds = doc["results"]["embtrain"]["round_step_medians_ms"]
    assert len(rounds) == 2
    assert doc["results"]["embtrain"]["step_ms"]["median"] == min(rounds)


def test_precision_runs_the_half_side_against_float32(cli, tmp_path: Path) -> None:
    """--precision bf16: the half side and float32 embtrain on the same batches, interleaved
    rounds, per-round and median speed-ups, the engine's table bytes and the losses."""
    from embtrain.bench.precision import half_tables_supported

    out = tmp_path / "half.json"
    result = cli("bench", *SMALL_RUN, "--precision", "bf16", "--baseline", "none",
                 "--repeat", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert list(doc["results"]) == ["embtrain", "float32"] and doc["identical_batches"]
    half, full = doc["results"]["embtrain"], doc["results"]["float32"]
    assert half["mixed_precision"] == "bf16" and full["mixed_precision"] == "none"
    tables = "bfloat16" if half_tables_supported("bfloat16") else "float32"
    assert half["table_dtype"] == tables and full["table_dtype"] == "float32"
    summary = doc["half_precision"]
    assert summary["tables_dtype"] == tables and len(summary["rounds"]) == 2
    for part in ("step", "embedding", "dense"):
        assert summary["speedup"][part] > 0
        lo, hi = summary["speedup_spread"][part]
        assert lo <= summary["speedup"][part] <= hi
    values = summary["engine_bytes"]
    assert values["float32"]["values"] > 0
    want = 0.5 if tables == "bfloat16" else 1.0
    assert summary["value_bytes_ratio"] == pytest.approx(want)
    # same batches, same seed: the losses after the same steps are close, not equal
    first, last = summary["loss_last"]["half"], summary["loss_last"]["float32"]
    assert np.isfinite(first) and abs(first - last) < 0.05 and first != last
    assert cli("bench", "--precision", "fp8").returncode == 2
    assert cli("bench", "--optimizer-state", "table").returncode == 2  # needs --precision
    assert cli("bench", "--precision", "bf16", "--optimizer-state", "half").returncode == 2


def test_precision_with_dynamic_tables_compares_like_with_like(cli, tmp_path: Path) -> None:
    """--precision bf16 --dynamic: half dynamic tables against float32 dynamic ones (the half
    summary) and against half static ones (the dynamic ratio), on the same batches."""
    from embtrain.bench.precision import half_tables_supported

    out = tmp_path / "half_dynamic.json"
    result = cli("bench", *SMALL_RUN, "--precision", "bf16", "--dynamic", "--baseline", "none",
                 "--out", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert list(doc["results"]) == ["embtrain", "float32", "static"]
    assert doc["identical_batches"]
    sides = doc["results"]
    tables = "bfloat16" if half_tables_supported("bfloat16") else "float32"
    assert [(sides[s]["table_dtype"], sides[s]["dynamic_tables"]) for s in sides] == [
        (tables, True), ("float32", True), (tables, False)]
    assert doc["half_precision"]["speedup"]["embedding"] > 0
    assert doc["ratios_static"]["embedding"] > 0 and "hash_table" in doc


def test_optimizer_state_in_the_tables_dtype_halves_the_planned_state() -> None:
    """--optimizer-state table: the half side's plan holds its Adagrad state in bfloat16."""
    top = Topology(world_size=1, device_memory=None, host_memory=24 * GiB, disk=100 * GiB)
    planned = {}
    for state in ("float32", "table"):
        outcome, _, _ = plan_and_check(BenchOptions(model="tiny", scale=0.01, batch=1024,
                                                    precision="bf16", optimizer_state=state,
                                                    baseline="none"),
                                       topology=top, available=23 * GiB)
        planned[state] = outcome.doc["plan"]["totals"]["bytes"]
        assert outcome.doc["optimizer_state"] == state
    assert planned["table"] < planned["float32"]
