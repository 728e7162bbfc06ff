"""The pipeline stage of a multi-rank step: the next batch's id exchange on a thread of its own.

While batch *t*'s dense forward and backward run on the training thread, batch *t + 1*'s ids
travel to their owners on a communication thread (:class:`Background`; one thread, kept): the packing, the
all-to-all (a Horovod collective named ``ids.ahead``, distinct from every collective of the
training thread, so the two may be in flight at once) and the unpacking into the owner's
local inputs. Only ids move: the owners' lookups of batch *t + 1* stay after batch *t*'s
update, so a row that batch *t* updates and batch *t + 1* reads is read updated, and a
pipelined run equals an unpipelined one bit for bit (``tests/test_pipeline.py``).

:class:`Ahead` is what :meth:`ShardedEmbedding.prefetch
<embtrain.embedding.sharded.ShardedEmbedding.prefetch>` returns and the forward of that
batch takes as ``ahead=``; the forward joins the thread (re-raising its error, if any).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from embtrain.embedding.config import SparseInput
from embtrain.embedding.sharding.base import Pending

T = TypeVar("T")


class _Worker:
    """A daemon thread running the calls handed to it, one at a time, in order."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self._calls.get()()

    def submit(self, call: Callable[[], None]) -> None:
        self._calls.put(call)


_WORKERS: dict[str, _Worker] = {}
_WORKERS_LOCK = threading.Lock()


def _worker(name: str) -> _Worker:
    """The process's worker thread called ``name``, started on first use and then kept (a
    thread started per step cost ~9 % of a 2-rank quickstart step on 2 busy cores: starting
    one waits until the scheduler runs it). A forked child starts its own."""
    with _WORKERS_LOCK:
        worker = _WORKERS.get(name)
        if worker is None or not worker.thread.is_alive():
            worker = _WORKERS[name] = _Worker(name)
        return worker


class Background(Generic[T]):
    """``fn()`` running on the communication thread (one per process, kept between steps;
    jobs run in the order they are started); :meth:`result` waits for it and returns its
    value or raises its exception in the caller's thread."""

    def __init__(self, fn: Callable[[], T], name: str = "embtrain-comm"):
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()
        _worker(name).submit(self._run)

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to the joining thread
            self._error = exc
        finally:
            self._finished.set()

    def done(self) -> bool:
        """Whether ``fn`` has returned (or raised)."""
        return self._finished.is_set()

    def result(self) -> T:
        """``fn``'s value, once it has returned; its exception if it raised."""
        self._finished.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class Ahead(NamedTuple):
    """The next batch's id exchange, started by ``ShardedEmbedding.prefetch`` and handed to
    that batch's forward: ``local`` the owner's inputs when the exchange ran in the caller's
    thread, else ``job`` the running exchange."""

    size: int
    pending: Pending
    local: dict[str, SparseInput] | None
    job: Background[dict[str, SparseInput]] | None = None

    def inputs(self) -> dict[str, SparseInput]:
        """The owner's local inputs of the batch (waits for a background exchange)."""
        if self.job is not None:
            return self.job.result()
        assert self.local is not None
        return self.local


def settle(ahead: Any) -> None:
    """Wait for ``ahead``'s exchange, if one is running (an :class:`Ahead` or None)."""
    if isinstance(ahead, Ahead) and ahead.job is not None:
        ahead.job.result()


__all__ = ["Ahead", "Background", "settle"]
