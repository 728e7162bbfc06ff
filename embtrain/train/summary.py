"""What a run reports: its evaluations and its summary (``summary.json``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class EvalResult:
    """Exact metrics over an evaluation split."""

    step: int
    auc: float | None  # None when undefined (the rows hold one class): ``auc_note`` says why
    logloss: float
    rows: int
    auc_note: str | None = None
    labels: dict[str, dict[str, float | None]] | None = None  # per label with data.labels

    def record(self) -> dict[str, Any]:
        """The metrics.jsonl record (no ``labels`` key for one label)."""
        out = {"kind": "eval", **_finite(asdict(self))}
        if self.labels is None:
            out.pop("labels")
        return out


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float inside it as None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def defined_auc(value: float, y: np.ndarray) -> tuple[float | None, str | None]:
    """The AUC, or None and why when it is undefined (the rows hold one class)."""
    if np.isfinite(value):
        return value, None
    positives = int((y > 0.5).sum())
    return None, (f"AUC is undefined: all {y.shape[0]} eval rows are "
                  f"{'positive' if positives else 'negative'} (one class)")


def format_label_metrics(metrics: dict[str, float | None]) -> str:
    """One label's eval metrics: ``AUC 0.7512  logloss 0.4321`` (bce; an AUC of one class
    is ``undefined``) or ``MSE 0.0123`` (mse)."""
    def number(value: float | None) -> str:
        return f"{value:.4f}" if value is not None and math.isfinite(value) else "undefined"

    if "mse" in metrics:
        return f"MSE {number(metrics['mse'])}"
    return f"AUC {number(metrics.get('auc'))}  logloss {number(metrics.get('logloss'))}"


def has_auc(result: EvalResult) -> bool:
    """Whether the evaluation has an AUC (defined or not): it has none when every label is a
    regression (``mse``) label, which report their MSE instead."""
    return result.auc is not None or result.auc_note is not None or not result.labels


def eval_headline(result: EvalResult) -> str:
    """``auc 0.7512  logloss 0.4321``, or each label's MSE when no label has an AUC."""
    if not has_auc(result):
        return "  ".join(f"{name} {format_label_metrics(m)}"
                         for name, m in (result.labels or {}).items())
    return f"auc {format_auc(result)}  logloss {result.logloss:.4f}"


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
    transport: str = "none"  # how the ranks exchanged: none, shared_memory or horovod
    stopped: str | None = None  # "signal": stopped early by SIGTERM/SIGINT, resumable

    @property
    def last_eval(self) -> EvalResult | None:
        return self.evals[-1] if self.evals else None

    def to_dict(self) -> dict[str, Any]:
        out = _finite(asdict(self))
        for e in out["evals"]:  # per-label metrics only with data.labels
            if e.get("labels") is None:
                e.pop("labels", None)
        return out
