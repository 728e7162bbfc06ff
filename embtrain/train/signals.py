"""Graceful stop of a training run on SIGTERM or SIGINT.

A cluster scheduler that preempts a job sends SIGTERM and waits a grace period before
SIGKILL; a user presses Ctrl-C (SIGINT). :class:`GracefulStop` turns the first such signal
into a flag the training loop checks after each step (it then writes a checkpoint, its
metrics and summary, and the CLI exits ``128 + signal``: 143 for SIGTERM, 130 for SIGINT).
A second signal stops at once by raising :class:`StopNow` (a ``SystemExit``, so neither
``except Exception`` nor the CLI framework's Ctrl-C handling turns it into another exit code);
checkpoints are written to a temporary directory and renamed into place, so the previous
checkpoint stays intact.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from types import FrameType
from typing import Any

#: Signals that request a graceful stop.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class StopNow(SystemExit):
    """Raised by a second stop signal: leave at once with exit code ``128 + signum``."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell convention for death by this signal: ``128 + signum``."""
        return 128 + self.signum


class GracefulStop:
    """Context manager: while active, the first SIGTERM/SIGINT sets :attr:`requested`.

    Handlers are installed only in the main thread (elsewhere the manager is inert) and the
    previous handlers are restored on exit. Each signal is acknowledged with one line on stderr.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS):
        self.signals = signals
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal has arrived."""
        return self.signum is not None

    @property
    def exit_code(self) -> int | None:
        """``128 + signum`` once a signal has arrived (143 for SIGTERM, 130 for SIGINT)."""
        return None if self.signum is None else 128 + self.signum

    @property
    def signal_name(self) -> str | None:
        """``"SIGTERM"`` or ``"SIGINT"`` once a signal has arrived."""
        return None if self.signum is None else signal.Signals(self.signum).name

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            self._say(f"{name} again: stopping at once (the previous checkpoint is kept)")
            raise StopNow(signum)
        self.signum = signum
        self._say(
            f"{name}: stopping after this step and writing a checkpoint (send it again to stop "
            "at once)"
        )

    @staticmethod
    def _say(line: str) -> None:
        # A closed or busy stderr must not turn the stop into a crash.
        with contextlib.suppress(Exception):
            print(line, file=sys.stderr, flush=True)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
