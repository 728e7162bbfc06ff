"""One builder and one step for `run`, `bench` and the tests: (recipe, plan, comm) → trainer.

The plan decides where every table lives; :class:`~embtrain.embedding.sharded.ShardedEmbedding`
builds this rank's shards of it; the dense model reads the one-process layout, so its
weights, and everything a checkpoint holds, do not depend on the number of ranks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embtrain.comm import Communicator, LocalComm
from embtrain.recipe import Recipe


@dataclass
class Trainer:
    """The sharded embedding and the dense model of one rank, and the step that joins them."""

    embedding: Any  # ShardedEmbedding
    model: Any  # DenseModel
    comm: Communicator

    def forward(self, batch: Any, training: bool = True, step: int = -1) -> list[np.ndarray]:
        """This rank's pooled group arrays for ``batch`` (collective); dynamic tables insert
        new keys only when ``training``."""
        return self.embedding.forward(batch.sparse, batch.global_rows, training=training,
                                      step=step)

    voted: bool = False  # whether any rank voted (to stop) at the latest step
    # the read-ahead of the batch the next training step reads (see prefetch)
    _ahead: Any = field(default=None, repr=False)

    def prefetch(self, batch: Any) -> None:
        """The read-ahead stage: tiered tables start reading the rows ``batch`` (the next
        training step's) will miss, while this step computes; with several ranks its ids are
        exchanged now (collective) and the next training step uses that exchange. Call it
        after this step's forward (the step does, given ``upcoming``)."""
        self._ahead = self.embedding.prefetch(batch.sparse, batch.global_rows)

    def step(self, batch: Any, step: int, times: dict[str, float] | None = None,
             vote: bool = False, upcoming: Any = None) -> float:
        """One training step on this rank's slice of a global batch; returns the global loss
        (the mean over the global batch, equal on every rank).

        ``times``, when given, receives the step's seconds by phase: ``embedding_forward``,
        ``dense``, ``embedding_update`` (each without its collectives) and ``communication``.
        ``vote``: this rank's wish to stop after this step; :attr:`voted` tells whether any
        rank wished so (carried by the loss all-reduce, so every rank stops at the same step).
        ``upcoming``: the next batch, whose rows tiered tables then read ahead while this step
        computes.
        """
        traffic = self.comm.traffic
        waited = traffic.total_seconds()
        t0 = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        # keys → rows → pool (errors count steps from 1)
        groups = self.embedding.forward(batch.sparse, batch.global_rows, step=step + 1,
                                        ahead=ahead)
        if upcoming is not None:
            self.prefetch(upcoming)  # the next batch's rows, read while this step computes
        t1, w1 = time.perf_counter(), traffic.total_seconds()
        if self.comm.size == 1:
            loss, grads = self.model.train_step(batch.dense, groups, batch.label)
        else:
            loss, grads = self.model.train_step(
                batch.dense, groups, batch.label, global_batch_size=batch.global_rows,
                allreduce_dense_grads=self.comm.allreduce_tensors)
        t2, w2 = time.perf_counter(), traffic.total_seconds()
        self.embedding.backward_update(grads, step)
        if self.comm.size > 1:
            summed = self.comm.allreduce_sum(np.array([loss, float(vote)], np.float64), "control")
            loss, self.voted = float(summed[0]), bool(summed[1] > 0)
        else:
            self.voted = vote
        t3, w3 = time.perf_counter(), traffic.total_seconds()
        if times is not None:
            times["embedding_forward"] = (t1 - t0) - (w1 - waited)
            times["dense"] = (t2 - t1) - (w2 - w1)
            times["embedding_update"] = (t3 - t2) - (w3 - w2)
            times["communication"] = w3 - waited
        return float(loss)

    def predict(self, batch: Any) -> np.ndarray:
        """Click probabilities for this rank's rows of ``batch`` (collective)."""
        return self.model.predict(batch.dense, self.forward(batch, training=False))


def build_trainer(recipe: Recipe, plan: Any, comm: Communicator | None = None,
                  seed: int | None = None, backend: str = "cpu") -> Trainer:
    """This rank's embedding shards (as ``plan`` places them) and dense model for ``recipe``."""
    from embtrain.embedding.from_recipe import (
        feature_configs,
        sparse_optimizer_config,
        table_configs,
    )
    from embtrain.embedding.sharded import ShardedEmbedding, placements_from_plan
    from embtrain.models import build_model
    from embtrain.models.slots import FeatureSlot, feature_slots
    from embtrain.storage import open_store

    comm = comm or LocalComm()
    seed = recipe.train.seed if seed is None else seed
    embedding = ShardedEmbedding(
        table_configs(recipe),
        feature_configs(recipe),
        sparse_optimizer_config(recipe.optimizer.sparse),
        seed=seed,
        placements=placements_from_plan(plan) if comm.size > 1 else None,
        comm=comm,
        quantize=recipe.distributed.comm.quantize if comm.size > 1 else "none",
        mixed_precision=recipe.train.mixed_precision,  # half tables' wire dtype (comm/wire.py)
        backend=backend,
        stores=open_store,  # the tier kinds' row stores (embtrain.storage.kinds)
    )
    slots: list[FeatureSlot] = feature_slots(recipe, embedding.layout)
    num_dense = sum(len(f.columns) for f in recipe.dense_features)
    model = build_model(recipe.model, num_dense=num_dense, slots=slots, seed=seed,
                        labels=recipe.data.label_specs() if recipe.data.labels is not None else None,
                        label_names=[lab.name for lab in recipe.data.label_specs()],
                        precision=recipe.train.mixed_precision)
    model.make_optimizer(recipe.optimizer.dense)
    return Trainer(embedding, model, comm)
