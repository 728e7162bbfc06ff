"""A dynamic hash table in memory: keys take rows of the table's region when admitted,
evicted or expired as :mod:`embtrain.embedding.dynamic` says."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embtrain.embedding.dynamic import Placed
from embtrain.embedding.initializers import initializer_code, table_base
from embtrain.embedding.keyed import KeyedRows
from embtrain.embedding.rowspace import TableState
from embtrain.kernels import dynamic as kd

_NO_ROWS = np.empty((0, 1), dtype=np.float32)  # an optimizer slot the optimizer lacks

__all__ = ["HashRows"]


class HashRows(KeyedRows):
    """The rows of a dynamic table all in memory (its region: ``capacity`` rows)."""

    directory = None
    looks_ahead = True

    def fused_inserts(self, training: bool) -> bool:
        return training and self.d.dyn.admission == "none" and self.d.store is None

    def reads_in_together(self, placed: Placed) -> bool:
        p = self.table.placement
        return placed.inserted_at_once and (p is None or (p.col_start == 0
                                                          and p.full_dim == self.table.dim))

    @staticmethod
    def read_in_together(spaces: Sequence[KeyedRows], placed: Sequence[Placed]) -> None:
        """The new rows of several tables of one group (inserted at once: no scratch rows) at
        their keys' initial values, slots initial, metadata zero: what :meth:`read_in` does
        table by table, in one parallel pass."""
        parts = [(j, s, p) for j, (s, p) in enumerate(zip(spaces, placed, strict=True))
                 if p.new_rows.size]
        if not parts:
            return
        g, ctx = spaces[0].g, spaces[0].ctx
        target = np.concatenate([p.new_rows + s.offset for _, s, p in parts])
        init_row = np.concatenate([
            p.new_keys if (s.d.init_offset, s.d.init_stride) == (0, 1)  # type: ignore[attr-defined]
            else s.d.init_offset + s.d.init_stride * p.new_keys  # type: ignore[attr-defined]
            for _, s, p in parts])
        table_of = np.concatenate([np.full(p.new_rows.size, j, np.int64) for j, _, p in parts])
        codes = [initializer_code(s.d.config.initializer) for s in spaces]  # type: ignore[attr-defined]
        bases = np.array([table_base(s.d.seed, s.d.name) for s in spaces],  # type: ignore[attr-defined]
                         dtype=np.uint64)
        kinds = np.array([k for k, _ in codes], dtype=np.int64)
        params = np.array([v for _, v in codes], dtype=np.float64)
        slots = [*g.slots, _NO_ROWS, _NO_ROWS]
        inits = np.array([spec.initial_value for spec in ctx.slot_specs] + [0.0, 0.0],
                         dtype=np.float64)
        kd.fresh_keyed_rows(g.values, slots[0], slots[1], inits, g.meta, target,
                            np.ascontiguousarray(init_row, dtype=np.int64), table_of, bases,
                            kinds, params, *spaces[0].codes)

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
