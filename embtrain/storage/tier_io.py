"""Background reads and write-backs of a disk tier, overlapped with the training step.

The cache (the key → slot table) calls, per step::

    ticket = tier.prefetch(rows_step_t_plus_1_misses)   # while step t computes
    ...
    rows = tier.wait(ticket)                            # at step t + 1: usually ready
    tier.write_back(evicted_rows)                       # async

One coordinator thread runs the jobs in the order they were submitted, each with the file's
``depth`` I/O threads, so a write-back is on disk before any read submitted after it (of the
same row or not), and a read never sees a half-written row. :meth:`TierIO.read` (a demand
miss) is a prefetch followed by a wait. Errors of a background job are raised by the next
:meth:`wait` or :meth:`flush`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from embtrain.storage.disk import RowFile, Rows


@dataclass
class TierStats:
    """Counters of a tier since it was opened (or since :meth:`TierIO.take_stats`)."""

    hits: int = 0
    misses: int = 0
    rows_read: int = 0
    rows_initialized: int = 0
    rows_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    io_seconds: float = 0.0
    wait_seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (1.0 when there were none)."""
        total = self.hits + self.misses
        return self.hits / total if total else 1.0

    def minus(self, other: TierStats) -> TierStats:
        """The counts since ``other`` was taken."""
        return TierStats(**{k: getattr(self, k) - getattr(other, k) for k in self.__dict__})

    def to_dict(self) -> dict[str, float]:
        """A JSON-ready mapping, with the hit rate."""
        return {**self.__dict__, "hit_rate": self.hit_rate}


class Ticket:
    """A submitted read: :meth:`TierIO.wait` returns its rows."""

    __slots__ = ("_done", "_error", "_rows", "keys")

    def __init__(self, keys: np.ndarray):
        self.keys = keys
        self._done = threading.Event()
        self._rows: Rows | None = None
        self._error: BaseException | None = None

    @property
    def ready(self) -> bool:
        """Whether the rows are in memory."""
        return self._done.is_set()


_STOP = object()


class TierIO:
    """Ordered background reads and write-backs of one :class:`RowFile`."""

    def __init__(self, file: RowFile):
        self.file = file
        self._jobs: queue.Queue[object] = queue.Queue()
        self._stats = TierStats()
        self._taken = TierStats()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="embtrain-tier", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the cache's API

    def prefetch(self, keys: np.ndarray, out: Rows | None = None) -> Ticket:
        """Start reading rows ``keys`` (into ``out`` if given: ``len(keys)`` rows) after every
        job submitted before."""
        ticket = Ticket(np.ascontiguousarray(keys, dtype=np.int64).reshape(-1))
        self._submit(lambda: self._read_job(ticket, out))
        return ticket

    def wait(self, ticket: Ticket) -> Rows:
        """The rows of ``ticket``; the time spent blocked counts as I/O wait."""
        if not ticket.ready:
            t0 = time.perf_counter()
            ticket._done.wait()
            with self._lock:
                self._stats.wait_seconds += time.perf_counter() - t0
        self._raise()
        if ticket._error is not None:
            raise ticket._error
        assert ticket._rows is not None
        return ticket._rows

    def read(self, keys: np.ndarray, out: Rows | None = None) -> Rows:
        """Rows ``keys`` now (a demand miss), in order after the submitted jobs."""
        return self.wait(self.prefetch(keys, out))

    def write_back(self, rows: Rows) -> None:
        """Store ``rows`` (unique keys) in the background; the arrays now belong to the tier
        (the caller must not change them). Any read submitted later sees them."""
        self._submit(lambda: self._write_job(rows))

    def count(self, hits: int, misses: int) -> None:
        """Record the cache's lookups of a step."""
        with self._lock:
            self._stats.hits += int(hits)
            self._stats.misses += int(misses)

    def flush(self) -> None:
        """Wait until every submitted job is done (e.g. before a checkpoint reads the file)."""
        t0 = time.perf_counter()
        with self._idle:
            while self._pending:
                self._idle.wait()
            self._stats.wait_seconds += time.perf_counter() - t0
        self._raise()

    def stats(self) -> TierStats:
        """A snapshot of the counters since the start."""
        with self._lock:
            return TierStats(**self._stats.__dict__)

    def take_stats(self) -> TierStats:
        """The counters since the last call (per step)."""
        now = self.stats()
        out, self._taken = now.minus(self._taken), now
        return out

    def close(self) -> None:
        """Finish the submitted jobs, stop the thread and close the file cleanly."""
        try:
            self.flush()
        finally:
            self._jobs.put(_STOP)
            self._thread.join()
            try:
                self.file.close()
            except OSError as exc:
                raise _with_path(exc, self.file.path) from None

    # ------------------------------------------------------------------ the thread

    def _submit(self, job: Callable[[], None]) -> None:
        self._raise()
        with self._lock:
            self._pending += 1
        self._jobs.put(job)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _read_job(self, ticket: Ticket, out: Rows | None) -> None:
        try:
            ticket._rows = self._timed(lambda: self.file.read(ticket.keys, out))
        except BaseException as exc:  # handed to the waiter
            ticket._error = exc
        finally:
            ticket._done.set()

    def _write_job(self, rows: Rows) -> None:
        self._timed(lambda: self.file.write(rows))

    def _timed(self, fn: Callable[[], Rows | None]) -> Rows | None:
        c = self.file.counters
        before = (c.rows_read, c.rows_initialized, c.rows_written, c.bytes_read,
                  c.bytes_written)
        t0 = time.perf_counter()
        try:
            return fn()
        except OSError as exc:  # disk full, I/O error: name the file (the one line says it)
            raise _with_path(exc, self.file.path) from None
        finally:
            dt = time.perf_counter() - t0
            with self._lock:
                s = self._stats
                s.rows_read += c.rows_read - before[0]
                s.rows_initialized += c.rows_initialized - before[1]
                s.rows_written += c.rows_written - before[2]
                s.bytes_read += c.bytes_read - before[3]
                s.bytes_written += c.bytes_written - before[4]
                s.io_seconds += dt

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            try:
                job()  # type: ignore[operator]
            except BaseException as exc:  # raised by the next wait, flush or submit
                self._error = exc
            finally:
                with self._idle:
                    self._pending -= 1
                    if not self._pending:
                        self._idle.notify_all()


def _with_path(exc: OSError, path: object) -> OSError:
    """``exc`` naming ``path`` when it names no file (the raw I/O calls work on descriptors)."""
    if exc.filename is not None:
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), str(path))
