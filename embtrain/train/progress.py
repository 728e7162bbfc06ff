"""Progress display: a Rich bar on a terminal, plain timestamped lines otherwise.

Plain lines (output redirected to a file, a pipe or a scheduler's log) are written and
flushed as they happen, each with a UTC timestamp; the loss they show is the windowed mean
that ``metrics.jsonl`` records for the same step. With ``to_stderr`` (``--json``) nothing of
the display goes to stdout. :func:`announce` shows one-off lines (kernel compilation) on the
active display, or as plain lines before the display exists.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TextIO

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

_ACTIVE: StepProgress | None = None


def timestamp() -> str:
    """The current UTC time as ``2026-01-31T12:00:00Z``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def window_mean(losses: Sequence[float], log_every: int) -> float:
    """Mean of the last ``log_every`` losses: the value ``metrics.jsonl`` records as ``loss``."""
    return float(np.mean(losses[-log_every:])) if len(losses) else float("nan")


def announce(text: str, stream: TextIO | None = None) -> None:
    """Show ``text`` on the active progress display, else as a timestamped line on ``stream``.

    ``stream`` defaults to stdout; the line is flushed at once.
    """
    active = _ACTIVE
    if active is not None:
        active.note(text)
    else:
        print(f"{timestamp()} {text}", file=stream or sys.stdout, flush=True)


class StepProgress:
    """Shows steps done, samples/s, loss and ETA."""

    def __init__(
        self, total_steps: int, batch_size: int, log_every: int, interactive: bool | None = None,
        to_stderr: bool = False,
    ):
        self.total = total_steps
        self.batch_size = batch_size
        self.log_every = max(1, log_every)
        self.to_stderr = to_stderr
        self.console = Console(stderr=to_stderr, highlight=False)
        self.interactive = self.console.is_terminal if interactive is None else interactive
        self._bar: Progress | None = None
        self._task = None
        self._t0 = time.perf_counter()
        self._last_t = self._t0
        self._last_step = 0
        self._first_step: int | None = None  # steps done before this process (a resume)

    @property
    def stream(self) -> TextIO:
        """Where plain lines go: stderr with ``to_stderr``, else stdout (looked up when used)."""
        return sys.stderr if self.to_stderr else sys.stdout

    def __enter__(self) -> StepProgress:
        global _ACTIVE
        if self.interactive:
            self._bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]} samples/s"),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[detail]}"),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("train", total=self.total, rate="-", loss="-",
                                            detail="")
        self._t0 = self._last_t = time.perf_counter()
        _ACTIVE = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        if self._bar is not None:
            self._bar.__exit__(*exc)  # type: ignore[arg-type]

    def update(self, step: int, losses: Sequence[float], detail: str | None = None) -> float:
        """Record that ``step`` steps are done (``losses``: every loss so far, or the latest
        ``log_every`` of them; ``detail``: what a logged step shows after the loss, each
        label's loss and the learning rates); returns the recent samples/s."""
        now = time.perf_counter()
        if self._first_step is None:
            self._first_step = self._last_step = step - 1
        rate = (step - self._last_step) * self.batch_size / max(now - self._last_t, 1e-9)
        line = step % self.log_every == 0 or step == self.total
        if self._bar is not None:
            loss = window_mean(losses, self.log_every)
            self._bar.update(self._task, completed=step, rate=f"{rate:,.0f}", loss=f"{loss:.4f}",
                             **({"detail": detail} if detail is not None else {}))
        if line:
            if self._bar is None:
                loss = window_mean(losses, self.log_every)
                eta = (self.total - step) * (now - self._t0) / max(step - self._first_step, 1)
                print(
                    f"{timestamp()} step {step}/{self.total}  loss {loss:.4f}  "
                    + (f"{detail}  " if detail else "")
                    + f"{rate:,.0f} samples/s  eta {eta:.0f}s",
                    file=self.stream,
                    flush=True,
                )
            self._last_t, self._last_step = now, step
        return rate

    def note(self, text: str) -> None:
        """Print a line without breaking the bar (a timestamped plain line without one)."""
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(f"{timestamp()} {text}", file=self.stream, flush=True)


@contextmanager
def compile_notices(to_stderr: bool = False) -> Iterator[Any]:
    """While active, every numba compilation (a kernel not in the cache yet) is announced as
    it starts and when it ends, with its duration; yields the :class:`CompileWatch`."""
    from embtrain.kernels.watch import CompileWatch, expected_duration

    def stream() -> TextIO:
        return sys.stderr if to_stderr else sys.stdout

    def started(name: str) -> None:
        announce(f"compiling kernels, first run only: {name}{expected_duration(name)} ...",
                 stream())

    def ended(name: str, seconds: float) -> None:
        announce(f"compiled {name} in {seconds:.1f} s", stream())

    with CompileWatch(started, ended) as watch:
        yield watch
