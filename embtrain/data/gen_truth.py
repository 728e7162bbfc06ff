"""The hidden ground-truth model of ``embtrain gen-data``'s labels: calibrated once on sampled
rows (fixed shares of the logit's spread, a bias for the target click rate), then the true
click probability of every row (:mod:`embtrain.data.gen`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from embtrain.data.gen_plan import (
    CALIBRATION_ROWS,
    LOGIT_STD,
    SHARES,
    TARGET_CTR,
    GenConfig,
    GenPlan,
)
from embtrain.data.gen_sampling import Rows, dense_params, gen_rows


@dataclass(frozen=True)
class Truth:
    dense_mean: np.ndarray
    dense_std: np.ndarray
    dense_weight: np.ndarray
    effect_std: np.ndarray
    scales: tuple[float, float, float]  # multipliers of the dense, categorical, interaction parts
    inter_std: np.ndarray
    bias: float


def _parts(plan: GenPlan, rows: Rows, truth: Truth | None, weight: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = rows.effects.shape[0]
    if truth is None:
        d_mean, d_std = rows.dense.mean(axis=0), rows.dense.std(axis=0) + 1e-12
        e_std = rows.effects.std(axis=0) + 1e-12
    else:
        d_mean, d_std, e_std = truth.dense_mean, truth.dense_std, truth.effect_std
    dense = ((rows.dense - d_mean) / d_std) @ weight if plan.dense else np.zeros(n)
    cat = (rows.effects / e_std).sum(axis=1) if plan.ids else np.zeros(n)
    inter = np.zeros((n, len(plan.interactions)))
    for p, (a, b) in enumerate(plan.interactions):
        inter[:, p] = (rows.latent[a] * rows.latent[b]).sum(axis=1)
    return dense, cat, inter


def calibrate(plan: GenPlan, config: GenConfig) -> Truth:
    n = min(max(config.rows, 10_000), CALIBRATION_ROWS)
    rows = gen_rows(plan, n, np.random.default_rng((config.seed, 99)), config.seed, config.alpha)
    weight = dense_params(plan, config.seed)[2]
    dense, cat, inter = _parts(plan, rows, None, weight)
    inter_std = inter.std(axis=0) + 1e-12
    inter_sum = (inter / inter_std).sum(axis=1)
    present = {"dense": bool(plan.dense), "categorical": bool(plan.ids),
               "interactions": bool(plan.interactions)}
    total = sum(SHARES[k] for k, on in present.items() if on) or 1.0
    stds = (dense.std(), cat.std(), inter_sum.std())
    scales = tuple(
        (LOGIT_STD * math.sqrt(SHARES[k] / total) / (s + 1e-12)) if present[k] else 0.0
        for k, s in zip(("dense", "categorical", "interactions"), stds, strict=True))
    z = scales[0] * dense + scales[1] * cat + scales[2] * inter_sum
    lo, hi = -20.0, 20.0
    for _ in range(60):  # bisection: mean(sigmoid(z + b)) = TARGET_CTR
        mid = (lo + hi) / 2
        if sigmoid(z + mid).mean() < TARGET_CTR:
            lo = mid
        else:
            hi = mid
    return Truth(rows.dense.mean(axis=0), rows.dense.std(axis=0) + 1e-12, weight,
                  rows.effects.std(axis=0) + 1e-12, scales, inter_std, (lo + hi) / 2)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def probability(plan: GenPlan, rows: Rows, truth: Truth) -> np.ndarray:
    dense, cat, inter = _parts(plan, rows, truth, truth.dense_weight)
    inter_sum = (inter / truth.inter_std).sum(axis=1)
    s = truth.scales
    return sigmoid(truth.bias + s[0] * dense + s[1] * cat + s[2] * inter_sum)


