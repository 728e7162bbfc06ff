"""A data set appears whole or not at all: `gen-data` writes into a temporary directory beside
``OUT`` and publishes it with renames, under a lock that one writer per ``OUT`` holds.

- Lock: ``flock`` on ``.<OUT name>.gen-data.lock`` beside ``OUT`` (the kernel drops it when the
  process dies in any way; a second writer is refused with one line, exit 2).
- Temporary: ``.<OUT name>.gen-data-tmp-<pid>`` beside ``OUT`` (same file system, so the
  publish is a rename). A writer killed before the publish leaves only this hidden directory;
  the next writer for the same ``OUT`` removes it (under the lock, every temporary of that
  ``OUT`` belongs to a dead writer).
- Publish: a new or empty ``OUT`` is replaced by the temporary directory in one ``rename``. With
  ``--overwrite`` into a non-empty ``OUT``, its ``dataset.json`` (the mark of a complete data
  set) goes first, then ``train/`` and ``eval/`` are swapped, then the new ``dataset.json`` is
  renamed in last: at no moment is there a ``dataset.json`` beside a partial data set.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from embtrain.errors import StorageError, UserInputError, os_error_cause

SPLITS = ("train", "eval")


def _lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.gen-data.lock"


def _tmp_prefix(out: Path) -> str:
    return f".{out.name}.gen-data-tmp-"


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold the lock of ``out`` (refused at once, exit 2, when another writer holds it)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(_lock_path(out), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # read-only, a file in the way: the environment, exit 1
        raise StorageError(f"{out}: cannot write the data set there: {os_error_cause(exc)}"
                           ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 100, 0).decode("utf-8", "replace").strip() or "unknown pid"
            raise UserInputError(
                f"{out}: another gen-data ({owner}) is writing this data set; wait for it "
                "to finish or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # drops the flock


def sweep(out: Path) -> list[Path]:
    """Remove temporaries of ``out`` left by killed writers (call with the lock held)."""
    removed = []
    if out.parent.is_dir():
        for child in out.parent.iterdir():
            if child.name.startswith(_tmp_prefix(out)) and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed


def temporary(out: Path) -> Path:
    """A fresh temporary directory for ``out`` (beside it)."""
    tmp = out.parent / f"{_tmp_prefix(out)}{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: Path, out: Path) -> None:
    """Move the complete data set in ``tmp`` to ``out`` (see the module docstring)."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        os.replace(tmp, out)  # rename(2) replaces an empty directory
        return
    (out / "dataset.json").unlink(missing_ok=True)
    for split in SPLITS:
        new, old = tmp / split, out / split
        aside = tmp / f"{split}.old"
        if old.exists():
            os.replace(old, aside)
        if new.exists():
            os.replace(new, old)
    os.replace(tmp / "dataset.json", out / "dataset.json")
    shutil.rmtree(tmp, ignore_errors=True)
