"""What a run reports: its evaluations and its summary (``summary.json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EvalResult:
    """Exact metrics over an evaluation split."""

    step: int
    auc: float
    logloss: float
    rows: int


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
