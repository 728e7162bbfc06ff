"""What a run directory holds when a run stops early, and what the user can do with it."""

from __future__ import annotations

import shutil
from pathlib import Path


def resume_hint(run_dir: Path) -> str:
    """``the last checkpoint ... is kept: resume with ...`` or that there is none."""
    from embtrain.checkpoint import latest_checkpoint

    latest = latest_checkpoint(run_dir)
    if latest is None:
        return f"{run_dir} has no checkpoint yet"
    return (f"the last checkpoint {latest.name} is kept: continue with "
            f"`embtrain run --resume {run_dir}`")


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
