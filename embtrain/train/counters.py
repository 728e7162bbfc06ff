"""Dynamic tables' cumulative counters (inserts, evictions, expired rows) across resumes.

The engine counts from zero in every process; a run's counters are state: a checkpoint records
the run's totals (``extra["dynamic_counters"]``), and a resumed run adds the difference between
them and what the restored engine counts, so metrics.jsonl and the summary report the same
totals as an uninterrupted run (at any number of ranks: the totals are the whole model's).
"""

from __future__ import annotations

from typing import Any

#: The counters that accumulate over a run (the others describe the current table).
CUMULATIVE = ("inserts", "evictions", "expired")


class DynamicCounters:
    """Offsets that turn this process's counts into the run's totals."""

    def __init__(self) -> None:
        self.offset: dict[str, dict[str, int]] = {}

    def restore(self, stored: dict[str, Any], current: dict[str, dict[str, Any]]) -> None:
        """After a restore: ``stored`` the checkpoint's totals, ``current`` the engine's counts."""
        self.offset = {
            table: {f: int(fields[f]) - int(current.get(table, {}).get(f, 0))
                    for f in CUMULATIVE if f in fields}
            for table, fields in (stored or {}).items()
        }

    def adjust(self, metrics: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The engine's ``dynamic_metrics()`` with the run's totals."""
        out = {}
        for table, fields in metrics.items():
            extra = self.offset.get(table, {})
            out[table] = {k: (v + extra[k] if k in extra else v) for k, v in fields.items()}
        return out

    def state(self, metrics: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
        """What a checkpoint records: the run's cumulative totals per dynamic table."""
        return {table: {f: int(fields[f]) for f in CUMULATIVE if f in fields}
                for table, fields in self.adjust(metrics).items()}
