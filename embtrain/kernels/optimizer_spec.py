"""The sparse optimizers' spec, in one place: kernel code, slots, options, hyper-parameters.

Everything that lists sparse optimizers reads :data:`SPARSE_OPTIMIZERS`: the engine allocates
the slots from it (:mod:`embtrain.embedding.optimizers`), the planner counts their bytes from
it (:func:`slot_counts`, :mod:`embtrain.plan.cost`), the recipe loader and the kernels
(:mod:`embtrain.kernels.rules.optimizers`, which holds the update rules) take the names and
codes from it. No numba here (the planner imports this module).

The kernels get a float32 hyper-parameter vector ``hp`` (:func:`hyperparams`): the common
fields at the ``HP_*`` indices below, then the optimizer's own :attr:`OptimizerSpec.options`
from ``HP_OPTIONS`` on, in declaration order.

To add a sparse optimizer: a code and an entry here, its rule (and one branch of the
dispatch) in :mod:`embtrain.kernels.rules.optimizers`, its recipe model in
:mod:`embtrain.recipe.models` (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# Kernel codes of the sparse optimizers.
OPT_SGD = 0
OPT_ADAGRAD = 1
OPT_ROWWISE_ADAGRAD = 2
OPT_ADAM = 3
OPT_LAZY_ADAM = 4
OPT_FTRL = 5
OPT_SGD_MOMENTUM = 6

# Layout of the float32 hyper-parameter vector ``hp`` given to ``backward_update``.
HP_LR = 0
HP_EPS = 1
HP_BETA1 = 2
HP_BETA2 = 3
HP_ONE_MINUS_BETA1 = 4
HP_ONE_MINUS_BETA2 = 5
HP_LR_T = 6
HP_LR_POWER = 7
HP_L1 = 8
HP_L2 = 9
HP_L2_SHRINKAGE = 10
HP_SIZE = 11  # the common part; an optimizer's own options follow
HP_OPTIONS = HP_SIZE


@dataclass(frozen=True)
class SlotSpec:
    """One optimizer slot: its name, whether it holds one value per row, and its start value."""

    name: str
    per_row: bool
    initial_value: float


@dataclass(frozen=True)
class SlotDef:
    """A slot as the spec declares it: ``initial`` is a number or the name of the optimizer
    config field holding the start value (e.g. ``initial_accumulator_value``)."""

    name: str
    per_row: bool = False
    initial: float | str = 0.0


@dataclass(frozen=True)
class OptimizerSpec:
    """A sparse optimizer: recipe/engine name, kernel code, slots in kernel order (slot1,
    slot2; at most two), and its own options beyond the common config fields, with defaults
    (they fill ``hp[HP_OPTIONS + i]``)."""

    name: str
    code: int
    slots: tuple[SlotDef, ...] = ()
    options: tuple[tuple[str, float], ...] = ()

    @property
    def row_wise(self) -> bool:
        """True when the update works on whole rows (a per-row slot): such a table cannot be
        split by column."""
        return any(s.per_row for s in self.slots)


_ACC = "initial_accumulator_value"

#: Every sparse optimizer, by name (recipe ``optimizer.sparse.type`` and engine ``kind``).
SPARSE_OPTIMIZERS: dict[str, OptimizerSpec] = {
    s.name: s
    for s in (
        OptimizerSpec("sgd", OPT_SGD),
        OptimizerSpec("adagrad", OPT_ADAGRAD, (SlotDef("accumulator", initial=_ACC),)),
        OptimizerSpec(
            "rowwise_adagrad", OPT_ROWWISE_ADAGRAD, (SlotDef("accumulator", True, _ACC),)
        ),
        OptimizerSpec("adam", OPT_ADAM, (SlotDef("m"), SlotDef("v"))),
        OptimizerSpec("lazy_adam", OPT_LAZY_ADAM, (SlotDef("m"), SlotDef("v"))),
        OptimizerSpec(
            "ftrl", OPT_FTRL, (SlotDef("accumulator", initial=_ACC), SlotDef("linear"))
        ),
        OptimizerSpec(
            "sgd_momentum", OPT_SGD_MOMENTUM, (SlotDef("momentum"),), (("momentum", 0.9),)
        ),
    )
}

#: The names, in registry order.
OPTIMIZER_NAMES: tuple[str, ...] = tuple(SPARSE_OPTIMIZERS)


def spec_of(name: str) -> OptimizerSpec:
    """The spec of the optimizer called ``name`` (ValueError naming the known ones)."""
    try:
        return SPARSE_OPTIMIZERS[name]
    except KeyError:
        raise ValueError(
            f"unknown sparse optimizer {name!r}; one of {OPTIMIZER_NAMES}"
        ) from None


def slot_counts(name: str) -> tuple[int, int]:
    """float32 slots per row of the optimizer: (per column, per row)."""
    slots = spec_of(name).slots
    return sum(not s.per_row for s in slots), sum(s.per_row for s in slots)


def slot_specs(cfg: Any) -> tuple[SlotSpec, ...]:
    """The slots of optimizer config ``cfg`` (``cfg.kind``; start values read from its
    fields), in kernel order."""
    return tuple(
        SlotSpec(s.name, s.per_row,
                 float(getattr(cfg, s.initial)) if isinstance(s.initial, str) else s.initial)
        for s in spec_of(cfg.kind).slots
    )


def option_values(cfg: Any) -> tuple[float, ...]:
    """The optimizer's own options of ``cfg`` (``cfg.options``, a mapping or pairs), defaults
    filled in, in declaration order."""
    given: Mapping[str, float] = dict(getattr(cfg, "options", ()) or ())
    return tuple(float(given.get(name, default)) for name, default in spec_of(cfg.kind).options)


def hyperparams(cfg: Any, step: int) -> np.ndarray:
    """The float32 hyper-parameter vector for ``step`` (0-based) of optimizer config ``cfg``
    (:class:`embtrain.embedding.config.SparseOptimizerConfig`)."""
    f32 = np.float32
    own = option_values(cfg)
    hp = np.zeros(HP_SIZE + len(own), dtype=np.float32)
    lr = f32(cfg.lr)
    hp[HP_LR] = lr
    hp[HP_EPS] = cfg.epsilon
    b1, b2 = f32(cfg.beta1), f32(cfg.beta2)
    hp[HP_BETA1] = b1
    hp[HP_BETA2] = b2
    hp[HP_ONE_MINUS_BETA1] = f32(1.0) - b1
    hp[HP_ONE_MINUS_BETA2] = f32(1.0) - b2
    t = f32(step + 1)
    p1 = np.power(b1, t, dtype=np.float32)
    p2 = np.power(b2, t, dtype=np.float32)
    hp[HP_LR_T] = lr * np.sqrt(f32(1.0) - p2) / (f32(1.0) - p1)
    hp[HP_LR_POWER] = cfg.learning_rate_power
    hp[HP_L1] = cfg.l1_regularization_strength
    hp[HP_L2] = f32(cfg.l2_regularization_strength) + f32(cfg.beta) / (f32(2.0) * lr)
    hp[HP_L2_SHRINKAGE] = cfg.l2_shrinkage_regularization_strength
    for i, v in enumerate(own):
        hp[HP_OPTIONS + i] = v
    return hp


def slot_count_table() -> np.ndarray:
    """int64 slots per kernel code (index: code), for the kernels."""
    out = np.zeros(max(s.code for s in SPARSE_OPTIMIZERS.values()) + 1, dtype=np.int64)
    for s in SPARSE_OPTIMIZERS.values():
        out[s.code] = len(s.slots)
    return out


def row_wise_table() -> np.ndarray:
    """bool per kernel code: the update works on whole rows (see :attr:`OptimizerSpec.row_wise`)."""
    out = np.zeros(max(s.code for s in SPARSE_OPTIMIZERS.values()) + 1, dtype=np.bool_)
    for s in SPARSE_OPTIMIZERS.values():
        out[s.code] = s.row_wise
    return out
