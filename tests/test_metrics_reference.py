"""The one metrics module (:mod:`embtrain.metrics`) against plain references on fresh random
inputs: AUC against the pairwise definition (ties count one half), log loss against a per-sample
loop with the same clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest

from embtrain.metrics import auc, logloss


def _pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (pos.size * neg.size))


@pytest.mark.parametrize("distinct", [2, 7, 1000])  # few distinct scores: many ties
def test_auc_equals_the_pairwise_definition_with_ties(distinct: int) -> None:
    rng = np.random.default_rng()
    for _ in range(20):
        n = int(rng.integers(2, 400))
        scores = rng.integers(0, distinct, n) / distinct + rng.choice([0.0, 1e-9], n)
        labels = (rng.random(n) < rng.uniform(0.05, 0.95)).astype(np.int8)
        if labels.min() == labels.max():
            assert math.isnan(auc(labels, scores))
            continue
        assert auc(labels, scores) == pytest.approx(_pairwise_auc(labels, scores), abs=1e-12)


def test_auc_refuses_nan_scores_and_unequal_lengths() -> None:
    with pytest.raises(ValueError, match="NaN"):
        auc([0, 1], [0.5, float("nan")])
    with pytest.raises(ValueError, match="differ in length"):
        auc([0, 1, 1], [0.5, 0.2])


def test_logloss_equals_a_per_sample_loop_with_clipping() -> None:
    rng = np.random.default_rng()
    eps = 1e-7
    n = 500
    labels = (rng.random(n) < 0.3).astype(np.float64)
    probs = rng.random(n)
    probs[:20] = rng.choice([0.0, 1.0, 1e-12, 1 - 1e-12], 20)  # clipped to [eps, 1 - eps]
    total = 0.0
    for y, p in zip(labels, probs, strict=True):
        q = min(max(float(p), eps), 1.0 - eps)
        total += -(y * math.log(q) + (1.0 - y) * math.log(1.0 - q))
    assert logloss(labels, probs) == pytest.approx(total / n, rel=1e-12)
    assert math.isfinite(logloss([1.0, 0.0], [0.0, 1.0]))  # certain and wrong: clipped, finite
