"""Dynamic and tiered half-precision tables (float16 / bfloat16 rows as uint16 patterns).

* a dynamic half table computes exactly what the static half table of its keys computes
  (the static one is held to the NumPy oracle in tests/half/test_half_tables.py): new rows start
  at the float32 initial value narrowed to nearest, and stochastic rounding draws its bits
  from the *key*, never from the row the key happens to sit in;
* one update of a dynamic half group equals the float32 update of its widened state narrowed
  by the NumPy rules (``narrow_update_reference``, the group's row keys) bit for bit;
* eviction, TTL and admission decide the same rows as for a float32 table;
* tiered half tables (memory and disk stores, static and dynamic) equal the same tables all in
  memory bit for bit, their stores holding rows in the table's dtype (half the bytes).
"""

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
from embtrain.embedding.groups import FusedGroup
from embtrain.embedding.kernel_inputs import frozen
from embtrain.embedding.optimizers import hyperparams, kind_code, slot_specs
from embtrain.embedding.reference import narrow_update_reference
from embtrain.embedding.reference_halves import widen_ref
from embtrain.kernels import get_backend
from embtrain.kernels.codes import VAL_BF16
from embtrain.kernels.contract import GroupTables, UpdateStep

FEATS = [FeatureConfig("f1", "t", "sum"), FeatureConfig("f2", "t", "mean")]


def _batch(rng: np.random.Generator, keys_of, batch: int = 24) -> dict[str, SparseInput]:
    out = {}
    for f in ("f1", "f2"):
        lens = rng.integers(0, 4, batch)
        offs = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        w = rng.uniform(0.5, 1.5, int(offs[-1])).astype(np.float32) if f == "f2" else None
        out[f] = SparseInput(keys_of(rng, int(offs[-1])).astype(np.int64), offs, w)
    return out


def _train(engines, rng, steps, keys_of, exact_forward: bool = True, batch: int = 24) -> None:
    for step in range(steps):
        inputs = _batch(rng, keys_of, batch)
        outs = [e.forward(inputs) for e in engines]
        if exact_forward:
            for o in outs[1:]:
                for x, y in zip(outs[0], o, strict=True):
                    assert x.tobytes() == y.tobytes(), f"forward at step {step}"
        grads = [rng.standard_normal(x.shape).astype(np.float32) for x in outs[0]]
        for e in engines:
            e.backward_update(grads, step)


def _same_rows(a, b, keys: np.ndarray | None = None) -> None:
    """``b``'s exported rows equal ``a``'s rows of the same keys, bit for bit."""
    pos = b.keys if keys is None else np.searchsorted(a.keys, b.keys)
    assert a.values.dtype == b.values.dtype
    assert a.values[pos].tobytes() == b.values.tobytes()
    for s in a.slots:
        assert a.slots[s][pos].tobytes() == b.slots[s].tobytes(), s
    np.testing.assert_array_equal(a.update_count[pos], b.update_count)
    np.testing.assert_array_equal(a.last_step[pos], b.last_step)
    assert (a.dtype, a.state_dtype) == (b.dtype, b.state_dtype)


@pytest.mark.parametrize(("dtype", "opt", "state", "rounding"), [
    ("bfloat16", "adagrad", "float32", "stochastic"),
    ("float16", "adam", "table", "stochastic"),
    ("bfloat16", "rowwise_adagrad", "table", "nearest"),
])
def test_dynamic_half_table_equals_the_static_half_table(dtype, opt, state, rounding) -> None:
    cfg = SparseOptimizerConfig(opt, lr=0.05)
    half = {"dtype": dtype, "optimizer_state": state, "rounding": rounding}
    static = EmbeddingEngine([TableConfig("t", 60, 8, **half)], FEATS, cfg, 5)
    dyn = EmbeddingEngine([TableConfig("t", 64, 8, dynamic=DynamicConfig(), **half)], FEATS,
                          cfg, 5)
    # keys arrive in another order than rows: key k sits in some row, rounds as row k
    _train((static, dyn), np.random.default_rng(1), 6,
           lambda rng, n: (rng.zipf(1.3, n) - 1) % 60)
    a, b = static.export_table("t"), dyn.export_table("t")
    assert b.values.dtype == np.uint16 and b.keys.size > 20
    assert not np.array_equal(b.keys, np.arange(b.keys.size))  # not trivially row == key
    _same_rows(a, b)
    d = dyn.dynamic_table("t")
    assert d is not None and not np.array_equal(d.row_key[d.live_rows()], d.live_rows())


def test_dynamic_half_update_is_the_float32_update_narrowed() -> None:
    """The fused kernel on a dynamic bfloat16 group (stochastic rounding, bfloat16 slots)
    against the float32 kernel on the widened state, narrowed by the NumPy rules with the
    group's row keys: bit for bit."""
    cfg = SparseOptimizerConfig("adagrad", lr=0.1)
    eng = EmbeddingEngine([TableConfig("t", 40, 8, dtype="bfloat16", optimizer_state="table",
                                       dynamic=DynamicConfig())], FEATS, cfg, 9)
    rng = np.random.default_rng(4)
    universe = rng.integers(-10**12, 10**12, 30)
    keys_of = lambda rng, n: universe[rng.integers(0, 30, n)]  # noqa: E731
    _train((eng,), rng, 2, keys_of)
    out = eng.forward(_batch(rng, keys_of))
    grads = [rng.standard_normal(x.shape).astype(np.float32) for x in out]
    g, step = eng._groups[0], 2
    plan = g.plan
    assert plan.row_round.size == g.total_rows
    old_v, old_s = widen_ref(g.values, plan.value_code), [widen_ref(s, plan.slot_code)
                                                          for s in g.slots]
    wide = GroupTables(old_v.copy(), [s.copy() for s in old_s], g.meta.copy())
    pending = eng._pending[0]
    eng.backward_update(grads, step)
    touched = np.flatnonzero(g.meta[:, 1] == step + 1)
    assert touched.size > 5
    assert set(plan.row_round[touched].tolist()) <= set(universe.tolist())
    # the same step in float32 on the widened state
    be = get_backend("cpu")
    f32 = FusedGroup(0, 8, "float32", [replace(t, dtype="float32", optimizer_state="float32")
                                       for t in g.tables], g.features, g.reserve, 9)
    scratch = be.new_scratch(f32.plan)
    be.forward_group(f32.plan, wide, pending, np.empty_like(out[0]), scratch)
    # the gradient read-only, as the engine hands it over (the kernels' compiled types)
    be.backward_group(f32.plan, wide, pending, frozen(grads[0]),
                      UpdateStep(kind_code(cfg), hyperparams(cfg, step), step), scratch)
    np.testing.assert_array_equal(wide.meta, g.meta)
    want_v, want_s = narrow_update_reference(plan, wide.values, wide.slots, old_v, old_s,
                                             touched, step)
    assert g.values.tobytes() == want_v.tobytes()
    assert len(g.slots) == len(slot_specs(cfg)) == 1
    assert g.slots[0].tobytes() == want_s[0].tobytes()


def test_eviction_ttl_and_admission_decide_as_for_float32() -> None:
    cfg = SparseOptimizerConfig("adagrad", lr=0.05)
    dyn = DynamicConfig(eviction="lfu", admission="count", min_count=2, ttl_steps=5)
    f32 = EmbeddingEngine([TableConfig("t", 40, 8, dynamic=dyn)], FEATS, cfg, 2)
    bf = EmbeddingEngine([TableConfig("t", 40, 8, dtype="bfloat16", dynamic=dyn)], FEATS,
                         cfg, 2)
    _train((f32, bf), np.random.default_rng(6), 16, lambda rng, n: rng.integers(0, 120, n),
           exact_forward=False, batch=8)
    a, b = f32.export_table("t"), bf.export_table("t")
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.update_count, b.update_count)
    np.testing.assert_array_equal(a.last_step, b.last_step)
    assert f32.dynamic_metrics() == bf.dynamic_metrics()
    m = bf.dynamic_metrics()["t"]
    assert m["evictions"] > 0 and m["expired"] > 0
    assert np.abs(widen_ref(b.values, VAL_BF16) - a.values).max() < 0.05  # the same training, rounded


def _tiered(tables, store: str, path: Path | None):
    return [replace(t, tier=TierConfig(30, store=store, path=None if path is None else str(path),
                                       eviction="lfu")) for t in tables]


@pytest.mark.parametrize("store", ["memory", "disk"])
@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_tiered_half_tables_equal_in_memory(kind: str, store: str, tmp_path: Path) -> None:
    cfg = SparseOptimizerConfig("adam", lr=0.05)
    dyn = DynamicConfig(eviction="lru") if kind == "dynamic" else None
    rows = 100 if dyn is None else 120
    tables = [TableConfig("t", rows, 8, dtype="bfloat16", optimizer_state="table", dynamic=dyn)]
    plain = EmbeddingEngine(tables, FEATS, cfg, 3)
    tiered = EmbeddingEngine(_tiered(tables, store, tmp_path if store == "disk" else None),
                             FEATS, cfg, 3)
    universe = np.random.default_rng(0).integers(-500, 500, 100)
    keys = (lambda rng, n: rng.integers(0, 100, n)) if dyn is None else (
        lambda rng, n: universe[rng.integers(0, 100, n)])
    _train((plain, tiered), np.random.default_rng(8), 10, keys, batch=8)
    a, b = plain.export_table("t"), tiered.export_table("t")
    np.testing.assert_array_equal(a.keys, b.keys)
    _same_rows(a, b, keys=a.keys)
    t = tiered.tier_metrics()["t"]
    assert t["evictions"] > 0 and t["rows_read"] > 0
    store_obj = tiered._space("t").store
    # the store's rows are in the table's dtype: dim 8 values + 2 × 8 slots, 2 bytes each
    if store == "memory":
        assert store_obj.values.dtype == np.uint16 and store_obj.record_bytes == 2 * 24 + 8
    else:
        assert store_obj.file.layout.record_bytes == 8 + 8 + 2 * 24


def test_plan_prices_tiered_half_rows_at_their_dtype() -> None:
    """The disk tier of a bfloat16 table with bfloat16 Adagrad state holds half the bytes of
    values and state; the memory tiers buy more cache rows, as many as the engine makes."""
    from embtrain.embedding.from_recipe import tier_config
    from embtrain.plan import Topology, make_plan
    from embtrain.plan.cost import RowCost
    from embtrain.recipe.models import Recipe

    def plan_of(extra: dict):
        recipe = Recipe.model_validate({
            "version": 1, "name": "tiers", "data": {"train": "x/*.parquet", "batch_size": 64},
            "features": [{"kind": "categorical", "name": "f", "column": "a", "table": "a"}],
            "tables": [{"name": "a", "dim": 16, "rows": 400_000, **extra,
                        "storage": [{"tier": "host", "budget": "2MiB"},
                                    {"tier": "disk", "path": "x"}]}],
            "optimizer": {"sparse": {"type": "adagrad", "lr": 0.1},
                          "dense": {"type": "adam", "lr": 0.1}},
            "model": {"type": "mlp", "hidden": [8]}, "train": {"steps": 1}})
        group = make_plan(recipe, Topology(1, None, 2**36, 2**50)).table("a").groups[0]
        cfg = tier_config(recipe.tables[0], "adagrad")
        assert cfg is not None and cfg.cache_rows == group.tier_rows.host
        return group

    f32, bf16 = plan_of({}), plan_of({"dtype": "bfloat16", "optimizer_state": "table"})
    assert bf16.tier_rows.host > f32.tier_rows.host
    # every row's 16 values and 16 accumulators take 2 bytes instead of 4 on disk
    assert f32.tiers.disk - bf16.tiers.disk == 400_000 * (16 + 16) * 2
    half_row = RowCost.of("bfloat16", "adagrad", False, "bfloat16").shard(1, 16)
    assert half_row[:2] == (32, 32)


@pytest.mark.parametrize("table", [
    "{name: t, dim: 8, dtype: bfloat16, dynamic: {capacity: 100}}",
    "{name: t, dim: 8, rows: 100, dtype: float16, storage: [{tier: host, budget: 1KiB}, "
    "{tier: disk, path: x}]}",
])
def test_a_gpu_recipe_takes_dynamic_and_tiered_half_tables(table: str) -> None:
    """The recipe takes half keyed tables on either device (the cuda kernels round them by key,
    tests/test_cuda_dynamic.py); a real GPU still refuses a tiered table, in any dtype, before
    training (train/device.py), and runs a half dynamic one."""
    from embtrain.recipe import parse_recipe_text
    from embtrain.train.device import gpu_limits

    text = f"""
version: 1
data: {{train: x/*.parquet, batch_size: 8}}
features: [{{kind: categorical, name: f, column: c, table: t}}]
tables: [{table}]
optimizer: {{sparse: {{type: sgd, lr: 0.1}}, dense: {{type: sgd, lr: 0.1}}}}
model: {{type: mlp, hidden: [4]}}
train: {{steps: 1, device: DEVICE}}
"""
    assert parse_recipe_text(text.replace("DEVICE", "cpu"), "r.yaml").tables[0].dtype != "float32"
    recipe = parse_recipe_text(text.replace("DEVICE", "gpu"), "r.yaml")
    assert recipe.tables[0].dtype != "float32"
    tiered = len(recipe.tables[0].storage) > 1
    assert gpu_limits(recipe, 1) == ([
        "tables[0]: a tiered table (table 't') does not run on a GPU yet; use "
        "train.device: cpu"] if tiered else [])
