"""What a run directory holds when a run stops early, and what the user can do with it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

#: The run directory's record of how many processes trained it last.
PROCESSES_FILE = "processes.json"


def record_processes(run_dir: Path, processes: int) -> None:
    """Remember that ``processes`` ranks train ``run_dir`` (written at start and each resume)."""
    path = Path(run_dir) / PROCESSES_FILE
    tmp = path.with_name(PROCESSES_FILE + ".tmp")
    tmp.write_text(json.dumps({"processes": int(processes)}) + "\n")
    os.replace(tmp, path)


def recorded_processes(run_dir: Path) -> int | None:
    """The process count ``run_dir`` was last trained with (``None``: not recorded; runs of
    older versions: the ``start`` record of its metrics)."""
    path = Path(run_dir) / PROCESSES_FILE
    try:
        value = json.loads(path.read_text())["processes"]
        return int(value) if int(value) >= 1 else None
    except (OSError, ValueError, TypeError, KeyError):
        pass
    try:
        with open(Path(run_dir) / "metrics.jsonl", encoding="utf-8") as f:
            first = json.loads(f.readline())
        return int(first["processes"]) if first.get("kind") == "start" else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def resume_command(run_dir: Path | str, processes: int = 1) -> str:
    """The exact command that continues ``run_dir`` (its process count is recorded, so
    ``--np`` is only said for clarity)."""
    return f"embtrain run --resume {run_dir}" + (f" --np {processes}" if processes > 1 else "")


def resume_hint(run_dir: Path, processes: int = 1) -> str:
    """``the last checkpoint ... is kept: resume with ...`` or that there is none."""
    from embtrain.checkpoint import latest_checkpoint

    latest = latest_checkpoint(run_dir)
    if latest is None:
        return f"{run_dir} has no checkpoint yet"
    return (f"the last checkpoint {latest.name} is kept: continue with "
            f"`{resume_command(run_dir, processes)}`")


def remove_unresumable(run_dir: Path, existed: bool) -> bool:
    """Remove what a new run wrote in ``run_dir`` when it stopped before its first checkpoint.

    Such a directory can neither be resumed (no checkpoint) nor reused (not empty). A
    directory that ``existed`` (empty) before the run is emptied, not removed. Returns whether
    anything was removed; a run with a checkpoint is left as it is.
    """
    from embtrain.checkpoint import latest_checkpoint

    run_dir = Path(run_dir)
    if not run_dir.is_dir() or latest_checkpoint(run_dir) is not None:
        return False
    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
        return True
    for child in run_dir.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    return True
