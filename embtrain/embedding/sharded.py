"""Embeddings model-parallel over ranks: the plan's shards, exchanged around an unchanged engine.

Every rank builds one :class:`~embtrain.embedding.engine.EmbeddingEngine` over the shards
the plan gives it and runs it on the *global* batch of the features it serves:

* ``table``: the owner holds the whole table; ``column``: each owner holds a column range
  of every row; ``row``: owner ``r`` holds the keys ``k ≡ r (mod world size)`` as local rows
  ``k // world size`` (a dynamic table: the keys whose hash, :func:`shard_of_keys`, is ``r``,
  as they are, in its own hash table of capacity / world size rows); ``data_parallel``:
  every rank holds a replica (static tables only).
* Forward: each rank sends its samples' ids to the owners (one ``alltoallv``; a row-sharded
  feature's keys go to their owner only), the owners pool the global batch, and the pooled
  vectors of each rank's samples come back by a second ``alltoallv``. Row-sharded features
  are pooled as partial sums at each owner and combined (summed, then scaled for ``mean`` and
  ``sqrtn``) by the requester; a ``concat`` feature travels as one single-key bag per position.
* Backward: the gradient columns go back to the owners the same way (a third
  ``alltoallv``), and each owner applies the fused optimizer on the global batch.
* Data-parallel tables are pooled locally on every rank's own samples. Their gradients are
  summed per row locally (the engine's own fused gradient kernel, as SGD at learning rate 1
  on zeroed arrays: :meth:`EmbeddingEngine.backward_row_sums`), all-reduced as dense
  ``rows × dim`` arrays with a touched-row count, and applied by the fused optimizer to the
  rows any rank touched, identically on every replica.
* A row-sharded feature's partial sums and gradients travel only for the samples that have a
  key at that owner.

The dense network sees the layout a one-process engine would have (:func:`fused_layout`), so
its weights do not depend on the world size. With one rank everything is local: the engine is
called directly, without copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from embtrain.comm.base import Communicator, LocalComm, gather_to_root
from embtrain.comm.wire import (
    Cursor,
    MessageBuffer,
    Quantize,
    decode_vectors,
    encode_vectors,
    pack,
)
from embtrain.embedding.config import (
    FeatureConfig,
    ShardPlacement,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.dynamic import shard_of_keys
from embtrain.embedding.engine import (
    EmbeddingEngine,
    KeyOutOfRangeError,
    TableState,
    fused_layout,
)
from embtrain.embedding.optimizers import slot_specs
from embtrain.embedding.tiers import StoreOpener
from embtrain.plan.cost import cache_rows

MODES = ("data_parallel", "table", "column", "row")


@dataclass(frozen=True)
class TablePlacement:
    """Where one table lives: its sharding mode and, per owner rank, its rows and columns."""

    mode: str
    owners: tuple[int, ...]
    rows: Mapping[int, int]
    columns: Mapping[int, tuple[int, int]]

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown sharding {self.mode!r}; one of {MODES}")


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


@dataclass(frozen=True)
class _Route:
    """One feature's path to one owner of its table."""

    feature: str  # global feature name
    local: str  # the feature's name in the owner's engine
    table: str
    owner: int
    mode: str  # table, column or row
    position: int  # concat position of a row-sharded concat feature, else -1
    width: int  # columns of the block that travels, per sample
    cols: tuple[int, int]  # column range of the full dim (column mode)
    pieces: int  # hotness for concat, else 1


@dataclass
class _Pending:
    """What a forward leaves for its backward."""

    sizes: list[int]
    scales: dict[str, np.ndarray] = field(default_factory=dict)
    # row routes: which of this rank's samples have a key at the owner (route index → mask)
    sent_present: dict[int, np.ndarray] = field(default_factory=dict)
    # row routes this rank owns: which samples of each sender have a key here
    recv_present: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)


class _Ahead(NamedTuple):
    """The next batch's id exchange, done early by :meth:`ShardedEmbedding.prefetch` and
    handed to that batch's :meth:`ShardedEmbedding.forward`."""

    size: int
    pending: _Pending
    local: dict[str, SparseInput]


def _bounds(rank: int, world: int, size: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a global batch of ``size`` rows held by ``rank`` (the reader's rule)."""
    return rank * size // world, (rank + 1) * size // world


class _DataParallel:
    """The data-parallel tables of a rank: replicas, pooled on the rank's own samples.

    The backward sums each row's gradient over the local samples with the engine's fused
    kernel (:meth:`EmbeddingEngine.backward_row_sums`), all-reduces the dense
    ``[rows, dim + 1]`` sums and touch counts, and applies the optimizer to every row some rank
    touched through a one-key-per-bag batch, so every replica stays identical.
    """

    def __init__(self, tables: list[TableConfig], features: list[FeatureConfig],
                 optimizer: SparseOptimizerConfig, seed: int, backend: str):
        self.tables = tables
        self.engine = EmbeddingEngine(tables, features, optimizer, seed, backend)
        self.first = {t.name: next((f.name for f in features if f.table == t.name), None)
                      for t in tables}
        self._outputs: dict[int, list[np.ndarray]] = {}

    def forward(self, inputs: Mapping[str, SparseInput], batch: int) -> list[np.ndarray]:
        outs = self._outputs.get(batch)
        if outs is None:
            if len(self._outputs) > 4:
                self._outputs.clear()
            outs = self._outputs[batch] = self.engine.new_outputs(batch)
        return self.engine.forward(inputs, out=outs)

    def backward_update(self, grads: list[np.ndarray], step: int, comm: Communicator) -> None:
        self.engine.backward_row_sums(grads)
        parts = [self.engine.take_row_sums(t.name) for t in self.tables]
        total = comm.allreduce_sum(np.concatenate([p.reshape(-1) for p in parts]), "dp")
        at = 0
        touched: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for t in self.tables:
            block = total[at:at + t.rows * (t.dim + 1)].reshape(t.rows, t.dim + 1)
            at += t.rows * (t.dim + 1)
            rows = np.flatnonzero(block[:, t.dim] > 0)
            if rows.size and self.first[t.name] is not None:
                touched[t.name] = (rows, np.ascontiguousarray(block[rows, :t.dim]))
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
        self.engine.forward(feed)
        update = [np.zeros((n, g.width), np.float32) for g in self.engine.groups]
        for name, (rows, sums) in touched.items():
            g, c, _ = self.engine.layout[self.first[name]]  # type: ignore[index]
            update[g][:rows.size, c:c + sums.shape[1]] = sums
        self.engine.backward_update(update, step)


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
        self._outputs: dict[int, list[np.ndarray]] = {}
        self.dp: _DataParallel | None = None
        if self.world == 1:
            self.placements = {
                t.name: TablePlacement("table", (0,), {0: t.rows}, {0: (0, t.dim)}) for t in tables
            }
            self.engine = EmbeddingEngine(tables, features, optimizer, seed, backend, stores)
            self._routes: list[_Route] = []
            return
        if placements is None:
            raise ValueError("several ranks need the plan's placements")
        missing = set(self._tables) - set(placements)
        if missing:
            raise ValueError(f"no placement for tables {sorted(missing)}")
        self.placements = dict(placements)
        self._check_supported()
        self._routes = self._make_routes()
        self._buffers = {p: MessageBuffer() for p in ("ids", "forward", "backward")}
        self._grads: dict[int, list[np.ndarray]] = {}
        self._results: dict[int, list[np.ndarray]] = {}
        local_tables, local_features = self._local_configs()
        self.engine = EmbeddingEngine(local_tables, local_features, optimizer, seed, backend,
                                     stores)
        dp_tables = [t for t in tables if self.placements[t.name].mode == "data_parallel"]
        if dp_tables:
            names = {t.name for t in dp_tables}
            self.dp = _DataParallel(dp_tables, [f for f in features if f.table in names],
                                    optimizer, seed, backend)
        self._pending: _Pending | None = None

    # ------------------------------------------------------------------ structure

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
            if p.mode == "data_parallel" and self._tables[name].dynamic is not None:
                raise ValueError(f"table {name!r}: a dynamic table cannot be data-parallel "
                                 "(replicas would admit and evict apart); use table or row")
            if p.mode == "column" and any(s.per_row for s in self._slot_specs):
                raise ValueError(
                    f"table {name!r}: column sharding splits each row across ranks, but "
                    f"{self.optimizer.kind} keeps one accumulator per whole row; use table or row"
                )

    def _make_routes(self) -> list[_Route]:
        routes = []
        for f in self._features:
            t = self._tables[f.table]
            p = self.placements[f.table]
            pieces = int(f.hotness or 1) if f.combiner == "concat" else 1
            if p.mode == "data_parallel":
                continue
            if p.mode == "table":
                routes.append(_Route(f.name, f.name, t.name, p.owners[0], p.mode, -1,
                                     pieces * t.dim, (0, t.dim), pieces))
            elif p.mode == "column":
                for o in p.owners:
                    c0, c1 = p.columns[o]
                    routes.append(_Route(f.name, f.name, t.name, o, p.mode, -1,
                                         pieces * (c1 - c0), (c0, c1), pieces))
            else:  # row
                positions = range(pieces) if f.combiner == "concat" else [-1]
                for o in p.owners:
                    for pos in positions:
                        local = f.name if pos < 0 else f"{f.name}#{pos}"
                        routes.append(_Route(f.name, local, t.name, o, p.mode, pos, t.dim,
                                             (0, t.dim), pieces))
        return routes

    def _local_configs(self) -> tuple[list[TableConfig], list[FeatureConfig]]:
        tables = []
        for t in self._tables.values():
            p = self.placements[t.name]
            if p.mode == "data_parallel" or self.rank not in p.owners:
                continue
            c0, c1 = p.columns[self.rank]
            stride = self.world if p.mode == "row" else 1
            offset = self.rank if p.mode == "row" else 0
            tier = t.tier
            if tier is not None and t.dynamic is not None and tier.row_bytes and \
                    p.rows[self.rank] < t.rows:  # the shard's key directory costs less
                rows = cache_rows(tier.budget, tier.row_bytes, p.rows[self.rank], True)
                tier = replace(tier, cache_rows=min(rows, p.rows[self.rank]))
            tables.append(replace(t, rows=p.rows[self.rank], dim=c1 - c0, tier=tier,
                                  placement=ShardPlacement(offset, stride, c0, t.dim)))
        features: list[FeatureConfig] = []
        by_name = {f.name: f for f in self._features}
        for r in self._routes:
            if r.owner != self.rank:
                continue
            f = by_name[r.feature]
            if r.mode == "row":
                features.append(FeatureConfig(r.local, f.table, "sum", None))
            else:
                features.append(FeatureConfig(r.local, f.table, f.combiner, f.hotness))
        return tables, features

    # ------------------------------------------------------------------ forward

    def new_outputs(self, batch: int) -> list[np.ndarray]:
        """Fresh group arrays ``[batch, width]`` of the one-process layout."""
        return [self.engine.backend.empty((batch, w), np.float32) for w in self.group_widths]

    def _engine_outputs(self, batch: int) -> list[np.ndarray]:
        outs = self._outputs.get(batch)
        if outs is None:
            if len(self._outputs) > 4:
                self._outputs.clear()
            outs = self._outputs[batch] = self.engine.new_outputs(batch)
        return outs

    def forward(self, inputs: Mapping[str, SparseInput], global_size: int | None = None,
                training: bool = True, step: int = -1, ahead: _Ahead | None = None
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
            return self.engine.forward(inputs, out=self._engine_outputs(first.batch_size),
                                       training=training, step=step)
        batch = next(iter(inputs.values())).batch_size if inputs else 0
        size = batch * self.world if global_size is None else int(global_size)
        sizes = [hi - lo for lo, hi in (_bounds(r, self.world, size) for r in range(self.world))]
        if sizes[self.rank] != batch:
            raise ValueError(f"rank {self.rank}: {batch} samples, expected {sizes[self.rank]} "
                             f"of a global batch of {size}")
        self._check_keys(inputs)
        dp_inputs = ({f: inputs[f] for f in self.dp.engine.feature_names}
                     if self.dp is not None else {})
        if ahead is not None:
            if ahead.size != size:
                raise ValueError(f"prefetched a global batch of {ahead.size} rows, "
                                 f"forward got {size}")
            pending, local_inputs = ahead.pending, ahead.local  # exchanged by prefetch()
        else:
            pending = _Pending(sizes)
            local_inputs = self._exchange_ids(inputs, sizes, pending)
        outs = self.engine.forward(local_inputs, out=self._engine_outputs(size),
                                   training=training, step=step)
        result = self._results.get(batch)
        if result is None:
            if len(self._results) > 4:
                self._results.clear()
            result = self._results[batch] = self.new_outputs(batch)
        if self.dp is not None:
            dp_outs = self.dp.forward(dp_inputs, batch)
            for f in self.dp.engine.feature_names:
                g, c, w = self.dp.engine.layout[f]
                G, C, W = self.layout[f]
                result[G][:, C:C + W] = dp_outs[g][:, c:c + w]
        self._exchange_pooled(outs, sizes, inputs, pending, result)
        self._pending = pending
        return result

    def prefetch(self, inputs: Mapping[str, SparseInput], global_size: int | None = None
                 ) -> _Ahead | None:
        """Start reading what the next batch (this rank's ``inputs``, of a global batch of
        ``global_size`` rows) will miss in tiered tables' caches. With several ranks its ids
        are exchanged now (collective: every rank calls it for the same batch), each owner
        reads ahead for its shards, and the exchange is returned: pass it as ``ahead`` to the
        forward of that batch, which then skips its own."""
        if self.world == 1:
            self.engine.prefetch(inputs)
            return None
        if not any(t.tier is not None for t in self._tables.values()):
            return None
        batch = next(iter(inputs.values())).batch_size if inputs else 0
        size = batch * self.world if global_size is None else int(global_size)
        sizes = [hi - lo for lo, hi in (_bounds(r, self.world, size) for r in range(self.world))]
        self._check_keys(inputs)
        pending = _Pending(sizes)
        local = self._exchange_ids(inputs, sizes, pending)
        self.engine.prefetch(local)
        return _Ahead(size, pending, local)

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

    def _outbound(self, route: _Route, inp: SparseInput, sample_of: np.ndarray
                  ) -> tuple[list[int], list[np.ndarray], np.ndarray | None]:
        """Header ``[nnz, has_weights, bag_size]``, arrays and (row routes) the samples with a
        key at the owner, of one route from this rank."""
        keys = np.asarray(inp.keys, dtype=np.int64)
        weights = None if inp.weights is None else np.asarray(inp.weights, dtype=np.float32)
        if route.mode != "row":
            bag = int(inp.bag_size)
            arrays = [] if bag > 0 else [np.diff(np.asarray(inp.offsets, np.int64)).astype(np.int32)]
            arrays.append(keys)
            if weights is not None:
                arrays.append(weights)
            return [keys.shape[0], int(weights is not None), bag], arrays, None
        dynamic = self._tables[route.table].dynamic is not None
        owner = shard_of_keys(keys, self.world) if dynamic else keys % self.world
        mask = owner == route.owner
        if route.position >= 0:
            offsets = np.asarray(inp.offsets, dtype=np.int64)
            pos = np.arange(keys.shape[0], dtype=np.int64) - offsets[sample_of]
            mask &= pos == route.position
        lengths = np.bincount(sample_of[mask], minlength=inp.batch_size).astype(np.int32)
        arrays = [lengths, keys[mask] if dynamic else keys[mask] // self.world]
        if weights is not None:
            arrays.append(weights[mask])
        return [int(mask.sum()), int(weights is not None), 0], arrays, lengths > 0

    def _exchange_ids(self, inputs: Mapping[str, SparseInput], sizes: list[int],
                      pending: _Pending) -> dict[str, SparseInput]:
        samples: dict[str, np.ndarray] = {}
        per_dest: list[list[np.ndarray]] = []
        for dest in range(self.world):
            header: list[int] = []
            arrays: list[np.ndarray] = []
            for i, r in enumerate(self._routes):
                if r.owner != dest:
                    continue
                inp = inputs[r.feature]
                if r.mode == "row" and r.feature not in samples:
                    offs = np.asarray(inp.offsets, dtype=np.int64)
                    samples[r.feature] = np.repeat(np.arange(inp.batch_size, dtype=np.int64),
                                                   np.diff(offs))
                h, a, present = self._outbound(r, inp, samples.get(r.feature, np.empty(0, np.int64)))
                header += h
                arrays += a
                if present is not None:
                    pending.sent_present[i] = present
            per_dest.append([np.asarray(header, dtype=np.int64), *arrays])
        send, counts = self._buffers["ids"].pack(per_dest)
        got, received = self.comm.alltoallv(send, counts, "ids")
        return self._inbound_ids(got, received, sizes, pending)

    def _inbound_ids(self, got: np.ndarray, received: np.ndarray, sizes: list[int],
                     pending: _Pending) -> dict[str, SparseInput]:
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
                    if r.mode == "row":
                        pending.recv_present[(i, src)] = lens > 0
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
                         inputs: Mapping[str, SparseInput], pending: _Pending,
                         result: list[np.ndarray]) -> None:
        q = self.quantize
        mine = [(i, r) for i, r in enumerate(self._routes) if r.owner == self.rank]
        per_dest: list[list[np.ndarray]] = []
        starts = np.concatenate(([0], np.cumsum(sizes)))
        for dest in range(self.world):
            lo, hi = int(starts[dest]), int(starts[dest + 1])
            arrays: list[np.ndarray] = []
            for i, r in mine:
                g, c, w = self.engine.layout[r.local]
                block = outs[g][lo:hi, c:c + w]
                present = pending.recv_present.get((i, dest))
                if present is not None:
                    block = block[present]
                arrays += encode_vectors(block, q)
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
                rows = batch if present is None else int(present.sum())
                block = decode_vectors(cur, rows, r.width, q)
                self._place_block(result, r, block, row_sums, present)
            at += int(received[src])
        for f in self._features:
            if f.name in row_sums:
                G, C, W = self.layout[f.name]
                pooled = row_sums[f.name]
                if f.combiner in ("mean", "sqrtn"):
                    scale = self._bag_scales(f, inputs[f.name])
                    pending.scales[f.name] = scale
                    pooled *= scale[:, None]
                result[G][:, C:C + W] = pooled

    def _place_block(self, result: list[np.ndarray], r: _Route, block: np.ndarray,
                     row_sums: dict[str, np.ndarray], present: np.ndarray | None) -> None:
        G, C, W = self.layout[r.feature]
        dim = self._tables[r.table].dim
        if r.mode == "table":
            result[G][:, C:C + W] = block
        elif r.mode == "column":
            view = result[G][:, C:C + W].reshape(-1, r.pieces, dim)
            view[:, :, r.cols[0]:r.cols[1]] = block.reshape(-1, r.pieces, r.cols[1] - r.cols[0])
        else:  # row: partial sums of the samples with a key at this owner
            acc = row_sums.get(r.feature)
            if acc is None:
                acc = row_sums[r.feature] = np.zeros((result[G].shape[0], W), np.float32)
            cols = slice(0, dim) if r.position < 0 else slice(r.position * dim,
                                                              (r.position + 1) * dim)
            assert present is not None
            acc[present, cols] += block

    @staticmethod
    def _bag_scales(f: FeatureConfig, inp: SparseInput) -> np.ndarray:
        """Per sample: 1/Σw (mean) or 1/sqrt(Σw²) (sqrtn), 0 for an empty or zero-weight bag."""
        offs = np.asarray(inp.offsets, dtype=np.int64)
        n = offs.shape[0] - 1
        w = (np.ones(int(offs[-1]), np.float32) if inp.weights is None
             else np.asarray(inp.weights, np.float32))
        sample = np.repeat(np.arange(n), np.diff(offs))
        x = w if f.combiner == "mean" else w * w
        s = np.bincount(sample, weights=x, minlength=n).astype(np.float32)
        if f.combiner == "sqrtn":
            s = np.sqrt(s)
        out = np.zeros(n, np.float32)
        np.divide(np.float32(1), s, out=out, where=s != 0)
        return out

    # ------------------------------------------------------------------ backward

    def backward_update(self, grads: Sequence[np.ndarray], step: int) -> None:
        """Apply d(loss)/d(group arrays) of the latest forward (collective)."""
        if self.world == 1:
            self.engine.backward_update(grads, step)
            return
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("backward_update needs a forward first (each forward is used once)")
        q = self.quantize
        sizes = pending.sizes
        batch = sizes[self.rank]
        per_dest: list[list[np.ndarray]] = []
        for dest in range(self.world):
            arrays: list[np.ndarray] = []
            for i, r in enumerate(self._routes):
                if r.owner == dest:
                    block = self._grad_block(grads, r, pending, batch)
                    present = pending.sent_present.get(i)
                    arrays += encode_vectors(block if present is None else block[present], q)
            per_dest.append(arrays)
        send, counts = self._buffers["backward"].pack(per_dest)
        got, received = self.comm.alltoallv(send, counts, "backward")
        total = sum(sizes)
        local = self._grad_buffers(total)
        starts = np.concatenate(([0], np.cumsum(sizes)))
        mine = [(i, r) for i, r in enumerate(self._routes) if r.owner == self.rank]
        at = 0
        for src in range(self.world):
            cur = Cursor(got, at)
            lo, hi = int(starts[src]), int(starts[src + 1])
            for i, r in mine:
                g, c, w = self.engine.layout[r.local]
                present = pending.recv_present.get((i, src))
                if present is None:
                    local[g][lo:hi, c:c + w] = decode_vectors(cur, hi - lo, r.width, q)
                else:
                    rows = local[g][lo:hi, c:c + w]
                    rows[:] = 0.0  # samples without a key here: never read by the engine
                    rows[present] = decode_vectors(cur, int(present.sum()), r.width, q)
            at += int(received[src])
        self.engine.backward_update(local, step)
        if self.dp is not None:
            dp_grads = [np.empty((batch, g.width), np.float32) for g in self.dp.engine.groups]
            for f in self.dp.engine.feature_names:
                g, c, w = self.dp.engine.layout[f]
                G, C, W = self.layout[f]
                dp_grads[g][:, c:c + w] = np.asarray(grads[G])[:, C:C + W]
            self.dp.backward_update(dp_grads, step, self.comm)

    def _grad_buffers(self, total: int) -> list[np.ndarray]:
        """The owner's ``[global batch, width]`` gradient arrays, reused across steps."""
        bufs = self._grads.get(total)
        if bufs is None:
            if len(self._grads) > 4:
                self._grads.clear()
            bufs = self._grads[total] = self.engine.new_outputs(total)
        return bufs

    def _grad_block(self, grads: Sequence[np.ndarray], r: _Route, pending: _Pending,
                    batch: int) -> np.ndarray:
        G, C, W = self.layout[r.feature]
        g = np.asarray(grads[G], dtype=np.float32)[:, C:C + W]
        dim = self._tables[r.table].dim
        if r.mode == "table":
            return g
        if r.mode == "column":
            c0, c1 = r.cols
            return g.reshape(batch, r.pieces, dim)[:, :, c0:c1].reshape(batch, -1)
        if r.position >= 0:
            return g[:, r.position * dim:(r.position + 1) * dim]
        scale = pending.scales.get(r.feature)
        return g if scale is None else g * scale[:, None]

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
        fields = ("rows", "inserts", "evictions", "expired", "admissions_pending")
        local = self.engine.dynamic_metrics()
        vec = np.zeros((len(names), len(fields)), np.float64)
        for i, name in enumerate(names):
            p = self.placements[name]
            # column shards hold the same keys: count the first column range only
            if name in local and p.columns[self.rank][0] == 0:
                vec[i] = [local[name][f] for f in fields]
        total = self.comm.allreduce_sum(vec.reshape(-1), "control").reshape(vec.shape)
        out = {}
        for i, name in enumerate(names):
            m = {f: int(total[i, j]) for j, f in enumerate(fields)}
            cap = self._tables[name].rows
            out[name] = {"rows": m["rows"], "capacity": cap, "inserts": m["inserts"],
                         "evictions": m["evictions"], "expired": m["expired"],
                         "admissions_pending": m["admissions_pending"],
                         "load_factor": round(m["rows"] / cap, 6)}
        return out

    def tier_metrics(self) -> dict[str, dict[str, float]]:
        """Per tiered table: cache rows, lookups, misses, hit rate, evictions and the store's
        reads and writes, summed over its shards (collective with several ranks)."""
        names = [t.name for t in self._tables.values() if t.tier is not None]
        if not names:
            return {}
        if self.world == 1:
            return self.engine.tier_metrics()
        local = self.engine.tier_metrics()
        fields = ("cache_rows", "cached", "lookups", "misses", "distinct_misses", "evictions",
                  "rows_read", "rows_ahead", "rows_written", "bytes_read", "bytes_written",
                  "read_blocks", "read_seconds", "wait_seconds")
        vec = np.zeros((len(names), len(fields)), np.float64)
        for i, name in enumerate(names):
            if name in local:
                vec[i] = [local[name][f] for f in fields]
        total = self.comm.allreduce_sum(vec.reshape(-1), "control").reshape(vec.shape)
        out = {}
        for i, name in enumerate(names):
            m: dict[str, float] = {f: float(total[i, j]) for j, f in enumerate(fields)}
            for f in fields:
                if not f.endswith("_seconds"):
                    m[f] = int(m[f])
            m["hit_rate"] = round(1 - m["misses"] / m["lookups"], 6) if m["lookups"] else 0.0
            out[name] = m
        return out

    def _holder(self, name: str) -> EmbeddingEngine:
        if self.dp is not None and self.placements[name].mode == "data_parallel":
            return self.dp.engine
        return self.engine

    def export_table(self, name: str) -> TableState | None:
        """The whole table ``name`` with global keys on rank 0 (None on other ranks).

        Collective with several ranks: every rank calls it for the same table.
        """
        if self.world == 1:
            return self.engine.export_table(name)
        p = self.placements[name]
        if p.mode == "data_parallel" or p.owners == (0,):
            return self._holder(name).export_table(name) if self.rank == 0 else None
        payload = b""
        if self.rank in p.owners:
            payload = self._pack_state(self.engine.export_table(name))
        got = gather_to_root(self.comm, payload)
        if got is None:
            return None
        return self._merge(name, got)

    def _merge(self, name: str, got: list[bytes]) -> TableState:
        """One table (or key range) with global keys from its owners' packed states: row
        shards merged by key, column shards side by side."""
        p = self.placements[name]
        states = {o: self._unpack_state(got[o], p.columns[o][1] - p.columns[o][0])
                  for o in p.owners}
        if p.mode == "table":
            return states[p.owners[0]]
        if p.mode == "column":
            order = sorted(p.owners, key=lambda o: p.columns[o][0])
            first = states[order[0]]
            return TableState(
                keys=first.keys,
                values=np.concatenate([states[o].values for o in order], axis=1),
                slots={s: np.concatenate([states[o].slots[s] for o in order], axis=1)
                       for s in first.slots},
                update_count=first.update_count,
                last_step=first.last_step,
                extra=first.extra,
            )
        dynamic = self._tables[name].dynamic is not None
        keys = np.concatenate([states[o].keys if dynamic else states[o].keys * self.world + o
                               for o in p.owners])
        order = np.argsort(keys, kind="stable")

        def merged(arrays: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(arrays)[order]

        return TableState(
            keys=keys[order],
            values=merged([states[o].values for o in p.owners]),
            slots={s: merged([states[o].slots[s] for o in p.owners]) for s in self.slot_names},
            update_count=merged([states[o].update_count for o in p.owners]),  # type: ignore[misc]
            last_step=merged([states[o].last_step for o in p.owners]),  # type: ignore[misc]
            extra=_merge_admission([states[o].extra for o in p.owners]),
        )

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
        p = self.placements[name]
        if p.mode == "data_parallel" or p.owners == (0,):
            if self.rank != 0:
                return 0, iter(())
            holder = self._holder(name)
            return holder.export_rows(name), holder.export_chunks(name, rows)
        bounds, total = self._key_ranges(name, max(1, int(rows)))
        return total, self._range_chunks(name, bounds)

    def _key_ranges(self, name: str, rows: int) -> tuple[list[int], int]:
        """Global key boundaries of ``name``'s chunks and its total rows (same on every rank)."""
        t = self._tables[name]
        if t.dynamic is None:
            return [*range(0, t.rows, rows), t.rows] if t.rows else [0, 0], t.rows
        p = self.placements[name]
        mine = np.zeros(0, np.int64)
        # column shards hold the same keys: the first column range speaks for them
        if self.rank in p.owners and p.columns[self.rank][0] == 0:
            mine = self.engine.export_keys(name)
        every = max(1, rows // (2 * self.world))
        head = [mine.size, int(mine[-1]) if mine.size else 0]
        send = np.concatenate([np.array(head, np.int64), mine[::every]])
        got, sizes = self.comm.allgatherv(send.view(np.uint8), "checkpoint")
        samples, total, top, at = [], 0, None, 0
        for n in sizes.tolist():
            part = got[at:at + n].view(np.int64)
            at += n
            total += int(part[0])
            if part[0]:
                top = int(part[1]) if top is None else max(top, int(part[1]))
                samples.append(part[2:])
        if top is None:
            return [0, 0], 0
        # between consecutive samples every shard has fewer than `every` keys, so a range of
        # `world` samples holds at most 2 * world * every <= rows keys
        cuts = np.unique(np.concatenate(samples))[::self.world]
        return [*(int(c) for c in cuts), top + 1], total

    def _range_chunks(self, name: str, bounds: list[int]) -> Iterator[TableState | None]:
        p = self.placements[name]
        t = self._tables[name]
        for i in range(len(bounds) - 1):
            a, b = bounds[i], bounds[i + 1]
            payload = b""
            if self.rank in p.owners:
                if p.mode == "row" and t.dynamic is None:  # local row l is key l * W + rank
                    lo = max(0, -(-(a - self.rank) // self.world))
                    hi = max(lo, -(-(b - self.rank) // self.world))
                    part = self.engine.export_range(name, lo, hi)
                else:
                    part = self.engine.export_range(name, a, b)
                part.extra = self.engine.export_extra(name) if i == 0 else {}
                payload = self._pack_state(part)
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
        if p.mode == "data_parallel":
            self._holder(name).import_table(name, state)
            return
        sel: Any = slice(None)
        local_keys = keys
        extra = dict(getattr(state, "extra", None) or {})
        if p.mode == "row" and dynamic:
            sel = np.flatnonzero(shard_of_keys(keys, self.world) == self.rank)
            local_keys = keys[sel]
            if "admission_keys" in extra:
                mine = shard_of_keys(extra["admission_keys"], self.world) == self.rank
                extra = {"admission_keys": np.asarray(extra["admission_keys"])[mine],
                         "admission_counts": np.asarray(extra["admission_counts"])[mine]}
        elif p.mode == "row":
            sel = np.flatnonzero(keys % self.world == self.rank)
            local_keys = keys[sel] // self.world
        c0, c1 = p.columns[self.rank]

        def cut(arr: Any, per_dim: bool) -> np.ndarray:
            a = np.asarray(arr)[sel]
            return a[:, c0:c1] if per_dim and p.mode == "column" else a

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

    def _pack_state(self, s: TableState) -> bytes:
        assert s.update_count is not None and s.last_step is not None
        adm_keys = s.extra.get("admission_keys", np.empty(0, np.int64))
        adm_counts = s.extra.get("admission_counts", np.empty(0, np.int64))
        bloom = s.extra.get("bloom", np.empty(0, np.uint8))
        arrays = [np.array([s.keys.shape[0]], np.int64), s.keys, s.values,
                  *(s.slots[n] for n in self.slot_names), s.update_count, s.last_step,
                  np.array([adm_keys.size, int("admission_keys" in s.extra), bloom.size,
                            int("bloom" in s.extra)], np.int64),
                  adm_keys.astype(np.int64), adm_counts.astype(np.int64), bloom]
        return pack([np.ascontiguousarray(a) for a in arrays]).tobytes()

    def _unpack_state(self, data: bytes, cols: int) -> TableState:
        cur = Cursor(np.frombuffer(data, np.uint8))
        n = int(cur.take(np.int64, 1)[0])
        keys = cur.take(np.int64, n)
        values = cur.take(np.float32, n * cols).reshape(n, cols)
        slots = {}
        for spec in self._slot_specs:
            slots[spec.name] = (cur.take(np.float32, n) if spec.per_row
                                else cur.take(np.float32, n * cols).reshape(n, cols))
        counts, last = cur.take(np.int64, n), cur.take(np.int64, n)
        n_adm, has_adm, n_bloom, has_bloom = cur.take(np.int64, 4).tolist()
        extra = {}
        adm_keys, adm_counts = cur.take(np.int64, n_adm), cur.take(np.int64, n_adm)
        if has_adm:
            extra = {"admission_keys": adm_keys, "admission_counts": adm_counts}
        bloom = cur.take(np.uint8, n_bloom)
        if has_bloom:
            extra["bloom"] = bloom
        return TableState(keys, values, slots, counts, last, extra)


def _merge_admission(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One table's admission state from its row shards': counted keys concatenated (each key
    lives on one shard) and sorted; Bloom counters added (saturating), which is the filter one
    rank would hold."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    if "bloom" in parts[0]:
        total = np.sum([p["bloom"].astype(np.int64) for p in parts], axis=0)
        return {"bloom": np.minimum(total, 255).astype(np.uint8)}
    keys = np.concatenate([p["admission_keys"] for p in parts])
    counts = np.concatenate([p["admission_counts"] for p in parts])
    order = np.argsort(keys, kind="stable")
    return {"admission_keys": keys[order], "admission_counts": counts[order]}


class CollectiveExport:
    """An engine-like view of a :class:`ShardedEmbedding` over several ranks for writing a
    checkpoint on rank 0, with every table exported only when the writer asks for it.

    Rank 0 passes it to ``CheckpointManager.save``, which asks for the tables in
    ``table_names`` order: a tiered table as chunks (:meth:`ShardedEmbedding.table_stream`,
    written as they arrive), the others whole (:meth:`ShardedEmbedding.export_table`). Every
    rank then calls :meth:`drain`: on rank 0 it runs the collectives a failed write left out,
    on the others all of them, in the same order, so no rank waits forever for another.
    """

    def __init__(self, embedding: ShardedEmbedding, rows: int | None = None):
        self._embedding = embedding
        self.optimizer = embedding.optimizer
        self._rows = rows
        self._next = 0  # the next table whose collectives have not started
        self._open: Iterator[TableState | None] | None = None  # chunks of a table under way

    @property
    def table_names(self) -> tuple[str, ...]:
        return self._embedding.table_names

    @property
    def slot_names(self) -> tuple[str, ...]:
        return self._embedding.slot_names

    def table_config(self, name: str) -> TableConfig:
        return self._embedding.table_config(name)

    def streams(self, name: str) -> bool:
        return self._embedding.streams(name)

    def _start(self, name: str) -> None:
        names = self.table_names
        if self._next >= len(names) or names[self._next] != name:
            raise RuntimeError(f"table {name!r} exported out of order; the ranks' collectives "
                               "must run in table order")
        if self._open is not None:
            for _ in self._open:  # a table's chunks not taken: the other ranks still serve
                pass
            self._open = None
        self._next += 1

    def export_table(self, name: str) -> TableState:
        """The whole (untiered) table, gathered on rank 0 (collective)."""
        self._start(name)
        state = self._embedding.export_table(name)
        assert state is not None, "the writer runs on rank 0"
        return state

    def rows(self, name: str) -> int:
        """Rows per chunk of table ``name``: the ``rows`` given, else the checkpoint's
        default for the table's width (from the configuration: the same on every rank)."""
        if self._rows is not None:
            return max(1, int(self._rows))
        from embtrain.checkpoint.layout import chunk_rows, config_row_bytes

        return chunk_rows(config_row_bytes(self.table_config(name).dim, len(self.slot_names)))

    def table_stream(self, name: str, rows: int) -> tuple[int, Iterator[TableState]]:
        """A tiered table's total rows and chunks (collective), cut at :meth:`rows` rows on
        every rank whatever ``rows`` the writer asks for."""
        self._start(name)
        total, chunks = self._embedding.table_stream(name, self.rows(name))
        self._open = chunks
        return total, (c for c in chunks if c is not None)

    def drain(self) -> None:
        """Run every collective of the tables not exported yet (all of them on ranks other
        than 0), in order."""
        if self._open is not None:
            for _ in self._open:
                pass
            self._open = None
        names = self.table_names
        while self._next < len(names):
            name = names[self._next]
            self._next += 1
            if self.streams(name):
                for _ in self._embedding.table_stream(name, self.rows(name))[1]:
                    pass
            else:
                self._embedding.export_table(name)


__all__ = [
    "CollectiveExport",
    "ShardedEmbedding",
    "TablePlacement",
    "placements_from_plan",
]
