"""Embeddings model-parallel over ranks: the plan's shards, exchanged around an unchanged engine.

Every rank builds one :class:`~embtrain.embedding.engine.EmbeddingEngine` over its shards
(:mod:`embtrain.embedding.sharding.shards`) and runs it on the *global* batch of the features
it serves. A step chains the id exchange, the engine's lookup, the pooled exchange, and back
the gradient exchange and the engine's update (:mod:`embtrain.embedding.sharding.exchange`;
each table's part of each is its mode's strategy's); data-parallel replicas pool this rank's
own samples (:class:`~embtrain.embedding.sharding.data_parallel.DataParallelTables`). The next
batch's ids may be exchanged ahead, on a communication thread (:meth:`stage_ids_in_background`).
Tables are exported and imported whole with global keys
(:class:`~embtrain.embedding.sharding.state.GlobalTables`), and the dense network sees the
one-process layout (:func:`fused_layout`): neither depends on the world size. One rank is a
communicator of size one, whose exchanges hand the engine's arrays on without a copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from embtrain.comm.base import Communicator, LocalComm
from embtrain.comm.wire import Quantize
from embtrain.embedding.catalog import ModelCatalog
from embtrain.embedding.config import (
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.engine import EmbeddingEngine, TableState, fused_layout
from embtrain.embedding.optimizers import slot_specs
from embtrain.embedding.sharding.base import (
    Pending,
    TablePlacement,
    placements_from_plan,
    whole_tables,
)
from embtrain.embedding.sharding.data_parallel import DataParallelTables
from embtrain.embedding.sharding.exchange import FUSED_BYTES, batch_rows, exchanges, fuse_sums
from embtrain.embedding.sharding.metrics import summed_dynamic_metrics, summed_tier_metrics
from embtrain.embedding.sharding.pipeline import Ahead, Background, settle
from embtrain.embedding.sharding.shards import local_shards
from embtrain.embedding.sharding.state import GlobalTables
from embtrain.embedding.tiers import StoreOpener


class ShardedEmbedding(ModelCatalog):
    """The embedding tables of one job, sharded over the ranks of ``comm`` as ``placements`` says.

    ``tables`` and ``features`` describe the full model (as for one process); ``forward`` takes
    this rank's slice of a global batch and returns the group arrays of the one-process layout
    (:attr:`layout`); ``backward_update`` takes their gradients. ``placements`` may be left
    out on one rank (every table whole there).
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        features: Sequence[FeatureConfig],
        optimizer: SparseOptimizerConfig,
        seed: int,
        placements: Mapping[str, TablePlacement] | None = None,
        comm: Communicator | None = None,
        quantize: Quantize = "none",
        backend: str = "cpu",
        stores: StoreOpener | None = None,
        mixed_precision: str = "none",
    ):
        self.comm: Communicator = comm or LocalComm()
        self.rank, self.world = self.comm.rank, self.comm.size
        self.optimizer = optimizer
        self.seed = int(seed)
        self.quantize: Quantize = quantize
        self._tables = {t.name: t for t in tables}
        self._features = tuple(features)
        self._slot_specs = slot_specs(optimizer)
        self.layout, self.group_widths = fused_layout(tables, features)
        self._outputs: dict[tuple[int, str], list[np.ndarray]] = {}
        self._output_dtype = "float32"  # the engine's pooled arrays (set_output_dtype)
        self.placements = dict(placements or whole_tables(tables, self.world))
        shards = local_shards(self._tables, self._features, self.placements, optimizer.kind,
                              self._slot_specs, self.rank, self.world)
        self._strategies = shards.strategies
        self.engine = EmbeddingEngine(shards.tables, shards.features, optimizer, seed, backend,
                                     stores)
        self.dp: DataParallelTables | None = None
        dp_tables = [t for t in tables if not self._strategies[t.name].exchanged]
        if dp_tables:
            names = {t.name for t in dp_tables}
            self.dp = DataParallelTables(dp_tables, [f for f in features if f.table in names],
                                         optimizer, seed, backend)
        self._fuse_dp = self.dp is not None and fuse_sums(self.world, self.dp.sums_size * 4)
        self.exchanges = exchanges(self.comm, shards.routes, self.engine, self._tables,
                                   self._features, self.layout, self.new_outputs, quantize,
                                   mixed_precision)
        self.states = GlobalTables(self.comm, self.engine, self.dp.engine if self.dp else None,
                                   self._tables, self.placements, self._strategies,
                                   self._slot_specs)
        self._pending: Pending | None = None
        self._staged: Ahead | None = None  # the next batch's exchange (stage_ids)

    # ------------------------------------------------------------------ structure

    @property
    def tiered(self) -> bool:
        """Whether any table has storage tiers (whose rows a step may read ahead)."""
        return any(t.tier is not None for t in self._tables.values())

    @property
    def dynamic(self) -> bool:
        """Whether any table is a hash table (whose keys a step may look up ahead)."""
        return any(t.dynamic is not None for t in self._tables.values())

    @property
    def ids_leave(self) -> bool:
        """Whether ids leave this process in the id exchange (worth a thread of their own)."""
        return bool(self.exchanges.ids.remote)

    @property
    def lookahead_items(self) -> tuple[int, int]:
        """The engine's look-aheads: chunks of keys looked up ahead, chunks in all
        (:attr:`EmbeddingEngine.lookahead_items`)."""
        return self.engine.lookahead_items

    # ------------------------------------------------------------------ the step

    def new_outputs(self, batch: int) -> list[np.ndarray]:
        """Fresh group arrays ``[batch, width]`` of the one-process layout."""
        return [self.engine.backend.empty((batch, w), np.float32) for w in self.group_widths]

    def set_output_dtype(self, dtype: str) -> bool:
        """Hand the pooled arrays to the network in ``dtype``, its compute dtype
        (``bfloat16``/``float16``: rounded to nearest as its cast on entry would, so the
        network gets the same values and the engine writes half the bytes; its bfloat16
        gradients are then read as they are), where this engine can
        (:meth:`EmbeddingEngine.output_dtypes`) and its arrays are handed on as they are (one
        rank); otherwise (exchanged and the replicas' arrays are float32) they stay float32.
        Returns whether ``dtype`` is taken."""
        taken = dtype == "float32" or (self.exchanges.pooled.hands_on
                                       and dtype in self.engine.output_dtypes())
        self._output_dtype = dtype if taken else "float32"
        return taken

    def _engine_outputs(self, batch: int) -> list[np.ndarray]:
        outs = self._outputs.get((batch, self._output_dtype))
        if outs is None:
            if len(self._outputs) > 4:
                self._outputs.clear()
            outs = self._outputs[batch, self._output_dtype] = self.engine.new_outputs(
                batch, self._output_dtype)
        return outs

    def forward(self, inputs: Mapping[str, SparseInput], global_size: int | None = None,
                training: bool = True, step: int = -1) -> list[np.ndarray]:
        """Pooled embeddings of this rank's samples, one ``[batch, width]`` array per group.

        ``global_size``: rows of the global batch this rank's slice belongs to (default: the
        local batch times the world size). ``training``/``step``: as for
        :meth:`EmbeddingEngine.forward` (dynamic tables insert only in training). Collective:
        every rank calls it for the same step. The ids of ``inputs`` staged by
        :meth:`stage_ids` or :meth:`stage_ids_in_background` (the same mapping) are taken up,
        already exchanged.
        """
        staged = self._staged
        if staged is not None and staged.sparse is inputs:  # checked and exchanged ahead
            self._staged = None
            pending, local = staged.pending, staged.inputs()
            size = batch_rows(inputs) * self.world if global_size is None else int(global_size)
            if sum(pending.sizes) != size:
                raise ValueError(f"staged a global batch of {sum(pending.sizes)} rows, "
                                 f"forward got {size}")
        else:
            pending = self.exchanges.ids.start(inputs, global_size)
            local = self.exchanges.ids(inputs, pending)
        outs = self.engine.forward(local, out=self._engine_outputs(sum(pending.sizes)),
                                   training=training, step=step)
        result = self.exchanges.pooled(outs, inputs, pending)
        if self.dp is not None:
            dp_inputs = {f: inputs[f] for f in self.dp.engine.feature_names}
            self.dp.forward_into(dp_inputs, batch_rows(inputs), self.layout, result)
        self._pending = pending
        return result

    def stage_ids(self, inputs: Mapping[str, SparseInput], global_size: int | None = None
                  ) -> Mapping[str, SparseInput]:
        """Exchange the ids of the next training batch (this rank's ``inputs``, of a global
        batch of ``global_size`` rows) now, for the forward of the same ``inputs``; returns
        this rank's share, what the engine's ``read_ahead``/``look_ahead`` take. Collective.
        Only ids move ahead of the current step's update: the result is the unstaged one bit
        for bit."""
        pending = self._start_staging(inputs, global_size)
        self._staged = Ahead(inputs, pending, local := self.exchanges.ids(inputs, pending))
        return local

    def stage_ids_in_background(self, inputs: Mapping[str, SparseInput],
                                global_size: int | None = None) -> None:
        """As :meth:`stage_ids`, the exchange on a communication thread
        (:mod:`~embtrain.embedding.sharding.pipeline`) that the forward waits for."""
        pending, ids = self._start_staging(inputs, global_size), self.exchanges.ids
        self._staged = Ahead(inputs, pending, None,
                             Background(lambda: ids(inputs, pending, "ids.ahead")))

    def _start_staging(self, inputs: Mapping[str, SparseInput], global_size: int | None
                       ) -> Pending:
        settle(self._staged)  # one exchange ahead at a time (its buffer is reused)
        self._staged = None
        return self.exchanges.ids.start(inputs, global_size)  # keys checked now

    def backward_update(self, grads: Sequence[np.ndarray], step: int,
                        sums: Mapping[str, Sequence[np.ndarray]] | None = None
                        ) -> dict[str, list[np.ndarray]]:
        """Apply d(loss)/d(group arrays) of the latest forward (collective).

        One exchange carries the whole step's backward traffic: the gradient blocks to their
        owners, the data-parallel replicas' row sums (with two ranks, or when they are small:
        :data:`FUSED_BYTES`; else one all-reduce of their own) and ``sums``: arrays by
        purpose (e.g. ``control``: the loss and the stop vote; ``dense``: the dense
        gradients) that every rank sends to every other one and that come back summed over
        the ranks in rank order, the same bits on every rank (returned by purpose).
        """
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("backward_update needs a forward first (each forward is used once)")
        own = {k: [np.ascontiguousarray(a) for a in v] for k, v in (sums or {}).items()}
        batch = pending.sizes[self.rank]
        if self.dp is not None and self._fuse_dp:
            own["dp"] = [self.dp.local_sums(grads, batch, self.layout)]
        local, out = self.exchanges.gradients(grads, pending, own)
        self.engine.backward_update(local, step)
        if self.dp is not None:
            if "dp" in out:
                self.dp.apply_sums(out.pop("dp")[0], step)
            else:
                self.dp.backward_from(grads, batch, self.layout, step, self.comm)
        return out

    # ------------------------------------------------------------------ state

    def dynamic_metrics(self) -> dict[str, dict[str, float]]:
        """Per dynamic table of the whole model: rows, capacity, inserts, evictions, expired,
        pending admissions and load factor, summed over its row shards (collective)."""
        names = [t.name for t in self._tables.values() if t.dynamic is not None]
        return summed_dynamic_metrics(self.comm, self.engine, names, self._tables,
                                      self.placements) if names else {}

    def tier_metrics(self) -> dict[str, dict[str, float]]:
        """Per tiered table: cache rows, lookups, misses, hit rate, evictions and the store's
        reads and writes, summed over its shards (collective)."""
        names = [t.name for t in self._tables.values() if t.tier is not None]
        return summed_tier_metrics(self.comm, self.engine, names) if names else {}

    def export_table(self, name: str) -> TableState | None:
        """The whole table ``name`` with global keys on rank 0, None on other ranks
        (collective: every rank calls it for the same table)."""
        return self.states.export_table(name)

    def streams(self, name: str) -> bool:
        """Whether table ``name`` is exported and imported in chunks (a tiered table); the
        same answer on every rank."""
        return self.states.streams(name)

    def table_stream(self, name: str, rows: int) -> tuple[int, Iterator[TableState | None]]:
        """Table ``name`` as ``(total rows, key-ordered chunks)`` with global keys, never whole
        on any rank (collective; :meth:`GlobalTables.table_stream`)."""
        return self.states.table_stream(name, rows)

    def import_table(self, name: str, state: Any) -> None:
        """Overwrite table ``name`` from a whole-table state with global keys (every rank
        passes the same state and keeps its own shard of it)."""
        self.states.import_table(name, state)


__all__ = [
    "FUSED_BYTES",
    "ShardedEmbedding",
    "TablePlacement",
    "fuse_sums",
    "placements_from_plan",
]
