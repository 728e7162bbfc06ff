"""``data_parallel`` sharding: a replica of the table on every rank (static tables only).

No ids or pooled vectors travel: each rank pools its own samples in an engine of its own
(:class:`DataParallelTables`). The backward sums each row's gradient over the local samples
with the engine's fused kernel (:meth:`EmbeddingEngine.backward_row_sums`), all-reduces the
dense ``[rows, dim + 1]`` sums and touch counts, and applies the optimizer to every row some
rank touched through a one-key-per-bag batch (keys → rows only: no pooling pass), so every
replica stays identical. Traffic:
:class:`embtrain.plan.shardings.DataParallelModel`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from embtrain.comm.base import Communicator
from embtrain.embedding.config import (
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.engine import EmbeddingEngine
from embtrain.embedding.optimizers import SlotSpec
from embtrain.embedding.sharding.base import Route, ShardingStrategy, TablePlacement
from embtrain.plan.shardings import MODELS


class DataParallelSharding(ShardingStrategy):
    """Replicas, outside the exchanged engine."""

    name = "data_parallel"
    model = MODELS["data_parallel"]
    exchanged = False

    def check(self, name: str, table: TableConfig, optimizer: str,
              slots: Sequence[SlotSpec]) -> None:
        if table.dynamic is not None:
            raise ValueError(f"table {name!r}: a dynamic table cannot be data-parallel "
                             "(replicas would admit and evict apart); use table or row")

    def routes(self, feature: FeatureConfig, table: TableConfig,
               placement: TablePlacement) -> list[Route]:
        return []


class DataParallelTables:
    """The data-parallel tables of a rank: replicas, pooled on the rank's own samples."""

    def __init__(self, tables: list[TableConfig], features: list[FeatureConfig],
                 optimizer: SparseOptimizerConfig, seed: int, backend: str):
        self.tables = tables
        self.engine = EmbeddingEngine(tables, features, optimizer, seed, backend)
        self.first = {t.name: next((f.name for f in features if f.table == t.name), None)
                      for t in tables}
        self._outputs: dict[int, list[np.ndarray]] = {}
        self._own: dict[int, list[np.ndarray]] = {}

    def forward(self, inputs: Mapping[str, SparseInput], batch: int) -> list[np.ndarray]:
        outs = self._outputs.get(batch)
        if outs is None:
            if len(self._outputs) > 4:
                self._outputs.clear()
            outs = self._outputs[batch] = self.engine.new_outputs(batch)
        return self.engine.forward(inputs, out=outs)

    def forward_into(self, inputs: Mapping[str, SparseInput], batch: int,
                     layout: Mapping[str, tuple[int, int, int]],
                     result: list[np.ndarray]) -> None:
        """Pool this rank's samples into their columns of the one-process ``result``."""
        outs = self.forward(inputs, batch)
        for f in self.engine.feature_names:
            g, c, w = self.engine.layout[f]
            G, C, W = layout[f]
            result[G][:, C:C + W] = outs[g][:, c:c + w]

    def backward_from(self, grads: Sequence[np.ndarray], batch: int,
                      layout: Mapping[str, tuple[int, int, int]], step: int,
                      comm: Communicator) -> None:
        """Apply the replicas' columns of the one-process gradient ``grads`` (collective: one
        all-reduce of the row sums)."""
        local = self.local_sums(grads, batch, layout)
        self.apply_sums(comm.allreduce_sum(local, "dp"), step)

    def local_sums(self, grads: Sequence[np.ndarray], batch: int,
                   layout: Mapping[str, tuple[int, int, int]]) -> np.ndarray:
        """This rank's ``[rows, dim + 1]`` row sums (gradient sums and touch counts) of every
        replica, flat float32 in table order: what the ranks sum (:meth:`apply_sums`)."""
        own = self._own.get(batch)
        if own is None:  # reused across steps: a fresh multi-megabyte array costs page faults
            if len(self._own) > 4:
                self._own.clear()
            own = self._own[batch] = [np.empty((batch, g.width), np.float32)
                                      for g in self.engine.groups]
        for f in self.engine.feature_names:
            g, c, w = self.engine.layout[f]
            G, C, W = layout[f]
            own[g][:, c:c + w] = np.asarray(grads[G])[:, C:C + W]
        self.engine.backward_row_sums(own)
        parts = [self.engine.take_row_sums(t.name) for t in self.tables]
        return np.concatenate([p.reshape(-1) for p in parts])

    @property
    def sums_size(self) -> int:
        """Elements of :meth:`local_sums`' vector."""
        return sum(t.rows * (t.dim + 1) for t in self.tables)

    def backward_update(self, grads: list[np.ndarray], step: int, comm: Communicator) -> None:
        self.engine.backward_row_sums(grads)
        parts = [self.engine.take_row_sums(t.name) for t in self.tables]
        total = comm.allreduce_sum(np.concatenate([p.reshape(-1) for p in parts]), "dp")
        self.apply_sums(total, step)

    def apply_sums(self, total: np.ndarray, step: int) -> None:
        """Apply the optimizer to every row some rank touched, from the row sums summed over
        the ranks (every replica gets the same update)."""
        at = 0
        touched: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for t in self.tables:
            block = total[at:at + t.rows * (t.dim + 1)].reshape(t.rows, t.dim + 1)
            at += t.rows * (t.dim + 1)
            rows = np.flatnonzero(block[:, t.dim] > 0)
            if rows.size and self.first[t.name] is not None:
                touched[t.name] = (rows, block[rows, :t.dim])
        if not touched:
            return
        n = max(r.size for r, _ in touched.values())
        empty = np.zeros(n + 1, dtype=np.int64)
        feed: dict[str, SparseInput] = {}
        for f in self.engine.feature_names:
            feed[f] = SparseInput(np.empty(0, np.int64), empty)
        for name, (rows, _) in touched.items():
            offsets = np.minimum(np.arange(n + 1, dtype=np.int64), rows.size)
            feed[self.first[name]] = SparseInput(rows.astype(np.int64), offsets)  # type: ignore[index]
        self.engine.forward(feed, pool=False)  # the rows to update; nothing to pool
        update = [np.zeros((n, g.width), np.float32) for g in self.engine.groups]
        for name, (rows, sums) in touched.items():
            g, c, _ = self.engine.layout[self.first[name]]  # type: ignore[index]
            update[g][:rows.size, c:c + sums.shape[1]] = sums
        self.engine.backward_update(update, step)


STRATEGY = DataParallelSharding()
traffic = STRATEGY.traffic

__all__ = ["STRATEGY", "DataParallelSharding", "DataParallelTables", "traffic"]
