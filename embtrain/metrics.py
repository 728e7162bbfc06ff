"""Evaluation metrics in NumPy: exact AUC and log loss (the one definition: training, prediction
and the generated data's best achievable figures all use these)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def auc(labels: ArrayLike, scores: ArrayLike) -> float:
    """Exact ROC AUC by ranks (Mann-Whitney U), tied scores sharing their average rank.

    A label > 0.5 is a positive. O(n log n). NaN when one class is absent.
    """
    y = np.asarray(labels).reshape(-1) > 0.5
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.size} vs {s.size}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    n = s.size
    n_pos = int(y.sum())
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    new_group = np.empty(n, dtype=bool)
    new_group[0] = True
    np.not_equal(sorted_s[1:], sorted_s[:-1], out=new_group[1:])
    starts = np.flatnonzero(new_group)
    ends = np.append(starts[1:], n)
    mean_rank = (starts + ends + 1) / 2.0  # 1-based ranks starts+1 .. ends
    ranks = mean_rank[np.cumsum(new_group) - 1]
    rank_sum = float(ranks[y[order]].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def logloss(labels: ArrayLike, probs: ArrayLike, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy with probabilities clipped to ``[eps, 1 - eps]``."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(probs, dtype=np.float64).reshape(-1), eps, 1.0 - eps)
    if y.shape != p.shape:
        raise ValueError(f"labels and probs differ in length: {y.size} vs {p.size}")
    if y.size == 0:
        return float("nan")
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def mse(labels: ArrayLike, predictions: ArrayLike) -> float:
    """Mean squared error."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.asarray(predictions, dtype=np.float64).reshape(-1)
    if y.shape != p.shape:
        raise ValueError(f"labels and predictions differ in length: {y.size} vs {p.size}")
    return float(np.mean(np.square(p - y))) if y.size else float("nan")


def label_metrics(labels: list[tuple[str, str]], y: np.ndarray, p: np.ndarray
                  ) -> dict[str, dict[str, float]]:
    """Per label ``(name, loss)`` (column ``t`` of ``y`` and ``p``): AUC and log loss of a bce
    label, MSE of an mse label."""
    out: dict[str, dict[str, float]] = {}
    for t, (name, loss) in enumerate(labels):
        if loss == "bce":
            out[name] = {"auc": auc(y[:, t], p[:, t]), "logloss": logloss(y[:, t], p[:, t])}
        else:
            out[name] = {"mse": mse(y[:, t], p[:, t])}
    return out
