"""Where a run's numbers go: ``metrics.jsonl`` (one JSON object a line) and TensorBoard scalars."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def tensorboard_available() -> bool:
    """Whether TensorFlow (which writes the TensorBoard events) imports here: a JAX-only
    machine writes ``metrics.jsonl`` alone."""
    from embtrain.models.backend import tensorflow_imports

    return tensorflow_imports()


class MetricsLog:
    """Append-only metrics of one run; TensorBoard events in ``<run_dir>/tensorboard``."""

    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._writer = None
        if tensorboard and tensorboard_available():
            import tensorflow as tf

            self._tf = tf
            self._writer = tf.summary.create_file_writer(str(run_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (``kind``, ``step`` and values) and mirror numeric values to TensorBoard."""
        clean = _finite(record)
        self._file.write(json.dumps(clean, sort_keys=True) + "\n")
        self._file.flush()
        if self._writer is not None:
            kind, step = record.get("kind", "train"), int(record.get("step", 0))
            with self._writer.as_default(step=step):
                for key, value in _scalars(record):
                    if key not in ("kind", "step"):
                        self._tf.summary.scalar(f"{kind}/{key}", value)
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the files."""
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """The record with NaN and infinities as None (JSON has no NaN), nested dicts too."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v)
                else _finite(v) if isinstance(v, dict) else v) for k, v in record.items()}


def _scalars(record: dict[str, Any], prefix: str = "") -> list[tuple[str, float]]:
    """Numeric values of a record, nested ones (per-label metrics) as ``key/name/metric``."""
    out: list[tuple[str, float]] = []
    for key, value in record.items():
        if isinstance(value, dict) and (key == "labels" or prefix):
            out.extend(_scalars(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((f"{prefix}{key}", value))
    return out


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All records of a run's ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
