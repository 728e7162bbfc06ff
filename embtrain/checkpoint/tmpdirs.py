"""Temporary directories of bundle writers (`dump`, exports, increments): named by owner, swept
when their owner is dead.

A writer builds ``PARENT/.tmp-<name>-<pid>-<hex>@<host>`` and renames it into place. A writer
stopped by SIGTERM or Ctrl-C removes it on the way out (`cli/dump.py` turns SIGTERM into an
exit that runs the clean-up); one killed with SIGKILL cannot, so every later write into the
same PARENT removes the temporaries whose owner is a process of this host that no longer
exists. Temporaries of another host (a shared file system) or of a live process are left alone;
checkpoints' own temporaries (``.tmp-step-N``, without an owner) are the checkpoint manager's.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
from pathlib import Path

from embtrain.checkpoint.bundle_format import TMP_PREFIX

_OWNED = re.compile(r"^" + re.escape(TMP_PREFIX) + r".*-(\d+)-[0-9a-f]+@(.+)$")


def owned_name(dest_name: str) -> str:
    """The temporary name of a bundle written to ``dest_name`` by this process."""
    return f"{TMP_PREFIX}{dest_name}-{os.getpid()}-{secrets.token_hex(3)}@{socket.gethostname()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def sweep_dead(parent: Path) -> list[Path]:
    """Remove ``parent``'s temporaries whose owner (a process of this host) is dead."""
    removed: list[Path] = []
    host = socket.gethostname()
    try:
        children = list(Path(parent).iterdir())
    except OSError:
        return removed
    for child in children:
        match = _OWNED.match(child.name)
        if (match is None or match.group(2) != host or int(match.group(1)) == os.getpid()
                or _alive(int(match.group(1))) or not child.is_dir() or child.is_symlink()):
            continue
        shutil.rmtree(child, ignore_errors=True)
        removed.append(child)
    return removed
