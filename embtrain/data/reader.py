"""Parquet, CSV or TSV files → :class:`Batch`: the training and evaluation input of one rank.

The *global* stream of batches does not depend on the number of processes:

1. The split's files are the union of its globs (relative to the working directory), sorted.
   For a shuffled training epoch the file order is ``default_rng((seed, epoch)).permutation``.
2. The files' rows, concatenated in that order, are cut into *windows* of
   ``shuffle.window_batches`` global batches; window ``k`` of the epoch is permuted with
   ``default_rng((seed, epoch, k)).permutation`` (training with ``shuffle.enabled`` only).
3. The stream is cut into global batches of ``data.batch_size`` rows (evaluation:
   ``data.eval_batch_size`` or ``batch_size``). The last partial batch is dropped when
   training with ``last_batch: drop``, kept (smaller) otherwise.
4. Rank ``r`` of ``w`` takes rows ``[r*S//w, (r+1)*S//w)`` of each global batch of ``S`` rows
   (``S = B`` for full batches; when ``w`` does not divide ``S`` the first ranks hold one row
   fewer than the last ones).

With ``data.shards: V`` > 1 (training only) steps 2-3 are taken per *virtual shard*
(:mod:`embtrain.data.shards`): the epoch's rows are cut into ``V`` contiguous shards
(shard ``v``: rows ``[v*R//V, (v+1)*R//V)`` of the ``R`` rows), shard ``v``'s rows into
windows of ``window_batches * B/V`` rows, window ``k`` permuted with
``default_rng((seed, epoch, k, v))``, and global batch ``t`` is the concatenation, in shard
order, of each shard's next ``B/V`` rows (the last partial batch: what each shard has left).
Step 4 is unchanged; rank ``r`` opens and decodes only the shards its slice takes rows from
(``V/w`` shards when ``w`` divides ``V``), each read sequentially in blocks of row-group rows.
The batches depend on ``V``, never on ``w``: any process count, and a resume at another
one, gives the same global batches. ``V = 1`` is the stream above, read whole by every rank.

``seed`` is the recipe's ``train.seed`` (taken modulo 2**64). Resuming at ``start_batch`` reads
row counts from Parquet metadata (text files: their line counts) and opens only the files and
row groups that hold the rows needed (with shuffling: from the start of the batch's window;
a text file is skipped to the row by its reader). The format does not change the stream: the
same rows as CSV/TSV and as Parquet give the same batches (see :mod:`embtrain.data.sources`).
"""

from __future__ import annotations

import glob
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from embtrain.data.batch import Batch, ReaderPosition, SparseInput
from embtrain.data.columns import (
    Chunk,
    Ragged,
    ReadSpec,
    convert,
    one_hot_offsets,
    read_spec,
)
from embtrain.data.group_cache import GroupCache
from embtrain.data.kernels import gather_rows, gather_transposed, transpose_into
from embtrain.data.memory import empty, take
from embtrain.data.prefetch import Prefetcher
from embtrain.data.shards import ShardLayout
from embtrain.data.sources import FileInfo, ParquetFiles, TextFiles, open_files
from embtrain.errors import DataError, UserInputError
from embtrain.recipe.models import Recipe

Split = Literal["train", "eval"]


ParquetFileInfo = FileInfo  # the name before CSV/TSV input


def list_files(patterns: str | list[str], what: str) -> list[str]:
    """Sorted union of the files matching ``patterns``; a pattern matching nothing is a DataError."""
    found: set[str] = set()
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        matches = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
        if not matches:
            raise DataError(f"{what}: no file matches '{pattern}' (relative to {os.getcwd()})")
        found.update(matches)
    return sorted(found)


class _RowStream:
    """Converted rows of the epoch's files in order, from a global row onwards.

    With ``threaded``, Parquet decoding and conversion each run in their own thread
    (two pipeline stages ahead of the caller).
    """

    def __init__(self, reader: BatchReader, order: list[int], start_row: int, threaded: bool):
        self._reader = reader
        self._pieces: deque[Chunk] = deque()
        self.row = start_row  # the global row the next piece starts at
        tables = self._tables(order, start_row)
        if threaded:
            tables = Prefetcher(tables, 2, "embtrain-decode")
        chunks = (convert(table, reader.spec, path, base) for table, path, base in tables)
        self._tables_source = tables
        self._source: Iterator[Chunk] = (Prefetcher(chunks, 2, "embtrain-convert") if threaded
                                         else chunks)

    def _tables(self, order: list[int], start_row: int) -> Iterator[tuple[pa.Table, str, int]]:
        skip = start_row
        for fi in order:
            info = self._reader.files[fi]
            if skip >= info.rows:
                skip -= info.rows
                continue
            for table, base in self._reader.source.tables(fi, skip):
                yield table, info.path, base
            skip = 0

    def take(self, n: int) -> Chunk | None:
        """The next ``n`` rows (fewer at the end of the epoch); None when nothing is left."""
        parts = list(self.parts(n))
        return Chunk.concat(parts) if parts else None

    def parts(self, n: int) -> Iterator[Chunk]:
        """The next ``n`` rows (fewer at the end of the epoch) as consecutive pieces, as they come."""
        need = n
        while need:
            if not self._pieces:
                piece = next(self._source, None)
                if piece is None:
                    return
                if not piece.rows:
                    continue
                self._pieces.append(piece)
            piece = self._pieces.popleft()
            if piece.rows > need:
                self._pieces.appendleft(piece.slice(need, piece.rows))
                piece = piece.slice(0, need)
            need -= piece.rows
            self.row += piece.rows
            yield piece

    def close(self) -> None:
        self._source.close()  # type: ignore[attr-defined]
        self._tables_source.close()  # type: ignore[attr-defined]


class _Window:
    """A shuffling window: rows stored row-major so that random row gathers stay cheap.

    Filled piece by piece as the pieces arrive, so copying overlaps with decoding.
    """

    def __init__(self, spec: ReadSpec, parts: Iterator[Chunk], rows: int):
        self.dense = empty((rows, spec.n_dense), np.float32)
        n_labels = len(spec.labels)
        self.label = empty((rows, n_labels) if n_labels else rows, np.float32)
        self.ids = empty((rows, len(spec.onehot)), np.int64)
        weights = [s.name for s in spec.onehot if s.weights]
        self.onehot_weights = {k: empty(rows, np.float32) for k in weights}
        ragged: dict[str, list[Ragged]] = {s.name: [] for s in spec.lists}
        at = 0
        for c in parts:
            end = at + c.rows
            self.dense[at:end] = c.dense
            self.label[at:end] = c.label
            transpose_into(c.onehot, self.ids, at)
            for k, w in self.onehot_weights.items():
                w[at:end] = c.onehot_weights[k]
            for k, r in c.ragged.items():
                ragged[k].append(r)
            at = end
        self.rows = at
        if at < rows:  # fewer rows than the metadata promised
            self.dense, self.label, self.ids = self.dense[:at], self.label[:at], self.ids[:at]
            self.onehot_weights = {k: w[:at] for k, w in self.onehot_weights.items()}
        self.ragged = {k: Ragged.concat(v) for k, v in ragged.items() if v}

    def take(self, rows: np.ndarray) -> Chunk:
        """Rows at positions ``rows`` as a column-major chunk."""
        onehot = empty((self.ids.shape[1], rows.shape[0]), np.int64)
        gather_transposed(self.ids, rows, onehot)
        dense = empty((rows.shape[0], self.dense.shape[1]), np.float32)
        gather_rows(self.dense, rows, dense)
        return Chunk(int(rows.shape[0]), dense, take(self.label, rows), onehot,
                     {k: take(w, rows) for k, w in self.onehot_weights.items()},
                     {k: r.take(rows) for k, r in self.ragged.items()})


def _empty_chunk(spec: ReadSpec) -> Chunk:
    """No rows, with every array a chunk of ``spec`` has."""
    n_labels = len(spec.labels)
    return Chunk(0, np.empty((0, spec.n_dense), np.float32),
                 np.empty((0, n_labels) if n_labels else 0, np.float32),
                 np.empty((len(spec.onehot), 0), np.int64),
                 {s.name: np.empty(0, np.float32) for s in spec.onehot if s.weights},
                 {s.name: Ragged(np.empty(0, np.int64), np.zeros(1, np.int64),
                                 np.empty(0, np.float32) if s.weights else None)
                  for s in spec.lists})


class BatchReader:
    """Batches of one split for rank ``rank`` of ``world_size``; see the module docstring.

    Iterating yields the batches of one epoch from :attr:`position` on and then advances the
    position to the next epoch, so ``for epoch ...: for batch in reader: ...`` walks epochs.
    Arrays in a batch may be read-only views; do not modify them in place. ``seed`` overrides
    ``train.seed``; ``prefetch`` and ``batch_size`` override the recipe's ``data`` values;
    ``labels=False`` reads no label column (every label is 0).
    A rank's slice of a short last batch may be empty (``size == 0``).
    """

    def __init__(self, recipe: Recipe, split: Split = "train", rank: int = 0, world_size: int = 1,
                 epoch: int = 0, start_batch: int = 0, *, seed: int | None = None,
                 prefetch: int | None = None, batch_size: int | None = None,
                 labels: bool = True):
        if split not in ("train", "eval"):
            raise UserInputError(f"split must be 'train' or 'eval', not {split!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise UserInputError(f"rank {rank} is not in [0, world_size={world_size})")
        if epoch < 0 or start_batch < 0:
            raise UserInputError("epoch and start_batch must be >= 0")
        data = recipe.data
        self.split: Split = split
        self.rank = rank
        self.world_size = world_size
        self.spec: ReadSpec = read_spec(recipe)
        if not labels:  # the label column is not read: every label is 0 (predict)
            self.spec = replace(self.spec, labelled=False, declared=tuple(
                (c, t) for c, t in self.spec.declared if c != self.spec.label))
        if split == "train":
            self.batch_size = batch_size or data.batch_size
            self.shuffle = data.shuffle.enabled
            self.drop_last = data.last_batch == "drop"
            patterns, what = data.train, "data.train"
        else:
            if data.eval is None:
                raise UserInputError("the recipe has no data.eval: nothing to evaluate on")
            self.batch_size = batch_size or data.eval_batch_size or data.batch_size
            self.shuffle = False
            self.drop_last = False
            patterns, what = data.eval, "data.eval"
        self.window_batches = data.shuffle.window_batches
        self.shards = data.shards if split == "train" else 1
        if self.batch_size % self.shards:
            raise UserInputError(f"data.shards: {self.shards} does not divide the batch size "
                                 f"{self.batch_size}")
        self.seed = (recipe.train.seed if seed is None else seed) % 2**64
        self.prefetch = data.prefetch if prefetch is None else prefetch
        paths = list_files(patterns, what)
        self.source: ParquetFiles | TextFiles = open_files(paths, self.spec, data, what)
        self.format = "parquet" if isinstance(self.source, ParquetFiles) else (
            "csv" if self.source.delimiter == "," else "tsv")
        self.files: tuple[FileInfo, ...] = self.source.infos
        self._position = ReaderPosition(epoch, start_batch)

    # -------------------------------------------------------------------------- metadata

    @property
    def total_rows(self) -> int:
        """Rows in all files of the split (Parquet metadata; text files: their lines)."""
        return sum(f.rows for f in self.files)

    def batches_per_epoch(self) -> int:
        """Global batches per epoch (every rank yields this many, each a slice of one)."""
        full, rest = divmod(self.total_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def position(self) -> ReaderPosition:
        """(epoch, batch) of the next batch to be yielded; store it in checkpoints."""
        return self._position

    def fragment(self, index: int) -> ds.ParquetFileFragment:
        """The dataset fragment of file ``index`` (in sorted order; Parquet input only)."""
        if not isinstance(self.source, ParquetFiles):
            raise UserInputError(f"{self.files[index].path}: a {self.format} file has no "
                                 "Parquet fragment")
        return self.source.fragments[index]

    def file_order(self, epoch: int) -> list[int]:
        """Indices into :attr:`files` in the order the epoch reads them."""
        n = len(self.files)
        if not self.shuffle:
            return list(range(n))
        return [int(i) for i in np.random.default_rng((self.seed, epoch)).permutation(n)]

    # ------------------------------------------------------------------------- iteration

    def _assemble(self, chunk: Chunk, global_size: int = -1) -> Batch:
        sparse: dict[str, SparseInput] = {}
        offsets = one_hot_offsets(chunk.rows)
        onehot = {s.name: f for f, s in enumerate(self.spec.onehot)}
        for s in self.spec.sparse:
            if s.name in onehot:
                sparse[s.name] = SparseInput(chunk.onehot[onehot[s.name]], offsets,
                                             chunk.onehot_weights.get(s.name), bag_size=1)
            else:
                r = chunk.ragged[s.name]
                sparse[s.name] = SparseInput(r.keys, r.offsets, r.weights)
        return Batch(chunk.rows, chunk.dense, chunk.label, sparse, global_size)

    def _bounds(self, size: int) -> tuple[int, int]:
        return self.rank * size // self.world_size, (self.rank + 1) * size // self.world_size

    @property
    def decoded_rows(self) -> int:
        """Rows this reader's files decoded so far (the reader's work; with ``data.shards``
        about ``1/world_size`` of the rows read)."""
        return self.source.decoded_rows

    def batches(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        """This rank's batches of ``epoch`` from ``start_batch`` on, computed in the caller's thread."""
        B = self.batch_size
        total = self.batches_per_epoch()
        if start_batch >= total:
            return
        if self.shards > 1:
            yield from self._sharded_batches(epoch, start_batch)
            return
        order = self.file_order(epoch)
        if not self.shuffle:
            stream = _RowStream(self, order, start_batch * B, self.prefetch > 0)
            try:
                for _ in range(start_batch, total):
                    chunk = stream.take(B)
                    if chunk is None:
                        return
                    lo, hi = self._bounds(chunk.rows)
                    yield self._assemble(chunk.slice(lo, hi), chunk.rows)
            finally:
                stream.close()
            return
        wb = self.window_batches
        window = start_batch // wb
        threaded = self.prefetch > 0
        stream = _RowStream(self, order, window * wb * B, threaded)
        # batches of one window are independent: with threads, two are gathered at a time
        pool = ThreadPoolExecutor(2, thread_name_prefix="embtrain-gather") if threaded else None
        b = start_batch
        try:
            while b < total:
                expected = min(wb * B, self.total_rows - window * wb * B)
                chunk = _Window(self.spec, stream.parts(wb * B), expected)
                if not chunk.rows:
                    return
                perm = np.random.default_rng((self.seed, epoch, window)).permutation(chunk.rows)

                def make(k: int, chunk: _Window = chunk, perm: np.ndarray = perm) -> Batch:
                    rows = perm[k * B:(k + 1) * B]
                    lo, hi = self._bounds(rows.shape[0])
                    return self._assemble(chunk.take(rows[lo:hi]), int(rows.shape[0]))

                ks = range(b - window * wb, min(wb, total - window * wb))
                if pool is None:
                    for k in ks:
                        yield make(k)
                else:
                    pending: deque[Future[Batch]] = deque()
                    for k in ks:
                        pending.append(pool.submit(make, k))
                        if len(pending) == 2:
                            yield pending.popleft().result()
                    while pending:
                        yield pending.popleft().result()
                window += 1
                b = window * wb
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            stream.close()

    def _sharded_batches(self, epoch: int, start_batch: int) -> Iterator[Batch]:
        """The batches with ``data.shards`` > 1 (:mod:`embtrain.data.shards`): shard ``v``'s
        rows are cut into windows of ``window_batches * b`` rows, window ``k`` permuted with
        ``default_rng((seed, epoch, k, v))``; this rank reads only the shards it takes rows of."""
        layout = ShardLayout(self.total_rows, self.shards, self.batch_size, self.drop_last)
        total = layout.batches()
        b, wb = layout.shard_batch, self.window_batches
        span = wb * b  # rows of a shard window
        plan = []  # per window: (k, first batch, last batch + 1, my pieces per batch, shards)
        full_pieces = layout.rank_pieces(0, self.rank, self.world_size)
        window, t = start_batch // wb, start_batch
        while t < total:
            last = min((window + 1) * wb, total)
            mine = [full_pieces if u < layout.full_batches
                    else layout.rank_pieces(u, self.rank, self.world_size)
                    for u in range(t, last)]
            need = sorted({v for pieces in mine for v, _, _ in pieces})
            plan.append((window, t, last, mine, need))
            window, t = window + 1, last

        def rows_of(window: int, shard: int) -> tuple[int, int]:
            lo, hi = layout.shard_rows(shard)
            return lo + window * span, min(lo + (window + 1) * span, hi)

        order = self.file_order(epoch)
        threaded = self.prefetch > 0
        if isinstance(self.source, ParquetFiles):
            cache = GroupCache(self.source, self.spec, order,
                               [rows_of(k, v) for k, *_, need in plan for v in need], threaded)
            read = cache.read
            close = cache.close
        else:  # text: one sequential stream per shard (a file is one group)
            streams: dict[int, _RowStream] = {}

            def read(start: int, stop: int) -> Iterator[Chunk]:
                stream = streams.pop(start, None) or _RowStream(self, order, start, False)
                streams[stop] = stream  # where it stands once this read is consumed
                return stream.parts(stop - start)

            def close() -> None:
                for stream in streams.values():
                    stream.close()
        try:
            for window, t, last, mine, need in plan:
                windows: dict[int, tuple[_Window, np.ndarray | None]] = {}
                for v in need:
                    start, stop = rows_of(window, v)
                    win = _Window(self.spec, read(start, stop), stop - start)
                    perm = (np.random.default_rng((self.seed, epoch, window, v))
                            .permutation(win.rows) if self.shuffle else None)
                    windows[v] = win, perm
                for u, pieces in zip(range(t, last), mine, strict=True):
                    at = (u - window * wb) * b
                    parts = []
                    for v, a, c in pieces:
                        win, perm = windows[v]
                        rows = (perm[at + a:at + c] if perm is not None
                                else np.arange(at + a, at + c, dtype=np.int64))
                        parts.append(win.take(rows))
                    if not parts:  # no row of this batch is this rank's
                        parts.append(_empty_chunk(self.spec))
                    yield self._assemble(Chunk.concat(parts), sum(layout.pieces(u)))
        finally:
            close()

    def __iter__(self) -> Iterator[Batch]:
        epoch, start = self._position.epoch, self._position.batch
        source = self.batches(epoch, start)
        it: Iterator[Batch] = Prefetcher(source, self.prefetch) if self.prefetch > 0 else source
        try:
            index = start
            for batch in it:
                index += 1
                self._position = ReaderPosition(epoch, index)
                yield batch
            self._position = ReaderPosition(epoch + 1, 0)
        finally:
            if isinstance(it, Prefetcher):
                it.close()
            else:
                source.close()  # type: ignore[attr-defined]

    def seek(self, epoch: int, batch: int = 0) -> None:
        """Make the next iteration start at ``batch`` of ``epoch``."""
        self._position = ReaderPosition(epoch, batch)
