"""Converted Parquet row groups shared by the shards one rank reads, each decoded once an epoch.

A rank reading several shards reads them side by side (every batch takes rows of each), so
two shards may need the same row group at different times: the last rows of shard ``v-1``
and the first of shard ``v`` often share one. The cache is told every read the epoch will
make (``[start, stop)`` ranges of epoch rows, one per shard window); a group is decoded and
converted the first time a read needs it (with ``threaded``, the group after it is decoded
ahead in a background thread) and dropped when the last read that overlaps it is done. At
most about two groups per shard read are held: the one each shard is in, and a group at a
shard boundary kept for the shard before it.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from embtrain.data.columns import Chunk, ReadSpec, convert
from embtrain.data.sources import ParquetFiles
from embtrain.errors import DataError

__all__ = ["GroupCache"]


class GroupCache:
    """Row groups of the files in ``order`` (epoch rows), for the announced ``reads``."""

    def __init__(self, source: ParquetFiles, spec: ReadSpec, order: list[int],
                 reads: list[tuple[int, int]], threaded: bool):
        self._source, self._spec = source, spec
        self._groups: list[tuple[int, int, int]] = []  # (file index, group, first file row)
        starts = [0]
        for fi in order:
            base = 0
            for g, rows in enumerate(source.infos[fi].group_rows):
                self._groups.append((fi, g, base))
                base += rows
                starts.append(starts[-1] + rows)
        self._starts = starts  # epoch row of each group's first row (and the end)
        self._refs: Counter[int] = Counter()
        for start, stop in reads:
            self._refs.update(self._overlapping(start, stop))
        self._held: dict[int, Future[Chunk]] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="embtrain-decode") if threaded \
            else None

    def _overlapping(self, start: int, stop: int) -> range:
        if start >= stop:
            return range(0)
        first = bisect.bisect_right(self._starts, start) - 1
        last = bisect.bisect_left(self._starts, stop)
        return range(first, last)

    def _decode(self, index: int) -> Chunk:
        fi, g, base = self._groups[index]
        path = self._source.infos[fi].path
        try:
            parquet = self._source.open(fi)
            try:
                table = parquet.read_row_group(g, columns=self._spec.columns, use_threads=True)
            finally:
                parquet.close()
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: cannot read row group {g}: {exc}") from None
        self._source.decoded_rows += table.num_rows
        return convert(table, self._spec, path, base)

    def _future(self, index: int) -> Future[Chunk]:
        held = self._held.get(index)
        if held is None:
            if self._pool is not None:
                held = self._pool.submit(self._decode, index)
            else:
                held = Future()
                held.set_result(self._decode(index))
            self._held[index] = held
        return held

    def read(self, start: int, stop: int) -> Iterator[Chunk]:
        """Epoch rows ``[start, stop)`` (one of the announced reads) as consecutive pieces."""
        groups = self._overlapping(start, stop)
        for index in groups:
            chunk = self._future(index).result()
            if self._pool is not None and index + 1 < len(self._groups) \
                    and self._refs[index + 1] > 0:
                self._future(index + 1)  # decode ahead while this group is used
            g0 = self._starts[index]
            a, c = max(start, g0) - g0, min(stop, self._starts[index + 1]) - g0
            piece = chunk if (a, c) == (0, chunk.rows) else chunk.slice(a, c)
            self._release(index)
            yield piece

    def _release(self, index: int) -> None:
        self._refs[index] -= 1
        if self._refs[index] <= 0:
            self._held.pop(index, None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._held.clear()
