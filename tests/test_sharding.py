"""Sharding modes: one registry, one strategy module per mode, and the plan's traffic is the
wire's.

The unit part checks the registry (every mode the planner knows has a strategy module whose
traffic model is the planner's). The distributed part runs one step of a table-, column- and
data-parallel-sharded model on 2 real Horovod ranks and compares the bytes each rank sent
with the plan's traffic for that rank: pooled vectors forward, gradients backward and the
data-parallel all-reduce are equal to the byte; the id exchange carries the plan's ids plus
its message headers. (Row sharding's pooled traffic is an expectation over random keys, see
:mod:`embtrain.plan.cost`, so it is not compared to the byte.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import get_args

import pytest

from embtrain.comm.launch import LaunchSpec, launch
from embtrain.embedding.sharding import STRATEGIES, strategy
from embtrain.embedding.sharding.base import ShardingStrategy, TablePlacement
from embtrain.plan.objects import SHARDINGS
from embtrain.plan.shardings import MODELS, MODES
from embtrain.recipe.models import Table

REPO = Path(__file__).resolve().parents[1]


def test_every_mode_has_one_strategy_module_with_the_planners_traffic() -> None:
    assert tuple(STRATEGIES) == MODES == SHARDINGS
    for mode, s in STRATEGIES.items():
        module = sys.modules[f"embtrain.embedding.sharding.{mode}"]
        assert module.STRATEGY is s and s.name == mode
        assert s.model is MODELS[mode]
        # the strategy prices its exchange with the planner's formula, not a copy of it
        assert "traffic" not in vars(type(s))
        assert module.traffic.__func__ is ShardingStrategy.traffic


def test_the_recipe_offers_exactly_the_registered_modes() -> None:
    # the recipe sits below the planner, so it spells the names out; they must not drift
    assert set(get_args(Table.model_fields["sharding"].annotation)) == {"auto", *MODES}


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sharding 'diagonal'"):
        strategy("diagonal")
    with pytest.raises(ValueError, match="unknown sharding 'diagonal'"):
        TablePlacement("diagonal", (0,), {0: 1}, {0: (0, 1)})


@pytest.mark.distributed
def test_wire_bytes_equal_the_plans_traffic(tmp_path: Path) -> None:
    code = launch([sys.executable, str(REPO / "tests" / "workers" / "dist_traffic_worker.py"),
                   str(tmp_path)], LaunchSpec(2))
    assert code == 0
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert reports[0]["modes"] == {"whole": "table", "cols": "column", "rep": "data_parallel"}
    for rep in reports:
        assert rep["sent"]["forward"] == rep["plan_rank"]["forward"] > 0
        assert rep["sent"]["dp"] == rep["plan_rank"]["dp"] > 0
    total = {k: sum(rep["sent"][k] for rep in reports) for k in ("ids", "forward", "backward")}
    plan = reports[0]["plan_total"]
    assert total["forward"] == plan["forward"]
    assert total["backward"] == plan["backward"]
    # ids: the plan's bytes plus one padded header per message (3 int64 per route)
    assert plan["ids"] <= total["ids"] <= plan["ids"] + 2 * 64 * 2
