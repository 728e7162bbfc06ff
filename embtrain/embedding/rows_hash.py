"""A dynamic hash table in memory: keys take rows of the table's region when admitted,
evicted or expired as :mod:`embtrain.embedding.dynamic` says."""

from __future__ import annotations

import numpy as np

from embtrain.embedding.keyed import KeyedRows
from embtrain.embedding.rowspace import TableState

__all__ = ["HashRows"]


class HashRows(KeyedRows):
    """The rows of a dynamic table all in memory (its region: ``capacity`` rows)."""

    directory = None

    def metrics(self) -> dict[str, dict[str, float]]:
        return {"dynamic": self.d.metrics()}

    def export_rows(self) -> int:
        return self.d.live

    def export_keys(self) -> np.ndarray:
        return self.d.row_key[self.d.live_rows()]

    def _state_all(self) -> TableState:
        live = self.d.live_rows()
        return self._state_of(live + self.offset, self.d.row_key[live])

    def export_range(self, lo: int, hi: int) -> TableState:
        live = self.d.live_rows()
        k = self.d.row_key[live]
        a, b = np.searchsorted(k, [lo, hi])
        return self._state_of(live[a:b] + self.offset, k[a:b])

    def _chunk_bounds(self, step: int) -> list[int]:
        return self._key_bounds(self.d, step)

    def check_import(self, keys: np.ndarray) -> None:
        """Any key fits a dynamic table (capacity is checked by the upsert)."""

    def import_rows(self, keys: np.ndarray, values: np.ndarray,
                    slots: list[tuple[int, np.ndarray]], counts: np.ndarray | None,
                    last: np.ndarray | None, extra: dict[str, np.ndarray]) -> None:
        d = self.d
        found = d.find(keys)
        local = d.upsert(keys)  # raises (changing nothing) when the keys do not fit
        fresh = found < 0
        self.fill_keys(local[fresh], keys[fresh])
        target = local + self.offset
        d.load_admission_state(extra)
        self._write_at(target, values, slots, counts, last, keys.size)
