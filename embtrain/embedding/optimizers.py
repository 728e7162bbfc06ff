"""Sparse optimizers of the engine: slots, hyper-parameters and exact update rules.

Every update touches only the rows the batch used; ``g`` is the row's gradient with
duplicates summed; arithmetic is float32, in the order written here.

The spec of every optimizer (kernel code, slots, options, hyper-parameter vector) is
:mod:`embtrain.kernels.optimizer_spec`; the update rules the kernels compile are
:mod:`embtrain.kernels.rules.optimizers`. This module is the engine's view of them.

* ``sgd``: ``var -= lr * g`` (TensorFlow's sparse SGD, ``ResourceScatterAdd(-g * lr)``).
* ``adagrad`` (slot ``accumulator``, starts at ``initial_accumulator_value``): TensorFlow's
  ``ResourceSparseApplyAdagradV2``: ``acc += g²; var -= g * lr / (sqrt(acc) + epsilon)``.
* ``rowwise_adagrad`` (slot ``accumulator``, one value per row):
  ``acc += mean(g²) over the row; var -= g * lr / (sqrt(acc) + epsilon)``.
* ``ftrl`` (slots ``accumulator``, ``linear``): TensorFlow's ``ResourceSparseApplyFtrlV2``
  including ``l2_shrinkage``; Keras' ``beta`` enters as ``l2 + beta / (2 lr)``.
* ``lazy_adam`` (slots ``m``, ``v``): TensorFlow-Addons' LazyAdam. With the global step
  count ``t = step + 1``: ``m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²;
  lr_t = lr sqrt(1-β2^t) / (1-β1^t); var -= lr_t m / (sqrt(v) + epsilon)``, for touched
  rows only; the moments of untouched rows do not change.
* ``adam`` (slots ``m``, ``v``): dense Adam would touch every row every step. embtrain's
  ``adam`` is *lazy Adam whose moments are decayed for the steps a row was skipped*: before
  a touched row is updated at step ``t`` (0-based) with ``last_step`` ``s``, its moments are
  multiplied by ``β1^(t-s-1)`` and ``β2^(t-s-1)``. Its ``m`` and ``v`` therefore equal dense
  Adam's moments exactly (up to float rounding); only the parameter drift that dense Adam
  would apply to a row during the steps it was skipped (from its decaying moments) is not
  applied. The update itself is the lazy_adam one.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from embtrain.embedding.config import SparseOptimizerConfig
from embtrain.kernels.optimizer_spec import SlotSpec, spec_of
from embtrain.kernels.optimizer_spec import hyperparams as _hyperparams
from embtrain.kernels.optimizer_spec import slot_specs as _slot_specs

__all__ = ["SlotSpec", "hyperparams", "kind_code", "slot_specs"]


def kind_code(cfg: SparseOptimizerConfig) -> int:
    """Kernel code of the optimizer kind."""
    return spec_of(cfg.kind).code


def slot_specs(cfg: SparseOptimizerConfig) -> tuple[SlotSpec, ...]:
    """The slots the optimizer keeps per table row, in kernel order (slot1, slot2)."""
    return _slot_specs(cfg)


def hyperparams(cfg: SparseOptimizerConfig, step: int) -> np.ndarray:
    """The float32 hyper-parameter vector (layout ``codes.HP_*``, then the optimizer's own
    options) for ``step`` (0-based)."""
    if cfg.lr_factor is not None:  # the schedule's learning rate at this step
        cfg = replace(cfg, lr=float(np.float32(cfg.lr * cfg.lr_factor(step))))
    return _hyperparams(cfg, step)
