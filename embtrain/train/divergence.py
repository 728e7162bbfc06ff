"""When a run has diverged, and what is kept when it has.

The rule (docs/RELIABILITY.md):

- after every step, the global loss must be finite and at most :data:`LOSS_LIMIT`, a mean
  binary cross-entropy 1000 times that of always predicting 0.5 (1000 ln 2 ≈ 693: the model
  gives the true label a probability of e^-693 on average over a whole batch; no training that
  still learns comes near it, and a learning rate of 1e30 passes it within a few steps);
- before every checkpoint, the dense weights and the in-memory embedding rows of every rank
  must be finite (a tiered table's rows on disk are not read again for this).

A run breaking the rule stops with ``training diverged ...`` (exit 1) before anything of the
bad state is written. The loss of step ``s + 1`` is the first verdict on the state a checkpoint
at step ``s`` holds, so :class:`DivergenceGuard` prunes a checkpoint's predecessors only once
the step after it passed: when step ``s + 1`` diverges, the checkpoint at ``s`` is renamed
``step-s.diverged`` (kept for inspection, never resumed from) and the one before it, which
passed, is the run's latest. The last good checkpoint is kept, never overwritten.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.errors import TrainingDiverged

#: The largest mean batch loss a run may report (1000 x the loss of always predicting 0.5).
LOSS_LIMIT = 1000.0 * math.log(2.0)

HINT = "lower the learning rates (optimizer.sparse.lr, optimizer.dense.lr)"


def _kept(run_dir: Path | None) -> str:
    from embtrain.checkpoint import latest_checkpoint

    latest = latest_checkpoint(run_dir) if run_dir is not None else None
    if latest is None:
        return "no checkpoint was written"
    return f"the last good checkpoint {latest.name} is kept"


def check_loss(loss: float, step: int, source: str, run_dir: Path | None,
               limit: float = LOSS_LIMIT) -> None:
    """Raise :class:`TrainingDiverged` when the loss after ``step`` breaks the rule (``limit``:
    infinite when a label is an mse one, whose loss has its label's units: only a non-finite
    loss is divergence then)."""
    if math.isfinite(loss) and loss <= limit:
        return
    what = (f"the loss became {loss}" if not math.isfinite(loss) else
            f"the loss reached {loss:.3g} (over {LOSS_LIMIT:.0f}, 1000x that of predicting 0.5)")
    raise TrainingDiverged(f"{source}: training diverged: {what} at step {step}; "
                           f"{_kept(run_dir)}; {HINT}")


def _finite_tables(embedding: Any) -> list[str]:
    """Names of this rank's in-memory tables holding a non-finite value."""
    from embtrain.embedding.halves import DTYPE_CODES, to_float32

    engines = [embedding.engine]
    if getattr(embedding, "dp", None) is not None:
        engines.append(embedding.dp.engine)
    bad = []
    for engine in engines:
        for name in engine.table_names:
            if engine.table_config(name).tier is not None:
                continue  # rows on disk: not read again here
            for chunk in engine.export_chunks(name):  # bounded memory, whatever the size
                values = to_float32(chunk.values, DTYPE_CODES[chunk.dtype])  # (half: widened)
                if not bool(np.isfinite(values).all()):
                    bad.append(name)
                    break
    return bad


def check_state(model: Any, embedding: Any, comm: Any, step: int, source: str,
                run_dir: Path | None) -> None:
    """Before a checkpoint of ``step``: dense weights and every rank's in-memory rows finite.

    Collective with several ranks (every rank calls it at the same step).
    """
    weights = [name for name, w in zip(model.weight_names(), model.get_weights(), strict=True)
               if not bool(np.isfinite(w).all())]
    tables = _finite_tables(embedding)
    flag = float(bool(weights or tables))
    if comm.size > 1:
        flag = float(comm.allreduce_sum(np.array([flag], np.float64), "other")[0])
    if not flag:
        return
    where = ", ".join([*(f"table {t}" for t in tables), *(f"dense weight {w}" for w in weights)])
    what = f"non-finite values in {where}" if where else "non-finite values on another rank"
    raise TrainingDiverged(f"{source}: training diverged: {what} at step {step}; "
                           f"{_kept(run_dir)}; {HINT}")


class DivergenceGuard:
    """The job's side of the rule: checks after each step and before each checkpoint, and the
    checkpoint pruning that keeps the last good one (file operations on rank 0 only)."""

    def __init__(self, checkpoints: Any, source: str, comm: Any, limit: float = LOSS_LIMIT):
        self.limit = limit
        self.checkpoints = checkpoints
        self.keep = int(checkpoints.keep)
        self.source = source
        self.comm = comm
        self.is_root = comm.rank == 0
        self.pending: int | None = None  # the newest checkpoint no later step has passed yet
        checkpoints.keep = self.keep + 1  # its predecessor survives the save

    def _prune(self) -> None:
        if self.is_root:
            self.checkpoints.keep = self.keep
            try:
                self.checkpoints.prune()
            finally:
                self.checkpoints.keep = self.keep + 1

    def before_checkpoint(self, model: Any, embedding: Any, step: int) -> None:
        """Refuse to write a non-finite state; the checkpoint about to be written is pending."""
        check_state(model, embedding, self.comm, step, self.source, self.checkpoints.run_dir)
        self.pending = step

    def after_step(self, loss: float, step: int) -> None:
        """After ``step``: its loss passes (a pending checkpoint is confirmed) or the run stops."""
        try:
            check_loss(loss, step, self.source, None, self.limit)
        except TrainingDiverged:
            if self.pending is not None and self.pending < step and self.is_root:
                from embtrain.checkpoint.manager import checkpoint_name

                bad = self.checkpoints.directory / checkpoint_name(self.pending)
                if bad.is_dir():
                    target, n = bad.with_name(bad.name + ".diverged"), 1
                    while target.exists():
                        n += 1
                        target = bad.with_name(f"{bad.name}.diverged-{n}")
                    os.replace(bad, target)
            check_loss(loss, step, self.source, self.checkpoints.run_dir, self.limit)
            raise
        if self.pending is not None and self.pending < step:
            self.pending = None
            self._prune()

    def finish(self) -> None:
        """At the end of a run: the recipe's ``keep`` checkpoints, no more."""
        self.pending = None
        self._prune()
