"""Temporary directories of bundle writers (`dump`, exports, increments): named by owner, swept
when their owner is dead.

A writer builds ``PARENT/.tmp-<name>-<pid>-<hex>@<host>`` and renames it into place. A writer
stopped by SIGTERM or Ctrl-C removes it on the way out (`cli/dump.py` turns SIGTERM into an
exit that runs the clean-up); one killed with SIGKILL cannot, so every later write into the
same PARENT removes the temporaries whose owner is a process of this host that no longer
exists. Temporaries of another host (a shared file system) or of a live process are left alone;
checkpoints' own temporaries (``.tmp-step-N``, without an owner) are the checkpoint manager's.
`predict`'s disk-tier scratch directories (``.embtrain-predict-tiers-<pid>-<hex>@<host>``) are
named and swept the same way (:func:`make_owned_dir`, ``sweep_dead(parent, prefix)``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
from pathlib import Path

from embtrain.checkpoint.bundle_format import TMP_PREFIX


def _owned(prefix: str) -> re.Pattern[str]:
    return re.compile(r"^" + re.escape(prefix) + r".*-(\d+)-[0-9a-f]+@(.+)$")


def owned_name(dest_name: str, prefix: str = TMP_PREFIX) -> str:
    """The temporary name of a bundle written to ``dest_name`` by this process."""
    return f"{prefix}{dest_name}-{os.getpid()}-{secrets.token_hex(3)}@{socket.gethostname()}"


def make_owned_dir(parent: Path, prefix: str) -> Path:
    """A new directory ``parent/<prefix><pid>-<hex>@<host>`` of this process, after removing
    those of ``prefix`` in ``parent`` whose owner is dead."""
    sweep_dead(parent, prefix)
    while True:
        path = Path(parent) / owned_name("", prefix)
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def sweep_dead(parent: Path, prefix: str = TMP_PREFIX) -> list[Path]:
    """Remove ``parent``'s temporaries (named ``prefix…``) whose owner (a process of this host)
    is dead."""
    removed: list[Path] = []
    owned = _owned(prefix)
    host = socket.gethostname()
    try:
        children = list(Path(parent).iterdir())
    except OSError:
        return removed
    for child in children:
        match = owned.match(child.name)
        if (match is None or match.group(2) != host or int(match.group(1)) == os.getpid()
                or _alive(int(match.group(1))) or not child.is_dir() or child.is_symlink()):
            continue
        shutil.rmtree(child, ignore_errors=True)
        removed.append(child)
    return removed


def remove_own(parent: Path, prefix: str) -> None:
    """Remove ``parent``'s directories named ``prefix…`` that this process owns: also the one
    whose creation a signal interrupted before its caller learned its name."""
    owned = _owned(prefix)
    host, pid = socket.gethostname(), os.getpid()
    try:
        children = list(Path(parent).iterdir())
    except OSError:
        return
    for child in children:
        match = owned.match(child.name)
        if (match is not None and match.group(2) == host and int(match.group(1)) == pid
                and child.is_dir() and not child.is_symlink()):
            shutil.rmtree(child, ignore_errors=True)
