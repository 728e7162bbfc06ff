"""Sparse optimizers of the engine: slots, hyper-parameters and exact update rules.

Every update touches only the rows the batch used; ``g`` is the row's gradient with
duplicates summed; arithmetic is float32, in the order written here.

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

from dataclasses import dataclass

import numpy as np

from embtrain.embedding.config import SparseOptimizerConfig
from embtrain.kernels import codes

_KIND_CODES = {
    "sgd": codes.OPT_SGD,
    "adagrad": codes.OPT_ADAGRAD,
    "rowwise_adagrad": codes.OPT_ROWWISE_ADAGRAD,
    "adam": codes.OPT_ADAM,
    "lazy_adam": codes.OPT_LAZY_ADAM,
    "ftrl": codes.OPT_FTRL,
}


@dataclass(frozen=True)
class SlotSpec:
    """One optimizer slot: its name, whether it holds one value per row, and its start value."""

    name: str
    per_row: bool
    initial_value: float


def kind_code(cfg: SparseOptimizerConfig) -> int:
    """Kernel code of the optimizer kind."""
    return _KIND_CODES[cfg.kind]


def slot_specs(cfg: SparseOptimizerConfig) -> tuple[SlotSpec, ...]:
    """The slots the optimizer keeps per table row, in kernel order (slot1, slot2)."""
    acc0 = float(cfg.initial_accumulator_value)
    if cfg.kind == "sgd":
        return ()
    if cfg.kind == "adagrad":
        return (SlotSpec("accumulator", False, acc0),)
    if cfg.kind == "rowwise_adagrad":
        return (SlotSpec("accumulator", True, acc0),)
    if cfg.kind in ("adam", "lazy_adam"):
        return (SlotSpec("m", False, 0.0), SlotSpec("v", False, 0.0))
    return (SlotSpec("accumulator", False, acc0), SlotSpec("linear", False, 0.0))


def hyperparams(cfg: SparseOptimizerConfig, step: int) -> np.ndarray:
    """The float32 hyper-parameter vector (layout ``codes.HP_*``) for ``step`` (0-based)."""
    f32 = np.float32
    hp = np.zeros(codes.HP_SIZE, dtype=np.float32)
    lr = f32(cfg.lr) if cfg.lr_factor is None else f32(cfg.lr * cfg.lr_factor(step))
    hp[codes.HP_LR] = lr
    hp[codes.HP_EPS] = cfg.epsilon
    b1, b2 = f32(cfg.beta1), f32(cfg.beta2)
    hp[codes.HP_BETA1] = b1
    hp[codes.HP_BETA2] = b2
    hp[codes.HP_ONE_MINUS_BETA1] = f32(1.0) - b1
    hp[codes.HP_ONE_MINUS_BETA2] = f32(1.0) - b2
    t = f32(step + 1)
    p1 = np.power(b1, t, dtype=np.float32)
    p2 = np.power(b2, t, dtype=np.float32)
    hp[codes.HP_LR_T] = lr * np.sqrt(f32(1.0) - p2) / (f32(1.0) - p1)
    hp[codes.HP_LR_POWER] = cfg.learning_rate_power
    hp[codes.HP_L1] = cfg.l1_regularization_strength
    hp[codes.HP_L2] = f32(cfg.l2_regularization_strength) + f32(cfg.beta) / (f32(2.0) * lr)
    hp[codes.HP_L2_SHRINKAGE] = cfg.l2_shrinkage_regularization_strength
    return hp
