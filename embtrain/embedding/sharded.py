"""Embeddings model-parallel over ranks: the plan's shards, exchanged around an unchanged engine.

Over 700 lines because the fused backward exchange and the per-route wire codecs joined on
one day; moving the exchange's pack and unpack into ``embedding/sharding/`` is the next step.

Every rank builds one :class:`~embtrain.embedding.engine.EmbeddingEngine` over the shards
the plan gives it and runs it on the *global* batch of the features it serves. What each
sharding mode does is its strategy's (:mod:`embtrain.embedding.sharding`: ``data_parallel``,
``table``, ``column``, ``row``, one module each); this module composes them into one step:

* Forward: each rank sends its samples' ids to the owners (one ``alltoallv`` for every
  table; each route's part is its strategy's ``outbound``), the owners pool the global
  batch, and the pooled vectors of each rank's samples come back by a second ``alltoallv``
  (each block placed by its strategy). Features whose owners pool partial sums (row
  sharding) are combined here: summed, then scaled for ``mean`` and ``sqrtn``.
* Backward: the gradient columns go back to the owners the same way (a third
  ``alltoallv``; each block cut by its strategy), and each owner applies the fused optimizer
  on the global batch. The same exchange carries what the step sums over ranks (the loss
  and stop vote, the dense gradients, the replicas' row sums; :func:`fuse_sums`), summed in
  rank order on every rank.
* Data-parallel tables are replicas pooled locally on every rank's own samples and updated
  from row sums summed over ranks
  (:class:`~embtrain.embedding.sharding.data_parallel.DataParallelTables`).
* The pipeline stage (:meth:`ShardedEmbedding.prefetch`): the next batch's id exchange runs
  on a communication thread while the current step computes
  (:mod:`~embtrain.embedding.sharding.pipeline`); a rank's own samples never go through a
  message (without quantization).
* State: tables are exported and imported whole with global keys (the strategies select,
  cut and merge shards), so checkpoints do not depend on the world size.

The dense network sees the layout a one-process engine would have (:func:`fused_layout`), so
its weights do not depend on the world size. With one rank everything is local: the engine is
called directly, without copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from embtrain.comm.base import Communicator, LocalComm, gather_to_root
from embtrain.comm.wire import (
    Codec,
    Cursor,
    MessageBuffer,
    Quantize,
    decode_vectors,
    encode_vectors,
    exchange_codec,
    packed_size,
)
from embtrain.embedding.config import (
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.engine import (
    EmbeddingEngine,
    KeyOutOfRangeError,
    TableState,
    fused_layout,
)
from embtrain.embedding.optimizers import slot_specs
from embtrain.embedding.sharding import strategy
from embtrain.embedding.sharding.base import (
    Pending,
    Route,
    Samples,
    TablePlacement,
    bag_scales,
)
from embtrain.embedding.sharding.data_parallel import DataParallelTables
from embtrain.embedding.sharding.metrics import summed_dynamic_metrics, summed_tier_metrics
from embtrain.embedding.sharding.pipeline import Ahead, Background
from embtrain.embedding.sharding.state import key_ranges, pack_state, unpack_state
from embtrain.embedding.tiers import StoreOpener


def placements_from_plan(plan: Any) -> dict[str, TablePlacement]:
    """Each table's :class:`TablePlacement` from a :class:`~embtrain.plan.Plan`."""
    out = {}
    for t in plan.tables:
        shards = [s for s in t.shards if s.rows > 0 and s.col_stop > s.col_start]
        out[t.name] = TablePlacement(
            mode=t.sharding,
            owners=tuple(s.rank for s in shards),
            rows={s.rank: s.rows for s in shards},
            columns={s.rank: (s.col_start, s.col_stop) for s in shards},
        )
    return out


#: sums over ranks (the data-parallel replicas' row sums, the dense gradients) ride the
#: backward exchange instead of an all-reduce of their own with two ranks, where an all-to-all
#: moves the same bytes as a ring all-reduce, or when they are at most this many bytes
#: (latency-bound): every rank sends them whole to every other one
FUSED_BYTES = 1 << 16


def fuse_sums(world: int, nbytes: int) -> bool:
    """Whether ``nbytes`` summed over ``world`` ranks ride the backward exchange."""
    return world == 2 or nbytes <= FUSED_BYTES


def _bounds(rank: int, world: int, size: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a global batch of ``size`` rows held by ``rank`` (the reader's rule)."""
    return rank * size // world, (rank + 1) * size // world


class ShardedEmbedding:
    """The embedding tables of one job, sharded over the ranks of ``comm`` as ``placements`` says.

    ``tables`` and ``features`` describe the full model (as for one process); ``forward`` takes
    this rank's slice of a global batch and returns the group arrays of the one-process layout
    (:attr:`layout`); ``backward_update`` takes their gradients. Tables are exported and
    imported whole (global keys), so checkpoints do not depend on the world size.
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
        pipeline: bool = True,
        mixed_precision: str = "none",
    ):
        self.comm: Communicator = comm or LocalComm()
        self.rank, self.world = self.comm.rank, self.comm.size
        self.optimizer = optimizer
        self.seed = int(seed)
        self.quantize: Quantize = quantize
        #: exchange the next batch's ids on a communication thread (see :meth:`prefetch`)
        self.pipeline = bool(pipeline)
        self._tables = {t.name: t for t in tables}
        self._features = tuple(features)
        self._slot_specs = slot_specs(optimizer)
        self.layout, self.group_widths = fused_layout(tables, features)
        self._outputs: dict[tuple[int, str], list[np.ndarray]] = {}
        self._output_dtype = "float32"  # one rank's pooled arrays (set_output_dtype)
        self.dp: DataParallelTables | None = None
        if self.world == 1:
            self.placements = {
                t.name: TablePlacement("table", (0,), {0: t.rows}, {0: (0, t.dim)}) for t in tables
            }
            self.engine = EmbeddingEngine(tables, features, optimizer, seed, backend, stores)
            self._routes: list[Route] = []
            return
        if placements is None:
            raise ValueError("several ranks need the plan's placements")
        missing = set(self._tables) - set(placements)
        if missing:
            raise ValueError(f"no placement for tables {sorted(missing)}")
        self.placements = dict(placements)
        self._strategies = {name: strategy(p.mode) for name, p in self.placements.items()}
        self._check_supported()
        self._routes = self._make_routes()
        # each route's wire format: pooled vectors (forward) and gradients (backward)
        self._codecs: dict[bool, list[Codec]] = {
            grad: [exchange_codec(self._tables[r.table].dtype, quantize, grad,
                                  r.strategy.partial_sums(r), mixed_precision)
                   for r in self._routes]
            for grad in (False, True)}
        self._buffers = {p: MessageBuffer() for p in ("ids", "ids.ahead", "forward", "backward")}
        self._grads: dict[int, list[np.ndarray]] = {}
        self._results: dict[int, list[np.ndarray]] = {}
        local_tables, local_features = self._local_configs()
        self.engine = EmbeddingEngine(local_tables, local_features, optimizer, seed, backend,
                                     stores)
        dp_tables = [t for t in tables if not self._strategies[t.name].exchanged]
        if dp_tables:
            names = {t.name for t in dp_tables}
            self.dp = DataParallelTables(dp_tables, [f for f in features if f.table in names],
                                         optimizer, seed, backend)
        self._fuse_dp = self.dp is not None and fuse_sums(self.world, self.dp.sums_size * 4)
        self._pending: Pending | None = None

    # ------------------------------------------------------------------ structure

    @property
    def reads_ahead(self) -> bool:
        """Whether a step should hand the next training batch to :meth:`prefetch`: tiered
        tables read its rows ahead; when :attr:`pipeline` is on, several ranks exchange its
        ids ahead and one rank looks its keys up in dynamic tables ahead."""
        tables = self._tables.values()
        if any(t.tier is not None for t in tables):
            return True
        return self.pipeline and (self.world > 1 or any(t.dynamic is not None for t in tables))

    @property
    def lookahead_items(self) -> tuple[int, int]:
        """The engine's look-aheads: chunks of keys looked up ahead, chunks in all
        (:attr:`EmbeddingEngine.lookahead_items`; one rank)."""
        return self.engine.lookahead_items

    @property
    def table_names(self) -> tuple[str, ...]:
        """Every table of the model, in the order given."""
        return tuple(self._tables)

    @property
    def slot_names(self) -> tuple[str, ...]:
        """The sparse optimizer's slot names."""
        return tuple(s.name for s in self._slot_specs)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Every feature of the model, in the order given."""
        return tuple(f.name for f in self._features)

    def table_config(self, name: str) -> TableConfig:
        """The configuration of the full table ``name``."""
        return self._tables[name]

    def _check_supported(self) -> None:
        for name, p in self.placements.items():
            if not p.owners:
                raise ValueError(f"table {name!r}: no rank holds it")
            self._strategies[name].check(name, self._tables[name], self.optimizer.kind,
                                         self._slot_specs)

    def _make_routes(self) -> list[Route]:
        routes = []
        for f in self._features:
            routes += self._strategies[f.table].routes(f, self._tables[f.table],
                                                       self.placements[f.table])
        return routes

    def _local_configs(self) -> tuple[list[TableConfig], list[FeatureConfig]]:
        tables = []
        for t in self._tables.values():
            p = self.placements[t.name]
            s = self._strategies[t.name]
            if s.exchanged and self.rank in p.owners:
                tables.append(s.local_table(t, p, self.rank, self.world))
        features: list[FeatureConfig] = []
        by_name = {f.name: f for f in self._features}
        for r in self._routes:
            if r.owner == self.rank:
                features.append(r.strategy.local_feature(r, by_name[r.feature]))
        return tables, features

    # ------------------------------------------------------------------ forward

    def new_outputs(self, batch: int) -> list[np.ndarray]:
        """Fresh group arrays ``[batch, width]`` of the one-process layout."""
        return [self.engine.backend.empty((batch, w), np.float32) for w in self.group_widths]

    def set_output_dtype(self, dtype: str) -> bool:
        """Hand one rank's pooled arrays to the network in ``dtype``, its compute dtype
        (``bfloat16``/``float16``: rounded to nearest as its cast on entry would, so the
        network gets the same values and the engine writes half the bytes; its bfloat16
        gradients are then read as they are), where this engine can
        (:meth:`EmbeddingEngine.output_dtypes`) and one rank trains; otherwise (several ranks
        exchange and the data-parallel replicas write float32) the arrays stay float32.
        Returns whether ``dtype`` is taken."""
        taken = dtype == "float32" or (self.world == 1 and dtype in self.engine.output_dtypes())
        self._output_dtype = dtype if taken else "float32"
        return taken

    def _engine_outputs(self, batch: int, dtype: str = "float32") -> list[np.ndarray]:
        outs = self._outputs.get((batch, dtype))
        if outs is None:
            if len(self._outputs) > 4:
                self._outputs.clear()
            outs = self._outputs[batch, dtype] = self.engine.new_outputs(batch, dtype)
        return outs

    def forward(self, inputs: Mapping[str, SparseInput], global_size: int | None = None,
                training: bool = True, step: int = -1, ahead: Ahead | None = None
                ) -> list[np.ndarray]:
        """Pooled embeddings of this rank's samples, one ``[batch, width]`` array per group.

        ``global_size``: rows of the global batch this rank's slice belongs to (default: the
        local batch times the world size). ``training``/``step``: as for
        :meth:`EmbeddingEngine.forward` (dynamic tables insert only in training). Collective:
        every rank calls it for the same step. ``ahead``: what :meth:`prefetch` returned for
        these ``inputs`` (their ids already exchanged).
        """
        if self.world == 1:
            first = next(iter(inputs.values()))
            return self.engine.forward(
                inputs, out=self._engine_outputs(first.batch_size, self._output_dtype),
                training=training, step=step)
        batch = next(iter(inputs.values())).batch_size if inputs else 0
        size = batch * self.world if global_size is None else int(global_size)
        sizes = [hi - lo for lo, hi in (_bounds(r, self.world, size) for r in range(self.world))]
        if sizes[self.rank] != batch:
            raise ValueError(f"rank {self.rank}: {batch} samples, expected {sizes[self.rank]} "
                             f"of a global batch of {size}")
        dp_inputs = ({f: inputs[f] for f in self.dp.engine.feature_names}
                     if self.dp is not None else {})
        if ahead is not None:  # keys checked and exchanged by prefetch()
            if ahead.size != size:
                raise ValueError(f"prefetched a global batch of {ahead.size} rows, "
                                 f"forward got {size}")
            pending, local_inputs = ahead.pending, ahead.inputs()
        else:
            self._check_keys(inputs)
            pending = Pending(sizes)
            local_inputs = self._exchange_ids(inputs, sizes, pending)
        outs = self.engine.forward(local_inputs, out=self._engine_outputs(size),
                                   training=training, step=step)
        result = self._results.get(batch)
        if result is None:
            if len(self._results) > 4:
                self._results.clear()
            result = self._results[batch] = self.new_outputs(batch)
        if self.dp is not None:
            self.dp.forward_into(dp_inputs, batch, self.layout, result)
        self._exchange_pooled(outs, sizes, inputs, pending, result)
        self._pending = pending
        return result

    def prefetch(self, inputs: Mapping[str, SparseInput], global_size: int | None = None
                 ) -> Ahead | None:
        """The pipeline stage for the next batch (this rank's ``inputs``, of a global batch of
        ``global_size`` rows); pass what it returns as ``ahead`` to that batch's forward.

        One rank: tiered tables start reading the rows it will miss, dynamic tables look its
        keys up (:meth:`EmbeddingEngine.prefetch`). Several ranks
        (collective: every rank calls it for the same batch): its keys are checked now and
        its ids exchanged; with tiered tables in the caller's thread, and each owner reads
        ahead for its shards; otherwise, when :attr:`pipeline` is on, on a communication
        thread (:mod:`~embtrain.embedding.sharding.pipeline`) while the caller goes on with
        the current step's dense part. Only ids move ahead: the owners' lookups stay after
        the current step's update, so the result is the unpipelined one bit for bit.
        """
        if self.world == 1:
            self.engine.prefetch(inputs, look_ahead=self.pipeline)
            return None
        tiered = any(t.tier is not None for t in self._tables.values())
        if not tiered and not self.pipeline:
            return None
        batch = next(iter(inputs.values())).batch_size if inputs else 0
        size = batch * self.world if global_size is None else int(global_size)
        sizes = [hi - lo for lo, hi in (_bounds(r, self.world, size) for r in range(self.world))]
        self._check_keys(inputs)
        pending = Pending(sizes)
        if tiered:
            local = self._exchange_ids(inputs, sizes, pending)
            self.engine.prefetch(local)
            return Ahead(size, pending, local)
        job = Background(lambda: self._exchange_ids(inputs, sizes, pending, "ids.ahead"))
        return Ahead(size, pending, None, job)

    def _check_keys(self, inputs: Mapping[str, SparseInput]) -> None:
        for f in self._features:
            if self._tables[f.table].dynamic is not None:
                continue
            keys = np.asarray(inputs[f.name].keys)
            if keys.size:
                rows = self._tables[f.table].rows
                lo, hi = int(keys.min()), int(keys.max())
                if lo < 0 or hi >= rows:
                    raise KeyOutOfRangeError(f.name, lo if lo < 0 else hi, f.table, rows)

    def _exchange_ids(self, inputs: Mapping[str, SparseInput], sizes: list[int],
                      pending: Pending, purpose: str = "ids") -> dict[str, SparseInput]:
        """Send this rank's ids to their owners; the owner's local inputs of the global batch
        (``purpose``: ``ids``, or ``ids.ahead`` on the pipeline's thread, a buffer of its own)."""
        samples = Samples()
        dynamic = {name: t.dynamic is not None for name, t in self._tables.items()}
        per_dest: list[list[np.ndarray]] = []
        for dest in range(self.world):
            header: list[int] = []
            arrays: list[np.ndarray] = []
            for i, r in enumerate(self._routes):
                if r.owner != dest:
                    continue
                h, a, present = r.strategy.outbound(r, inputs[r.feature], samples, self.world,
                                                    dynamic[r.table])
                header += h
                arrays += a
                if present is not None:
                    pending.sent_present[i] = present
            per_dest.append([np.asarray(header, dtype=np.int64), *arrays])
        send, counts = self._buffers[purpose].pack(per_dest)
        got, received = self.comm.alltoallv(send, counts, purpose)
        return self._inbound_ids(got, received, sizes, pending)

    def _inbound_ids(self, got: np.ndarray, received: np.ndarray, sizes: list[int],
                     pending: Pending) -> dict[str, SparseInput]:
        mine = [(i, r) for i, r in enumerate(self._routes) if r.owner == self.rank]
        keys: dict[str, list[np.ndarray]] = {r.local: [] for _, r in mine}
        lengths: dict[str, list[np.ndarray]] = {r.local: [] for _, r in mine}
        weights: dict[str, list[np.ndarray | None]] = {r.local: [] for _, r in mine}
        bags: dict[str, set[int]] = {r.local: set() for _, r in mine}
        at = 0
        for src in range(self.world):
            cur = Cursor(got, at)
            header = cur.take(np.int64, 3 * len(mine)).reshape(-1, 3)
            for (i, r), (nnz, has_w, bag) in zip(mine, header.tolist(), strict=True):
                if bag > 0:
                    lengths[r.local].append(np.full(sizes[src], bag, dtype=np.int64))
                else:
                    lens = cur.take(np.int32, sizes[src])
                    lengths[r.local].append(lens)
                    r.strategy.received(pending, i, src, lens)
                keys[r.local].append(cur.take(np.int64, nnz))
                weights[r.local].append(cur.take(np.float32, nnz) if has_w else None)
                bags[r.local].add(bag)
            at += int(received[src])
        out = {}
        for name in keys:
            k = np.concatenate(keys[name])
            lens = np.concatenate(lengths[name]).astype(np.int64)
            offsets = np.zeros(lens.shape[0] + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            ws = weights[name]
            w = None
            if any(x is not None for x in ws):
                w = np.concatenate([x if x is not None else np.ones(len(kk), np.float32)
                                    for x, kk in zip(ws, keys[name], strict=True)])
            bag = bags[name].pop() if len(bags[name]) == 1 else 0
            out[name] = SparseInput(k, offsets, w, bag_size=max(bag, 0))
        return out

    def _exchange_pooled(self, outs: list[np.ndarray], sizes: list[int],
                         inputs: Mapping[str, SparseInput], pending: Pending,
                         result: list[np.ndarray]) -> None:
        q = self._codecs[False]
        mine = [(i, r) for i, r in enumerate(self._routes) if r.owner == self.rank]
        per_dest: list[list[np.ndarray]] = []
        starts = np.concatenate(([0], np.cumsum(sizes)))
        for dest in range(self.world):
            lo, hi = int(starts[dest]), int(starts[dest + 1])
            arrays: list[np.ndarray] = []
            for i, r in mine:
                if q[i] == "none" and dest == self.rank:
                    continue  # read straight from the pooled arrays below
                g, c, w = self.engine.layout[r.local]
                block = outs[g][lo:hi, c:c + w]
                present = pending.recv_present.get((i, dest))
                if present is not None:
                    block = block[present]
                arrays += encode_vectors(block, q[i])
            per_dest.append(arrays)
        send, counts = self._buffers["forward"].pack(per_dest)
        got, received = self.comm.alltoallv(send, counts, "forward")
        batch = sizes[self.rank]
        row_sums: dict[str, np.ndarray] = {}
        at = 0
        for src in range(self.world):
            cur = Cursor(got, at)
            for i, r in enumerate(self._routes):
                if r.owner != src:
                    continue
                present = pending.sent_present.get(i)
                # this rank's own samples skip the message where it travels in float32
                if q[i] == "none" and src == self.rank:  # straight from the pooled arrays
                    g, c, w = self.engine.layout[r.local]
                    lo = int(starts[src])
                    block = outs[g][lo:lo + batch, c:c + w]
                    kept = pending.recv_present.get((i, src))
                    block = block if kept is None else block[kept]
                else:
                    rows = batch if present is None else int(present.sum())
                    block = decode_vectors(cur, rows, r.width, q[i])
                r.strategy.place(result, self.layout[r.feature], r, block,
                                 self._tables[r.table].dim, row_sums, present)
            at += int(received[src])
        for f in self._features:
            if f.name in row_sums:
                G, C, W = self.layout[f.name]
                pooled = row_sums[f.name]
                if f.combiner in ("mean", "sqrtn"):
                    scale = bag_scales(f.combiner, inputs[f.name])
                    pending.scales[f.name] = scale
                    pooled *= scale[:, None]
                result[G][:, C:C + W] = pooled

    # ------------------------------------------------------------------ backward

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
        sums = {k: [np.ascontiguousarray(a) for a in v] for k, v in (sums or {}).items()}
        if self.world == 1:
            self.engine.backward_update(grads, step)
            return {k: [a.copy() for a in v] for k, v in sums.items()}
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("backward_update needs a forward first (each forward is used once)")
        q = self._codecs[True]
        sizes = pending.sizes
        batch = sizes[self.rank]
        if self.dp is not None and self._fuse_dp:
            sums["dp"] = [self.dp.local_sums(grads, batch, self.layout)]
        shared = [a for v in sums.values() for a in v]  # 8-byte padded each: read in place
        per_dest: list[list[Any]] = []
        for dest in range(self.world):
            arrays: list[Any] = [] if dest == self.rank else list(shared)
            for i, r in enumerate(self._routes):
                # this rank's own gradient blocks skip the message where they travel in float32
                if r.owner == dest and not (q[i] == "none" and dest == self.rank):
                    block = self._grad_block(grads, r, pending, batch)
                    present = pending.sent_present.get(i)
                    arrays += encode_vectors(block if present is None else block[present], q[i])
            per_dest.append(arrays)
        send, counts = self._buffers["backward"].pack(per_dest)
        others = self.world - 1
        parts = {k: packed_size(v) * others for k, v in sums.items()}
        if "dp" in sums:  # the plan counts the row sums' bytes; padding is overhead
            parts["control"] = parts.get("control", 0) + parts["dp"] - sums["dp"][0].nbytes * others
            parts["dp"] = sums["dp"][0].nbytes * others
        got, received = self.comm.alltoallv(send, counts, "backward", parts)
        total = sum(sizes)
        local = self._grad_buffers(total)
        starts = np.concatenate(([0], np.cumsum(sizes)))
        mine = [(i, r) for i, r in enumerate(self._routes) if r.owner == self.rank]
        # summed in rank order, starting from rank 0's part: the same bits on every rank
        summed = [np.empty_like(a) for a in shared]
        at = 0
        for src in range(self.world):
            cur = Cursor(got, at)
            for k, a in enumerate(shared):
                part = a if src == self.rank else cur.take(a.dtype, a.size).reshape(a.shape)
                if src == 0:
                    summed[k][...] = part
                else:
                    summed[k] += part
            lo, hi = int(starts[src]), int(starts[src + 1])
            for i, r in mine:
                g, c, w = self.engine.layout[r.local]
                present = pending.recv_present.get((i, src))
                if q[i] == "none" and src == self.rank:
                    block = self._grad_block(grads, r, pending, batch)
                    sent = pending.sent_present.get(i)
                    block = block if sent is None else block[sent]
                else:
                    block = decode_vectors(cur, (hi - lo) if present is None
                                           else int(present.sum()), r.width, q[i])
                if present is None:
                    local[g][lo:hi, c:c + w] = block
                else:
                    rows = local[g][lo:hi, c:c + w]
                    rows[:] = 0.0  # samples without a key here: never read by the engine
                    rows[present] = block
            at += int(received[src])
        self.engine.backward_update(local, step)
        out: dict[str, list[np.ndarray]] = {}
        at = 0
        for k, v in sums.items():
            out[k], at = summed[at:at + len(v)], at + len(v)
        if self.dp is not None:
            if "dp" in out:
                self.dp.apply_sums(out.pop("dp")[0], step)
            else:
                self.dp.backward_from(grads, batch, self.layout, step, self.comm)
        return out

    def _grad_buffers(self, total: int) -> list[np.ndarray]:
        """The owner's ``[global batch, width]`` gradient arrays, reused across steps."""
        bufs = self._grads.get(total)
        if bufs is None:
            if len(self._grads) > 4:
                self._grads.clear()
            bufs = self._grads[total] = self.engine.new_outputs(total)
        return bufs

    def _grad_block(self, grads: Sequence[np.ndarray], r: Route, pending: Pending,
                    batch: int) -> np.ndarray:
        G, C, W = self.layout[r.feature]
        g = np.asarray(grads[G], dtype=np.float32)[:, C:C + W]
        return r.strategy.grad_block(g, r, pending, batch, self._tables[r.table].dim)

    # ------------------------------------------------------------------ state

    def dynamic_metrics(self) -> dict[str, dict[str, float]]:
        """Per dynamic table of the whole model: rows, capacity, inserts, evictions, expired,
        pending admissions and load factor, summed over its row shards (collective with
        several ranks)."""
        names = [t.name for t in self._tables.values() if t.dynamic is not None]
        if not names:
            return {}
        if self.world == 1:
            return self.engine.dynamic_metrics()
        return summed_dynamic_metrics(self.comm, self.engine, names, self._tables,
                                      self.placements)

    def tier_metrics(self) -> dict[str, dict[str, float]]:
        """Per tiered table: cache rows, lookups, misses, hit rate, evictions and the store's
        reads and writes, summed over its shards (collective with several ranks)."""
        names = [t.name for t in self._tables.values() if t.tier is not None]
        if not names:
            return {}
        if self.world == 1:
            return self.engine.tier_metrics()
        return summed_tier_metrics(self.comm, self.engine, names)

    def _holder(self, name: str) -> EmbeddingEngine:
        if self.dp is not None and not self._strategies[name].exchanged:
            return self.dp.engine
        return self.engine

    def export_table(self, name: str) -> TableState | None:
        """The whole table ``name`` with global keys on rank 0 (None on other ranks).

        Collective with several ranks: every rank calls it for the same table.
        """
        if self.world == 1:
            return self.engine.export_table(name)
        if self._on_root(name):
            return self._holder(name).export_table(name) if self.rank == 0 else None
        payload = b""
        if self.rank in self.placements[name].owners:
            payload = pack_state(self.engine.export_table(name), self.slot_names)
        got = gather_to_root(self.comm, payload)
        if got is None:
            return None
        return self._merge(name, got)

    def _merge(self, name: str, got: list[bytes]) -> TableState:
        """One table (or key range) with global keys from its owners' packed states: row
        shards merged by key, column shards side by side."""
        p = self.placements[name]
        states = {o: unpack_state(got[o], p.columns[o][1] - p.columns[o][0], self._slot_specs)
                  for o in p.owners}
        return self._strategies[name].merge(states, p, self.world,
                                            self._tables[name].dynamic is not None,
                                            self.slot_names)

    def _on_root(self, name: str) -> bool:
        """Whether table ``name`` is whole on rank 0 (a replica, or one owner there)."""
        return not self._strategies[name].exchanged or self.placements[name].owners == (0,)

    def streams(self, name: str) -> bool:
        """Whether table ``name`` is exported and imported in chunks (a tiered table); the
        same answer on every rank."""
        if self.world == 1:
            return self.engine.streams(name)
        return self._tables[name].tier is not None

    def table_stream(self, name: str, rows: int) -> tuple[int, Iterator[TableState | None]]:
        """Table ``name`` as ``(total rows, key-ordered chunks)`` with global keys, never whole
        on any rank: rank 0 gets the chunks, the other ranks ``None`` for each.

        Collective with several ranks: every rank calls it for the same table and iterates
        the chunks to the end. Chunks are global key ranges cut the same way on every rank
        (a static table's ``rows`` keys at a time; a dynamic table's from a sample of every
        shard's sorted keys, one allgather, at most about ``rows`` keys each); each owner
        exports its part of a range (:meth:`EmbeddingEngine.export_range`), rank 0 gathers
        and merges it as :meth:`export_table` does. A dynamic table's admission state comes
        in the first chunk.
        """
        if self.world == 1:
            return self.engine.export_rows(name), self.engine.export_chunks(name, rows)
        if self._on_root(name):
            if self.rank != 0:
                return 0, iter(())
            holder = self._holder(name)
            return holder.export_rows(name), holder.export_chunks(name, rows)
        bounds, total = key_ranges(self.comm, self.engine, name, self._tables[name],
                                   self.placements[name], max(1, int(rows)))
        return total, self._range_chunks(name, bounds)

    def _range_chunks(self, name: str, bounds: list[int]) -> Iterator[TableState | None]:
        p = self.placements[name]
        t = self._tables[name]
        for i in range(len(bounds) - 1):
            a, b = bounds[i], bounds[i + 1]
            payload = b""
            if self.rank in p.owners:
                part = self._strategies[name].export_range(self.engine, name, a, b, self.rank,
                                                           self.world, t.dynamic is not None)
                part.extra = self.engine.export_extra(name) if i == 0 else {}
                payload = pack_state(part, self.slot_names)
            got = gather_to_root(self.comm, payload)
            yield None if got is None else self._merge(name, got)

    def import_table(self, name: str, state: Any) -> None:
        """Overwrite table ``name`` from a whole-table state with global keys (every rank
        passes the same state and keeps its own shard of it)."""
        if self.world == 1:
            self.engine.import_table(name, state)
            return
        p = self.placements[name]
        if self.rank not in p.owners:
            return
        keys = np.asarray(state.keys, dtype=np.int64).reshape(-1)
        rows = self._tables[name].rows
        dynamic = self._tables[name].dynamic is not None
        if not dynamic and keys.size and (keys.min() < 0 or keys.max() >= rows):
            raise KeyOutOfRangeError(name, int(keys.min() if keys.min() < 0 else keys.max()),
                                     name, rows)
        values = np.asarray(state.values)
        dim = self._tables[name].dim
        if values.shape != (keys.size, dim):
            raise ValueError(f"table {name!r}: values shape {values.shape} != ({keys.size}, {dim})")
        s = self._strategies[name]
        if not s.exchanged:
            self._holder(name).import_table(name, state)
            return
        extra = dict(getattr(state, "extra", None) or {})
        sel, local_keys, extra = s.select(keys, extra, self.rank, self.world, dynamic)
        columns = p.columns[self.rank]

        def cut(arr: Any, per_dim: bool) -> np.ndarray:
            return s.cut(np.asarray(arr)[sel], per_dim, columns)

        slots = {}
        for spec in self._slot_specs:
            if spec.name in state.slots:
                slots[spec.name] = cut(state.slots[spec.name], not spec.per_row)
        for extra in set(state.slots) - {s.name for s in self._slot_specs}:
            slots[extra] = np.asarray(state.slots[extra])
        self.engine.import_table(name, TableState(
            keys=local_keys,
            values=cut(values, True),
            slots=slots,
            update_count=None if state.update_count is None else cut(state.update_count, False),
            last_step=None if state.last_step is None else cut(state.last_step, False),
            extra=extra,
        ))


__all__ = [
    "ShardedEmbedding",
    "TablePlacement",
    "placements_from_plan",
]
