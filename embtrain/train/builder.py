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
from embtrain.train.device import Device, resolve_device


@dataclass
class StartedStep:
    """A training step whose embedding forward is done (:meth:`Trainer.begin_step`): its
    batch, step, pooled group arrays, and the clocks at its start."""

    batch: Any
    step: int
    groups: list[np.ndarray]
    t0: float  # perf_counter at the start
    waited: float  # seconds this thread had waited inside collectives at the start
    hidden: float  # seconds background threads had spent inside collectives at the start
    looked_ahead: tuple[int, int]  # the embedding's lookahead_items at the start


@dataclass
class Trainer:
    """The sharded embedding and the dense model of one rank, and the step that joins them."""

    embedding: Any  # ShardedEmbedding
    model: Any  # DenseModel
    comm: Communicator
    # where this rank trains, and how pooled arrays and gradients cross to the network
    device: Device = field(default_factory=lambda: Device("cpu", "cpu"))

    def forward(self, batch: Any, training: bool = True, step: int = -1) -> list[np.ndarray]:
        """This rank's pooled group arrays for ``batch`` (collective); dynamic tables insert
        new keys only when ``training``."""
        return self.embedding.forward(batch.sparse, batch.global_rows, training=training,
                                      step=step)

    voted: bool = False  # whether any rank voted (to stop) at the latest step
    #: each label's loss at the latest step (the mean over the global batch; ``None`` without
    #: ``data.labels``), see :meth:`DenseModel.label_losses`
    label_losses: np.ndarray | None = None
    _dense_fused: bool | None = field(default=None, repr=False)

    def step(self, batch: Any, step: int, times: dict[str, float] | None = None,
             vote: bool = False) -> float:
        """One training step on this rank's slice of a global batch; returns the global loss
        (the mean over the global batch, equal on every rank): :meth:`begin_step` then
        :meth:`finish_step`, with nothing staged between them (the step loop,
        :class:`~embtrain.train.pipeline.StepPipeline`, sends the next batch ahead there)."""
        return self.finish_step(self.begin_step(batch, step), times, vote)

    def begin_step(self, batch: Any, step: int) -> StartedStep:
        """The embedding forward of training step ``step`` on ``batch``: keys → rows → pool,
        the ids of a batch staged by the embedding (``stage_ids``) taken up exchanged."""
        traffic = self.comm.traffic
        waited, hidden = traffic.blocking_seconds(), traffic.background_seconds()
        looked_ahead = self.embedding.lookahead_items
        t0 = time.perf_counter()
        # errors count steps from 1
        groups = self.embedding.forward(batch.sparse, batch.global_rows, step=step + 1)
        return StartedStep(batch, step, groups, t0, waited, hidden, looked_ahead)

    def finish_step(self, started: StartedStep, times: dict[str, float] | None = None,
                    vote: bool = False) -> float:
        """The dense part, the backward exchange and the embedding update of a step that
        :meth:`begin_step` started; returns the global loss.

        ``times``, when given, receives the step's seconds by phase, from the start of
        :meth:`begin_step` (so whatever ran between the two counts as embedding forward):
        ``embedding_forward``, ``dense``, ``embedding_update`` (each without the time this
        thread waits inside collectives), ``communication`` (that waiting) and
        ``hidden_communication`` (time the pipeline's thread spent inside collectives while
        this one computed); on one rank with dynamic tables ``lookup_ahead_share`` (the
        share of this step's lookup that the look-ahead's thread did while the step before
        computed; not a time).
        ``vote``: this rank's wish to stop after this step; :attr:`voted` tells whether any
        rank wished so (summed with the loss in the backward exchange, so every rank stops at
        the same step).
        """
        batch, step, groups = started.batch, started.step, started.groups
        t0, waited, hidden = started.t0, started.waited, started.hidden
        looked_ahead = started.looked_ahead
        traffic = self.comm.traffic
        t1, w1 = time.perf_counter(), traffic.blocking_seconds()
        dev = self.device  # cpu: NumPy as it is; gpu: DLPack both ways
        inputs = dev.to_network(groups)
        control = np.array([0.0, float(vote)], np.float64)  # then each label's loss, if any
        heads = 0 if self.model.labels is None else self.model.heads

        def with_labels(control: np.ndarray) -> np.ndarray:
            parts = self.model.label_losses()
            return control if parts is None else np.concatenate([control[:2], parts])
        # [start, end, waited at start, waited at end] of the embedding backward + update
        update = [0.0, 0.0, 0.0, 0.0]
        if self.comm.size == 1:
            loss, grads = self.model.train_step(batch.dense, inputs, batch.label,
                                                grads_as_tensors=dev.on_gpu)
            if dev.on_gpu:
                grads = dev.from_network(grads)
            update[0], update[2] = time.perf_counter(), traffic.blocking_seconds()
            self.embedding.backward_update(grads, step)
            self.voted = vote
            self.label_losses = self.model.label_losses()
            update[1], update[3] = time.perf_counter(), traffic.blocking_seconds()
        elif self._fused_dense():
            # one exchange for the step's backward: the embedding gradients, the dense ones,
            # the replicas' row sums, the loss and the stop vote (summed in rank order)
            summed: dict[str, list[np.ndarray]] = {}

            def backward(value: float, group_grads: list[np.ndarray],
                         dense_grads: list[np.ndarray]) -> list[np.ndarray]:
                update[0], update[2] = time.perf_counter(), traffic.blocking_seconds()
                control[0] = value
                if dev.on_gpu:  # host arrays here (several ranks exchange host buffers)
                    group_grads = [np.array(g) for g in group_grads]
                summed.update(self.embedding.backward_update(
                    group_grads, step, {"control": [with_labels(control)],
                                        "dense": dense_grads}))
                update[1], update[3] = time.perf_counter(), traffic.blocking_seconds()
                return summed["dense"]

            self.model.train_step(batch.dense, inputs, batch.label,
                                  global_batch_size=batch.global_rows, backward=backward)
            loss, self.voted = float(summed["control"][0][0]), bool(summed["control"][0][1] > 0)
            self.label_losses = summed["control"][0][2:] if heads else None
        else:
            loss, grads = self.model.train_step(
                batch.dense, inputs, batch.label, global_batch_size=batch.global_rows,
                allreduce_dense_grads=self.comm.allreduce_tensors, grads_as_tensors=dev.on_gpu)
            if dev.on_gpu:
                grads = dev.from_network(grads)
            update[0], update[2] = time.perf_counter(), traffic.blocking_seconds()
            # the loss and the stop vote ride the gradient exchange (no collective of their own)
            control[0] = loss
            summed = self.embedding.backward_update(grads, step,
                                                    {"control": [with_labels(control)]})
            loss, self.voted = float(summed["control"][0][0]), bool(summed["control"][0][1] > 0)
            self.label_losses = summed["control"][0][2:] if heads else None
            update[1], update[3] = time.perf_counter(), traffic.blocking_seconds()
        t3, w3 = time.perf_counter(), traffic.blocking_seconds()
        if times is not None:
            updating, update_wait = update[1] - update[0], update[3] - update[2]
            times["embedding_forward"] = (t1 - t0) - (w1 - waited)
            times["dense"] = (t3 - t1 - updating) - (w3 - w1 - update_wait)
            times["embedding_update"] = updating - update_wait
            times["communication"] = w3 - waited
            if self.comm.size > 1:
                times["hidden_communication"] = traffic.background_seconds() - hidden
            else:
                done, parts = (a - b for a, b in zip(self.embedding.lookahead_items,
                                                     looked_ahead, strict=True))
                if parts:
                    times["lookup_ahead_share"] = done / parts
        return float(loss)

    def _fused_dense(self) -> bool:
        """Whether the dense gradients ride the backward exchange (the same answer on every
        rank: two ranks, or a small dense network; else Horovod's grouped all-reduce)."""
        if self._dense_fused is None:
            from embtrain.embedding.sharding.exchange import fuse_sums

            nbytes = sum(int(np.prod(v.shape)) * 4 for v in self.model.trainable_variables)
            # float16's loss scaling decides after the all-reduce whether a step is skipped;
            # a model whose gradients cross on the host (JAX: the tensor all-reduces are
            # TensorFlow's) always rides the backward exchange
            self._dense_fused = getattr(self.model, "host_exchange", False) or (
                fuse_sums(self.comm.size, nbytes) and not self.model.loss_scaled)
        return self._dense_fused

    def predict(self, batch: Any) -> np.ndarray:
        """Click probabilities for this rank's rows of ``batch`` (collective)."""
        return self.model.predict(
            batch.dense, self.device.to_network(self.forward(batch, training=False)))


def build_trainer(recipe: Recipe, plan: Any, comm: Communicator | None = None,
                  seed: int | None = None, device: Device | None = None) -> Trainer:
    """This rank's embedding shards (as ``plan`` places them) and dense model for ``recipe``,
    on ``device`` (default: the recipe's ``train.device`` on this machine, see
    :func:`~embtrain.train.device.resolve_device`). One builder for every device: only the
    kernel backend (its array module) and the device's crossings to the network differ."""
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
    device = device or resolve_device(recipe, world_size=comm.size)
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
        backend=device.backend,
        stores=open_store,  # the tier kinds' row stores (embtrain.storage.kinds)
    )
    slots: list[FeatureSlot] = feature_slots(recipe, embedding.layout)
    num_dense = sum(len(f.columns) for f in recipe.dense_features)
    model = build_model(recipe.model, num_dense=num_dense, slots=slots, seed=seed,
                        labels=recipe.data.label_specs() if recipe.data.labels is not None else None,
                        label_names=[lab.name for lab in recipe.data.label_specs()],
                        precision=recipe.train.mixed_precision,
                        batch_size=recipe.data.batch_size)
    model.make_optimizer(recipe.optimizer.dense)
    # one CPU rank hands the pooled arrays over in the network's compute dtype (bfloat16 under
    # mixed_precision bf16): the same values its cast would make, half the bytes written
    embedding.set_output_dtype(model.group_dtype.name)
    return Trainer(embedding, model, comm, device)
