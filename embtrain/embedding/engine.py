"""The embedding engine: fused static tables, forward pooling, fused backward + sparse update.

Arrays in, arrays out (NumPy on CPU); every hot loop is a kernel of the backend
(:mod:`embtrain.kernels`), launched once per group and phase, never once per table or key.

Grouping and output layout
    Tables with the same ``(dim, dtype)`` form one *group*, numbered in order of the first
    such table in ``tables``; inside a group, tables are packed in ``tables`` order (row
    offsets). ``forward`` returns one ``[batch, width]`` float32 array per group; its columns
    hold the group's features table by table (tables in group order, then the features
    reading each table in the order of ``features``), each ``dim`` wide (``hotness * dim``
    for ``concat``). ``engine.layout[feature]`` gives ``(group, column_start, width)``.

Per step
    ``forward`` range-checks the keys while it gathers and pools (one pass, no dedup).
    ``backward_update`` takes d(loss)/d(output) per group, forms each key's gradient (pooled
    gradient × weight × combiner scale), deduplicates the keys while it sums the gradients of
    duplicates, and applies the optimizer to those rows only, updating ``update_count`` (+1
    per step the row is updated) and ``last_step``. A ``backward_update`` applies to the
    latest ``forward`` and consumes it; it reads that forward's key, offset and weight arrays
    again, so they must not be changed in between.

Determinism
    Duplicate gradients are summed in a fixed *block-major* order (blocks of ``block``
    samples; within a block, feature by feature), without atomics: results do not depend on
    the number of threads. (A different ``engine.block`` may change the summation order of a
    table read by several features, i.e. the last bit.)

Speed notes
    Pass ``out=engine.new_outputs(batch)`` to ``forward`` and reuse it: fresh large arrays
    cost page faults every step. Gradients should likewise arrive in reused buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from embtrain.embedding.config import (
    DynamicConfig,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.dynamic import DynamicTable, Placed
from embtrain.embedding.initializers import initializer_code, table_base
from embtrain.embedding.optimizers import hyperparams, kind_code, slot_specs
from embtrain.embedding.tiers import KeyDirectory, MemoryStore
from embtrain.errors import DataError
from embtrain.kernels import KernelBackend, codes, get_backend
from embtrain.kernels import dynamic as kd
from embtrain.kernels.codes import BAD_KEY, BAD_OFFSETS
from embtrain.kernels.contract import GroupPlan, GroupTables, StepBatch, UpdateStep

__all__ = [
    "EmbeddingEngine",
    "FeatureLayout",
    "GroupInfo",
    "KeyOutOfRangeError",
    "TableState",
    "fused_groups",
    "fused_layout",
]

_COMBINER_CODES = {
    "sum": codes.COMB_SUM,
    "mean": codes.COMB_MEAN,
    "sqrtn": codes.COMB_SQRTN,
    "concat": codes.COMB_CONCAT,
}


def _frozen(a: Any) -> Any:
    """A read-only view of a NumPy array: the kernels' inputs always have the same numba type
    (read-only, C-contiguous) whether they came from NumPy, Arrow or TensorFlow, so each CPU
    kernel has one compiled specialisation, which ``embtrain.kernels.warm`` compiles ahead of
    time. Device arrays (CuPy) pass through."""
    if not isinstance(a, np.ndarray):
        return a
    view = a.view()
    view.flags.writeable = False
    return view


_NO_WEIGHTS = _frozen(np.empty(0, dtype=np.float32))
_NO_ROWS = np.empty((0, 1), dtype=np.float32)  # an optimizer slot the optimizer lacks
IMPORT_CHUNK_ROWS = 1 << 16  # keys a tiered table imports at a time



class KeyOutOfRangeError(DataError, ValueError):
    """A key of a static table is outside ``[0, rows)``; names the feature and the value."""

    def __init__(self, feature: str, value: int, table: str | None = None, rows: int | None = None):
        self.feature = feature
        self.value = int(value)
        self.table = table
        self.rows = rows
        where = f" of table {table!r} (rows 0..{rows - 1})" if table is not None and rows else ""
        super().__init__(f"feature {feature!r}: key {self.value} is out of range{where}")


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


@dataclass
class TableState:
    """A table's full state, for checkpoints: keys (row ids of a static table, the live keys
    of a dynamic one, ascending), values, slots, metadata and a dynamic table's admission
    state (``extra``)."""

    keys: np.ndarray
    values: np.ndarray
    slots: dict[str, np.ndarray] = field(default_factory=dict)
    update_count: np.ndarray | None = None
    last_step: np.ndarray | None = None
    # dynamic tables: what admission remembers (see DynamicTable.admission_state)
    extra: dict[str, np.ndarray] = field(default_factory=dict)


class _Keyless(NamedTuple):
    """Positions of feature ``feature`` whose keys have no row in table ``table``'s directory:
    they read scratch row ``capacity + scratch`` of the cache region (filled from ``keys``,
    or zeros when ``keys`` is None; ``scratch_rows`` rows in all, 0 when another feature of
    the table fills them)."""

    table: int
    feature: int
    positions: np.ndarray
    scratch: np.ndarray
    keys: np.ndarray | None
    scratch_rows: int


class _Group:
    """Arrays and static index structures of one fused group."""

    def __init__(
        self,
        index: int,
        dim: int,
        dtype: str,
        tables: list[TableConfig],
        features: list[FeatureConfig],
        reserve: Sequence[int] | None = None,
    ):
        self.dim = dim
        self.tables = tables
        self.features = features
        t_index = {t.name: i for i, t in enumerate(tables)}
        # a dynamic table's region: its rows, then scratch rows for keys without one
        self.reserve = np.zeros(len(tables), np.int64) if reserve is None else np.asarray(
            reserve, dtype=np.int64)
        rows = np.array([_region_rows(t) for t in tables], dtype=np.int64) + self.reserve
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
        )
        # State arrays (of the backend), filled by the engine.
        self.values = np.empty((0, dim), dtype=np.float32)
        self.slots: list[np.ndarray] = []
        # per row: (update_count, last_step + 1); zero for a fresh row
        self.meta = np.empty((0, 2), dtype=np.int32)
        self.scratch: object = None  # the backend's, from `new_scratch`
        # gradient sums per row (values) and touch counts (meta), for data-parallel replicas
        self.row_sums: GroupTables | None = None
        # dynamic tables (None for static ones); the group is either all static or all dynamic
        self.dynamic: list[DynamicTable | None] = [None] * len(tables)
        self.epoch = 0  # pins of the latest lookup
        self.row_bufs: list[np.ndarray] = []  # the key → row phase's output, per feature
        self.vrow_bufs: list[np.ndarray] = []  # a directory's rows of the keys, per feature

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


# the fused update that only sums: values -= 1 * g on zeroed arrays (see backward_row_sums)
_ROW_SUMS = SparseOptimizerConfig(kind="sgd", lr=1.0)


def fused_groups(
    tables: Sequence[TableConfig], features: Sequence[FeatureConfig]
) -> list[tuple[int, str, list[TableConfig], list[FeatureConfig]]]:
    """The engine's grouping: ``(dim, dtype, tables, features)`` per group (static and
    dynamic tables never share a group), groups in order of their first table; a group's columns hold its tables in order, each table's features in
    ``features`` order."""
    keys: list[tuple[int, str, str]] = []
    for t in tables:
        if _group_key(t) not in keys:
            keys.append(_group_key(t))
    out = []
    for key in keys:
        g_tables = [t for t in tables if _group_key(t) == key]
        g_feats = [f for t in g_tables for f in features if f.table == t.name]
        out.append((key[0], key[1], g_tables, g_feats))
    return out


def _group_key(table: TableConfig) -> tuple[int, str, str]:
    """Tables fuse when they agree on dim, dtype and kind (static, dynamic or tiered)."""
    kind = "dynamic" if table.dynamic is not None else "tiered" if table.tier else "static"
    return table.dim, table.dtype, kind


def _region_rows(table: TableConfig) -> int:
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


def _contiguous(xp: ModuleType, a: object, dtype: type) -> np.ndarray:
    """``a`` as a C-contiguous array of the backend's array module (no copy when it is one
    already; host data is copied to the device on GPU)."""
    if xp is np:
        return np.ascontiguousarray(a, dtype=dtype)
    return xp.ascontiguousarray(xp.asarray(a, dtype=dtype))


class EmbeddingEngine:
    """Static embedding tables packed into fused groups, with a fused sparse optimizer.

    ``tables``: every table; ``features``: the sparse inputs, each reading one table (several
    features may share a table); ``optimizer``: the one sparse optimizer; ``seed``: initial
    values depend only on (seed, table name, row, column).
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        features: Sequence[FeatureConfig],
        optimizer: SparseOptimizerConfig,
        seed: int,
        backend: str = "cpu",
    ):
        self.backend: KernelBackend = get_backend(backend)
        self.optimizer = optimizer
        self.seed = int(seed)
        self._tables = {t.name: t for t in tables}
        if len(self._tables) != len(tables):
            raise ValueError("duplicate table names")
        names = [f.name for f in features]
        if len(set(names)) != len(names):
            raise ValueError("duplicate feature names")
        for f in features:
            if f.table not in self._tables:
                raise ValueError(f"feature {f.name!r} reads unknown table {f.table!r}")
        self._features = tuple(features)
        self._opt_kind = kind_code(optimizer)
        self._slot_specs = slot_specs(optimizer)

        self._groups: list[_Group] = []
        self._table_loc: dict[str, tuple[int, int]] = {}
        layout: dict[str, FeatureLayout] = {}
        for gi, (dim, dtype, g_tables, g_feats) in enumerate(fused_groups(tables, features)):
            for ti, t in enumerate(g_tables):
                self._table_loc[t.name] = (gi, ti)
            keyed = g_tables[0].dynamic is not None or g_tables[0].tier is not None
            if keyed and self.backend.name != "cpu":
                raise ValueError(f"dynamic and tiered tables run on the cpu backend only "
                                 f"(table {g_tables[0].name!r}, backend {self.backend.name!r})")
            group = _Group(gi, dim, dtype, g_tables, g_feats,
                           [1] * len(g_tables) if keyed else None)
            if keyed:
                group.dynamic = [self._hash_table(t) for t in g_tables]
            for fi, f in enumerate(g_feats):
                layout[f.name] = FeatureLayout(
                    gi, int(group.feat_col[fi]), int(group.feat_width[fi])
                )
            group.scratch = self.backend.new_scratch(group.plan)
            self._groups.append(group)
        self.layout: dict[str, FeatureLayout] = {f.name: layout[f.name] for f in features}
        self._feature_order = {f.name: i for i, f in enumerate(features)}
        self._pending: list[StepBatch | None] | None = None
        self._batch = 0
        for group in self._groups:
            self._allocate(group)

    # ------------------------------------------------------------------ CPU kernel tuning

    @property
    def block(self) -> int:
        """Samples per block of the CPU kernels (see :class:`embtrain.kernels.cpu.CpuScratch`;
        other backends ignore it)."""
        return int(getattr(self._groups[0].scratch, "block", 256)) if self._groups else 256

    @block.setter
    def block(self, value: int) -> None:
        for g in self._groups:
            if hasattr(g.scratch, "block"):
                g.scratch.block = int(value)  # type: ignore[attr-defined]

    @property
    def workers(self) -> int | None:
        """Work lists of the CPU backward (None: one per thread; results do not depend on
        it; other backends ignore it)."""
        return getattr(self._groups[0].scratch, "workers", None) if self._groups else None

    @workers.setter
    def workers(self, value: int | None) -> None:
        for g in self._groups:
            if hasattr(g.scratch, "workers"):
                g.scratch.workers = value  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ properties

    @property
    def groups(self) -> tuple[GroupInfo, ...]:
        """The fused groups, in output order."""
        return tuple(g.info for g in self._groups)

    @property
    def table_names(self) -> tuple[str, ...]:
        """Every table, in the order given."""
        return tuple(self._tables)

    @property
    def slot_names(self) -> tuple[str, ...]:
        """The optimizer's slot names (e.g. ``("accumulator",)`` for adagrad)."""
        return tuple(s.name for s in self._slot_specs)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Every feature, in the order given."""
        return tuple(f.name for f in self._features)

    def table_config(self, name: str) -> TableConfig:
        """The configuration of table ``name``."""
        return self._tables[name]

    # ------------------------------------------------------------------ state

    def _allocate(self, group: _Group) -> None:
        be = self.backend
        n, dim = group.total_rows, group.dim
        if group.is_dynamic:
            # Rows are filled when a key takes them. The pages are touched now, by the
            # parallel fill kernels: left to the first insert, faulting them in (the kernel
            # zeroing each huge page) cost ~170 ms a step on DE tiny while new keys arrive.
            group.values = be.empty((n, dim), np.float32)
            be.fill_f32(group.values.reshape(-1), 0.0)
            group.slots = []
            for spec in self._slot_specs:
                arr = be.empty((n, 1 if spec.per_row else dim), np.float32)
                be.fill_f32(arr.reshape(-1), spec.initial_value)
                group.slots.append(arr)
            group.meta = be.empty((n, 2), np.int32)
            be.fill_i32(group.meta.reshape(-1), 0)
            return
        group.values = be.empty((n, dim), np.float32)
        for ti, t in enumerate(group.tables):
            off = int(group.table_offset[ti])
            self._init_table(group.values[off : off + t.rows], t)
        group.slots = []
        for spec in self._slot_specs:
            arr = be.empty((n, 1 if spec.per_row else dim), np.float32)
            be.fill_f32(arr.reshape(-1), spec.initial_value)
            group.slots.append(arr)
        # int32 pairs: half the bytes of int64 per row, so more of the rows a step touches
        # stay in cache (the pair is read and written for every updated row).
        group.meta = be.zeros((n, 2), np.int32)

    def _init_table(self, out: np.ndarray, table: TableConfig) -> None:
        """Initial values of ``table`` into ``out``; a shard gets its full table's rows and
        columns (computed in chunks of whole rows, then sliced)."""
        be = self.backend
        kind, param = initializer_code(table.initializer)
        base = table_base(self.seed, table.name)
        p = table.placement
        if p is None or (p.row_stride == 1 and p.col_start == 0 and p.full_dim <= table.dim):
            be.init_range(out, np.int64(0 if p is None else p.row_offset), base, kind, param)
            return
        full = max(p.full_dim, table.dim)
        chunk = max(1, (1 << 22) // full)
        tmp = np.empty((min(chunk, table.rows), full), dtype=np.float32)
        for a in range(0, table.rows, chunk):
            b = min(a + chunk, table.rows)
            rows = p.row_offset + p.row_stride * np.arange(a, b, dtype=np.int64)
            be.init_rows(tmp[: b - a], rows, base, kind, param)
            out[a:b] = tmp[: b - a, p.col_start : p.col_start + table.dim]

    def _locate(self, table: str) -> tuple[_Group, int, slice]:
        if table not in self._table_loc:
            raise KeyError(f"unknown table {table!r}")
        gi, ti = self._table_loc[table]
        group = self._groups[gi]
        off = int(group.table_offset[ti])
        return group, ti, slice(off, off + _region_rows(group.tables[ti]))

    # ------------------------------------------------------------------ dynamic tables

    def _grow_reserve(self, gi: int, need: Sequence[int]) -> _Group:
        """Group ``gi`` rebuilt with at least ``need[t]`` scratch rows per table (rows and
        state of every table copied over; happens a few times early in a run)."""
        old = self._groups[gi]
        reserve = np.maximum(old.reserve, (np.asarray(need, np.int64) * 3) // 2 + 1)
        group = _Group(gi, old.dim, old.info.dtype, old.tables, old.features, reserve)
        group.dynamic = old.dynamic
        group.epoch = old.epoch
        group.row_bufs = old.row_bufs
        group.vrow_bufs = old.vrow_bufs
        group.scratch = self.backend.new_scratch(group.plan)
        if hasattr(old.scratch, "block"):
            group.scratch.block = old.scratch.block  # type: ignore[attr-defined]
            group.scratch.workers = old.scratch.workers  # type: ignore[attr-defined]
        self._allocate(group)
        for ti, t in enumerate(old.tables):
            a, b, n = int(old.table_offset[ti]), int(group.table_offset[ti]), _region_rows(t)
            group.values[b : b + n] = old.values[a : a + n]
            for new, prev in zip(group.slots, old.slots, strict=True):
                new[b : b + n] = prev[a : a + n]
            group.meta[b : b + n] = old.meta[a : a + n]
        self._groups[gi] = group
        return group

    def _table_meta(self, group: _Group, ti: int) -> np.ndarray:
        off = int(group.table_offset[ti])
        return group.meta[off : off + _region_rows(group.tables[ti])]

    def _fill_rows(self, group: _Group, ti: int, rows: np.ndarray, keys: np.ndarray | None,
                   by_key: bool = False) -> None:
        """Fresh rows (region-local ``rows``): initial values of ``keys`` (zeros if None),
        slots at their initial values, metadata zero. The keys of a dynamic table behind a
        cache are its directory's rows, unless ``by_key`` (its own keys: scratch rows)."""
        if rows.size == 0:
            return
        t = group.tables[ti]
        target = np.ascontiguousarray(rows + int(group.table_offset[ti]), dtype=np.int64)
        if keys is None:
            init = np.zeros((rows.size, t.dim), np.float32)
        else:
            init = self._initial_values(group, ti, keys, by_key)
        slots = [*group.slots, _NO_ROWS, _NO_ROWS]
        inits = np.array([spec.initial_value for spec in self._slot_specs] + [0.0, 0.0],
                         dtype=np.float64)
        kd.fresh_rows(group.values, slots[0], slots[1], inits, group.meta, target,
                      np.ascontiguousarray(init))

    def _initial_values(self, group: _Group, ti: int, keys: np.ndarray, by_key: bool = False
                        ) -> np.ndarray:
        """Initial values of region keys ``keys`` of table ``ti`` (a directory's rows are
        turned into their keys first, unless ``by_key``)."""
        t = group.tables[ti]
        d = group.dynamic[ti]
        assert d is not None
        p = t.placement
        if d.directory is not None:
            if not by_key:
                keys = d.directory.table.row_key[keys]
            d = d.directory.table
        return d.initial_values(keys, t.dim, 0 if p is None else p.col_start,
                                0 if p is None else p.full_dim)

    def _hash_table(self, t: TableConfig) -> DynamicTable:
        """The key → row table of a dynamic table, or the cache of a tiered one."""
        if t.tier is None:
            return DynamicTable(t, self.seed)
        p = t.placement
        cache = replace(t, rows=t.tier.cache_rows, tier=None,
                        dynamic=DynamicConfig(eviction=t.tier.eviction))
        d = DynamicTable(cache, self.seed, 0 if p is None else p.row_offset,
                         1 if p is None else p.row_stride)
        if t.dynamic is not None:  # the cache's keys are the rows of the table's directory
            d.directory = KeyDirectory(replace(t, tier=None), self.seed)
        widths = [1 if spec.per_row else t.dim for spec in self._slot_specs]
        if t.tier.store == "memory":
            d.store = MemoryStore(t.rows, t.dim, widths)
        else:
            from embtrain.storage import open_row_store  # the disk tier

            d.store = open_row_store(t, widths, self.seed,
                                     [spec.initial_value for spec in self._slot_specs])
        return d

    def _check_rows(self, group: _Group, ti: int, keys: list[np.ndarray]) -> None:
        """Keys of a tiered (static) table must be rows of it."""
        t = group.tables[ti]
        for k in keys:
            if k.size and (int(k.min()) < 0 or int(k.max()) >= t.rows):
                bad = int(k.min()) if int(k.min()) < 0 else int(k.max())
                f = next(f.name for f in group.features if f.table == t.name)
                raise KeyOutOfRangeError(f, bad, t.name, t.rows)

    def _row_state(self, group: _Group, ti: int, rows: np.ndarray
                   ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        target = rows + int(group.table_offset[ti])
        return (group.values[target], [arr[target] for arr in group.slots],
                group.meta[target])

    def _write_back(self, group: _Group, ti: int, rows: np.ndarray, keys: np.ndarray) -> None:
        """Evicted cache rows (still holding their state) to the table's store."""
        values, slots, meta = self._row_state(group, ti, rows)
        d = group.dynamic[ti]
        assert d is not None and d.store is not None
        if d.directory is not None:
            d.directory.on_store[keys] = True
            d.directory.meta[keys] = meta
        d.store.write(keys, values, slots, meta)

    def _read_in(self, group: _Group, ti: int, rows: np.ndarray, keys: np.ndarray) -> None:
        """Fresh cache rows (already at their initial state) from the store, for the rows it
        holds."""
        directory = group.dynamic[ti].directory  # type: ignore[union-attr]
        if directory is not None:  # rows new to their key start from its initializer
            held = directory.on_store[keys]
            rows, keys = rows[held], keys[held]
            if rows.size == 0:
                return
        values, slots, meta = self._row_state(group, ti, rows)
        found = group.dynamic[ti].store.read(keys, values, slots, meta)  # type: ignore[union-attr]
        if found.any():
            target = rows[found] + int(group.table_offset[ti])
            group.values[target] = values[found]
            for arr, got in zip(group.slots, slots, strict=True):
                arr[target] = got[found]
            group.meta[target] = meta[found]

    def _read_whole(self, group: _Group, ti: int, rows: np.ndarray, keys: np.ndarray) -> None:
        """Fresh cache rows straight from a store that fills every row (its stored state, or
        the initial state of a row never written: the engine's fill would be thrown away)."""
        if rows.size == 0:
            return
        d = group.dynamic[ti]
        assert d is not None and d.store is not None
        n = rows.size
        values = np.empty((n, group.dim), np.float32)
        slots = [np.empty((n, arr.shape[1]), np.float32) for arr in group.slots]
        meta = np.empty((n, 2), np.int32)
        d.store.read(keys, values, slots, meta)
        target = rows + int(group.table_offset[ti])
        group.values[target] = values
        for arr, got in zip(group.slots, slots, strict=True):
            arr[target] = got
        group.meta[target] = meta

    def _resolve(self, gi: int, keys: list[np.ndarray], training: bool, step: int
                 ) -> list[np.ndarray]:
        """The key → row phase of a dynamic group: each feature's keys as rows of its table's
        region (see :mod:`embtrain.embedding.dynamic`)."""
        group = self._groups[gi]
        be = self.backend
        # each feature's rows, in buffers kept across steps (fresh ones fault in their pages)
        if len(group.row_bufs) != len(keys):
            group.row_bufs = [np.empty(0, np.int64) for _ in keys]
        for i, k in enumerate(keys):
            if group.row_bufs[i].shape[0] < k.shape[0]:
                group.row_bufs[i] = np.empty(int(k.shape[0] * 1.25) + 16, np.int64)
        outs = [buf[: k.shape[0]] for buf, k in zip(group.row_bufs, keys, strict=True)]
        group.epoch = group.epoch % 2_000_000_000 + 1
        tables = group.dynamic
        keyless: list[_Keyless] = []
        if any(d is not None and d.directory is not None for d in tables):
            keys, keyless = self._directory_phase(group, keys, training, step)
        out_list = be.array_list(outs)
        kd.lookup_group(be.array_list(keys), group.feat_table,
                        be.array_list([d.index for d in tables]),  # type: ignore[union-attr]
                        out_list, 4096)
        for k in keyless:  # keys without a directory row: not cache misses (scratch rows)
            outs[k.feature][k.positions] = 0
        key_list = be.array_list(keys)
        misses: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for ti in range(len(group.tables)):
            feats = group.feats_of(ti)
            t = group.tables[ti]
            if t.tier is not None and t.dynamic is None:  # a static table behind a cache
                self._check_rows(group, ti, [keys[f] for f in feats.tolist()])
            n_miss = sum(int(np.count_nonzero(outs[f] < 0)) for f in feats.tolist())
            mk = np.empty(n_miss, np.int64)
            mc = np.empty(n_miss, np.int64)
            n = 0
            if n_miss:
                d = tables[ti]
                assert d is not None
                scratch = d.scratch_index(n_miss)
                n = kd.collect_misses(key_list, out_list, feats, scratch, mk, mc)
                kd.clear_index(scratch, mk[:n])  # empty again for the next step
            st = tables[ti].stats  # type: ignore[union-attr]
            st.lookups += sum(int(keys[f].shape[0]) for f in feats.tolist())
            st.misses += n_miss
            st.distinct_misses += n
            misses.append((feats, mk[:n], mc[:n]))
        placed: list[Placed] = []
        for ti, (_, mk, mc) in enumerate(misses):
            d = tables[ti]
            assert d is not None
            insert = training or d.store is not None  # a cache fills at evaluation too
            if insert and mk.size > d.n_free:  # eviction ahead: spare the rows found
                kd.pin_rows(out_list, misses[ti][0], d.pin, np.int32(group.epoch))
            placed.append(d.place(mk, mc, insert, self._table_meta(group, ti), group.epoch,
                                  step))
        need = [p.scratch_keys.size + int(p.scratch_zero) for p in placed]
        for k in keyless:
            need[k.table] = max(need[k.table], k.scratch_rows)
        if any(n > r for n, r in zip(need, group.reserve.tolist(), strict=True)):
            group = self._grow_reserve(gi, need)
        for ti, p in enumerate(placed):
            cap = _region_rows(group.tables[ti])
            d = tables[ti]
            assert d is not None
            if d.store is not None and p.evicted_rows.size:
                self._write_back(group, ti, p.evicted_rows, p.evicted_keys)
            if d.directory is None and getattr(d.store, "fills_all", False):
                self._read_whole(group, ti, p.new_rows, p.new_keys)
            else:
                self._fill_rows(group, ti, p.new_rows, p.new_keys)
                if d.store is not None and p.new_rows.size:
                    self._read_in(group, ti, p.new_rows, p.new_keys)
            if p.scratch_zero:
                self._fill_rows(group, ti, np.array([cap], np.int64), None)
            elif p.scratch_keys.size:
                self._fill_rows(group, ti, cap + np.arange(p.scratch_keys.size, dtype=np.int64),
                                p.scratch_keys)
            if p.slot_of.size:
                kd.assign_misses(out_list, misses[ti][0], p.slot_of)
        for k in keyless:
            cap = _region_rows(group.tables[k.table])
            outs[k.feature][k.positions] = cap + k.scratch
            if k.keys is not None:
                self._fill_rows(group, k.table, cap + np.arange(k.keys.size, dtype=np.int64),
                                k.keys, by_key=True)
            elif k.scratch_rows:
                self._fill_rows(group, k.table, np.array([cap], np.int64), None)
        return outs

    def _directory_phase(self, group: _Group, keys: list[np.ndarray], training: bool,
                         step: int) -> tuple[list[np.ndarray], list[_Keyless]]:
        """Keys of dynamic tables behind a cache become their directory's rows (found,
        admitted and inserted, evicting or not, exactly as the all-in-memory table does);
        the cache phase then looks those rows up as a static tiered table's. Returns the
        features' cache keys and, per feature, the keys left without a row (scratch)."""
        be = self.backend
        tables = group.dynamic
        order = [ti for ti, d in enumerate(tables) if d is not None and d.directory is not None]
        feats = [group.feats_of(ti) for ti in order]
        flat = [int(f) for fs in feats for f in fs.tolist()]
        if len(group.vrow_bufs) != len(keys):
            group.vrow_bufs = [np.empty(0, np.int64) for _ in keys]
        for f in flat:
            if group.vrow_bufs[f].shape[0] < keys[f].shape[0]:
                group.vrow_bufs[f] = np.empty(int(keys[f].shape[0] * 1.25) + 16, np.int64)
        sub_keys = [keys[f] for f in flat]
        sub_rows = [group.vrow_bufs[f][: keys[f].shape[0]] for f in flat]
        key_list, row_list = be.array_list(sub_keys), be.array_list(sub_rows)
        which = np.array([j for j, fs in enumerate(feats) for _ in fs.tolist()], np.int64)
        kd.lookup_group(key_list, which, be.array_list(
            [tables[ti].directory.table.index for ti in order]),  # type: ignore[union-attr]
            row_list, 4096)
        out = list(keys)
        keyless: list[_Keyless] = []
        start = 0
        for ti, fs in zip(order, feats, strict=True):
            d = tables[ti]
            assert d is not None and d.directory is not None
            directory, dt = d.directory, d.directory.table
            local = np.arange(start, start + fs.size, dtype=np.int64)
            start += fs.size
            n_miss = sum(int(np.count_nonzero(sub_rows[i] < 0)) for i in local.tolist())
            dt.stats.lookups += sum(int(sub_keys[i].shape[0]) for i in local.tolist())
            dt.stats.misses += n_miss
            mk = np.empty(n_miss, np.int64)
            mc = np.empty(n_miss, np.int64)
            n = 0
            if n_miss:
                scratch = dt.scratch_index(n_miss)
                n = kd.collect_misses(key_list, row_list, local, scratch, mk, mc)
                kd.clear_index(scratch, mk[:n])
            if training and n > dt.n_free:  # eviction ahead: spare the rows found, score all
                kd.pin_rows(row_list, local, dt.pin, np.int32(group.epoch))
                directory.sync_meta(d, self._table_meta(group, ti))
            p = dt.place(mk[:n], mc[:n], training, directory.meta, group.epoch, step)
            if p.evicted_rows.size:  # their keys are gone: so are their cached rows
                self._drop_cached(group, ti, p.evicted_rows)
                directory.reset(p.evicted_rows)
            directory.reset(p.new_rows)
            if p.slot_of.size:
                kd.assign_misses(row_list, local, p.slot_of)
            cap = dt.capacity
            n_scratch = p.scratch_keys.size + int(p.scratch_zero)
            first = True  # the first feature with keyless positions fills the scratch rows
            for j, f in zip(local.tolist(), fs.tolist(), strict=True):
                rows = sub_rows[j]
                out[f] = rows
                pos = np.flatnonzero(rows >= cap) if n_scratch else np.empty(0, np.int64)
                if pos.size:
                    keys_of = p.scratch_keys if first and p.scratch_keys.size else None
                    keyless.append(_Keyless(ti, f, pos, rows[pos] - cap, keys_of,
                                            n_scratch if first else 0))
                    rows[pos] = 0  # any row: the cache phase overwrites these positions
                    first = False
        return out, keyless

    def _drop_cached(self, group: _Group, ti: int, keys: np.ndarray) -> None:
        """Forget the cached rows of cache keys ``keys`` (no write-back: they are stale)."""
        d = group.dynamic[ti]
        assert d is not None
        rows = d.find(keys)
        rows = rows[rows >= 0]
        if rows.size:
            d.n_free = kd.remove_rows(d.index, rows, d.row_key, d.row_live, d.free, d.n_free)

    def prefetch(self, inputs: Mapping[str, SparseInput]) -> None:
        """Start reading, in the background, the rows of tiered tables that ``inputs`` (the
        next step's batch) will miss in their caches. Call it after this step's forward: the
        rows missing then are exactly what the next forward fills (nothing enters or leaves a
        cache in between), so that forward finds them read."""
        for group in self._groups:
            for ti, d in enumerate(group.dynamic):
                if d is None or not hasattr(d.store, "prefetch"):
                    continue
                rows = group.tables[ti].rows
                keys = [np.asarray(inputs[group.features[f].name].keys, np.int64)
                        for f in group.feats_of(ti).tolist() if group.features[f].name in inputs]
                if not keys:
                    continue
                flat = np.concatenate(keys)
                if d.directory is not None:  # keys → the directory's rows held by the store
                    flat = d.directory.table.find(flat)
                    flat = flat[flat >= 0]
                    flat = flat[d.directory.on_store[flat]]
                miss = flat[d.find(flat) < 0]
                miss = np.unique(miss[(miss >= 0) & (miss < rows)])
                if miss.size:
                    d.store.prefetch(miss)  # type: ignore[union-attr]

    def _expire(self, step: int) -> None:
        """TTL at the step boundary after training step ``step``."""
        for group in self._groups:
            if not group.is_dynamic:
                continue
            for ti, d in enumerate(group.dynamic):
                assert d is not None
                if d.directory is None:
                    d.expire(self._table_meta(group, ti), step)
                    continue
                dt, ttl = d.directory.table, d.directory.table.dyn.ttl_steps
                if ttl is None or dt.ttl_low > step - ttl:
                    continue
                d.directory.sync_meta(d, self._table_meta(group, ti))
                gone = dt.expire(d.directory.meta, step)
                if gone.size:
                    self._drop_cached(group, ti, gone)
                    d.directory.reset(gone)

    def dynamic_metrics(self) -> dict[str, dict[str, float]]:
        """Per dynamic table: rows, capacity, inserts, evictions, expired, pending admissions,
        load factor."""
        return {d.name: (d.metrics() if d.directory is None else d.directory.table.metrics())
                for g in self._groups for d in g.dynamic
                if d is not None and (d.store is None or d.directory is not None)}

    def tier_metrics(self) -> dict[str, dict[str, float]]:
        """Per tiered table: cache rows, lookups and misses (key occurrences), hit rate,
        distinct misses (rows a step missed, each once), evictions (written back) and what its
        store read and wrote."""
        out = {}
        for g in self._groups:
            for d in g.dynamic:
                if d is None or d.store is None:
                    continue
                st = d.stats
                out[d.name] = {"cache_rows": d.capacity, "cached": d.live,
                               "lookups": st.lookups, "misses": st.misses,
                               "hit_rate": round(1 - st.misses / st.lookups, 6) if st.lookups
                               else 0.0, "distinct_misses": st.distinct_misses,
                               "evictions": st.evictions,
                               **d.store.counters.as_dict()}
        return out

    def dynamic_table(self, name: str) -> DynamicTable | None:
        """The key → row table of dynamic table ``name`` (a tiered one's directory), or a
        tiered static table's cache; None for a static table in memory."""
        group, ti, _ = self._locate(name)
        d = group.dynamic[ti]
        return d.directory.table if d is not None and d.directory is not None else d

    def export_table(self, name: str) -> TableState:
        """A copy of table ``name``'s keys, values, slots, update_count and last_step."""
        group, ti, sl = self._locate(name)
        d = group.dynamic[ti]
        if d is not None and d.store is not None:
            state = self._tiered_state(group, ti, self._tiered_rows(group, ti))
            state.extra = self._admission_state(d)
            return state
        rows: Any = sl
        keys = np.arange(sl.stop - sl.start, dtype=np.int64)
        if d is not None:
            live = d.live_rows()
            keys = d.row_key[live]
            rows = live + sl.start
        state = self._state_of(rows, keys, group)
        state.extra = {} if d is None else d.admission_state()
        return state

    def streams(self, name: str) -> bool:
        """Whether table ``name`` should be exported chunk by chunk (:meth:`export_chunks`):
        a tiered table, whose rows mostly live in its store."""
        group, ti, _ = self._locate(name)
        d = group.dynamic[ti]
        return d is not None and d.store is not None

    def export_rows(self, name: str) -> int:
        """How many rows :meth:`export_table` returns for ``name`` (static: its rows; dynamic:
        its live keys)."""
        group, ti, sl = self._locate(name)
        t = group.tables[ti]
        d = group.dynamic[ti]
        if d is None:
            return sl.stop - sl.start
        if d.directory is not None:
            return d.directory.table.live
        if d.store is not None:
            return t.rows
        return d.live

    def export_range(self, name: str, lo: int, hi: int) -> TableState:
        """The rows of table ``name`` whose keys lie in ``[lo, hi)``, ascending by key (the
        same arrays :meth:`export_table` has for them; ``extra`` empty). A tiered table reads
        only these rows from its cache and store."""
        group, ti, sl = self._locate(name)
        d = group.dynamic[ti]
        if d is not None and d.directory is not None:
            live = d.directory.table.live_rows()
            a, b = np.searchsorted(d.directory.table.row_key[live], [lo, hi])
            return self._tiered_state(group, ti, live[a:b])
        if d is not None and d.store is not None:
            rows = np.arange(max(int(lo), 0), min(int(hi), group.tables[ti].rows),
                             dtype=np.int64)
            return self._tiered_state(group, ti, rows)
        if d is None:
            keys = np.arange(max(int(lo), 0), min(int(hi), sl.stop - sl.start), dtype=np.int64)
            rows: Any = keys + sl.start
        else:
            live = d.live_rows()
            k = d.row_key[live]
            a, b = np.searchsorted(k, [lo, hi])
            keys, rows = k[a:b], live[a:b] + sl.start
        return self._state_of(rows, keys, group)

    def export_chunks(self, name: str, rows: int = 1 << 20) -> Iterator[TableState]:
        """Table ``name`` as consecutive chunks of at most ``rows`` rows, ascending by key:
        together exactly :meth:`export_table` (a dynamic table's admission state in the first
        chunk's ``extra``). A tiered table is read chunk by chunk, never whole."""
        group, ti, _ = self._locate(name)
        d = group.dynamic[ti]
        step = max(1, int(rows))
        extra = {} if d is None else self._admission_state(d)
        if d is None or (d.store is not None and d.directory is None):
            total = self.export_rows(name)
            bounds = [*range(0, total, step), total]
        else:
            keyed = d if d.directory is None else d.directory.table
            keys = keyed.row_key[keyed.live_rows()]
            bounds = [int(keys[i]) for i in range(0, keys.size, step)]
            bounds.append(int(keys[-1]) + 1 if keys.size else 0)
        if len(bounds) < 2:
            bounds = [0, 0]
        for i in range(len(bounds) - 1):
            part = self.export_range(name, bounds[i], bounds[i + 1])
            if i == 0:
                part.extra = extra
            yield part

    @staticmethod
    def _admission_state(d: DynamicTable) -> dict[str, np.ndarray]:
        return (d if d.directory is None else d.directory.table).admission_state()

    def _tiered_rows(self, group: _Group, ti: int) -> np.ndarray:
        """Every row of a tiered table, ascending by key (a directory's live rows)."""
        d = group.dynamic[ti]
        assert d is not None
        if d.directory is not None:
            return d.directory.table.live_rows()
        return np.arange(group.tables[ti].rows, dtype=np.int64)

    def export_keys(self, name: str) -> np.ndarray:
        """The keys :meth:`export_table` returns for ``name``, ascending (of a dynamic table,
        tiered or not, from its index in memory; no row is read)."""
        group, ti, _ = self._locate(name)
        d = group.dynamic[ti]
        if d is None or (d.store is not None and d.directory is None):
            return np.arange(self.export_rows(name), dtype=np.int64)
        keyed = d if d.directory is None else d.directory.table
        return keyed.row_key[keyed.live_rows()]

    def export_extra(self, name: str) -> dict[str, np.ndarray]:
        """What :meth:`export_chunks` puts in the first chunk's ``extra``: a dynamic table's
        admission state (empty for a static table)."""
        group, ti, _ = self._locate(name)
        d = group.dynamic[ti]
        return {} if d is None else self._admission_state(d)

    def _state_of(self, rows: Any, keys: np.ndarray, group: _Group) -> TableState:
        host = self.backend.to_host
        slots = {}
        for spec, arr in zip(self._slot_specs, group.slots, strict=True):
            part = host(arr[rows])
            slots[spec.name] = part.reshape(-1) if spec.per_row else part
        meta = host(group.meta[rows])
        return TableState(keys=keys, values=host(group.values[rows]), slots=slots,
                          update_count=meta[:, 0].astype(np.int64),
                          last_step=meta[:, 1].astype(np.int64) - 1)

    def _full_rows(self, group: _Group, ti: int, rows: np.ndarray
                   ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        """Whole state of rows of a tiered table wherever they are: initial, else the store's,
        else (newest) the cache's."""
        d = group.dynamic[ti]
        assert d is not None and d.store is not None
        values = self._initial_values(group, ti, rows)
        slots = [np.full((rows.size, arr.shape[1]), spec.initial_value, np.float32)
                 for spec, arr in zip(self._slot_specs, group.slots, strict=True)]
        meta = np.zeros((rows.size, 2), np.int32)
        if d.directory is None:
            d.store.read(rows, values, slots, meta)
        else:  # only rows the store holds for their current key
            held = np.flatnonzero(d.directory.on_store[rows])
            if held.size:
                hv, hm = values[held], meta[held]
                hs = [a[held] for a in slots]
                d.store.read(rows[held], hv, hs, hm)
                values[held], meta[held] = hv, hm
                for dst, src in zip(slots, hs, strict=True):
                    dst[held] = src
        cached = d.find(rows)
        hit = np.flatnonzero(cached >= 0)
        if hit.size:
            cv, cs, cm = self._row_state(group, ti, cached[hit])
            values[hit] = cv
            for dst, src in zip(slots, cs, strict=True):
                dst[hit] = src
            meta[hit] = cm
        return values, slots, meta

    def _tiered_state(self, group: _Group, ti: int, rows: np.ndarray) -> TableState:
        """The state of a tiered table's ``rows`` (a directory's rows for a dynamic one)."""
        values, slots, meta = self._full_rows(group, ti, rows)
        d = group.dynamic[ti]
        assert d is not None
        return TableState(
            keys=rows if d.directory is None else d.directory.table.row_key[rows],
            values=values,
            slots={spec.name: (a.reshape(-1) if spec.per_row else a)
                   for spec, a in zip(self._slot_specs, slots, strict=True)},
            update_count=meta[:, 0].astype(np.int64),
            last_step=meta[:, 1].astype(np.int64) - 1,
        )

    def _import_tiered(self, group: _Group, ti: int, keys: np.ndarray, values: np.ndarray,
                       slots: list[tuple[int, np.ndarray]], counts: np.ndarray | None,
                       last: np.ndarray | None) -> None:
        """Imported rows go where the row is: its cache row, else the store (whole records);
        :data:`IMPORT_CHUNK_ROWS` keys at a time, so a large import holds no whole-table copy."""
        n, step = keys.size, IMPORT_CHUNK_ROWS
        if n > step:
            for a in range(0, n, step):
                b = min(n, a + step)
                self._import_tiered(group, ti, keys[a:b], values[a:b],
                                    [(i, src.reshape(n, group.slots[i].shape[1])[a:b])
                                     for i, src in slots],
                                    None if counts is None else counts[a:b],
                                    None if last is None else last[a:b])
            return
        d = group.dynamic[ti]
        assert d is not None and d.store is not None
        cur_v, cur_s, cur_m = self._full_rows(group, ti, keys)
        cur_v[:] = values
        for i, src in slots:
            cur_s[i][:] = src.reshape(keys.size, cur_s[i].shape[1])
        if counts is not None:
            cur_m[:, 0] = np.minimum(counts, np.iinfo(np.int32).max)
        if last is not None:
            cur_m[:, 1] = last
        cached = d.find(keys)
        hit = np.flatnonzero(cached >= 0)
        if hit.size:
            target = cached[hit] + int(group.table_offset[ti])
            group.values[target] = cur_v[hit]
            for arr, src in zip(group.slots, cur_s, strict=True):
                arr[target] = src[hit]
            group.meta[target] = cur_m[hit]
        rest = np.flatnonzero(cached < 0)
        if rest.size:
            if d.directory is not None:
                d.directory.on_store[keys[rest]] = True
                d.directory.meta[keys[rest]] = cur_m[rest]
            d.store.write(keys[rest], cur_v[rest], [a[rest] for a in cur_s], cur_m[rest])

    def import_table(self, name: str, state: TableState) -> None:
        """Overwrite table ``name`` with ``state`` (rows given by ``state.keys``).

        Slots, ``update_count`` and ``last_step`` are optional; missing ones are left as is.
        """
        group, ti, sl = self._locate(name)
        rows = sl.stop - sl.start
        keys = np.asarray(state.keys, dtype=np.int64).reshape(-1)
        d = group.dynamic[ti]
        if d is None and keys.size and (keys.min() < 0 or keys.max() >= rows):
            raise KeyOutOfRangeError(
                name, int(keys.min() if keys.min() < 0 else keys.max()), name, rows
            )
        dev = self.backend.xp.asarray  # host data to the backend's arrays (no copy on CPU)
        # Every check comes before the first write: a refused import changes nothing.
        values = np.asarray(state.values, dtype=np.float32)
        if values.shape != (keys.size, group.dim):
            raise ValueError(
                f"table {name!r}: values shape {values.shape} != {(keys.size, group.dim)}"
            )
        extra = set(state.slots) - {s.name for s in self._slot_specs}
        if extra:
            raise ValueError(f"table {name!r}: unknown slots {sorted(extra)}")
        slots = []
        for spec, arr in zip(self._slot_specs, group.slots, strict=True):
            if spec.name not in state.slots:
                continue
            src = np.asarray(state.slots[spec.name], dtype=np.float32)
            want = (keys.size,) if spec.per_row else (keys.size, group.dim)
            if src.shape != want:
                raise ValueError(f"table {name!r}: slot {spec.name!r} shape {src.shape} != {want}")
            slots.append((arr, src))
        if d is not None and d.store is not None and d.directory is None:  # rows 0..rows-1
            rows = group.tables[ti].rows
            if keys.size and (keys.min() < 0 or keys.max() >= rows):
                raise KeyOutOfRangeError(
                    name, int(keys.min() if keys.min() < 0 else keys.max()), name, rows)
        limit = np.iinfo(np.int32).max
        counts = last = None
        if state.update_count is not None:
            counts = np.asarray(state.update_count, dtype=np.int64).reshape(-1)
            if counts.shape != (keys.size,):
                raise ValueError(f"table {name!r}: update_count shape {counts.shape} != "
                                 f"{(keys.size,)}")
        if state.last_step is not None:
            last = np.asarray(state.last_step, dtype=np.int64).reshape(-1) + 1
            if last.shape != (keys.size,):
                raise ValueError(f"table {name!r}: last_step shape {last.shape} != "
                                 f"{(keys.size,)}")
            if last.size and int(last.max()) > limit:
                raise ValueError(f"table {name!r}: last_step above {limit - 1} is not supported")
        if d is not None and d.store is not None:
            by_index = [(i, src) for i, (arr, src) in enumerate(slots)]
            names = [spec.name for spec in self._slot_specs if spec.name in state.slots]
            order = {spec.name: i for i, spec in enumerate(self._slot_specs)}
            directory = d.directory
            if directory is not None:  # the keys' rows in the directory (new ones fresh)
                found = directory.table.find(keys)
                local = directory.table.upsert(keys)  # raises (changing nothing) if no fit
                directory.reset(local[found < 0])
                directory.table.load_admission_state(getattr(state, "extra", None) or {})
                keys = local
            self._import_tiered(group, ti, keys, values,
                                [(order[n], src) for n, (_, src) in zip(names, by_index,
                                                                        strict=True)],
                                counts, last)
            return
        if d is None:
            target = dev(keys + sl.start)
        else:
            found = d.find(keys)
            local = d.upsert(keys)  # raises (changing nothing) when the keys do not fit
            fresh = found < 0
            self._fill_rows(group, ti, local[fresh], keys[fresh])
            target = local + sl.start
            d.load_admission_state(getattr(state, "extra", None) or {})
        group.values[target] = dev(values)
        for arr, src in slots:
            arr[target] = dev(src.reshape(keys.size, arr.shape[1]))  # also 0 keys
        if counts is not None:
            group.meta[target, 0] = dev(np.minimum(counts, limit))  # a count saturates
        if last is not None:
            group.meta[target, 1] = dev(last)

    def read_rows(self, table: str, rows: np.ndarray) -> np.ndarray:
        """Current values ``[len(rows), dim]`` of the given rows of ``table`` (a copy)."""
        group, _, sl = self._locate(table)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        n = sl.stop - sl.start
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise IndexError(f"table {table!r}: row out of range [0, {n})")
        be = self.backend
        out = be.xp.empty((rows.size, group.dim), dtype=np.float32)
        be.gather_rows(group.values, be.xp.asarray(rows + sl.start), out)
        return out if be.xp is np else be.to_host(out)

    def read_slot(self, table: str, slot: str, rows: np.ndarray) -> np.ndarray:
        """Current values of optimizer slot ``slot`` for the given rows of ``table``."""
        group, _, sl = self._locate(table)
        names = self.slot_names
        if slot not in names:
            raise KeyError(f"unknown slot {slot!r}; slots: {names}")
        i = names.index(slot)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        n = sl.stop - sl.start
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise IndexError(f"table {table!r}: row out of range [0, {n})")
        out = group.slots[i][self.backend.xp.asarray(rows + sl.start)]
        if self.backend.xp is not np:
            out = self.backend.to_host(out)
        return out.reshape(-1) if self._slot_specs[i].per_row else out

    # ------------------------------------------------------------------ step

    def _prepare(
        self, inputs: Mapping[str, SparseInput]
    ) -> tuple[int, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, int]]]:
        unknown = set(inputs) - set(self._feature_order)
        if unknown:
            raise ValueError(f"inputs for unknown features: {sorted(unknown)}")
        xp = self.backend.xp  # host inputs become the backend's arrays (no copy on CPU)
        no_weights = _NO_WEIGHTS if self.backend.name == "cpu" else xp.empty(0, dtype=np.float32)
        batch = -1
        arrays = {}
        for f in self._features:
            if f.name not in inputs:
                raise ValueError(f"missing input for feature {f.name!r}")
            inp = inputs[f.name]
            keys = self._freeze(_contiguous(xp, inp.keys, np.int64).reshape(-1))
            offs = self._freeze(_contiguous(xp, inp.offsets, np.int64).reshape(-1))
            if batch < 0:
                batch = offs.shape[0] - 1
            if offs.shape[0] != batch + 1 or batch < 0:
                raise ValueError(
                    f"feature {f.name!r}: {offs.shape[0] - 1} samples, expected {batch}"
                )
            if offs[0] != 0 or offs[-1] != keys.shape[0]:
                raise ValueError(
                    f"feature {f.name!r}: offsets must start at 0 and end at len(keys)"
                )
            bag = int(inp.bag_size)
            if bag < 0 or (
                bag > 0 and (keys.shape[0] != batch * bag or (batch > 0 and offs[1] != bag))
            ):
                raise ValueError(
                    f"feature {f.name!r}: bag_size {bag} does not match offsets and keys "
                    f"({keys.shape[0]} keys in {batch} bags)"
                )
            if inp.weights is None:
                w = no_weights
            else:
                w = self._freeze(_contiguous(xp, inp.weights, np.float32).reshape(-1))
                if w.shape[0] != keys.shape[0]:
                    raise ValueError(f"feature {f.name!r}: weights and keys differ in length")
            arrays[f.name] = (keys, offs, w, bag)
        return max(batch, 0), arrays

    def forward(
        self, inputs: Mapping[str, SparseInput], out: Sequence[np.ndarray] | None = None,
        training: bool = True, step: int = -1,
    ) -> list[np.ndarray]:
        """Pooled embeddings: one ``[batch, width]`` float32 array per group (see ``layout``).

        ``out``: optional arrays to write into (C-contiguous float32 ``[batch, width]``, one
        per group), e.g. from :meth:`new_outputs`; reusing them across steps avoids the page
        faults of fresh large arrays. Raises :class:`KeyOutOfRangeError` for a key outside its
        table. Arrays are the backend's (device arrays on ``cuda``).

        Dynamic tables: ``training`` looks keys up and inserts the admitted new ones (evicting
        when full); otherwise keys are only looked up and a key without a row reads what
        ``dynamic.missing`` says. ``step`` only names the step in errors (as the user counts
        steps: from 1).
        """
        be = self.backend
        batch, arrays = self._prepare(inputs)
        self._pending = None
        steps: list[StepBatch | None] = []
        outs = []
        for gi in range(len(self._groups)):
            group = self._groups[gi]
            feats = group.features
            keys = [arrays[f.name][0] for f in feats]
            if feats and group.is_dynamic:
                keys = [self._freeze(k) for k in self._resolve(gi, keys, training, step)]
                group = self._groups[gi]  # rebuilt when it needed more scratch rows
            if out is None:
                dst = be.empty((batch, group.info.width), np.float32)
            else:
                dst = out[group.info.index]
                shape = (batch, group.info.width)
                if dst.shape != shape or dst.dtype != np.float32 or not dst.flags.c_contiguous:
                    raise ValueError(
                        f"out[{group.info.index}] must be C-contiguous float32 {shape}"
                    )
            gstep = None
            if feats:
                gstep = be.pack_step(
                    group.plan,
                    batch,
                    keys,
                    [arrays[f.name][1] for f in feats],
                    [arrays[f.name][2] for f in feats],
                    np.array([arrays[f.name][3] for f in feats], dtype=np.int64),
                )
                err = be.forward_group(group.plan, group.state, gstep, dst, group.scratch)
                if err.any():
                    self._raise_input_error(arrays, group, err)
            steps.append(gstep)
            outs.append(dst)
        self._pending = steps
        self._batch = batch
        return outs

    def _raise_input_error(
        self,
        arrays: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray, int]],
        group: _Group,
        err: np.ndarray,
    ) -> None:
        """Raise the error ``forward_group`` flagged: the first feature (in ``features``
        order) holding a key outside its table, else the first malformed feature of ``group``."""
        xp = self.backend.xp
        for f in self._features:
            if self._tables[f.table].dynamic is not None:
                continue
            keys = arrays[f.name][0]
            rows = self._tables[f.table].rows
            bad = (keys < 0) | (keys >= rows)
            if bool(bad.any()):
                raise KeyOutOfRangeError(f.name, int(keys[int(xp.argmax(bad))]), f.table, rows)
        f = group.features[int(np.flatnonzero(err[:, BAD_OFFSETS] | err[:, BAD_KEY])[0])]
        raise ValueError(
            f"feature {f.name!r}: malformed offsets (decreasing, out of range, or a bag longer "
            f"than hotness {f.hotness} for concat)"
        )

    def new_outputs(self, batch: int) -> list[np.ndarray]:
        """Fresh output arrays for ``forward(..., out=...)``, one ``[batch, width]`` per group."""
        return [self.backend.empty((batch, g.info.width), np.float32) for g in self._groups]

    def backward_update(self, grads: Sequence[np.ndarray], step: int) -> None:
        """Apply d(loss)/d(output) (one array per group) to the rows of the latest forward."""
        update = UpdateStep(self._opt_kind, hyperparams(self.optimizer, int(step)), int(step))
        self._backward(grads, update, lambda group: group.state)
        self._expire(int(step))

    def backward_row_sums(self, grads: Sequence[np.ndarray]) -> None:
        """Sum each row's gradient over the latest forward into the row sums
        (:meth:`take_row_sums`) instead of applying the optimizer.

        The same fused kernel runs as SGD at learning rate 1 on zeroed arrays (``v -= g``), so
        the sums are formed, deduplicated and ordered exactly as an update would see them.
        Data-parallel replicas all-reduce these sums before the optimizer is applied.
        """
        update = UpdateStep(kind_code(_ROW_SUMS), hyperparams(_ROW_SUMS, 0), 0)
        self._backward(grads, update, self._row_sum_state)

    def take_row_sums(self, table: str) -> np.ndarray:
        """``[rows, dim + 1]`` float32: each row's gradient sum since the last call and, in the
        last column, how many backward passes touched it (0: untouched); then resets them."""
        group, _, sl = self._locate(table)
        state = self._row_sum_state(group)
        values, meta = state.values[sl], state.meta[sl]
        if self.backend.xp is not np:
            values, meta = self.backend.to_host(values), self.backend.to_host(meta)
        out = np.empty((sl.stop - sl.start, group.dim + 1), dtype=np.float32)
        np.negative(values, out=out[:, : group.dim])
        out[:, group.dim] = meta[:, 0]
        state.values[sl] = 0.0
        state.meta[sl] = 0
        return out

    def _row_sum_state(self, group: _Group) -> GroupTables:
        if group.row_sums is None:
            be = self.backend
            group.row_sums = GroupTables(be.zeros(tuple(group.values.shape), np.float32), [],
                                         be.zeros((group.values.shape[0], 2), np.int32))
        return group.row_sums

    def _freeze(self, a: Any) -> Any:
        """Read-only inputs for the CPU kernels (one compiled specialisation each, see
        :func:`_frozen`); other backends take their arrays as they are."""
        return _frozen(a) if self.backend.name == "cpu" else a

    def _backward(self, grads: Sequence[np.ndarray], update: UpdateStep,
                  state: Callable[[_Group], GroupTables]) -> None:
        if self._pending is None:
            raise RuntimeError("backward_update needs a forward first (each forward is used once)")
        if len(grads) != len(self._groups):
            raise ValueError(f"expected {len(self._groups)} gradient arrays, got {len(grads)}")
        be = self.backend
        pending, self._pending = self._pending, None
        for group, gstep, grad in zip(self._groups, pending, grads, strict=True):
            want = (self._batch, group.info.width)
            grad = self._freeze(_contiguous(be.xp, grad, np.float32))
            if grad.shape != want:
                raise ValueError(f"group {group.info.index}: gradient shape {grad.shape} != {want}")
            if gstep is None:
                continue
            try:
                bad = be.backward_group(
                    group.plan, state(group), gstep, grad, update, group.scratch
                )
            except ValueError as e:
                raise ValueError(f"group {group.info.index}: {e}") from None
            if bad:
                raise RuntimeError(
                    f"group {group.info.index}: keys or offsets changed between forward and "
                    "backward_update; the invalid ones were skipped"
                )
