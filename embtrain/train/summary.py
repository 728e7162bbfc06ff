"""What a run reports: its evaluations and its summary (``summary.json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EvalResult:
    """Exact metrics over an evaluation split."""

    step: int
    auc: float | None  # None when undefined (the rows hold one class): ``auc_note`` says why
    logloss: float
    rows: int
    auc_note: str | None = None


def format_auc(result: EvalResult) -> str:
    """``0.7512``, or ``undefined (…why…)``."""
    return f"{result.auc:.4f}" if result.auc is not None else f"undefined ({result.auc_note})"


@dataclass
class RunSummary:
    """What a finished run reports."""

    run_dir: str
    steps: int
    epochs: float
    seconds: float
    samples_per_s: float
    final_loss: float
    evals: list[EvalResult] = field(default_factory=list)
    best_auc: float | None = None
    processes: int = 1
    stopped: str | None = None  # "signal": stopped early by SIGTERM/SIGINT, resumable

    @property
    def last_eval(self) -> EvalResult | None:
        return self.evals[-1] if self.evals else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
