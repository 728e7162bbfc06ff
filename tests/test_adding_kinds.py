"""Adding a sparse optimizer, a tier kind or a model type is what docs/ARCHITECTURE.md says:
each test registers a dummy of one kind in temporary copies of exactly the registries the
document lists (one entry per listed file; ``monkeypatch`` restores them), then drives the
real code paths that read them, against plain NumPy. The sharding mode's dummy runs on two
Horovod ranks (``tests/workers/dist_registered_mode_worker.py``, in ``test_distributed.py``'s style)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from numba import njit
from numba.extending import register_jitable
from pydantic import Field, TypeAdapter, ValidationError

from embtrain.embedding import (
    EmbeddingEngine,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.config import TierConfig
from embtrain.embedding.from_recipe import sparse_optimizer_config, store_kind
from embtrain.embedding.tiers import MemoryStore
from embtrain.kernels.optimizer_spec import (
    HP_LR,
    HP_OPTIONS,
    SPARSE_OPTIMIZERS,
    OptimizerSpec,
    SlotDef,
    SlotSpec,
    hyperparams,
    slot_specs,
)
from embtrain.plan.cost import RowCost
from embtrain.plan.topology import Topology
from embtrain.recipe.base import Decay, LearningRate, Strict, registry_of, tagged_union
from embtrain.recipe.checks import cross_checks
from embtrain.recipe.kinds import TIERS, TierKindSpec, in_files
from embtrain.recipe.optimizers import SPARSE_OPTIMIZER_MODELS, Scheduled
from embtrain.storage.kinds import ROW_STORES, open_store

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------- a sparse optimizer

DUMMY_OPTIMIZER = "dummy_rms"


@register_jitable(inline="always")
def dummy_rms(hp, w, total, g):
    """The dummy's rule, as ``kernels/rules/optimizers.py`` writes one: ``total = decay·total
    + g²; w -= lr·g / (1 + total)``; returns ``(w, total)``."""
    t = hp[HP_OPTIONS] * total + g * g
    return w - hp[HP_LR] * g / (np.float32(1.0) + t), t


@njit(cache=False)
def _update_rows(hp, values, total, rows, grads):
    """The CPU kernel's loop over a group's touched rows, for the dummy's rule."""
    for i in range(rows.shape[0]):
        r = rows[i]
        for d in range(values.shape[1]):
            values[r, d], total[r, d] = dummy_rms(hp, values[r, d], total[r, d], grads[i, d])


class SparseDummyRms(Scheduled):
    """The dummy's recipe model (``recipe/optimizers.py``)."""

    type: Literal["dummy_rms"] = Field(description="sparse optimizer")
    lr: LearningRate = Field(description="learning rate")
    initial_accumulator_value: float = Field(0.1, ge=0, description="the slot's start value")
    decay: Decay = Field(0.5, description="decay of the slot")


def test_a_registered_optimizer_reaches_the_recipe_the_plan_the_engine_and_its_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 1. kernels/optimizer_spec.py: a code and a spec entry
    code = max(s.code for s in SPARSE_OPTIMIZERS.values()) + 1
    spec = OptimizerSpec(DUMMY_OPTIMIZER, code, (SlotDef("total", initial="initial_accumulator_value"),),
                         (("decay", 0.5),))
    monkeypatch.setitem(SPARSE_OPTIMIZERS, DUMMY_OPTIMIZER, spec)
    names = tuple(SPARSE_OPTIMIZERS)
    # the recipe refuses to build its union while the spec names an optimizer it has no model of
    with pytest.raises(ValueError, match=DUMMY_OPTIMIZER):
        registry_of(SPARSE_OPTIMIZER_MODELS.values(), names)
    # 3. recipe/optimizers.py: its model in SPARSE_OPTIMIZER_MODELS
    models = registry_of([*SPARSE_OPTIMIZER_MODELS.values(), SparseDummyRms], names)
    union = TypeAdapter(tagged_union(models.values()))
    recipe_opt = union.validate_python({"type": DUMMY_OPTIMIZER, "lr": 0.1, "decay": 0.25,
                                        "initial_accumulator_value": 0.2})
    with pytest.raises(ValidationError):
        union.validate_python({"type": DUMMY_OPTIMIZER, "lr": 0.1, "decay": 1.5})
    cfg = sparse_optimizer_config(recipe_opt)
    assert cfg == SparseOptimizerConfig(DUMMY_OPTIMIZER, lr=0.1, initial_accumulator_value=0.2,
                                        options=(("decay", 0.25),))
    assert slot_specs(cfg) == (SlotSpec("total", False, 0.2),)
    hp = hyperparams(cfg, 0)
    assert hp[HP_OPTIONS] == np.float32(0.25) and hp[HP_LR] == np.float32(0.1)

    # the engine allocates the slot the spec declares and the planner prices the same bytes
    rows, dim = 13, 4
    engine = EmbeddingEngine([TableConfig("t", rows, dim)], [FeatureConfig("f", "t")], cfg, seed=3)
    state = engine.export_table("t")
    assert list(state.slots) == ["total"]
    np.testing.assert_array_equal(state.slots["total"], np.full((rows, dim), 0.2, np.float32))
    _, optimizer_bytes, _ = RowCost.of("float32", DUMMY_OPTIMIZER, False).shard(rows, dim)
    assert optimizer_bytes == state.slots["total"].nbytes

    # 2. kernels/rules/optimizers.py: its rule, compiled, on a tiny table against NumPy
    rng = np.random.default_rng(5)
    values = state.values.copy()
    total = state.slots["total"].copy()
    want_w, want_t = values.copy(), total.copy()
    for _ in range(3):
        touched = np.sort(rng.choice(rows, 6, replace=False)).astype(np.int64)
        grads = rng.standard_normal((touched.size, dim)).astype(np.float32)
        _update_rows(hp, values, total, touched, grads)
        decay, lr = np.float32(0.25), np.float32(0.1)
        t = decay * want_t[touched] + grads * grads
        want_w[touched] = want_w[touched] - lr * grads / (np.float32(1.0) + t)
        want_t[touched] = t
    np.testing.assert_allclose(values, want_w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(total, want_t, rtol=1e-6, atol=1e-7)
    assert not np.array_equal(values, state.values)


# --------------------------------------------------------------------------- a tier kind

DUMMY_TIER = "ram_file"


class _OpenedStores:
    """The dummy tier's store: rows in memory, each open recorded (it is the one in use)."""

    def __init__(self) -> None:
        self.opened: list[str] = []

    def __call__(self, t: TableConfig, widths: list[int], seed: int,
                 inits: list[float]) -> MemoryStore:
        assert t.tier is not None and t.tier.path, "a file tier gets its path"
        self.opened.append(t.name)
        return MemoryStore.of(t, widths)


def test_a_registered_tier_kind_is_checked_planned_and_trains_as_in_memory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # 1. recipe/kinds.py: its entry in TIERS, after the slowest (it shares the disk's pool)
    monkeypatch.setitem(TIERS, DUMMY_TIER, TierKindSpec(DUMMY_TIER, "ram files", "disk",
                                                        files=True))
    # 2./3. storage/<kind>.py and its entry in storage/kinds.py ROW_STORES
    stores = _OpenedStores()
    monkeypatch.setitem(ROW_STORES, DUMMY_TIER, stores)

    # the recipe's checks: it takes a path, comes after the faster tiers, and needs a budget
    # above a slower one
    def findings(storage: list[dict]) -> list[str]:
        table = {"name": "t", "dim": 4, "rows": 100, "storage": storage}
        return [msg for _, msg in cross_checks({"tables": [table]})]

    assert in_files(DUMMY_TIER)
    assert findings([{"tier": "host", "budget": 4096}, {"tier": DUMMY_TIER, "path": "x"}]) == []
    assert any("after a slower tier" in m
               for m in findings([{"tier": DUMMY_TIER, "budget": 4096}, {"tier": "host"}]))
    assert any("has a path" in m
               for m in findings([{"tier": "host", "budget": 4096, "path": "x"},
                                  {"tier": DUMMY_TIER, "path": "x"}]))
    assert Topology(1, None, 10, 77).capacity(DUMMY_TIER) == 77

    # the engine opens it through the registry and trains as the all-in-memory engine does
    tables = [TableConfig("a", 300, 8), TableConfig("b", 50, 4)]
    feats = [FeatureConfig("fa", "a", "sum", None), FeatureConfig("fb", "b", "mean", None)]
    tiered = [replace(tables[0], tier=TierConfig(60, store=store_kind(DUMMY_TIER),
                                                 path=str(tmp_path))), tables[1]]
    cfg = SparseOptimizerConfig("adagrad", lr=0.05)
    plain = EmbeddingEngine(tables, feats, cfg, 7)
    cached = EmbeddingEngine(tiered, feats, cfg, 7, stores=open_store)
    assert stores.opened == ["a"]
    rng = np.random.default_rng(2)
    for step in range(8):
        inputs = {}
        for f, rows in (("fa", 300), ("fb", 50)):
            lens = rng.integers(0, 5, 32)
            keys = (rng.zipf(1.3, int(lens.sum())) - 1) % rows
            inputs[f] = SparseInput(keys.astype(np.int64),
                                    np.concatenate(([0], np.cumsum(lens))).astype(np.int64))
        a, b = plain.forward(inputs), cached.forward(inputs)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        grads = [rng.standard_normal(x.shape).astype(np.float32) for x in a]
        plain.backward_update(grads, step)
        cached.backward_update(grads, step)
    assert cached.tier_metrics()["a"]["evictions"] > 0
    for name in ("a", "b"):
        x, y = plain.export_table(name), cached.export_table(name)
        np.testing.assert_array_equal(x.values, y.values)
        np.testing.assert_array_equal(x.slots["accumulator"], y.slots["accumulator"])


# -------------------------------------------------------------------------- a model type


class LinearModel(Strict):
    """The dummy model type's recipe model (``recipe/models.py``)."""

    type: Literal["linear"] = Field(description="model type")


def test_a_registered_model_type_is_validated_sized_and_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from embtrain.models.networks import NETWORKS, Dense, Network, build_network
    from embtrain.models.slots import FeatureSlot
    from embtrain.plan.dense import DENSE_SHAPES, DenseInputs
    from embtrain.recipe.models import DENSE_MODELS

    class LinearNet(Network):
        """One dense layer on concat(dense, embeddings)."""

        def __init__(self, cfg: LinearModel, inputs, factory) -> None:
            super().__init__(inputs, factory)
            self.out = Dense(factory, inputs.num_dense + inputs.emb_width, inputs.heads, False,
                             "linear/out", logits=True)

        def __call__(self, dense, groups):
            return self.logits(self.out(self.inputs.parts(dense, groups)))

    # 1. recipe/models.py: its model in DENSE_MODELS
    models = registry_of([*DENSE_MODELS.values(), LinearModel])
    cfg = TypeAdapter(tagged_union(models.values())).validate_python({"type": "linear"})
    assert isinstance(cfg, LinearModel)
    # 2. models/networks.py: its network in NETWORKS
    monkeypatch.setitem(NETWORKS, LinearModel, LinearNet)
    # 3. plan/dense.py: its size in DENSE_SHAPES
    monkeypatch.setitem(DENSE_SHAPES, LinearModel,
                        lambda model, x: (x.width * x.heads + x.heads, x.heads))

    slots = [FeatureSlot("f", 0, 0, 8, 4), FeatureSlot("g", 0, 8, 4, 4)]
    net, variables = build_network(cfg, 3, slots, seed=1)
    params, _ = DENSE_SHAPES[LinearModel](cfg, DenseInputs(3, 12, 3, 4, {"f": 8, "g": 4}, 1))
    assert sum(int(np.prod(v.shape)) for v in variables) == params
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((5, 3)).astype(np.float32)
    group = rng.standard_normal((5, 12)).astype(np.float32)
    kernel, bias = (np.asarray(v) for v in variables)
    want = (np.concatenate([dense, group], axis=1) @ kernel + bias)[:, 0]
    np.testing.assert_allclose(np.asarray(net(dense, [group])), want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- a sharding mode


def test_a_registered_sharding_mode_trains_on_two_ranks_as_one_engine(tmp_path: Path) -> None:
    from embtrain.comm.launch import LaunchSpec, launch

    code = launch([sys.executable, str(REPO / "tests" / "workers" / "dist_registered_mode_worker.py"),
                   str(tmp_path)], LaunchSpec(2))
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]
    problems = [p for rep in reports for p in rep["problems"]]
    assert not problems, "\n".join(problems[:10])
    assert code == 0 and len(reports) == 2
    # the mode's own layout put the table on the last rank, which alone holds it
    assert [(rep["owners"], rep["holds_table"]) for rep in reports] == [([1], False), ([1], True)]
