"""The training step loop of ``run`` and ``bench``: one batch ahead of the step that computes.

While step *t* computes, batch *t + 1* is on its way (:meth:`Trainer.prefetch
<embtrain.train.builder.Trainer.prefetch>`, called by the step right after its embedding
forward): tiered tables read the rows it will miss, dynamic tables look its keys up on a thread
of their own (:mod:`embtrain.embedding.lookahead`), and with several ranks its ids travel to
their owners on a communication thread (:mod:`embtrain.embedding.sharding.pipeline`). Whether
any of this happens is the embedding's answer (``reads_ahead``); which batch comes next, and
that the last step reads none ahead, is this loop's. Every stage ahead leaves the result the
unpipelined one bit for bit (``tests/test_pipeline.py``, ``tests/test_lookahead.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from embtrain.train.builder import Trainer


class StepPipeline:
    """Steps of ``trainer`` on the batches of ``batches`` up to step ``total_steps`` (exclusive),
    each step with the next batch on its way.

    ``input_seconds``: the time the latest :meth:`step` spent drawing a batch from
    ``batches`` (reading or building it; the batch ahead's, when one is read ahead).
    """

    def __init__(self, trainer: Trainer, batches: Iterator[Any], total_steps: int):
        self.trainer = trainer
        self._batches = batches
        self._total = int(total_steps)
        self.reads_ahead: bool = trainer.embedding.reads_ahead
        self._upcoming: Any = None
        self._primed = False
        self.input_seconds = 0.0

    def _draw(self) -> Any:
        t0 = time.perf_counter()
        got = next(self._batches, None)
        self.input_seconds += time.perf_counter() - t0
        return got

    def step(self, step: int, times: dict[str, float] | None = None,
             vote: bool = False) -> tuple[Any, float] | None:
        """Train step ``step`` (0-based) on the next batch: ``(batch, global loss)``, or None
        when the batches ran out. ``times``/``vote``: as for :meth:`Trainer.step`."""
        self.input_seconds = 0.0
        if not self.reads_ahead:
            batch, upcoming = self._draw(), None
        else:
            if not self._primed:
                self._upcoming, self._primed = self._draw(), True
            batch = self._upcoming
            upcoming = self._draw() if batch is not None and step + 1 < self._total else None
            self._upcoming = upcoming
        if batch is None:
            return None
        return batch, self.trainer.step(batch, step, times, vote=vote, upcoming=upcoming)


__all__ = ["StepPipeline"]
