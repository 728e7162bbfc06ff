"""Several labels: the weighted sum of their losses and each head's prediction (any backend).

Label ``t`` reads column ``t`` of the ``[b, labels]`` labels and logits. ``bce``: binary
cross-entropy of the logit (the prediction is its sigmoid); ``mse``: squared error of the
head's output, which is the prediction itself. The loss is ``Σ_t weight_t · Σ_i loss_t,i``
(the caller scales it by 1 / global batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embtrain.models.ops import ops
from embtrain.recipe.models import Label

Tensor = Any


def label_losses(labels: Sequence[Label], y: Tensor, logits: Tensor) -> list[Tensor]:
    """``Σ_i loss_t(y[i, t], logits[i, t])`` of each label ``t`` (scalars, not weighted)."""
    out = []
    for t, label in enumerate(labels):
        if label.loss == "bce":
            per = ops.sigmoid_cross_entropy(y[:, t], logits[:, t])
        else:
            per = ops.square(logits[:, t] - y[:, t])
        out.append(ops.reduce_sum(per))
    return out


def weighted_loss(labels: Sequence[Label], y: Tensor, logits: Tensor,
                  terms: Sequence[Tensor] | None = None) -> Tensor:
    """``Σ_t weight_t · Σ_i loss_t(y[i, t], logits[i, t])`` (a scalar); ``terms``: the
    :func:`label_losses` already computed."""
    total = None
    if terms is None:
        terms = label_losses(labels, y, logits)
    for label, term in zip(labels, terms, strict=True):
        if label.weight != 1.0:
            term = term * label.weight
        total = term if total is None else total + term
    assert total is not None
    return total


def predictions(labels: Sequence[Label], logits: Tensor) -> Tensor:
    """``[b, labels]``: the sigmoid of each bce head, the output of each mse head."""
    cols = [ops.sigmoid(logits[:, t]) if label.loss == "bce" else logits[:, t]
            for t, label in enumerate(labels)]
    return ops.stack(cols, axis=1)
