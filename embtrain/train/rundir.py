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


def start_over_hint(run_dir: Path) -> str:
    """How to start a run over whose directory holds no complete checkpoint (killed before
    its first): its own recipe into a new directory, or the same one once removed."""
    recipe = Path(run_dir) / "recipe.yaml"
    again = (f"`embtrain run {recipe} --run-dir NEW_DIR`" if recipe.is_file()
             else "`embtrain run RECIPE --run-dir NEW_DIR`")
    return (f"it stopped before its first checkpoint, so nothing can be resumed: start over "
            f"with {again}, or remove it (`rm -r {run_dir}`) and run again")


def occupied_hint(run_dir: Path) -> str:
    """What to do about a non-empty ``--run-dir``: resume the run it holds, start that run
    over, or choose another directory."""
    from embtrain.checkpoint import latest_checkpoint

    run_dir = Path(run_dir)
    if latest_checkpoint(run_dir) is not None:
        return (f"it holds a run: continue it with `{resume_command(run_dir)}`, or choose "
                "another --run-dir")
    if (run_dir / "recipe.yaml").is_file() or (run_dir / "metrics.jsonl").is_file():
        return "it holds a run that " + start_over_hint(run_dir).removeprefix("it ")
    return "choose another --run-dir"


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
