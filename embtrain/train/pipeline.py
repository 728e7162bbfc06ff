"""The training step loop of ``run`` and ``bench``: one batch ahead of the step that computes.

This loop is the one place that decides what of batch *n + 1* happens during step *n*. Within
step *n*, in this order (each stage's owner in brackets):

1. **exchange and lookup of batch n**: its ids to their owners (staged at step *n - 1*, else
   now), the rows looked up (a look-ahead's lookup taken up when its index is unchanged),
   pooled, and the pooled arrays exchanged back
   (:meth:`Trainer.begin_step <embtrain.train.builder.Trainer.begin_step>` →
   :meth:`ShardedEmbedding.forward <embtrain.embedding.sharded.ShardedEmbedding.forward>`);
2. **read-ahead of batch n + 1**: drawn from the batches (this loop), its ids exchanged
   (:meth:`ShardedEmbedding.stage_ids
   <embtrain.embedding.sharded.ShardedEmbedding.stage_ids>`, or ``stage_ids_in_background``
   on a communication thread, :mod:`embtrain.embedding.sharding.pipeline`, when ids leave
   this process and no table is tiered), then
3. **look-ahead of batch n + 1**: hash tables start looking its keys up on a thread of their
   own (:meth:`EmbeddingEngine.look_ahead
   <embtrain.embedding.engine.EmbeddingEngine.look_ahead>`,
   :mod:`embtrain.embedding.lookahead`), and tiered tables start reading the rows it will
   miss (:meth:`EmbeddingEngine.read_ahead
   <embtrain.embedding.engine.EmbeddingEngine.read_ahead>`, :mod:`embtrain.storage.tier_io`);
4. **dense** forward and backward of batch *n* (:meth:`Trainer.finish_step
   <embtrain.train.builder.Trainer.finish_step>` → the dense model), overlapping 2–3;
5. **backward**: the gradient exchange and the embedding update of batch *n*
   (:meth:`ShardedEmbedding.backward_update
   <embtrain.embedding.sharded.ShardedEmbedding.backward_update>`; it first stops the
   look-ahead threads, and a look-ahead whose index the update changed is dropped).

Only ids and keys move ahead of step *n*'s update, and rows read ahead are re-read when
written meanwhile, so every stage ahead leaves the result the unpipelined one bit for bit
(``tests/test_pipeline.py``, ``tests/test_lookahead.py``). Tiered tables always read ahead
(that needs the ids exchanged in this thread); ``overlap`` adds the background exchange and
the look-ahead. The last step sends nothing ahead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from embtrain.train.builder import Trainer


class StepPipeline:
    """Steps of ``trainer`` on the batches of ``batches`` up to step ``total_steps`` (exclusive),
    each step with the next batch on its way (see the module's docstring).

    ``overlap``: exchange the next batch's ids on a communication thread when they leave this
    process, and look hash tables' keys up ahead (the same result bit for bit; off: only
    tiered tables' reads go ahead). ``input_seconds``: the time the latest :meth:`step` spent
    drawing a batch from ``batches`` (reading or building it; the batch ahead's, when one is
    sent ahead).
    """

    def __init__(self, trainer: Trainer, batches: Iterator[Any], total_steps: int,
                 overlap: bool = True):
        self.trainer = trainer
        self._batches = batches
        self._total = int(total_steps)
        embedding = trainer.embedding
        self.overlap = bool(overlap)
        self._in_background = self.overlap and embedding.ids_leave and not embedding.tiered
        #: whether a step sends the next batch ahead at all
        self.sends_ahead: bool = embedding.tiered or (self.overlap and (
            embedding.ids_leave or embedding.dynamic))
        self._upcoming: Any = None
        self._primed = False
        self.input_seconds = 0.0

    def _draw(self) -> Any:
        t0 = time.perf_counter()
        got = next(self._batches, None)
        self.input_seconds += time.perf_counter() - t0
        return got

    def _send_ahead(self, batch: Any) -> None:
        """Stages 2–3 for ``batch``, the next step's (collective)."""
        embedding = self.trainer.embedding
        if self._in_background:
            embedding.stage_ids_in_background(batch.sparse, batch.global_rows)
            return
        local = embedding.stage_ids(batch.sparse, batch.global_rows)
        if self.overlap:
            embedding.engine.look_ahead(local)
        embedding.engine.read_ahead(local)

    def step(self, step: int, times: dict[str, float] | None = None,
             vote: bool = False) -> tuple[Any, float] | None:
        """Train step ``step`` (0-based) on the next batch: ``(batch, global loss)``, or None
        when the batches ran out. ``times``/``vote``: as for :meth:`Trainer.finish_step`."""
        self.input_seconds = 0.0
        if not self.sends_ahead:
            batch, upcoming = self._draw(), None
        else:
            if not self._primed:
                self._upcoming, self._primed = self._draw(), True
            batch = self._upcoming
            upcoming = self._draw() if batch is not None and step + 1 < self._total else None
            self._upcoming = upcoming
        if batch is None:
            return None
        started = self.trainer.begin_step(batch, step)
        if upcoming is not None:
            self._send_ahead(upcoming)
        return batch, self.trainer.finish_step(started, times, vote)


__all__ = ["StepPipeline"]
