"""Notice numba compiling a kernel (a cache miss) while it happens.

Kernels are compiled once and cached (:mod:`embtrain.kernels.numba_cache`; ``scripts/bootstrap.sh``
warms the cache). Whatever still compiles at run time takes seconds to minutes with nothing
else happening, so :class:`CompileWatch` reports each top-level compilation as it starts and
ends (with its duration) through callbacks: ``embtrain run`` shows them on its progress
display. Loads from the on-disk cache are not compilations and are not reported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from numba.core import event

#: CPU seconds one specialisation of the largest kernels takes to compile on one core of an
#: Intel Xeon with AVX-512, fewest to most (float32 tables; half tables, with half optimizer
#: state the most): ``python -m embtrain.cli.warm``'s units, 2026-11-27. What a first-use
#: notice says to expect; the other kernels compile in seconds.
COMPILE_CPU_SECONDS = {"pool_forward": (90.0, 95.0), "backward_update": (165.0, 385.0)}


def expected_duration(name: str) -> str:
    """``" (about N min)"`` or ``" (about N-M min)"`` for a kernel of
    :data:`COMPILE_CPU_SECONDS`, else ``""``."""
    if name not in COMPILE_CPU_SECONDS:
        return ""
    low, high = (max(1, round(s / 60)) for s in COMPILE_CPU_SECONDS[name])
    return f" (about {low} min)" if low == high else f" (about {low}-{high} min)"


def _kernel_name(data: Any) -> str:
    dispatcher = (data or {}).get("dispatcher")
    py_func = getattr(dispatcher, "py_func", None)
    return getattr(py_func, "__name__", None) or str(dispatcher)


def _is_ours(data: Any) -> bool:
    """Whether the compiled function is one of embtrain's kernels (including the cached
    twins of numba's typed-list helpers, :mod:`embtrain.kernels.typed_lists`), not one of
    numba's own helpers."""
    py_func = getattr((data or {}).get("dispatcher"), "py_func", None)
    return str(getattr(py_func, "__module__", "")).startswith("embtrain.")


class _Listener(event.Listener):
    def __init__(self, watch: CompileWatch):
        self.watch = watch

    def on_start(self, ev: event.Event) -> None:
        self.watch._started(ev)

    def on_end(self, ev: event.Event) -> None:
        self.watch._ended(ev)


class CompileWatch:
    """Context manager: calls ``on_start(name)`` and ``on_end(name, seconds)`` around every
    top-level compilation of an embtrain kernel (nested ones, a kernel's callees, count
    toward their caller; numba's own uncacheable helpers are left out).

    ``compiled`` lists ``(name, seconds)`` of the compilations seen; ``seconds`` is their total;
    ``cpu_seconds`` the CPU time they took (numba compiles in the calling thread): unlike the
    wall time, it does not grow when other processes share the cores.
    """

    def __init__(
        self,
        on_start: Callable[[str], None] | None = None,
        on_end: Callable[[str, float], None] | None = None,
    ):
        self.on_start = on_start
        self.on_end = on_end
        self.compiled: list[tuple[str, float]] = []
        self.cpu_seconds = 0.0
        self._local = threading.local()
        self._listener = _Listener(self)

    @property
    def seconds(self) -> float:
        """Total seconds spent compiling while watched."""
        return sum(s for _, s in self.compiled)

    def _started(self, ev: event.Event) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.t0 = time.perf_counter()
            self._local.c0 = time.thread_time()
            self._local.ours = _is_ours(ev.data)
            if self._local.ours and self.on_start is not None:
                self.on_start(_kernel_name(ev.data))

    def _ended(self, ev: event.Event) -> None:
        depth = max(getattr(self._local, "depth", 1) - 1, 0)
        self._local.depth = depth
        if depth == 0 and getattr(self._local, "ours", False):
            name, seconds = _kernel_name(ev.data), time.perf_counter() - self._local.t0
            self.cpu_seconds += time.thread_time() - self._local.c0
            self.compiled.append((name, seconds))
            if self.on_end is not None:
                self.on_end(name, seconds)

    def __enter__(self) -> CompileWatch:
        event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc: object) -> None:
        event.unregister("numba:compile", self._listener)
