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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from embtrain.embedding.config import (
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.initializers import initializer_code, table_base
from embtrain.embedding.optimizers import hyperparams, kind_code, slot_specs
from embtrain.errors import DataError
from embtrain.kernels import KernelBackend, codes, get_backend
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
    """A table's full state, for checkpoints: keys (row ids), values, slots and metadata."""

    keys: np.ndarray
    values: np.ndarray
    slots: dict[str, np.ndarray] = field(default_factory=dict)
    update_count: np.ndarray | None = None
    last_step: np.ndarray | None = None


class _Group:
    """Arrays and static index structures of one fused group."""

    def __init__(
        self,
        index: int,
        dim: int,
        dtype: str,
        tables: list[TableConfig],
        features: list[FeatureConfig],
    ):
        self.dim = dim
        self.tables = tables
        self.features = features
        t_index = {t.name: i for i, t in enumerate(tables)}
        rows = np.array([t.rows for t in tables], dtype=np.int64)
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

    @property
    def state(self) -> GroupTables:
        """The state arrays as the backend takes them."""
        return GroupTables(self.values, self.slots, self.meta)


# the fused update that only sums: values -= 1 * g on zeroed arrays (see backward_row_sums)
_ROW_SUMS = SparseOptimizerConfig(kind="sgd", lr=1.0)


def fused_groups(
    tables: Sequence[TableConfig], features: Sequence[FeatureConfig]
) -> list[tuple[int, str, list[TableConfig], list[FeatureConfig]]]:
    """The engine's grouping: ``(dim, dtype, tables, features)`` per group, groups in order of
    their first table; a group's columns hold its tables in order, each table's features in
    ``features`` order."""
    keys: list[tuple[int, str]] = []
    for t in tables:
        if (t.dim, t.dtype) not in keys:
            keys.append((t.dim, t.dtype))
    out = []
    for dim, dtype in keys:
        g_tables = [t for t in tables if (t.dim, t.dtype) == (dim, dtype)]
        g_feats = [f for t in g_tables for f in features if f.table == t.name]
        out.append((dim, dtype, g_tables, g_feats))
    return out


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
            group = _Group(gi, dim, dtype, g_tables, g_feats)
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
        return group, ti, slice(off, off + int(group.table_rows[ti]))

    def export_table(self, name: str) -> TableState:
        """A copy of table ``name``'s keys, values, slots, update_count and last_step."""
        group, _, sl = self._locate(name)
        host = self.backend.to_host
        slots = {}
        for spec, arr in zip(self._slot_specs, group.slots, strict=True):
            part = host(arr[sl])
            slots[spec.name] = part.reshape(-1) if spec.per_row else part
        meta = host(group.meta[sl])
        return TableState(
            keys=np.arange(sl.stop - sl.start, dtype=np.int64),
            values=host(group.values[sl]),
            slots=slots,
            update_count=meta[:, 0].astype(np.int64),
            last_step=meta[:, 1].astype(np.int64) - 1,
        )

    def import_table(self, name: str, state: TableState) -> None:
        """Overwrite table ``name`` with ``state`` (rows given by ``state.keys``).

        Slots, ``update_count`` and ``last_step`` are optional; missing ones are left as is.
        """
        group, _, sl = self._locate(name)
        rows = sl.stop - sl.start
        keys = np.asarray(state.keys, dtype=np.int64).reshape(-1)
        if keys.size and (keys.min() < 0 or keys.max() >= rows):
            raise KeyOutOfRangeError(
                name, int(keys.min() if keys.min() < 0 else keys.max()), name, rows
            )
        dev = self.backend.xp.asarray  # host data to the backend's arrays (no copy on CPU)
        target = dev(keys + sl.start)
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
        group.values[target] = dev(values)
        for arr, src in slots:
            arr[target] = dev(src.reshape(keys.size, -1))
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
        self, inputs: Mapping[str, SparseInput], out: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """Pooled embeddings: one ``[batch, width]`` float32 array per group (see ``layout``).

        ``out``: optional arrays to write into (C-contiguous float32 ``[batch, width]``, one
        per group), e.g. from :meth:`new_outputs`; reusing them across steps avoids the page
        faults of fresh large arrays. Raises :class:`KeyOutOfRangeError` for a key outside its
        table. Arrays are the backend's (device arrays on ``cuda``).
        """
        be = self.backend
        batch, arrays = self._prepare(inputs)
        self._pending = None
        steps: list[StepBatch | None] = []
        outs = []
        for group in self._groups:
            feats = group.features
            if out is None:
                dst = be.empty((batch, group.info.width), np.float32)
            else:
                dst = out[group.info.index]
                shape = (batch, group.info.width)
                if dst.shape != shape or dst.dtype != np.float32 or not dst.flags.c_contiguous:
                    raise ValueError(
                        f"out[{group.info.index}] must be C-contiguous float32 {shape}"
                    )
            step = None
            if feats:
                step = be.pack_step(
                    group.plan,
                    batch,
                    [arrays[f.name][0] for f in feats],
                    [arrays[f.name][1] for f in feats],
                    [arrays[f.name][2] for f in feats],
                    np.array([arrays[f.name][3] for f in feats], dtype=np.int64),
                )
                err = be.forward_group(group.plan, group.state, step, dst, group.scratch)
                if err.any():
                    self._raise_input_error(arrays, group, err)
            steps.append(step)
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
