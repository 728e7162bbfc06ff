"""What a logged training step shows besides its loss: the learning rates the step trained with
(sparse and dense, after their schedules) and, with ``data.labels``, each label's loss.

A label's loss is the mean of its (unweighted) loss over the global batch, averaged over the
last ``log_every`` steps like the run's ``loss``; the window is checkpointed with the losses,
so a resumed run logs what an uninterrupted one does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from embtrain.embedding.from_recipe import sparse_optimizer_config
from embtrain.embedding.optimizers import hyperparams
from embtrain.recipe.models import Recipe
from embtrain.train.loss_window import LossWindow


class StepReport:
    """The learning rates and per-label losses of the steps a run logs."""

    def __init__(self, recipe: Recipe, model: Any, restored: Iterable[Sequence[float]] = ()):
        self.labels = ([lab.name for lab in recipe.data.label_specs()]
                       if recipe.data.labels is not None else [])
        self.window = LossWindow(recipe.train.log_every, (list(map(float, r)) for r in restored))
        self._sparse = sparse_optimizer_config(recipe.optimizer.sparse)
        self._model = model

    def after_step(self, label_losses: np.ndarray | None) -> None:
        """Keep the step's per-label losses (``None`` without ``data.labels``)."""
        if self.labels and label_losses is not None:
            self.window.append([float(x) for x in label_losses])

    def state(self) -> list[list[float]]:
        """The per-label loss window, for a checkpoint."""
        return [list(r) for r in self.window]

    def fields(self, step: int) -> dict[str, Any]:
        """The metrics.jsonl fields after ``step`` steps (1-based): ``lr_sparse`` (what the
        engine's update of step ``step`` used), ``lr_dense`` (the dense optimizer's latest
        update) and, with ``data.labels``, ``labels: {name: {loss}}``."""
        out: dict[str, Any] = {
            "lr_sparse": float(hyperparams(self._sparse, max(step - 1, 0))[0]),
            "lr_dense": float(self._model.learning_rate()),
        }
        if self.labels and len(self.window):
            means = np.mean(np.asarray(list(self.window), np.float64), axis=0)
            out["labels"] = {name: {"loss": float(m)}
                             for name, m in zip(self.labels, means, strict=True)}
        return out


def describe(fields: dict[str, Any]) -> str:
    """The progress line's part for :meth:`StepReport.fields`:
    ``click 0.4512  conversion 0.0811  lr 0.05/0.001`` (sparse/dense)."""
    parts = [f"{name} {v['loss']:.4f}" for name, v in fields.get("labels", {}).items()]
    parts.append(f"lr {fields['lr_sparse']:.4g}/{fields['lr_dense']:.4g}")
    return "  ".join(parts)
