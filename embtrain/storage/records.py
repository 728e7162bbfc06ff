"""The disk tier's records: a table shard's row layout, batches of rows, and the sizes and
names of its tier file (see :mod:`embtrain.storage.disk` for the file format)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embtrain.embedding.config import SparseOptimizerConfig, TableConfig
from embtrain.embedding.halves import DTYPE_CODES, stored_as
from embtrain.embedding.initializers import initializer_code, table_base
from embtrain.embedding.optimizers import slot_specs
from embtrain.storage.aligned import BLOCK

__all__ = ["CHUNK_BLOCKS", "COMPACT_FACTOR", "COMPACT_SLACK_UNITS", "FORMAT_VERSION", "MAGIC",
           "SUFFIX", "RowLayout", "Rows", "index_dtype", "initial_rows", "max_file_bytes",
           "tier_file_name"]

MAGIC = b"EMBTIER\x00"
FORMAT_VERSION = 1
COMPACT_FACTOR = 1.5
COMPACT_SLACK_UNITS = 64
CHUNK_BLOCKS = 2048  # blocks per batched read or write (8 MiB of aligned buffer, reused)
SUFFIX = ".tier"


def tier_file_name(table: str, row_offset: int = 0, row_stride: int = 1,
                   col_start: int = 0) -> str:
    """The file name of a table shard's tier file inside the tier's ``path``: the table's name,
    and for a shard its rows (``row_offset`` of every ``row_stride``) and first column."""
    if (row_offset, row_stride, col_start) == (0, 1, 0):
        return f"{table}{SUFFIX}"
    return f"{table}.rows{row_offset}of{row_stride}.col{col_start}{SUFFIX}"


@dataclass(frozen=True)
class RowLayout:
    """What a row of a table shard holds and how a never-written row starts.

    ``slots``: ``(name, width, initial value)`` per optimizer slot, width ``dim`` or 1;
    ``placement``: ``(row_offset, row_stride, col_start, full_dim)`` mapping a shard row to its
    table's row and columns (``(0, 1, 0, dim)`` for a whole table); ``value_dtype`` /
    ``slot_dtype``: the table's dtype and its optimizer state's (``float32``, or a half type
    whose records hold 16-bit patterns: a row takes half the bytes).
    """

    table: str
    rows: int
    dim: int
    seed: int
    init_kind: int
    init_param: float
    slots: tuple[tuple[str, int, float], ...] = ()
    placement: tuple[int, int, int, int] = (0, 1, 0, 0)
    # the table's dtype and its slots' (a half type's rows hold its 16-bit patterns)
    value_dtype: str = "float32"
    slot_dtype: str = "float32"

    @classmethod
    def of(cls, table: TableConfig, optimizer: SparseOptimizerConfig, seed: int) -> RowLayout:
        """The layout of ``table`` (a whole table or a shard with a placement) under
        ``optimizer``."""
        kind, param = initializer_code(table.initializer)
        slots = tuple((s.name, 1 if s.per_row else table.dim, float(s.initial_value))
                      for s in slot_specs(optimizer))
        p = table.placement
        place = (0, 1, 0, table.dim) if p is None else (
            p.row_offset, p.row_stride, p.col_start, max(p.full_dim, table.dim))
        return cls(table.name, table.rows, table.dim, int(seed), kind, float(param), slots, place,
                   table.dtype, table.state_dtype)

    @property
    def value_code(self) -> int:
        """``codes.VAL_*`` of the values."""
        return DTYPE_CODES[self.value_dtype]

    @property
    def slot_code(self) -> int:
        """``codes.VAL_*`` of the optimizer slots."""
        return DTYPE_CODES[self.slot_dtype]

    @property
    def value_type(self) -> type:
        """The array type of the values: float32, or uint16 patterns."""
        return np.uint16 if self.value_code else np.float32

    @property
    def slot_type(self) -> type:
        """The array type of the slots: float32, or uint16 patterns."""
        return np.uint16 if self.slot_code else np.float32

    @property
    def dtype(self) -> np.dtype:
        """The record: key, metadata, values, slots (packed, no padding)."""
        fields: list[tuple[str, Any, Any]] = [
            ("key", "<i8"), ("meta", "<i4", (2,)),
            ("values", "<u2" if self.value_code else "<f4", (self.dim,))]
        slot = "<u2" if self.slot_code else "<f4"
        fields += [(f"slot{i}", slot, (w,)) for i, (_, w, _) in enumerate(self.slots)]
        return np.dtype(fields)  # type: ignore[arg-type]

    @property
    def record_bytes(self) -> int:
        """Bytes of one record."""
        return int(self.dtype.itemsize)

    @property
    def unit_blocks(self) -> int:
        """Blocks per unit: 1, or enough for one record when a record exceeds a block."""
        return max(1, -(-self.record_bytes // BLOCK))

    @property
    def rows_per_unit(self) -> int:
        """Records per unit."""
        return (self.unit_blocks * BLOCK) // self.record_bytes

    def header(self) -> dict[str, Any]:
        """The identity fields the header records and an open checks."""
        return {"format_version": FORMAT_VERSION, "table": self.table, "rows": self.rows,
                "dim": self.dim, "seed": self.seed, "initializer": [self.init_kind,
                                                                    self.init_param],
                "slots": [list(s) for s in self.slots], "placement": list(self.placement),
                "record_bytes": self.record_bytes, "rows_per_unit": self.rows_per_unit,
                "unit_blocks": self.unit_blocks,
                **({"dtype": self.value_dtype, "state_dtype": self.slot_dtype}
                   if (self.value_code, self.slot_code) != (0, 0) else {})}


def max_file_bytes(layout: RowLayout) -> int:
    """The most bytes a tier file of ``layout`` can take: header, ``COMPACT_FACTOR`` × the
    packed rows plus slack, one chunk of writes before the next compaction, and the index
    written at close."""
    units = -(-layout.rows // layout.rows_per_unit)
    chunk = min(units, max(1, CHUNK_BLOCKS // layout.unit_blocks))
    data = (int(COMPACT_FACTOR * units) + COMPACT_SLACK_UNITS + chunk) * layout.unit_blocks
    index = -(-layout.rows * index_dtype(layout.rows).itemsize // BLOCK) * BLOCK
    return BLOCK + data * BLOCK + index


def index_dtype(rows: int) -> np.dtype:
    limit = int(COMPACT_FACTOR * rows) + 2 * COMPACT_SLACK_UNITS * BLOCK + 2
    return np.dtype("<u4") if limit < 2**32 - 1 else np.dtype("<u8")


@dataclass
class Rows:
    """A batch of rows: keys (shard row ids), values ``[n, dim]``, slots (``[n, width]`` each,
    in the optimizer's order) and metadata ``[n, 2]`` int32 (update count, last step + 1)."""

    keys: np.ndarray
    values: np.ndarray
    slots: list[np.ndarray] = field(default_factory=list)
    meta: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @classmethod
    def empty(cls, layout: RowLayout, n: int) -> Rows:
        """Uninitialised arrays for ``n`` rows."""
        return cls(np.empty(n, np.int64), np.empty((n, layout.dim), layout.value_type),
                   [np.empty((n, w), layout.slot_type) for _, w, _ in layout.slots],
                   np.empty((n, 2), np.int32))


def initial_rows(layout: RowLayout, keys: np.ndarray, out: Rows, at: np.ndarray) -> None:
    """Write the initial state of rows ``keys`` into ``out`` at positions ``at``."""
    from embtrain.kernels import get_backend

    n = int(keys.shape[0])
    if n == 0:
        return
    off, stride, col, full = layout.placement
    full = max(full, layout.dim)
    rows = np.ascontiguousarray(off + stride * keys, dtype=np.int64)
    tmp = np.empty((n, full), np.float32)
    get_backend("cpu").init_rows(tmp, rows, table_base(layout.seed, layout.table),
                                 layout.init_kind, layout.init_param)
    out.keys[at] = keys
    out.values[at] = stored_as(tmp[:, col : col + layout.dim], layout.value_code)
    for arr, (_, _, start) in zip(out.slots, layout.slots, strict=True):
        arr[at] = stored_as(np.float32(start), layout.slot_code)
    assert out.meta is not None
    out.meta[at] = 0
