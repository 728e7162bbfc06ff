"""A resume reads the data its run trained on: the check against the checkpoint's fingerprint.

The fingerprint itself (:func:`embtrain.data.fingerprint.data_fingerprint`) is the data
layer's; the run records it in each checkpoint's state (``extra.data``), and this module,
above both, compares.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from embtrain.checkpoint import find_checkpoint, latest_checkpoint, open_bundle
from embtrain.checkpoint.bundle import read_json_member
from embtrain.checkpoint.manager import STATE
from embtrain.data.fingerprint import describe_change
from embtrain.errors import UserInputError


def check_resume_data(run_dir: Path, from_step: int | None, now: dict[str, Any],
                      allow: bool) -> None:
    """Compare the data now with the fingerprint in the checkpoint a resume starts from.

    A difference is one line and exit 2, or (``allow``) a warning on stderr. Checkpoints
    written before fingerprints were recorded are not checked.
    """
    if from_step is None and latest_checkpoint(run_dir) is None:  # killed before its first
        from embtrain.train.rundir import start_over_hint

        raise UserInputError(f"{run_dir}: no complete checkpoint in "
                             f"{Path(run_dir) / 'checkpoints'}; {start_over_hint(run_dir)}")
    path = find_checkpoint(run_dir, from_step)
    bundle = open_bundle(path, kinds=("checkpoint",))
    if STATE not in bundle.files:
        return
    then = (read_json_member(bundle, STATE).get("extra") or {}).get("data")
    if not isinstance(then, dict):
        return
    change = describe_change(then, now)
    if change is None:
        return
    if allow:
        print(f"warning: {change} since {path.name}; continuing (--allow data): the resumed "
              "run is not the one an uninterrupted run would give", file=sys.stderr)
        return
    raise UserInputError(
        f"{run_dir}: {change} since {path.name}; the resume would not continue exactly: "
        "restore the data, or pass --allow data"
    )
