"""A finished run stays finished: resuming it says so and changes nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from embtrain.train.summary import EvalResult, RunSummary


def finished_summary(run_dir: Path, total_steps: int) -> RunSummary | None:
    """The stored :class:`~embtrain.train.summary.RunSummary` when ``run_dir`` finished its steps.

    Finished: ``summary.json`` says ``total_steps`` steps and the latest checkpoint is at that
    step (its manifest is checked: a damaged one is refused). Then a note goes to stderr and the caller returns the summary without touching the
    run; ``None`` otherwise (the run continues from its latest checkpoint).
    """
    from embtrain.checkpoint import list_checkpoints, open_bundle
    from embtrain.checkpoint.bundle import check_content_fingerprint

    path = Path(run_dir) / "summary.json"
    found = list_checkpoints(run_dir)
    if not path.is_file() or not found or found[-1][0] != total_steps:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if int(data["steps"]) != total_steps:
            return None
        data["evals"] = [EvalResult(**e) for e in data.get("evals", [])]
        summary = RunSummary(**data)
    except (OSError, ValueError, TypeError, KeyError):
        return None  # not a summary this version wrote: continue as a resume would
    # the final checkpoint must still be sound (cheap: sizes and the manifest's fingerprint)
    check_content_fingerprint(open_bundle(found[-1][1], kinds=("checkpoint",)))
    print(f"note: {run_dir} finished at step {total_steps}; nothing to resume (nothing "
          "changed; --from-step N trains again from an earlier checkpoint)", file=sys.stderr)
    return summary
