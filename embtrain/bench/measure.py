"""How every side of the benchmark is measured: the same loops, clocks and memory marks.

This module imports only the standard library and numpy: the baselines that run in
environments of their own (``baseline_tfra.py``, ``baseline_fbgemm.py``, started with ``-P``
by another Python) import it from their directory, embtrain's worker as part of the package.

A baseline is measured three ways by :func:`measure_steps`: ``fused`` (the whole training step
as the framework runs it), ``timed`` (the same work in timed phases: lookup, the dense part,
the embedding backward and update) and ``embedding_only`` (lookup, backward from the last
dense gradients and update: the embedding part the bench compares).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

PHASES = ("input", "embedding_forward", "dense", "embedding_update", "communication")


def digest(arrays: Iterable[np.ndarray]) -> str:
    """A short hash of arrays' shapes, dtypes and bytes: every side reports it for its batches."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def rss_bytes() -> tuple[int, int]:
    """``(current RSS, peak RSS)`` of this process in bytes, from /proc/self/status."""
    fields = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(rest.split()[0]) * 1024
    except OSError:  # pragma: no cover - not Linux
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return peak, peak
    return fields.get("VmRSS", 0), fields.get("VmHWM", 0)


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0: ``5`` into /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class CpuShare:
    """How much of the machine's CPU went elsewhere while a side was timed.

    From /proc/stat and this process's CPU time: ``steal_pct`` is time the hypervisor gave
    to other machines, ``others_pct`` is CPU used by other processes of this machine, both
    in percent of all cores × wall time. Either one above a few percent makes timings slower.
    """

    def __init__(self) -> None:
        self.start: tuple[list[int], float] | None = None

    @staticmethod
    def _read() -> tuple[list[int], float]:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:9]
        times = os.times()
        return [int(x) for x in fields], times.user + times.system

    def begin(self, own_total: float | None = None) -> None:
        """Start of the timed steps (``own_total``: as for :meth:`end`)."""
        self._start_total = own_total or 0.0
        try:
            self.start = self._read()
        except (OSError, ValueError, IndexError):
            self.start = None

    def end(self, own_total: float | None = None) -> dict[str, float | None]:
        """Shares since :meth:`begin` (None where /proc/stat cannot be read).

        ``own_total``: CPU seconds of the whole side when it is several processes (the ranks'
        summed :func:`os.times`), so that the other ranks do not count as other processes.
        """
        if self.start is None:
            return {"steal_pct": None, "others_pct": None}
        try:
            ticks, own = self._read()
        except (OSError, ValueError, IndexError):
            return {"steal_pct": None, "others_pct": None}
        d = [b - a for a, b in zip(self.start[0], ticks, strict=True)]
        total = sum(d) or 1
        busy = total - d[3] - d[4] - d[7]
        spent = own - self.start[1] if own_total is None else own_total - self._start_total
        own_ticks = spent * os.sysconf("SC_CLK_TCK")
        return {
            "steal_pct": 100.0 * d[7] / total,
            "others_pct": max(0.0, 100.0 * (busy - own_ticks) / total),
        }


class MemoryMarks:
    """RSS figures of a side: after building, at the end of warm-up, during the timed steps."""

    def __init__(self) -> None:
        self.marks: dict[str, int | None] = {}

    def built(self) -> None:
        """Right after the tables, model and optimizers exist."""
        self.marks["built_rss_bytes"], self.marks["built_peak_rss_bytes"] = rss_bytes()

    def warmed_up(self) -> None:
        """After the warm-up steps: record the peak so far, then reset it for the timed steps."""
        self.marks["warmup_peak_rss_bytes"] = rss_bytes()[1]
        self.marks["timed_reset"] = int(reset_peak_rss())

    def finished(self) -> None:
        """After the timed steps, before anything is freed."""
        current, peak = rss_bytes()
        self.marks["end_rss_bytes"] = current
        self.marks["timed_peak_rss_bytes"] = peak if self.marks.get("timed_reset") else None

    def whole_run_peak(self) -> int:
        """The peak over the whole run: VmHWM was reset after warm-up, so the larger of the
        peak up to then and the peak since."""
        return max(rss_bytes()[1], int(self.marks.get("warmup_peak_rss_bytes") or 0))


class PhaseLog:
    """Per-phase seconds of every timed step."""

    def __init__(self) -> None:
        self.phases: dict[str, list[float]] = {p: [] for p in PHASES}
        self.step: list[float] = []
        #: seconds the pipeline's communication thread spent inside collectives while the
        #: step computed (not part of the step's time; several ranks only)
        self.hidden: list[float] = []
        #: the share of the step's lookup in dynamic tables done by the look-ahead's thread
        #: while the step before computed (one rank only)
        self.lookup_ahead: list[float] = []

    def add(self, times: dict[str, float], step: float | None = None) -> None:
        """Record one step's phases; ``step`` defaults to their sum."""
        for name in PHASES:
            self.phases[name].append(float(times.get(name, 0.0)))
        self.step.append(float(step) if step is not None else sum(times.values()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the per-step lists."""
        out: dict[str, Any] = {"phases": self.phases, "step": self.step}
        if any(self.hidden):
            out["hidden_communication"] = self.hidden
        if self.lookup_ahead:
            out["lookup_ahead_share"] = self.lookup_ahead
        return out


def check_loss(loss: float, side: str, step: int, run: str = "step") -> None:
    """Stop a side whose loss is no longer finite, naming the step (``run``: which loop)."""
    if not np.isfinite(loss):
        raise FloatingPointError(f"{side}: loss became {loss} at {run} {step}")


#: one batch as a side feeds it to its steps: ``(ids, dense, labels)``
Fed = tuple[Any, Any, Any]


def measure_steps(
    side: str,
    inputs: Callable[[int], Fed],
    count: int,
    warmup: int,
    steps: int,
    step: Callable[[Any, Any, Any], Any],
    phased_step: Callable[[Any, Any, Any], tuple[Any, dict[str, float], Any]],
    embedding_step: Callable[[Any, Any, Any], Any],
) -> dict[str, Any]:
    """Measure a baseline built just now, three ways, each ``warmup`` steps then ``steps`` timed,
    on batch ``s % count`` at step ``s`` (``inputs(k)``: that batch as the side feeds it):

    * ``step(ids, dense, labels)``: one whole training step, its loss (``fused``);
    * ``phased_step(ids, dense, labels)``: the same in phases: ``(loss, {phase: seconds},
      d(loss)/d(pooled))`` (``timed``; :data:`PHASES` but ``input``, timed here);
    * ``embedding_step(ids, dense, grads)``: lookup, backward from the last phased step's
      gradients and update (``embedding_only``).

    Returns those with the losses, the memory marks (:class:`MemoryMarks`; the built one
    taken on entry), ``peak_rss_bytes`` over the whole run and the CPU shares of the timed
    fused steps onward (:class:`CpuShare`)."""
    memory = MemoryMarks()
    memory.built()
    cpu = CpuShare()
    fused = PhaseLog()
    losses: list[float] = []
    for s in range(warmup + steps):
        if s == warmup:
            memory.warmed_up()
            cpu.begin()
        t0 = time.perf_counter()
        ids, dense, labels = inputs(s % count)
        t1 = time.perf_counter()
        loss = float(step(ids, dense, labels))
        t2 = time.perf_counter()
        check_loss(loss, side, s)
        losses.append(loss)
        if s >= warmup:
            fused.add({"input": t1 - t0}, step=t2 - t0)
    phased = PhaseLog()
    grads: Any = None
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        ids, dense, labels = inputs(s % count)
        t1 = time.perf_counter()
        loss, times, grads = phased_step(ids, dense, labels)
        check_loss(float(loss), side, s, "phased step")
        if s >= warmup:
            phased.add({"input": t1 - t0, **times})
    embedding_only = []
    for s in range(warmup + steps):
        ids, dense, _labels = inputs(s % count)
        t0 = time.perf_counter()
        embedding_step(ids, dense, grads)
        if s >= warmup:
            embedding_only.append(time.perf_counter() - t0)
    memory.finished()
    return {
        "losses": losses,
        "embedding_only": embedding_only,
        "timed": phased.to_dict(),
        "fused": fused.to_dict(),
        "peak_rss_bytes": memory.whole_run_peak(),
        **memory.marks,
        **cpu.end(),
    }


def child_main(name: str, args: list[str], check_spec: Callable[[dict[str, Any]], None],
               run: Callable[[dict[str, Any]], dict[str, Any]], usage: str) -> int:
    """The entry of a baseline child started as ``NAME SPEC.json``: the spec checked (a missing
    file, bad JSON or a bad spec: one line, exit 2) before anything heavy is imported, run,
    and its report written as JSON to ``spec['out']``."""
    if len(args) != 1:
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(args[0]).read_text())
        check_spec(spec)
    except (OSError, ValueError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    Path(spec["out"]).write_text(json.dumps(run(spec)))
    return 0
