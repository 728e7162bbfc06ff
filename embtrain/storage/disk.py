"""The disk tier: one file per table shard, rows in 4 KiB blocks, read and written directly.

File format (version 1)
    Block 0 is the header: ``MAGIC`` then a JSON object padded with zeros to 4 KiB: format
    version, table, rows, dim, slot layout, seed, initializer, shard placement, record size,
    rows per unit, the run id that created the file, whether it was closed cleanly, and (when
    clean) where the row index lies and its CRC-32. Blocks 1.. hold *units*: one 4 KiB block of
    ``rows_per_unit`` packed records (a record larger than a block takes whole blocks, one
    record per unit). A record is one row: key (int64), metadata (update count, last step + 1:
    int32 × 2), values, then each optimizer slot, so a miss is one read of one block.

Log-structured
    Rows have no fixed place: a batch of written rows (evictions) is packed densely into free
    or new units and written in runs of adjacent blocks; an in-memory index (``loc``: the
    record number + 1 of every row, 0 for a row never written; 4 or 8 bytes per row) says
    where each row's latest record is. Rewriting a row in place would need a read-modify-write
    of its block (its neighbours' records live there too), tripling the I/O of an eviction.
    A unit whose records are all stale goes back to a free list; when units holding live
    records exceed ``COMPACT_FACTOR`` × the packed size of the live rows, the emptiest units
    are read and their live records rewritten, so the file stays within
    :func:`max_file_bytes` (about 1.5 × the packed table).

Never-written rows
    A row never written is not in the file: a read computes it from the table's initializer
    (values depend only on seed, table and row) with the optimizer's initial slot values and
    zero metadata, so a fresh table costs no writes.

Trust
    A file is created for a run (its id in the header) and locked (``flock``) while open. The
    index is only written by :meth:`RowFile.close`, which then marks the header clean; a file
    that was not closed cleanly, or whose header differs in any field from what the caller
    expects, is refused by :meth:`RowFile.open` with one line. :meth:`RowFile.create`
    overwrites an earlier tier file (a run rebuilds its tier from its checkpoint), but never a
    file that is not a tier file.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.errors import StorageError, UserInputError
from embtrain.storage.aligned import BLOCK, IOPool, aligned_blocks, open_direct
from embtrain.storage.records import (
    CHUNK_BLOCKS,
    COMPACT_FACTOR,
    COMPACT_SLACK_UNITS,
    MAGIC,
    RowLayout,
    Rows,
    index_dtype,
    initial_rows,
    max_file_bytes,
    tier_file_name,
)


class BusyClock:
    """Wall seconds during which at least one thread was inside (``with clock:``): the time
    this process spent reading rows from tier files, however many files read at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._since = 0.0
        self._total = 0.0

    def __enter__(self) -> BusyClock:
        with self._lock:
            if self._inside == 0:
                self._since = time.perf_counter()
            self._inside += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                self._total += time.perf_counter() - self._since

    @property
    def seconds(self) -> float:
        """Busy seconds so far."""
        with self._lock:
            return self._total + (time.perf_counter() - self._since if self._inside else 0.0)


# every RowFile's reads of rows (bench: the tier's read rate = blocks read ÷ these seconds)
READ_CLOCK = BusyClock()

__all__ = [
    "BLOCK",
    "RowFile",
    "RowLayout",
    "Rows",
    "TierFileError",
    "max_file_bytes",
    "tier_file_name",
]


class TierFileError(UserInputError):
    """A tier file that cannot be used as given (another table's, another run's, not closed
    cleanly, in use, not a tier file): one line naming the file, exit 2."""


@dataclass
class FileCounters:
    """What a :class:`RowFile` did since it was opened."""

    rows_read: int = 0
    rows_initialized: int = 0
    rows_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_seconds: float = 0.0  # reading records of rows asked for (not scans, compactions)
    read_blocks: int = 0  # blocks those reads took
    write_seconds: float = 0.0
    compactions: int = 0
    rows_compacted: int = 0

    def to_dict(self) -> dict[str, float]:
        """A JSON-ready mapping."""
        return dict(self.__dict__)


class RowFile:
    """A table shard's rows in a file (see the module docstring); not thread-safe: one caller
    (the prefetcher's thread) at a time. Use :meth:`create` or :meth:`open`."""

    def __init__(self, path: Path, layout: RowLayout, run_id: str, fd: int, direct: bool,
                 depth: int):
        self.path = path
        self.layout = layout
        self.run_id = run_id
        self.direct = direct
        self._fd = fd
        self._io = IOPool(fd, BLOCK, depth=depth, direct=direct)
        self._dtype = layout.dtype
        self._r = layout.rows_per_unit
        self._k = layout.unit_blocks
        from embtrain.kernels import get_backend

        # record number + 1 of every row; a fresh anonymous mapping is zero: "never written"
        self._loc = get_backend("cpu").zeros((layout.rows,), index_dtype(layout.rows))
        self._live = np.zeros(0, np.int32)  # live records per unit
        self._units = 0  # units in the file
        self._free: list[int] = []
        self._live_rows = 0
        self.counters = FileCounters()
        self._closed = False
        self._buf = aligned_blocks(0)

    # ------------------------------------------------------------------ open / close

    @classmethod
    def create(cls, path: str | Path, layout: RowLayout, run_id: str, depth: int = 16,
               direct: bool = True) -> RowFile:
        """A fresh, empty tier file at ``path`` (every row reads as its initial value).

        An existing tier file there is overwritten; any other file is refused. ``depth``:
        requests in flight; ``direct=False``: buffered I/O (written pages are dropped from the
        page cache), which is also what a file system refusing ``O_DIRECT`` gets."""
        path = Path(path)
        if path.exists():
            _check_magic(path)
        try:
            fd, direct = open_direct(str(path), os.O_RDWR | os.O_CREAT, direct=direct)
        except OSError as exc:
            raise TierFileError(f"{path}: cannot create the tier file: {exc.strerror}") from None
        try:
            _lock(fd, path)
            os.ftruncate(fd, 0)
            self = cls(path, layout, run_id, fd, direct, depth)
            self._write_header(clean=False)
        except BaseException:
            os.close(fd)
            raise
        return self

    @classmethod
    def open(cls, path: str | Path, layout: RowLayout, run_id: str, depth: int = 16,
             direct: bool = True) -> RowFile:
        """Reopen a tier file that :meth:`close` left clean, checking every header field
        against ``layout`` and ``run_id``; anything else is a :class:`TierFileError`."""
        path = Path(path)
        head = _read_header(path)
        want = {**layout.header(), "run_id": run_id}
        for key, value in want.items():
            if head.get(key) != value:
                raise TierFileError(
                    f"{path}: tier file does not match: {key} is {head.get(key)!r} in the file, "
                    f"{value!r} expected; delete it or choose another path")
        if not head.get("clean"):
            raise TierFileError(f"{path}: tier file was not closed cleanly (the run stopped "
                                "while it was in use); it is rebuilt from the checkpoint, "
                                "never trusted")
        fd, direct = open_direct(str(path), os.O_RDWR, direct=direct)
        try:
            _lock(fd, path)
            self = cls(path, layout, run_id, fd, direct, depth)
            self._units = int(head["units"])
            nbytes = int(head["index_bytes"])
            first = int(head["index_block"])
            nblocks = -(-nbytes // BLOCK)
            buf = aligned_blocks(nblocks)
            self._io.read(np.arange(first, first + nblocks) - 1, buf)
            raw = buf.reshape(-1)[:nbytes]
            if zlib.crc32(raw) != int(head["index_crc32"]):
                raise TierFileError(f"{path}: tier file index checksum does not match; it is "
                                    "rebuilt from the checkpoint, never trusted")
            self._loc[:] = raw.view(self._loc.dtype)
            self._rebuild_live()
            self._write_header(clean=False)
        except BaseException:
            os.close(fd)
            raise
        return self

    def close(self) -> None:
        """Write the index after the data, mark the header clean and release the file."""
        if self._closed:
            return
        try:
            raw = self._loc.view(np.uint8)
            nblocks = -(-raw.shape[0] // BLOCK)
            buf = aligned_blocks(max(nblocks, 1))
            flat = buf.reshape(-1)
            flat[: raw.shape[0]] = raw
            flat[raw.shape[0]:] = 0
            first = self._units * self._k
            self._io.write(np.arange(first, first + nblocks), buf[:nblocks])
            os.ftruncate(self._fd, BLOCK * (1 + first + nblocks))
            os.fsync(self._fd)
            self._write_header(clean=True, index_block=first + 1, index_bytes=int(raw.shape[0]),
                               index_crc32=zlib.crc32(raw))
            os.fsync(self._fd)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Release the file without writing the index (it stays marked not clean)."""
        if self._closed:
            return
        self._closed = True
        self._io.close()
        os.close(self._fd)

    def __enter__(self) -> RowFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_header(self, clean: bool, **extra: int) -> None:
        head = {**self.layout.header(), "run_id": self.run_id, "clean": clean,
                "units": self._units, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                time.gmtime()), **extra}
        text = MAGIC + json.dumps(head, sort_keys=True).encode()
        if len(text) > BLOCK:
            raise StorageError(f"{self.path}: tier file header longer than {BLOCK} bytes")
        buf = aligned_blocks(1)
        buf[0, : len(text)] = np.frombuffer(text, np.uint8)
        buf[0, len(text):] = 0
        n = os.pwritev(self._fd, [memoryview(buf.reshape(-1))], 0)
        if n != BLOCK:
            raise StorageError(f"{self.path}: short header write")

    # ------------------------------------------------------------------ state

    @property
    def written_rows(self) -> int:
        """Rows that have a record in the file."""
        return self._live_rows

    @property
    def file_units(self) -> int:
        """Units in the file (live, stale or free)."""
        return self._units

    @property
    def occupied_units(self) -> int:
        """Units holding at least one live record."""
        return self._units - len(self._free)

    def written(self, keys: np.ndarray) -> np.ndarray:
        """Whether each row of ``keys`` has a record in the file."""
        return self._loc[np.asarray(keys, np.int64)] != 0

    def written_keys(self) -> np.ndarray:
        """The rows that have a record in the file, ascending."""
        return np.flatnonzero(self._loc).astype(np.int64)

    def _rebuild_live(self) -> None:
        loc = self._loc
        stored = loc[loc != 0].astype(np.int64) - 1
        self._live = np.bincount(stored // self._r, minlength=self._units).astype(np.int32)
        self._live_rows = int(stored.shape[0])
        self._free = np.flatnonzero(self._live == 0).tolist()

    def _check_keys(self, keys: np.ndarray) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        if keys.size and (int(keys.min()) < 0 or int(keys.max()) >= self.layout.rows):
            raise IndexError(f"{self.path}: row out of range [0, {self.layout.rows})")
        return keys

    def _buffer(self, blocks: int) -> np.ndarray:
        """``[blocks, BLOCK]`` of the file's reused aligned buffer (grown when needed)."""
        if self._buf.shape[0] < blocks:
            self._buf = aligned_blocks(min(CHUNK_BLOCKS, max(blocks, 2 * self._buf.shape[0])))
        return self._buf[:blocks]

    def _read_units(self, units: np.ndarray) -> tuple[np.ndarray, int]:
        """Records ``[len(units), rows_per_unit]`` of ascending ``units`` (at most
        ``CHUNK_BLOCKS`` blocks), in the reused buffer, and the blocks read."""
        blocks = (units[:, None] * self._k + np.arange(self._k)).reshape(-1)
        buf = self._buffer(blocks.shape[0])
        self._io.read(blocks, buf)
        return self._records(buf, units.shape[0]), int(blocks.shape[0])

    def _records(self, buf: np.ndarray, units: int) -> np.ndarray:
        """``[units, rows_per_unit]`` records viewing an aligned block buffer."""
        return (buf.reshape(units, self._k * BLOCK)[:, : self._r * self._dtype.itemsize]
                .view(self._dtype))

    # ------------------------------------------------------------------ read

    def read(self, keys: np.ndarray, out: Rows | None = None) -> Rows:
        """The current state of rows ``keys`` (any order, duplicates allowed): from the file
        where written, from the initializer where not. ``out``: arrays to fill (``len(keys)``
        rows)."""
        keys = self._check_keys(keys)
        n = int(keys.shape[0])
        if out is None:
            out = Rows.empty(self.layout, n)
        stored = self._loc[keys]
        fresh = np.flatnonzero(stored == 0)
        initial_rows(self.layout, keys[fresh], out, fresh)
        self.counters.rows_initialized += int(fresh.shape[0])
        self._read_records(keys, stored, out)
        return out

    def _read_records(self, keys: np.ndarray, stored: np.ndarray, out: Rows) -> None:
        """Scatter the records of the rows of ``keys`` that have one into ``out``."""
        on_disk = np.flatnonzero(stored)
        if on_disk.shape[0] == 0:
            return
        with READ_CLOCK:
            self._read_stored(keys, stored, on_disk, out)

    def _read_stored(self, keys: np.ndarray, stored: np.ndarray, on_disk: np.ndarray,
                     out: Rows) -> None:
        """Read the records of the rows ``keys[on_disk]`` and scatter them into ``out``."""
        t0 = time.perf_counter()
        rec_no = stored[on_disk].astype(np.int64) - 1
        order = np.argsort(rec_no, kind="stable")
        on_disk, rec_no = on_disk[order], rec_no[order]
        unit = rec_no // self._r
        units = np.unique(unit)
        step = max(1, CHUNK_BLOCKS // self._k)
        blocks = 0
        for a in range(0, units.shape[0], step):
            part = units[a : a + step]
            lo, hi = np.searchsorted(unit, (part[0], part[-1] + 1))
            recs, nb = self._read_units(part)
            blocks += nb
            got = recs[np.searchsorted(part, unit[lo:hi]), rec_no[lo:hi] % self._r]
            want = keys[on_disk[lo:hi]]
            if not np.array_equal(got["key"], want):
                bad = int(np.flatnonzero(got["key"] != want)[0])
                raise StorageError(f"{self.path}: record of row {int(want[bad])} holds row "
                                   f"{int(got['key'][bad])}: the file is corrupt")
            self._scatter(got, out, on_disk[lo:hi])
        self.counters.rows_read += int(on_disk.shape[0])
        self.counters.bytes_read += blocks * BLOCK
        self.counters.read_blocks += blocks
        self.counters.read_seconds += time.perf_counter() - t0

    @staticmethod
    def _scatter(recs: np.ndarray, out: Rows, at: np.ndarray) -> None:
        out.keys[at] = recs["key"]
        out.values[at] = recs["values"]
        assert out.meta is not None
        out.meta[at] = recs["meta"]
        for i, arr in enumerate(out.slots):
            arr[at] = recs[f"slot{i}"]

    # ------------------------------------------------------------------ streaming

    def scan(self) -> Iterator[np.ndarray]:
        """The live records (structured, see :attr:`RowLayout.dtype`), in file order: every
        unit read once, in large sequential requests; each row's latest record exactly once."""
        step = max(1, CHUNK_BLOCKS // self._k)
        for a in range(0, self._units, step):
            units = np.arange(a, min(self._units, a + step), dtype=np.int64)
            recs, nb = self._read_units(units)
            self.counters.bytes_read += nb * BLOCK
            recs = recs.reshape(-1)
            rec_no = (units[:, None] * self._r + np.arange(self._r)).reshape(-1)
            keys = recs["key"]
            ok = keys >= 0
            ok[ok] = self._loc[keys[ok]].astype(np.int64) - 1 == rec_no[ok]
            if ok.any():
                yield recs[ok].copy()

    def iter_sorted(self, chunk_rows: int = 1 << 20,
                    scratch: str | Path | None = None) -> Iterator[Rows]:
        """Every row of the shard in key order, ``chunk_rows`` keys at a time (the last chunk
        shorter), without holding the table in memory: one sequential :meth:`scan` deals the
        live records into one scratch file per chunk (in ``scratch``, default beside the tier
        file; removed afterwards), then each chunk is its rows' initial state overwritten by
        its scratch file's records. Callers overlay the rows a cache holds newer."""
        rows = self.layout.rows
        nchunks = max(1, -(-rows // chunk_rows))
        folder = Path(scratch) if scratch is not None else self.path.parent
        with tempfile.TemporaryDirectory(prefix=".embtrain-sort-", dir=folder) as tmp:
            names = [Path(tmp) / f"{i}.rec" for i in range(nchunks)]
            files = [open(n, "wb") for n in names]  # noqa: SIM115 - closed below
            try:
                for recs in self.scan():
                    bucket = recs["key"] // chunk_rows
                    order = np.argsort(bucket, kind="stable")
                    recs, bucket = recs[order], bucket[order]
                    cuts = np.flatnonzero(np.diff(bucket)) + 1
                    for part in np.split(recs, cuts):
                        part.tofile(files[int(part["key"][0]) // chunk_rows])
            finally:
                for fh in files:
                    fh.close()
            for i, name in enumerate(names):
                a, b = i * chunk_rows, min(rows, (i + 1) * chunk_rows)
                keys = np.arange(a, b, dtype=np.int64)
                out = Rows.empty(self.layout, b - a)
                initial_rows(self.layout, keys, out, np.arange(b - a))
                recs = np.fromfile(name, dtype=self._dtype)
                name.unlink()
                if recs.shape[0]:
                    self._scatter(recs, out, recs["key"] - a)
                yield out

    # ------------------------------------------------------------------ write

    def write(self, rows: Rows) -> None:
        """Store ``rows`` (unique keys) as their latest state; their older records go stale."""
        keys = self._check_keys(rows.keys)
        n = int(keys.shape[0])
        if n == 0:
            return
        if np.unique(keys).shape[0] != n:
            raise ValueError(f"{self.path}: write needs unique keys")
        t0 = time.perf_counter()
        step = max(1, CHUNK_BLOCKS // self._k) * self._r
        for a in range(0, n, step):  # compaction between chunks bounds the file's growth
            part = slice(a, min(n, a + step))
            self._forget(keys[part])
            recs_in = np.empty(part.stop - part.start, self._dtype)
            recs_in["key"] = keys[part]
            recs_in["values"] = rows.values[part]
            recs_in["meta"] = 0 if rows.meta is None else rows.meta[part]
            for i, arr in enumerate(rows.slots):
                recs_in[f"slot{i}"] = arr[part]
            self._append(recs_in)
            self._maybe_compact()
        self.counters.rows_written += n
        self.counters.write_seconds += time.perf_counter() - t0

    def _forget(self, keys: np.ndarray) -> None:
        """Mark the current records of ``keys`` stale; units left without live records are
        freed."""
        old = self._loc[keys]
        old = old[old != 0].astype(np.int64) - 1
        if old.shape[0] == 0:
            return
        units, counts = np.unique(old // self._r, return_counts=True)
        self._live[units] -= counts.astype(np.int32)
        self._free.extend(units[self._live[units] == 0].tolist())
        self._live_rows -= int(old.shape[0])
        self._loc[keys] = 0

    def _take_units(self, m: int) -> np.ndarray:
        """``m`` unit numbers to write into: free ones first (lowest first), then new ones."""
        take: list[int] = []
        if self._free:
            self._free.sort(reverse=True)
            while self._free and len(take) < m:
                take.append(self._free.pop())
        extra = m - len(take)
        if extra:
            take.extend(range(self._units, self._units + extra))
            self._units += extra
            if self._live.shape[0] < self._units:
                grown = np.zeros(max(self._units, 2 * self._live.shape[0]), np.int32)
                grown[: self._live.shape[0]] = self._live
                self._live = grown
        return np.sort(np.asarray(take, dtype=np.int64))

    def _append(self, recs_in: np.ndarray) -> None:
        step = max(1, CHUNK_BLOCKS // self._k) * self._r
        for a in range(0, int(recs_in.shape[0]), step):
            self._append_chunk(recs_in[a : a + step])

    def _append_chunk(self, recs_in: np.ndarray) -> None:
        n = int(recs_in.shape[0])
        m = -(-n // self._r)
        units = self._take_units(m)
        buf = self._buffer(m * self._k)
        buf[:] = 0
        recs = self._records(buf, m)
        recs["key"] = -1  # unused records of the last unit
        i = np.arange(n)
        recs[i // self._r, i % self._r] = recs_in
        blocks = (units[:, None] * self._k + np.arange(self._k)).reshape(-1)
        self._io.write(blocks, buf)
        self._loc[recs_in["key"]] = units[i // self._r] * self._r + i % self._r + 1
        np.add.at(self._live, units, np.minimum(self._r, n - np.arange(m) * self._r)
                  .astype(np.int32))
        self._live_rows += n
        self.counters.bytes_written += int(blocks.shape[0]) * BLOCK

    def _maybe_compact(self) -> None:
        """Rewrite the live records of the emptiest units when live units exceed
        ``COMPACT_FACTOR`` × the packed size of the live rows (plus slack)."""
        packed = -(-self._live_rows // self._r)
        occupied = self._units - len(self._free)
        limit = int(COMPACT_FACTOR * packed) + COMPACT_SLACK_UNITS
        if occupied <= limit:
            return
        target = int(1.25 * packed) + COMPACT_SLACK_UNITS // 2
        live = self._live[: self._units]
        cand = np.flatnonzero(live > 0)
        order = cand[np.argsort(live[cand], kind="stable")]
        # take the emptiest units until rewriting them brings occupied units to the target
        cum = np.cumsum(live[order])
        j = np.arange(1, order.shape[0] + 1)
        after = occupied - j + -(-cum // self._r)
        enough = np.flatnonzero(after <= target)
        count = int(enough[0]) + 1 if enough.shape[0] else order.shape[0]
        victims = np.sort(order[:count])
        step = max(1, CHUNK_BLOCKS // self._k)
        kept = []
        for a in range(0, victims.shape[0], step):
            part = victims[a : a + step]
            recs, nb = self._read_units(part)
            recs = recs.reshape(-1)
            rec_no = (part[:, None] * self._r + np.arange(self._r)).reshape(-1)
            keys = recs["key"]
            ok = keys >= 0
            ok[ok] = self._loc[keys[ok]].astype(np.int64) - 1 == rec_no[ok]
            kept.append(recs[ok].copy())
            self.counters.bytes_read += nb * BLOCK
        keep = np.concatenate(kept)
        self._live[victims] = 0
        self._live_rows -= int(keep.shape[0])
        self._loc[keep["key"]] = 0
        self._free.extend(victims.tolist())
        if keep.shape[0]:
            self._append(keep)
        self.counters.compactions += 1
        self.counters.rows_compacted += int(keep.shape[0])


def _lock(fd: int, path: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise TierFileError(f"{path}: tier file is in use by another process") from None


_DAMAGED = ("tier file header is damaged; a run rebuilds the tier from its checkpoint (it "
            "overwrites the file), or delete the file")


def _read_header(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            head = f.read(BLOCK)
    except FileNotFoundError:
        raise TierFileError(f"{path}: no tier file there") from None
    except OSError as exc:
        raise TierFileError(f"{path}: cannot read the tier file: {exc.strerror}") from None
    if not head.startswith(MAGIC):
        raise TierFileError(f"{path}: not an embtrain tier file (no header); refusing to use it")
    try:
        out = json.loads(head[len(MAGIC):].rstrip(b"\x00"))
    except ValueError:
        raise TierFileError(f"{path}: {_DAMAGED}") from None
    if not isinstance(out, dict):
        raise TierFileError(f"{path}: {_DAMAGED}")
    return out


def _check_magic(path: Path) -> None:
    """Refuse to overwrite a file that is not a tier file (an empty one is fine). A tier file
    whose header is damaged past its mark is one: it is rebuilt like a damaged body."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TierFileError(f"{path}: cannot read the tier file: {exc.strerror}") from None
    if head and not head.startswith(MAGIC):
        raise TierFileError(
            f"{path}: not an embtrain tier file (no tier-file mark in its header); refusing to "
            "overwrite it: if it is a damaged tier file, delete it and run again (the tier is "
            "rebuilt from the checkpoint), else choose another storage path")
