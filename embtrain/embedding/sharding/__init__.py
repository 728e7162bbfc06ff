"""Sharding strategies, one module per mode, and the registry that maps a mode name to its.

The mode names are :data:`embtrain.plan.shardings.MODES` (the planner's registry of cost
models, one per mode); the strategy of mode ``m`` is ``STRATEGY`` of the module
``embtrain.embedding.sharding.m`` (:mod:`.data_parallel`, :mod:`.table`, :mod:`.column`,
:mod:`.row`), whose ``traffic`` is the planner's model of ``m``. Adding a mode is a cost model
in :mod:`embtrain.plan.shardings` and a module here (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from importlib import import_module

from embtrain.embedding.sharding.base import ShardingStrategy, TablePlacement
from embtrain.plan.shardings import MODES


def _load() -> dict[str, ShardingStrategy]:
    out: dict[str, ShardingStrategy] = {}
    for mode in MODES:
        found = import_module(f"{__name__}.{mode}").STRATEGY
        if found.name != mode or found.model.name != mode:
            raise ImportError(f"sharding module {mode!r} holds the strategy of {found.name!r}")
        out[mode] = found
    return out


#: Every sharding mode's strategy, by name.
STRATEGIES: dict[str, ShardingStrategy] = _load()


def strategy(mode: str) -> ShardingStrategy:
    """The strategy of sharding ``mode``."""
    try:
        return STRATEGIES[mode]
    except KeyError:
        raise ValueError(f"unknown sharding {mode!r}; one of {MODES}") from None


__all__ = ["MODES", "STRATEGIES", "ShardingStrategy", "TablePlacement", "strategy"]
