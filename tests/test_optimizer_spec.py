"""One spec for the sparse optimizers: the planner's slot counts, the engine's slot arrays,
the kernels' slot counts and the recipe all come from ``kernels.optimizer_spec``; the kernel
cache key covers every rule module."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest
from pydantic import TypeAdapter

from embtrain.embedding import EmbeddingEngine, FeatureConfig, SparseOptimizerConfig, TableConfig
from embtrain.embedding.from_recipe import sparse_optimizer_config
from embtrain.kernels import numba_cache
from embtrain.kernels.optimizer_spec import (
    HP_OPTIONS,
    HP_SIZE,
    OPTIMIZER_NAMES,
    SPARSE_OPTIMIZERS,
    hyperparams,
    row_wise_table,
    slot_count_table,
    slot_counts,
)
from embtrain.plan.cost import OPTIMIZER_SLOTS, RowCost
from embtrain.recipe import models as rm


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_plan_counts_the_slots_the_engine_allocates(name):
    dim, rows = 6, 11
    eng = EmbeddingEngine([TableConfig("t", rows, dim)], [FeatureConfig("f", "t")],
                          SparseOptimizerConfig(name, lr=0.1), seed=0)
    slots = eng.export_table("t").slots
    per_column, per_row = OPTIMIZER_SLOTS[name]
    assert (per_column, per_row) == slot_counts(name)
    assert sum(a.size for a in slots.values()) == rows * (per_column * dim + per_row)
    assert len(slots) == per_column + per_row == len(SPARSE_OPTIMIZERS[name].slots)
    values, optimizer, _ = RowCost.of("float32", name, False).shard(rows, dim)
    assert optimizer == sum(a.nbytes for a in slots.values())
    assert values == eng.export_table("t").values.nbytes
    # the kernels' per-code tables agree
    code = SPARSE_OPTIMIZERS[name].code
    assert slot_count_table()[code] == per_column + per_row
    assert bool(row_wise_table()[code]) == (per_row > 0)


def test_every_recipe_sparse_optimizer_is_in_the_spec_and_back():
    union = get_args(get_args(rm.SparseOptimizer)[0])
    recipe_types = {get_args(m.model_fields["type"].annotation)[0] for m in union}
    assert recipe_types == set(OPTIMIZER_NAMES)


def test_recipe_options_reach_the_engine_config():
    adapter = TypeAdapter(rm.SparseOptimizer)
    ftrl = sparse_optimizer_config(adapter.validate_python(
        {"type": "ftrl", "lr": 0.2, "l1": 0.1, "l2": 0.3, "l2_shrinkage": 0.4, "beta": 0.5}))
    assert ftrl == SparseOptimizerConfig(
        kind="ftrl", lr=0.2, l1_regularization_strength=0.1, l2_regularization_strength=0.3,
        l2_shrinkage_regularization_strength=0.4, beta=0.5)
    sgd = sparse_optimizer_config(adapter.validate_python({"type": "sgd", "lr": 0.2}))
    assert sgd == SparseOptimizerConfig(kind="sgd", lr=0.2)
    adam = sparse_optimizer_config(adapter.validate_python(
        {"type": "adam", "lr": 0.2, "beta1": 0.5, "epsilon": 1e-3}))
    assert adam == SparseOptimizerConfig(kind="adam", lr=0.2, beta1=0.5, epsilon=1e-3)


def test_config_refuses_unknown_kinds_and_options():
    with pytest.raises(ValueError, match="unknown sparse optimizer 'nope'"):
        SparseOptimizerConfig("nope")
    with pytest.raises(ValueError, match="has no option 'momentum'"):
        SparseOptimizerConfig("adagrad", options=(("momentum", 0.5),))


def test_hyperparams_layout():
    for name, spec in SPARSE_OPTIMIZERS.items():
        hp = hyperparams(SparseOptimizerConfig(name, lr=0.25), 3)
        assert hp.dtype == np.float32 and hp.shape == (HP_SIZE + len(spec.options),)
        for i, (_, default) in enumerate(spec.options):
            assert hp[HP_OPTIONS + i] == np.float32(default)


def test_kernel_cache_key_covers_every_rule_module():
    rules = numba_cache.PACKAGE / "kernels" / "rules"
    sources = set(numba_cache.KERNEL_SOURCES)
    for path in rules.glob("*.py"):
        assert f"kernels/rules/{path.name}" in sources
    assert "kernels/optimizer_spec.py" in sources
    for rel in sources:
        assert (numba_cache.PACKAGE / rel).is_file(), rel


def test_sgd_momentum_from_the_recipe():
    adapter = TypeAdapter(rm.SparseOptimizer)
    cfg = sparse_optimizer_config(adapter.validate_python(
        {"type": "sgd_momentum", "lr": 0.05, "momentum": 0.5}))
    assert cfg == SparseOptimizerConfig("sgd_momentum", lr=0.05, options=(("momentum", 0.5),))
    hp = hyperparams(cfg, 0)
    assert hp[HP_OPTIONS] == np.float32(0.5)
    default = sparse_optimizer_config(adapter.validate_python({"type": "sgd_momentum", "lr": 1}))
    assert hyperparams(default, 0)[HP_OPTIONS] == np.float32(0.9)
    with pytest.raises(ValueError, match="momentum"):
        adapter.validate_python({"type": "sgd_momentum", "lr": 0.05, "momentum": 1.0})


def test_sgd_momentum_in_a_recipe_file():
    from pathlib import Path

    from embtrain.errors import RecipeError
    from embtrain.recipe import parse_recipe_text

    text = (Path(__file__).parents[1] / "recipes" / "quickstart.yaml").read_text()
    old = "sparse: {type: adagrad, lr: 0.6}"
    assert old in text
    recipe = parse_recipe_text(text.replace(old, "sparse: {type: sgd_momentum, lr: 0.1, momentum: 0.8}"))
    cfg = sparse_optimizer_config(recipe.optimizer.sparse)
    assert cfg.kind == "sgd_momentum" and dict(cfg.options) == {"momentum": 0.8}
    with pytest.raises(RecipeError, match="momentum"):
        parse_recipe_text(text.replace(old, "sparse: {type: sgd_momentum, lr: 0.1, momentum: 2}"))


@pytest.mark.parametrize("optimizer", OPTIMIZER_NAMES)
def test_column_sharding_is_refused_exactly_for_row_wise_optimizers(optimizer):
    """`run`'s check and the planner's `auto` read the spec's row_wise flag: an optimizer with
    state per whole row cannot have its rows split by column, every other one can."""
    from pathlib import Path

    from embtrain.kernels.optimizer_spec import spec_of
    from embtrain.recipe import parse_recipe_text
    from embtrain.train.support import unsupported_fields

    text = (Path(__file__).parents[1] / "recipes" / "quickstart.yaml").read_text()
    text = text.replace("sparse: {type: adagrad, lr: 0.6}", f"sparse: {{type: {optimizer}, lr: 0.1}}")
    text = text.replace("{name: user, dim: 16, rows: 300}", "{name: user, dim: 16, rows: 300, sharding: column}")
    problems = [p for p in unsupported_fields(parse_recipe_text(text), 2) if "accumulator per whole row" in p]
    assert len(problems) == (1 if spec_of(optimizer).row_wise else 0)
    assert spec_of("rowwise_adagrad").row_wise and not spec_of("adagrad").row_wise
