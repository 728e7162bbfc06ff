"""The three exchanges of a sharded step: ids to their owners, pooled vectors back, gradients
to the owners (TorchRec's input and output distributions).

Each runs one ``alltoallv`` for every table of the model, whatever their modes: a message to
a rank is the concatenation of every route's part, and each route's part is its strategy's
(:mod:`embtrain.embedding.sharding`: ``outbound``/``received`` for the ids, ``place`` for the
pooled vectors, ``grad_block`` for the gradients). A rank's own blocks skip the message where
they travel in float32.

* :class:`RoutedIds`: this rank's slice of a global batch → the owner's local inputs of the
  global batch (its keys checked first);
* :class:`RoutedPooled`: the owner's pooled ``[global batch, width]`` arrays → this rank's
  samples in the one-process layout (row shards' partial sums summed, then scaled for
  ``mean``/``sqrtn``);
* :class:`RoutedGradients`: this rank's gradient of the one-process layout → the owner's
  ``[global batch, width]`` gradient; it also carries what the step sums over ranks (the
  loss, the dense gradients, the replicas' row sums), summed in rank order on every rank.

A communicator of size one has nothing to route: :func:`exchanges` gives it exchanges that
hand the arrays on as they are (:class:`SameIds`, :class:`SamePooled`,
:class:`SameGradients`), so one process runs the engine without a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from embtrain.comm.base import Communicator
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
from embtrain.embedding.config import FeatureConfig, SparseInput, TableConfig
from embtrain.embedding.engine import EmbeddingEngine, KeyOutOfRangeError
from embtrain.embedding.sharding.base import Pending, Route, Samples, bag_scales

Layout = Mapping[str, tuple[int, int, int]]  # feature → (group, column, width)


#: sums over ranks (the data-parallel replicas' row sums, the dense gradients) ride the
#: backward exchange instead of an all-reduce of their own with two ranks, where an all-to-all
#: moves the same bytes as a ring all-reduce, or when they are at most this many bytes
#: (latency-bound): every rank sends them whole to every other one
FUSED_BYTES = 1 << 16


def fuse_sums(world: int, nbytes: int) -> bool:
    """Whether ``nbytes`` summed over ``world`` ranks ride the backward exchange."""
    return world == 2 or nbytes <= FUSED_BYTES


def rank_sizes(world: int, size: int) -> list[int]:
    """Rows of a global batch of ``size`` rows held by each rank (the reader's rule)."""
    return [(r + 1) * size // world - r * size // world for r in range(world)]


def batch_rows(inputs: Mapping[str, SparseInput]) -> int:
    """Samples of a batch (0 without features)."""
    return next(iter(inputs.values())).batch_size if inputs else 0


class IdExchange:
    """Ids of this rank's samples → the owner's local inputs of the global batch."""

    #: whether ids leave this process (worth a thread of their own ahead of a step)
    remote: bool = True

    def start(self, inputs: Mapping[str, SparseInput], global_size: int | None) -> Pending:
        """What the step of ``inputs`` (this rank's slice of a global batch of ``global_size``
        rows; default: the slice times the world size) leaves for its backward."""
        raise NotImplementedError

    def __call__(self, inputs: Mapping[str, SparseInput], pending: Pending,
                 purpose: str = "ids") -> Mapping[str, SparseInput]:
        """The owner's local inputs of the global batch (collective; ``purpose``: ``ids``, or
        ``ids.ahead`` on the pipeline's thread)."""
        raise NotImplementedError


class PooledExchange:
    """The owners' pooled arrays of the global batch → this rank's, one-process layout."""

    #: whether the engine's arrays are handed on as they are (then in any dtype it writes)
    hands_on: bool = False

    def __call__(self, outs: Sequence[np.ndarray], inputs: Mapping[str, SparseInput],
                 pending: Pending) -> list[np.ndarray]:
        """This rank's pooled vectors from the owners' ``outs`` (collective)."""
        raise NotImplementedError


class GradientExchange:
    """This rank's gradient of the one-process layout → the owner's of the global batch."""

    def __call__(self, grads: Sequence[np.ndarray], pending: Pending,
                 sums: dict[str, list[np.ndarray]]
                 ) -> tuple[Sequence[np.ndarray], dict[str, list[np.ndarray]]]:
        """The owner's gradient of the global batch, and ``sums`` (arrays by purpose)
        summed over the ranks in rank order, the same bits on every rank (collective)."""
        raise NotImplementedError


class RoutedIds(IdExchange):
    """This rank's ids to the owners of their rows; the owner's local inputs come back."""

    def __init__(self, comm: Communicator, routes: Sequence[Route],
                 tables: Mapping[str, TableConfig], features: Sequence[FeatureConfig]):
        self.comm = comm
        self._routes = list(routes)
        self._mine = [(i, r) for i, r in enumerate(self._routes) if r.owner == comm.rank]
        self._tables = tables
        self._features = tuple(features)
        self._dynamic = {name: t.dynamic is not None for name, t in tables.items()}
        # the pipeline's thread packs into a buffer of its own (purpose ids.ahead)
        self.buffers = {p: MessageBuffer() for p in ("ids", "ids.ahead")}

    def start(self, inputs: Mapping[str, SparseInput], global_size: int | None) -> Pending:
        """What the step of ``inputs`` (this rank's slice of a global batch of ``global_size``
        rows; default: the slice times the world size) leaves for its backward; raises for a
        key outside its table or a slice of the wrong size."""
        world, rank = self.comm.size, self.comm.rank
        batch = batch_rows(inputs)
        size = batch * world if global_size is None else int(global_size)
        sizes = rank_sizes(world, size)
        if sizes[rank] != batch:
            raise ValueError(f"rank {rank}: {batch} samples, expected {sizes[rank]} "
                             f"of a global batch of {size}")
        self._check_keys(inputs)
        return Pending(sizes)

    def _check_keys(self, inputs: Mapping[str, SparseInput]) -> None:
        for f in self._features:
            if self._dynamic[f.table]:
                continue
            keys = np.asarray(inputs[f.name].keys)
            if keys.size:
                rows = self._tables[f.table].rows
                lo, hi = int(keys.min()), int(keys.max())
                if lo < 0 or hi >= rows:
                    raise KeyOutOfRangeError(f.name, lo if lo < 0 else hi, f.table, rows)

    def __call__(self, inputs: Mapping[str, SparseInput], pending: Pending,
                 purpose: str = "ids") -> Mapping[str, SparseInput]:
        """Send this rank's ids to their owners (collective); the owner's local inputs of the
        global batch (``purpose``: ``ids``, or ``ids.ahead`` on the pipeline's thread)."""
        samples = Samples()
        per_dest: list[list[np.ndarray]] = []
        for dest in range(self.comm.size):
            header: list[int] = []
            arrays: list[np.ndarray] = []
            for i, r in enumerate(self._routes):
                if r.owner != dest:
                    continue
                h, a, present = r.strategy.outbound(r, inputs[r.feature], samples,
                                                    self.comm.size, self._dynamic[r.table])
                header += h
                arrays += a
                if present is not None:
                    pending.sent_present[i] = present
            per_dest.append([np.asarray(header, dtype=np.int64), *arrays])
        send, counts = self.buffers[purpose].pack(per_dest)
        got, received = self.comm.alltoallv(send, counts, purpose)
        return self._inbound(got, received, pending)

    def _inbound(self, got: np.ndarray, received: np.ndarray,
                 pending: Pending) -> dict[str, SparseInput]:
        mine, sizes = self._mine, pending.sizes
        keys: dict[str, list[np.ndarray]] = {r.local: [] for _, r in mine}
        lengths: dict[str, list[np.ndarray]] = {r.local: [] for _, r in mine}
        weights: dict[str, list[np.ndarray | None]] = {r.local: [] for _, r in mine}
        bags: dict[str, set[int]] = {r.local: set() for _, r in mine}
        at = 0
        for src in range(self.comm.size):
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


class RoutedPooled(PooledExchange):
    """The owners' pooled vectors of the global batch to the ranks whose samples they are,
    placed in the one-process layout."""

    def __init__(self, comm: Communicator, routes: Sequence[Route], engine: EmbeddingEngine,
                 tables: Mapping[str, TableConfig], features: Sequence[FeatureConfig],
                 layout: Layout, codecs: Sequence[Codec],
                 new_outputs: Callable[[int], list[np.ndarray]]):
        self.comm = comm
        self._routes = list(routes)
        self._mine = [(i, r) for i, r in enumerate(self._routes) if r.owner == comm.rank]
        self._engine = engine
        self._tables = tables
        self._features = tuple(features)
        self._layout = layout
        self._codecs = list(codecs)
        self._new_outputs = new_outputs
        self._results: dict[int, list[np.ndarray]] = {}
        self.buffer = MessageBuffer()

    def result(self, batch: int) -> list[np.ndarray]:
        """This rank's ``[batch, width]`` arrays of the one-process layout, reused."""
        got = self._results.get(batch)
        if got is None:
            if len(self._results) > 4:
                self._results.clear()
            got = self._results[batch] = self._new_outputs(batch)
        return got

    def __call__(self, outs: Sequence[np.ndarray], inputs: Mapping[str, SparseInput],
                 pending: Pending) -> list[np.ndarray]:
        """This rank's pooled vectors from the owners' ``outs`` (collective)."""
        q, rank, sizes = self._codecs, self.comm.rank, pending.sizes
        starts = np.concatenate(([0], np.cumsum(sizes)))
        per_dest: list[list[np.ndarray]] = []
        for dest in range(self.comm.size):
            lo, hi = int(starts[dest]), int(starts[dest + 1])
            arrays: list[np.ndarray] = []
            for i, r in self._mine:
                if q[i] == "none" and dest == rank:
                    continue  # read straight from the pooled arrays below
                g, c, w = self._engine.layout[r.local]
                block = outs[g][lo:hi, c:c + w]
                present = pending.recv_present.get((i, dest))
                if present is not None:
                    block = block[present]
                arrays += encode_vectors(block, q[i])
            per_dest.append(arrays)
        send, counts = self.buffer.pack(per_dest)
        got, received = self.comm.alltoallv(send, counts, "forward")
        batch = sizes[rank]
        result = self.result(batch)
        row_sums: dict[str, np.ndarray] = {}
        at = 0
        for src in range(self.comm.size):
            cur = Cursor(got, at)
            for i, r in enumerate(self._routes):
                if r.owner != src:
                    continue
                present = pending.sent_present.get(i)
                # this rank's own samples skip the message where it travels in float32
                if q[i] == "none" and src == rank:  # straight from the pooled arrays
                    g, c, w = self._engine.layout[r.local]
                    lo = int(starts[src])
                    block = outs[g][lo:lo + batch, c:c + w]
                    kept = pending.recv_present.get((i, src))
                    block = block if kept is None else block[kept]
                else:
                    rows = batch if present is None else int(present.sum())
                    block = decode_vectors(cur, rows, r.width, q[i])
                r.strategy.place(result, self._layout[r.feature], r, block,
                                 self._tables[r.table].dim, row_sums, present)
            at += int(received[src])
        for f in self._features:  # partial sums (row shards): summed above, scaled here
            if f.name in row_sums:
                G, C, W = self._layout[f.name]
                pooled = row_sums[f.name]
                if f.combiner in ("mean", "sqrtn"):
                    scale = bag_scales(f.combiner, inputs[f.name])
                    pending.scales[f.name] = scale
                    pooled *= scale[:, None]
                result[G][:, C:C + W] = pooled
        return result


class RoutedGradients(GradientExchange):
    """Each rank's gradient blocks to their owners, and the step's sums over ranks."""

    def __init__(self, comm: Communicator, routes: Sequence[Route], engine: EmbeddingEngine,
                 tables: Mapping[str, TableConfig], layout: Layout, codecs: Sequence[Codec]):
        self.comm = comm
        self._routes = list(routes)
        self._mine = [(i, r) for i, r in enumerate(self._routes) if r.owner == comm.rank]
        self._engine = engine
        self._tables = tables
        self._layout = layout
        self._codecs = list(codecs)
        self._grads: dict[int, list[np.ndarray]] = {}
        self.buffer = MessageBuffer()

    def _local(self, total: int) -> list[np.ndarray]:
        """The owner's ``[global batch, width]`` gradient arrays, reused across steps."""
        bufs = self._grads.get(total)
        if bufs is None:
            if len(self._grads) > 4:
                self._grads.clear()
            bufs = self._grads[total] = self._engine.new_outputs(total)
        return bufs

    def _block(self, grads: Sequence[np.ndarray], r: Route, pending: Pending,
               batch: int) -> np.ndarray:
        G, C, W = self._layout[r.feature]
        g = np.asarray(grads[G], dtype=np.float32)[:, C:C + W]
        return r.strategy.grad_block(g, r, pending, batch, self._tables[r.table].dim)

    def __call__(self, grads: Sequence[np.ndarray], pending: Pending,
                 sums: dict[str, list[np.ndarray]]
                 ) -> tuple[Sequence[np.ndarray], dict[str, list[np.ndarray]]]:
        """The owner's gradient of the global batch, and ``sums`` (arrays by purpose, each
        8-byte padded) summed over the ranks in rank order (collective)."""
        q, rank, world, sizes = self._codecs, self.comm.rank, self.comm.size, pending.sizes
        batch = sizes[rank]
        shared = [a for v in sums.values() for a in v]  # read in place on arrival
        per_dest: list[list[Any]] = []
        for dest in range(world):
            arrays: list[Any] = [] if dest == rank else list(shared)
            for i, r in enumerate(self._routes):
                # this rank's own gradient blocks skip the message where they travel in float32
                if r.owner == dest and not (q[i] == "none" and dest == rank):
                    block = self._block(grads, r, pending, batch)
                    present = pending.sent_present.get(i)
                    arrays += encode_vectors(block if present is None else block[present], q[i])
            per_dest.append(arrays)
        send, counts = self.buffer.pack(per_dest)
        others = world - 1
        parts = {k: packed_size(v) * others for k, v in sums.items()}
        if "dp" in sums:  # the plan counts the row sums' bytes; padding is overhead
            parts["control"] = parts.get("control", 0) + parts["dp"] - sums["dp"][0].nbytes * others
            parts["dp"] = sums["dp"][0].nbytes * others
        got, received = self.comm.alltoallv(send, counts, "backward", parts)
        local = self._local(sum(sizes))
        starts = np.concatenate(([0], np.cumsum(sizes)))
        # summed in rank order, starting from rank 0's part: the same bits on every rank
        summed = [np.empty_like(a) for a in shared]
        at = 0
        for src in range(world):
            cur = Cursor(got, at)
            for k, a in enumerate(shared):
                part = a if src == rank else cur.take(a.dtype, a.size).reshape(a.shape)
                if src == 0:
                    summed[k][...] = part
                else:
                    summed[k] += part
            lo, hi = int(starts[src]), int(starts[src + 1])
            for i, r in self._mine:
                g, c, w = self._engine.layout[r.local]
                present = pending.recv_present.get((i, src))
                if q[i] == "none" and src == rank:
                    block = self._block(grads, r, pending, batch)
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
        out: dict[str, list[np.ndarray]] = {}
        at = 0
        for k, v in sums.items():
            out[k], at = summed[at:at + len(v)], at + len(v)
        return local, out


class SameIds(IdExchange):
    """One rank: its inputs are the owner's (the engine checks their keys)."""

    remote = False

    def start(self, inputs: Mapping[str, SparseInput], global_size: int | None) -> Pending:
        return Pending([batch_rows(inputs)])

    def __call__(self, inputs: Mapping[str, SparseInput], pending: Pending,
                 purpose: str = "ids") -> Mapping[str, SparseInput]:
        return inputs


class SamePooled(PooledExchange):
    """One rank: the engine's arrays are the one-process layout, handed on as they are."""

    hands_on = True

    def __call__(self, outs: Sequence[np.ndarray], inputs: Mapping[str, SparseInput],
                 pending: Pending) -> list[np.ndarray]:
        return list(outs)


class SameGradients(GradientExchange):
    """One rank: the gradient is the owner's; a sum over one rank is a copy."""

    def __call__(self, grads: Sequence[np.ndarray], pending: Pending,
                 sums: dict[str, list[np.ndarray]]
                 ) -> tuple[Sequence[np.ndarray], dict[str, list[np.ndarray]]]:
        return grads, {k: [a.copy() for a in v] for k, v in sums.items()}


class Exchanges(NamedTuple):
    """The step's three exchanges."""

    ids: IdExchange
    pooled: PooledExchange
    gradients: GradientExchange


def exchanges(comm: Communicator, routes: Sequence[Route], engine: EmbeddingEngine,
              tables: Mapping[str, TableConfig], features: Sequence[FeatureConfig],
              layout: Layout, new_outputs: Callable[[int], list[np.ndarray]],
              quantize: Quantize = "none", mixed_precision: str = "none") -> Exchanges:
    """The exchanges of ``routes`` over ``comm``; over one rank the ones that hand arrays on.

    Each route's wire format (:func:`~embtrain.comm.wire.exchange_codec`): its table's dtype,
    ``quantize`` and ``mixed_precision``; partial sums travel as float32."""
    if comm.size == 1:  # nothing to route: no message, no copy
        return Exchanges(SameIds(), SamePooled(), SameGradients())
    codecs = {grad: [exchange_codec(tables[r.table].dtype, quantize, grad,
                                    r.strategy.partial_sums(r), mixed_precision)
                     for r in routes]
              for grad in (False, True)}
    return Exchanges(
        RoutedIds(comm, routes, tables, features),
        RoutedPooled(comm, routes, engine, tables, features, layout, codecs[False], new_outputs),
        RoutedGradients(comm, routes, engine, tables, layout, codecs[True]),
    )


__all__ = [
    "FUSED_BYTES",
    "Exchanges",
    "GradientExchange",
    "IdExchange",
    "PooledExchange",
    "RoutedGradients",
    "RoutedIds",
    "RoutedPooled",
    "SameGradients",
    "SameIds",
    "SamePooled",
    "batch_rows",
    "exchanges",
    "fuse_sums",
    "rank_sizes",
]
