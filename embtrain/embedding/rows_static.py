"""Static rows: a key is its row ``0..rows-1`` of the table (the forward range-checks it)."""

from __future__ import annotations

import numpy as np

from embtrain.embedding.config import ShardPlacement
from embtrain.embedding.halves import DTYPE_CODES
from embtrain.embedding.initializers import initializer_code, table_base
from embtrain.embedding.rowspace import TableRows, TableState
from embtrain.kernels.codes import VAL_F32

__all__ = ["StaticRows"]


class StaticRows(TableRows):
    """Every row of a static table in its group's arrays (any backend)."""

    def init_values(self) -> None:
        """Initial values of the table into its rows; a shard gets its full table's rows and
        columns (computed in chunks of whole rows, then sliced)."""
        table, be = self.table, self.ctx.backend
        out = self.g.values[self.offset : self.offset + table.rows]
        kind, param = initializer_code(table.initializer)
        base = table_base(self.ctx.seed, table.name)
        p = table.placement
        code = DTYPE_CODES[table.dtype]
        if code == VAL_F32 and (
            p is None or (p.row_stride == 1 and p.col_start == 0 and p.full_dim <= table.dim)
        ):
            be.init_range(out, np.int64(0 if p is None else p.row_offset), base, kind, param)
            return
        # a half table's float32 initial values are narrowed to nearest, chunk by chunk
        p = p or ShardPlacement()
        full = max(p.full_dim, table.dim)
        chunk = max(1, (1 << 22) // full)
        tmp = np.empty((min(chunk, table.rows), full), dtype=np.float32)
        for a in range(0, table.rows, chunk):
            b = min(a + chunk, table.rows)
            rows = p.row_offset + p.row_stride * np.arange(a, b, dtype=np.int64)
            be.init_rows(tmp[: b - a], rows, base, kind, param)
            part = tmp[: b - a, p.col_start : p.col_start + table.dim]
            if code == VAL_F32:
                out[a:b] = part
            else:
                be.narrow_block(out[a:b], np.ascontiguousarray(part), code)

    def export_rows(self) -> int:
        return self.table.rows

    def export_table(self) -> TableState:
        n = self.table.rows
        return self._state_of(slice(self.offset, self.offset + n), np.arange(n, dtype=np.int64))

    def export_range(self, lo: int, hi: int) -> TableState:
        keys = np.arange(max(int(lo), 0), min(int(hi), self.table.rows), dtype=np.int64)
        return self._state_of(keys + self.offset, keys)

    def import_rows(self, keys: np.ndarray, values: np.ndarray,
                    slots: list[tuple[int, np.ndarray]], counts: np.ndarray | None,
                    last: np.ndarray | None, extra: dict[str, np.ndarray]) -> None:
        target = self.ctx.backend.xp.asarray(keys + self.offset)
        self._write_at(target, values, slots, counts, last, keys.size)
