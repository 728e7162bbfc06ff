"""The pipeline stage of a multi-rank step: the next batch's id exchange on a thread of its own.

While batch *t*'s dense forward and backward run on the training thread, batch *t + 1*'s ids
travel to their owners on a communication thread (:class:`Background`): the packing, the
all-to-all (a collective of purpose ``ids.ahead``, distinct from every collective of the
training thread, so the two may be in flight at once) and the unpacking into the owner's
local inputs. Only ids move: the owners' lookups of batch *t + 1* stay after batch *t*'s
update, so a row that batch *t* updates and batch *t + 1* reads is read updated, and a
pipelined run equals an unpipelined one bit for bit (``tests/test_pipeline.py``).

:class:`Ahead` is what :meth:`ShardedEmbedding.prefetch
<embtrain.embedding.sharded.ShardedEmbedding.prefetch>` stages and the forward of the same
inputs takes up; the forward joins the thread (re-raising its error, if any). When to stage
which batch is the step loop's (:mod:`embtrain.train.pipeline`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from embtrain.embedding.config import SparseInput
from embtrain.embedding.sharding.base import Pending

T = TypeVar("T")


class Background(Generic[T]):
    """``fn()`` running on a daemon thread; :meth:`result` waits for it and returns its value
    or raises its exception in the caller's thread."""

    def __init__(self, fn: Callable[[], T], name: str = "embtrain-comm"):
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to the joining thread
            self._error = exc

    def done(self) -> bool:
        """Whether ``fn`` has returned (or raised)."""
        return not self._thread.is_alive()

    def result(self) -> T:
        """``fn``'s value, once it has returned; its exception if it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class Ahead(NamedTuple):
    """The next batch's id exchange, started by ``ShardedEmbedding.prefetch`` for ``sparse``
    (this rank's inputs) and taken up by the forward of the same inputs: ``local`` the owner's
    inputs when the exchange ran in the caller's thread, else ``job`` the running exchange."""

    sparse: Mapping[str, SparseInput]
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
