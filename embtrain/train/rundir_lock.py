"""One training process per run directory: an OS file lock on ``RUN_DIR/.lock``.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a file that holds the owner's pid and host. The
kernel releases it when the process exits in any way (even ``kill -9``), so a lock file left
behind by a dead process is stale by construction: the next process takes the lock and
overwrites the pid. A second process that finds the lock held is refused with one line
naming the run directory and the owner (exit 2), before it reads or writes anything there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path
from types import TracebackType

from embtrain.errors import StorageError, UserInputError, os_error_cause

LOCK_NAME = ".lock"


class RunDirBusy(UserInputError):
    """Another process is training in the run directory."""


class RunDirLock:
    """The exclusive lock of a run directory while this process trains in it."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self.stale_owner: str | None = None  # what a dead process left in the lock file

    def acquire(self) -> RunDirLock:
        """Take the lock or raise :class:`RunDirBusy`; returns ``self``."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except (FileNotFoundError, NotADirectoryError):
            raise UserInputError(f"{self.run_dir}: no such run directory") from None
        except OSError as exc:  # read-only, no permission: the environment, not the input
            raise StorageError(
                f"{self.run_dir}: cannot write in the run directory ({os_error_cause(exc)})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise RunDirBusy(
                f"{self.run_dir}: another embtrain process ({owner or 'unknown pid'}) is training "
                "in this run directory; wait for it to finish or stop it"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self.stale_owner = _read_owner(fd) or None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock up (the file stays; an unlocked file is no lock)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the last descriptor drops the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunDirLock:
        return self.acquire() if not self.held else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def _read_owner(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def lock_run_dir(run_dir: Path) -> RunDirLock:
    """Lock ``run_dir`` for this process (see the module docstring)."""
    return RunDirLock(run_dir).acquire()
