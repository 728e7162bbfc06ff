"""Fused groups: tables with the same ``(dim, dtype)`` and kind share one set of arrays.

Tables with the same ``(dim, dtype)`` (and kind: static, dynamic or tiered; and for half
tables the same rounding and optimizer-state dtype) form one *group*,
numbered in order of the first such table; inside a group, tables are packed in order (row
offsets), then each table's scratch rows when its row space is keyed. :class:`FusedGroup`
holds a group's static index structures (the kernels' :class:`GroupPlan`), its arrays and
its tables' row spaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from embtrain.embedding.config import FeatureConfig, TableConfig
from embtrain.embedding.rowspace import TableRows
from embtrain.kernels import codes
from embtrain.kernels.contract import GroupPlan, GroupTables
from embtrain.kernels.rules.halves import round_table_id

__all__ = ["VALUE_CODES", "FeatureLayout", "FusedGroup", "GroupInfo", "feature_width",
           "fused_groups", "fused_layout", "memory_layout", "numpy_dtype", "region_rows"]

#: ``codes.VAL_*`` of each table dtype.
VALUE_CODES = {"float32": codes.VAL_F32, "bfloat16": codes.VAL_BF16, "float16": codes.VAL_F16}
_ROUNDING_CODES = {"nearest": codes.ROUND_NEAREST, "stochastic": codes.ROUND_STOCHASTIC}
_M64 = (1 << 64) - 1


def numpy_dtype(dtype: str) -> type:
    """The array type a table dtype is stored in: float32, or the 16-bit patterns of a half
    type as ``np.uint16``."""
    return np.float32 if dtype == "float32" else np.uint16


def _int64(u: int) -> int:
    """A 64-bit pattern as the int64 of the same bits."""
    u &= _M64
    return u - (1 << 64) if u >= 1 << 63 else u

_COMBINER_CODES = {
    "sum": codes.COMB_SUM,
    "mean": codes.COMB_MEAN,
    "sqrtn": codes.COMB_SQRTN,
    "concat": codes.COMB_CONCAT,
}


class FeatureLayout(NamedTuple):
    """Where a feature's pooled vector sits in the forward output."""

    group: int
    column_start: int
    width: int


@dataclass(frozen=True)
class GroupInfo:
    """A fused group: its tables (packed in this order), features (column order) and width."""

    index: int
    dim: int
    dtype: str
    tables: tuple[str, ...]
    features: tuple[str, ...]
    width: int
    total_rows: int




class FusedGroup:
    """Arrays and static index structures of one fused group."""

    def __init__(
        self,
        index: int,
        dim: int,
        dtype: str,
        tables: list[TableConfig],
        features: list[FeatureConfig],
        reserve: Sequence[int] | None = None,
        seed: int = 0,
    ):
        self.dim = dim
        self.seed = int(seed)
        self.tables = tables
        self.features = features
        t_index = {t.name: i for i, t in enumerate(tables)}
        # a dynamic table's region: its rows, then scratch rows for keys without one
        self.reserve = np.zeros(len(tables), np.int64) if reserve is None else np.asarray(
            reserve, dtype=np.int64)
        rows = np.array([region_rows(t) for t in tables], dtype=np.int64) + self.reserve
        self.table_rows = rows
        self.table_offset = np.concatenate(([0], np.cumsum(rows)[:-1])).astype(np.int64)
        self.total_rows = int(rows.sum())
        nf = len(features)
        self.feat_table = np.array([t_index[f.table] for f in features], dtype=np.int64)
        self.feat_comb = np.array([_COMBINER_CODES[f.combiner] for f in features], dtype=np.int64)
        self.feat_hot = np.array([f.hotness or 0 for f in features], dtype=np.int64)
        widths = [feature_width(f, dim) for f in features]
        self.feat_width = np.array(widths, dtype=np.int64)
        self.feat_col = np.zeros(nf, dtype=np.int64)
        np.cumsum(self.feat_width[:-1], out=self.feat_col[1:])
        self.info = GroupInfo(
            index,
            dim,
            dtype,
            tuple(t.name for t in tables),
            tuple(f.name for f in features),
            int(self.feat_width.sum()),
            self.total_rows,
        )
        # CSR: for each table, the features reading it (ascending feature index).
        order = np.argsort(self.feat_table, kind="stable")
        counts = np.bincount(self.feat_table, minlength=len(tables))
        self.tf_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.tf_idx = order.astype(np.int64)
        self.plan = GroupPlan(
            dim=dim,
            width=self.info.width,
            table_offset=self.table_offset,
            table_rows=self.table_rows,
            feat_table=self.feat_table,
            feat_col=self.feat_col,
            feat_width=self.feat_width,
            feat_comb=self.feat_comb,
            feat_hot=self.feat_hot,
            tf_ptr=self.tf_ptr,
            tf_idx=self.tf_idx,
            **_half_fields(tables, self.seed, self.total_rows),
        )
        # State arrays (of the backend), filled by the engine.
        self.values = np.empty((0, dim), dtype=numpy_dtype(dtype))
        self.slots: list[np.ndarray] = []
        # per row: (update_count, last_step + 1); zero for a fresh row
        self.meta = np.empty((0, 2), dtype=np.int32)
        self.scratch: object = None  # the backend's, from `new_scratch`
        # gradient sums per row (values) and touch counts (meta), for data-parallel replicas
        self.row_sums: GroupTables | None = None
        # the tables' row spaces (bound to these arrays by the engine); a group is all static
        # rows or all keyed (dynamic tables, and tiered tables whose cache is one)
        self.spaces: list[TableRows] = []
        self.epoch = 0  # pins of the latest lookup

    @property
    def is_dynamic(self) -> bool:
        """Whether the group's tables go through the key → row phase (dynamic tables, and
        tiered tables whose cache is one)."""
        return bool(self.tables) and (self.tables[0].dynamic is not None
                                      or self.tables[0].tier is not None)

    def feats_of(self, table: int) -> np.ndarray:
        """The group features reading table ``table`` (ascending)."""
        return self.tf_idx[self.tf_ptr[table] : self.tf_ptr[table + 1]]

    @property
    def state(self) -> GroupTables:
        """The state arrays as the backend takes them."""
        return GroupTables(self.values, self.slots, self.meta)



def _half_fields(tables: Sequence[TableConfig], seed: int, total_rows: int) -> dict:
    """The :class:`GroupPlan` fields of a group's dtype and rounding (a group's tables agree
    on them: :func:`_group_key`). A keyed group (dynamic or tiered tables) rounds each row by
    its key (``row_round``, filled by the key → row phase): a dynamic table's key is its own
    (offset 0, stride 1), a tiered static shard's key is its local row (the shard's offset and
    stride give the global row, as for static rows)."""
    if not tables or not tables[0].is_half:
        return {}
    t0 = tables[0]
    keyed = t0.dynamic is not None or t0.tier is not None
    rows = []
    for t in tables:
        p = t.placement
        whole = p is None or t.dynamic is not None  # a dynamic table's keys are global
        rows.append((_int64(round_table_id(t.name)), 0 if whole else p.row_offset,
                     1 if whole else p.row_stride, 0 if p is None else p.col_start))
    return {"row_round": np.zeros(total_rows if keyed else 0, np.int64),
            "value_code": VALUE_CODES[t0.dtype],
            "slot_code": VALUE_CODES[t0.state_dtype],
            "rounding": _ROUNDING_CODES[t0.rounding],
            "round_seed": _int64(seed),
            "table_round": np.array(rows, dtype=np.int64).reshape(-1, 4)}


def fused_groups(
    tables: Sequence[TableConfig], features: Sequence[FeatureConfig]
) -> list[tuple[int, str, list[TableConfig], list[FeatureConfig]]]:
    """The engine's grouping: ``(dim, dtype, tables, features)`` per group (static and
    dynamic tables never share a group), groups in order of their first table; a group's columns hold its tables in order, each table's features in
    ``features`` order."""
    keys: list[tuple[int, str, str, str, str]] = []
    for t in tables:
        if _group_key(t) not in keys:
            keys.append(_group_key(t))
    out = []
    for key in keys:
        g_tables = [t for t in tables if _group_key(t) == key]
        g_feats = [f for t in g_tables for f in features if f.table == t.name]
        out.append((key[0], key[1], g_tables, g_feats))
    return out


def _group_key(table: TableConfig) -> tuple[int, str, str, str, str]:
    """Tables fuse when they agree on dim, dtype and kind (static, dynamic or tiered), and
    half tables on their rounding and optimizer-state dtype."""
    kind = "dynamic" if table.dynamic is not None else "tiered" if table.tier else "static"
    return table.dim, table.dtype, kind, table.rounding, table.state_dtype


def region_rows(table: TableConfig) -> int:
    """Rows a table holds in its group: a tiered table's cache rows, else its rows."""
    return table.tier.cache_rows if table.tier is not None else table.rows


def feature_width(feature: FeatureConfig, dim: int) -> int:
    """Columns of a feature's pooled output: ``hotness * dim`` for concat, else ``dim``."""
    return dim * (feature.hotness or 0) if feature.combiner == "concat" else dim


def fused_layout(
    tables: Sequence[TableConfig], features: Sequence[FeatureConfig]
) -> tuple[dict[str, FeatureLayout], list[int]]:
    """Where each feature sits in the engine's outputs, and each group's width, without
    building an engine (equal to ``EmbeddingEngine(tables, features, ...).layout``)."""
    layout: dict[str, FeatureLayout] = {}
    widths = []
    for gi, (dim, _, _, feats) in enumerate(fused_groups(tables, features)):
        col = 0
        for f in feats:
            w = feature_width(f, dim)
            layout[f.name] = FeatureLayout(gi, col, w)
            col += w
        widths.append(col)
    return {f.name: layout[f.name] for f in features}, widths


def memory_layout(
    tables: Sequence[TableConfig], features: Sequence[FeatureConfig]
) -> tuple[dict[str, FeatureLayout], list[int]]:
    """:func:`fused_layout` with every table in memory (a tiered table as the static or
    dynamic table it caches). A tier is storage, not model: the dense network orders and
    blocks its input by this layout (:func:`embtrain.models.slots.feature_slots`), so a run
    with tiers computes in the same order as the same recipe all in memory."""
    return fused_layout([replace(t, tier=None) for t in tables], features)
