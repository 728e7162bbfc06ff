"""Tier files: the row layout of a table."""

from __future__ import annotations

from embtrain.embedding.config import (
    InitializerConfig,
    ShardPlacement,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.storage.disk import RowLayout


def row_layout(kind: str = "adagrad", rows: int = 5000, dim: int = 16, seed: int = 7,
               placement: ShardPlacement | None = None, name: str = "t") -> RowLayout:
    """The row layout of one table of ``rows`` x ``dim`` under optimizer ``kind``."""
    table = TableConfig(name, rows, dim, InitializerConfig("normal", std=0.1), placement=placement)
    return RowLayout.of(table, SparseOptimizerConfig(kind=kind, lr=0.1), seed)

