"""The next step's keys looked up ahead: the pipeline stage's part of the key → row phase.

One process trains step ``t``'s dense network for most of a step (hundreds of ms on DE
tiny) while the embedding engine waits. The hash-table lookup of step ``t + 1``'s keys
(:func:`~embtrain.kernels.dynamic.lookup_group`, read-only on the tables' indexes) does not
depend on anything step ``t`` still computes, so :class:`Lookahead` runs it then, on a thread
of its own (the kernel releases the GIL), into row buffers of its own.

That thread takes only what the step leaves: it runs at idle priority (Linux ``SCHED_IDLE``)
with one kernel thread, so the dense network's threads keep their cores (on 2 cores a look-up
at normal priority slowed the dense part by more than the lookup costs: each of its parallel
ops waits for its slowest thread). It runs one resumable kernel
(:func:`~embtrain.kernels.dynamic.lookup_items`) that stops between chunks of keys when asked
(so the thread holds the GIL only to enter and leave it); :meth:`Lookahead.finish` stops it
and looks the rest up in the caller, in parallel. So a look-ahead costs the step about
what the lookup it replaces cost at most, and hides what the idle cycles allow.

The result is used only when it is exactly what the synchronous lookup would give: the same
key arrays (held here, so their memory stays theirs) and every table's index unchanged since
the lookup started (:meth:`~embtrain.embedding.dynamic.DynamicTable.index_state`: a counter
of the index's changes, its free rows and the index array itself). A TTL expiry at the step
boundary, a restore or an evaluation in between changes it, and the forward looks the keys
up again. So rows, values and every counter are the same bits with or without it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np

__all__ = ["Lookahead", "same_arrays"]


def _identity(a: np.ndarray) -> tuple[Any, ...]:
    return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)


def same_arrays(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    """Whether ``a`` and ``b`` are views of the same memory, array by array (same address,
    shape, strides and dtype)."""
    return len(a) == len(b) and all(_identity(x) == _identity(y) for x, y in zip(a, b,
                                                                                 strict=True))


def _idle_priority() -> None:
    """This thread at idle priority (it runs when a core has nothing else to do), where the
    OS has it; one kernel thread (numba's count is per thread)."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
    numba.set_num_threads(1)


class Lookahead:
    """One step's keys looked up on a thread, resumably: ``lookup(stop)`` looks up the work
    items (chunks of keys) not done yet until ``stop[0]`` is set, and returns how many are
    done in all (of ``items``); it fills ``outs`` (each feature's rows, -1 where the key has
    none), and ``misses()`` then gives each feature's missed positions. ``states``: the
    tables' index states when it started."""

    def __init__(self, keys: Sequence[np.ndarray], outs: list[np.ndarray],
                 states: list[tuple[int, ...]], items: int,
                 lookup: Callable[[np.ndarray], int], misses: Callable[[], np.ndarray]):
        self.keys = list(keys)
        self.misses = misses
        self.outs = outs
        self.states = states
        self.items = items
        self.hidden_items = 0  # items its thread looked up
        self._lookup = lookup
        self._stop = np.zeros(1, dtype=np.uint8)  # read by the kernel between items
        self._failed = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="embtrain-lookahead")
        self._thread.start()

    def _run(self) -> None:
        try:
            _idle_priority()
            self.hidden_items = int(self._lookup(self._stop))
        except BaseException:  # the forward looks the keys up itself (see usable())
            self._failed = True

    def stop(self) -> None:
        """Stop after the item being looked up and wait for the thread."""
        self._stop[0] = 1
        self._thread.join()

    def finish(self) -> None:
        """:meth:`stop`, then the items the thread did not reach, in the caller (with its
        kernel threads): every feature's rows are then in ``outs`` unless it failed."""
        self.stop()
        if not self._failed and self.hidden_items < self.items:
            self._lookup(np.zeros(1, dtype=np.uint8))

    def usable(self, keys: Sequence[np.ndarray], states: list[tuple[int, ...]]) -> bool:
        """Whether the result is (after :meth:`finish`) what a lookup of ``keys`` now
        gives."""
        return not self._failed and same_arrays(keys, self.keys) and states == self.states
