"""The embedding engine: fused static tables, forward pooling, fused backward + sparse update.

Arrays in, arrays out (NumPy on CPU); every hot loop is a kernel of the backend
(:mod:`embtrain.kernels`), launched once per group and phase, never once per table or key.
The step reads keys → rows → pool → (dense) → backward → update: where a table's keys have
their rows is the table's *row space* (:mod:`embtrain.embedding.rowspace`: static rows, a
dynamic hash table, a cache over a row store with or without a key directory); keyed groups
turn keys into rows in three visible steps (:mod:`embtrain.embedding.keyed`: resolve,
write back, read in) before the fused forward pools the rows.

Grouping and output layout (:mod:`embtrain.embedding.groups`)
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
from dataclasses import replace
from typing import Any

import numpy as np

from embtrain.embedding.catalog import ModelCatalog
from embtrain.embedding.config import (
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.dynamic import DynamicTable
from embtrain.embedding.dynamic_device import DeviceKeyedGroup, key_phase
from embtrain.embedding.groups import (
    FeatureLayout,
    FusedGroup,
    GroupInfo,
    feature_width,
    fused_groups,
    fused_layout,
    region_rows,
)
from embtrain.embedding.halves import half_pattern, widen
from embtrain.embedding.kernel_inputs import contiguous as _contiguous
from embtrain.embedding.keyed import KeyedGroup
from embtrain.embedding.optimizers import hyperparams, kind_code, slot_specs
from embtrain.embedding.outputs import check_output, gradient_array, output_dtype, output_dtypes
from embtrain.embedding.rows import table_rows
from embtrain.embedding.rows_cache import IMPORT_CHUNK_ROWS
from embtrain.embedding.rowspace import KeyOutOfRangeError, RowContext, TableRows, TableState
from embtrain.embedding.table_import import import_arrays
from embtrain.embedding.tiers import StoreOpener
from embtrain.kernels import KernelBackend, get_backend
from embtrain.kernels.codes import BAD_KEY, BAD_OFFSETS
from embtrain.kernels.contract import GroupTables, KernelTuning, StepBatch, UpdateStep

__all__ = [
    "IMPORT_CHUNK_ROWS",
    "EmbeddingEngine",
    "FeatureLayout",
    "GroupInfo",
    "KeyOutOfRangeError",
    "TableState",
    "feature_width",
    "fused_groups",
    "fused_layout",
]

_Group = FusedGroup  # the name tests and tools know

_ROW_SUMS = SparseOptimizerConfig(kind="sgd", lr=1.0)


class EmbeddingEngine(ModelCatalog):
    """Embedding tables packed into fused groups, with a fused sparse optimizer.

    ``tables``: every table; ``features``: the sparse inputs, each reading one table (several
    features may share a table); ``optimizer``: the one sparse optimizer; ``seed``: initial
    values depend only on (seed, table name, row, column). ``stores`` opens the row store of
    a tiered table (:data:`~embtrain.embedding.tiers.StoreOpener`; the builder hands in the
    registry of tier kinds of :mod:`embtrain.storage`; default: the one registered there).
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        features: Sequence[FeatureConfig],
        optimizer: SparseOptimizerConfig,
        seed: int,
        backend: str = "cpu",
        stores: StoreOpener | None = None,
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
        self._ctx = RowContext(self.backend, self.seed, self._slot_specs)

        self._groups: list[_Group] = []
        self._keyed: dict[int, KeyedGroup | DeviceKeyedGroup] = {}
        self._table_loc: dict[str, tuple[int, int]] = {}
        layout: dict[str, FeatureLayout] = {}
        for gi, (dim, dtype, g_tables, g_feats) in enumerate(fused_groups(tables, features)):
            for ti, t in enumerate(g_tables):
                self._table_loc[t.name] = (gi, ti)
            keyed = g_tables[0].dynamic is not None or g_tables[0].tier is not None
            where = f"table {g_tables[0].name!r}, backend {self.backend.name!r}"
            if g_tables[0].tier is not None and self.backend.xp is not np:
                # its key -> row phase (kernels/dynamic.py) reads host (NumPy) group arrays
                raise ValueError(f"tiered tables run on host arrays only ({where} on a GPU)")
            group = _Group(gi, dim, dtype, g_tables, g_feats,
                           [1] * len(g_tables) if keyed else None, self.seed)
            group.spaces = [table_rows(t, self._ctx, stores) for t in g_tables]
            for ti, space in enumerate(group.spaces):
                space.bind(group, ti)
            if keyed:  # on the device for dynamic tables on cuda, else on the host
                self._keyed[gi] = key_phase(group.spaces, self.backend,
                                            self._group_getter(gi), self._grower(gi))
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

    def _group_getter(self, gi: int) -> Callable[[], _Group]:
        return lambda: self._groups[gi]

    def _grower(self, gi: int) -> Callable[[Sequence[int]], _Group]:
        return lambda need: self._grow_reserve(gi, need)

    # ------------------------------------------------------------------ kernel tuning

    @property
    def tuning(self) -> KernelTuning:
        """How the backend's kernels split each group's work (:class:`KernelTuning`: the
        CPU's ``block`` and ``workers``; other backends report the defaults)."""
        return self.backend.tuning(self._groups[0].scratch) if self._groups else KernelTuning()

    @tuning.setter
    def tuning(self, value: KernelTuning) -> None:
        for g in self._groups:
            self.backend.tune(g.scratch, value)

    @property
    def block(self) -> int:
        """Samples per block of the CPU kernels (see :class:`embtrain.kernels.cpu.CpuScratch`;
        other backends ignore it)."""
        return self.tuning.block

    @block.setter
    def block(self, value: int) -> None:
        self.tuning = replace(self.tuning, block=int(value))

    @property
    def workers(self) -> int | None:
        """Work lists of the CPU backward (None: one per thread; results do not depend on
        it; other backends ignore it)."""
        return self.tuning.workers

    @workers.setter
    def workers(self, value: int | None) -> None:
        self.tuning = replace(self.tuning, workers=value)

    # ------------------------------------------------------------------ properties

    @property
    def groups(self) -> tuple[GroupInfo, ...]:
        """The fused groups, in output order."""
        return tuple(g.info for g in self._groups)

    # ------------------------------------------------------------------ state

    def _allocate(self, group: _Group) -> None:
        """The group's arrays in its dtype (a half table's values, and its slots with
        ``optimizer_state: table``, as uint16 patterns), initialised."""
        be = self.backend
        n, dim, plan = group.total_rows, group.dim, group.plan
        group.values = be.empty((n, dim), np.uint16 if plan.value_code else np.float32)
        if group.is_dynamic:
            # Rows are filled when a key takes them. The pages are touched now, by the
            # parallel fill kernels: left to the first insert, faulting them in (the kernel
            # zeroing each huge page) cost ~170 ms a step on DE tiny while new keys arrive.
            if plan.value_code:
                be.fill_u16(group.values.reshape(-1), 0)
            else:
                be.fill_f32(group.values.reshape(-1), 0.0)
        else:
            for space in group.spaces:
                space.init_values()  # type: ignore[attr-defined]
        group.slots = []
        for spec in self._slot_specs:
            arr = be.empty((n, 1 if spec.per_row else dim),
                           np.uint16 if plan.slot_code else np.float32)
            if plan.slot_code:
                be.fill_u16(arr.reshape(-1), int(half_pattern(spec.initial_value,
                                                              plan.slot_code)))
            else:
                be.fill_f32(arr.reshape(-1), spec.initial_value)
            group.slots.append(arr)
        # int32 pairs: half the bytes of int64 per row, so more of the rows a step touches
        # stay in cache (the pair is read and written for every updated row).
        if group.is_dynamic:
            group.meta = be.empty((n, 2), np.int32)
            be.fill_i32(group.meta.reshape(-1), 0)
        else:
            group.meta = be.zeros((n, 2), np.int32)

    def _locate(self, table: str) -> tuple[_Group, int, slice]:
        if table not in self._table_loc:
            raise KeyError(f"unknown table {table!r}")
        gi, ti = self._table_loc[table]
        group = self._groups[gi]
        off = int(group.table_offset[ti])
        return group, ti, slice(off, off + region_rows(group.tables[ti]))

    def _space(self, table: str) -> TableRows:
        group, ti, _ = self._locate(table)
        return group.spaces[ti]

    def _grow_reserve(self, gi: int, need: Sequence[int]) -> _Group:
        """Group ``gi`` rebuilt with at least ``need[t]`` scratch rows per table (rows and
        state of every table copied over; happens a few times early in a run)."""
        old = self._groups[gi]
        reserve = np.maximum(old.reserve, (np.asarray(need, np.int64) * 3) // 2 + 1)
        group = _Group(gi, old.dim, old.info.dtype, old.tables, old.features, reserve,
                       self.seed)
        group.spaces = old.spaces
        group.epoch = old.epoch
        group.scratch = self.backend.new_scratch(group.plan)
        self.backend.tune(group.scratch, self.backend.tuning(old.scratch))
        self._allocate(group)
        for ti, t in enumerate(old.tables):
            a, b, n = int(old.table_offset[ti]), int(group.table_offset[ti]), region_rows(t)
            group.values[b : b + n] = old.values[a : a + n]
            for new, prev in zip(group.slots, old.slots, strict=True):
                new[b : b + n] = prev[a : a + n]
            group.meta[b : b + n] = old.meta[a : a + n]
        for ti, space in enumerate(group.spaces):
            space.bind(group, ti)
        self._groups[gi] = group
        return group

    # ------------------------------------------------------------------ row spaces

    def read_ahead(self, inputs: Mapping[str, SparseInput]) -> None:
        """Tiered tables start reading the rows that ``inputs`` (the next training step's
        batch) will miss in their caches, in the background while this step's dense part
        runs. Call it after this step's forward: the rows missing then are what the next
        forward fills (nothing enters or leaves a cache in between). A no-op without tiers."""
        for group in self._groups:
            for ti, space in enumerate(group.spaces):
                if not space.reads_ahead:
                    continue
                keys = [np.asarray(inputs[group.features[f].name].keys, np.int64)
                        for f in group.feats_of(ti).tolist() if group.features[f].name in inputs]
                if keys:
                    space.prefetch(keys)

    def look_ahead(self, inputs: Mapping[str, SparseInput]) -> None:
        """Hash tables in memory start looking up the keys of ``inputs`` (the next training
        step's batch) on a thread of their own (:meth:`KeyedGroup.look_ahead`); the next
        forward of the same inputs uses that lookup when no index changed meanwhile. Nothing
        for inputs the forward would refuse (it raises then, at its own step), on a device
        (it looks up in its forward) or without dynamic tables."""
        if not self._keyed or not self.backend.looks_up_ahead:  # the device looks up in its forward
            return
        try:
            _, arrays = self._prepare(inputs)
        except ValueError:
            return
        for gi, keyed in self._keyed.items():
            if self._groups[gi].features:
                keyed.look_ahead([arrays[f.name][0] for f in self._groups[gi].features])

    def _settle(self) -> None:
        """Stop the look-aheads' threads (before anything may change an index)."""
        for keyed in self._keyed.values():
            keyed.settle()

    @property
    def lookahead_items(self) -> tuple[int, int]:
        """Of the look-aheads a forward used: the chunks of keys their threads looked up while
        the step before computed, and all their chunks (the rest: in the forward)."""
        items = [k.ahead_items for k in self._keyed.values()]
        return sum(i[0] for i in items), sum(i[1] for i in items)

    def _expire(self, step: int) -> None:
        """TTL at the step boundary after training step ``step``."""
        for group in self._groups:
            if group.is_dynamic:
                for space in group.spaces:
                    space.expire(step)

    def _metrics(self, kind: str) -> dict[str, dict[str, float]]:
        out = {}
        for g in self._groups:
            for space in g.spaces:
                if space.keyed:
                    m = space.metrics()
                    if kind in m:
                        out[space.table.name] = m[kind]
        return out

    def dynamic_metrics(self) -> dict[str, dict[str, float]]:
        """Per dynamic table: rows, capacity, inserts, evictions, expired, pending admissions,
        load factor."""
        return self._metrics("dynamic")

    def tier_metrics(self) -> dict[str, dict[str, float]]:
        """Per tiered table: cache rows, lookups and misses (key occurrences), hit rate,
        distinct misses (rows a step missed, each once), evictions (written back) and what its
        store read and wrote."""
        return self._metrics("tier")

    def dynamic_table(self, name: str) -> DynamicTable | None:
        """The key → row table of dynamic table ``name`` (a tiered one's directory), or a
        tiered static table's cache; None for a static table in memory."""
        return self._space(name).hash_table()

    def export_table(self, name: str) -> TableState:
        """A copy of table ``name``'s keys, values, slots, update_count and last_step."""
        return self._space(name).export_table()

    def streams(self, name: str) -> bool:
        """Whether table ``name`` should be exported chunk by chunk (:meth:`export_chunks`):
        a tiered table, whose rows mostly live in its store."""
        return self._space(name).streams()

    def export_rows(self, name: str) -> int:
        """How many rows :meth:`export_table` returns for ``name`` (static: its rows; dynamic:
        its live keys)."""
        return self._space(name).export_rows()

    def export_range(self, name: str, lo: int, hi: int) -> TableState:
        """The rows of table ``name`` whose keys lie in ``[lo, hi)``, ascending by key (the
        same arrays :meth:`export_table` has for them; ``extra`` empty). A tiered table reads
        only these rows from its cache and store."""
        return self._space(name).export_range(lo, hi)

    def export_chunks(self, name: str, rows: int = 1 << 20) -> Iterator[TableState]:
        """Table ``name`` as consecutive chunks of at most ``rows`` rows, ascending by key:
        together exactly :meth:`export_table` (a dynamic table's admission state in the first
        chunk's ``extra``). A tiered table is read chunk by chunk, never whole."""
        return self._space(name).export_chunks(rows)

    def export_keys(self, name: str) -> np.ndarray:
        """The keys :meth:`export_table` returns for ``name``, ascending (of a dynamic table,
        tiered or not, from its index in memory; no row is read)."""
        return self._space(name).export_keys()

    def export_extra(self, name: str) -> dict[str, np.ndarray]:
        """What :meth:`export_chunks` puts in the first chunk's ``extra``: a dynamic table's
        admission state (empty for a static table)."""
        return self._space(name).export_extra()

    def import_table(self, name: str, state: TableState) -> None:
        """Overwrite table ``name`` with ``state`` (rows given by ``state.keys``).

        Slots, ``update_count`` and ``last_step`` are optional; missing ones are left as is.
        """
        group, ti, _ = self._locate(name)
        space = group.spaces[ti]
        keys = np.asarray(state.keys, dtype=np.int64).reshape(-1)
        self._settle()
        space.check_import(keys)
        # every check comes before the first write: a refused import changes nothing
        got = import_arrays(name, state, keys, group.dim, group.plan.value_code,
                            group.plan.slot_code, self._slot_specs)
        space.import_rows(keys, got.values, got.slots, got.counts, got.last,
                          getattr(state, "extra", None) or {})

    def _checked_rows(self, table: str, rows: np.ndarray) -> tuple[_Group, np.ndarray]:
        """``table``'s group and its ``rows`` (range-checked) as group rows."""
        group, _, sl = self._locate(table)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        n = sl.stop - sl.start
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise IndexError(f"table {table!r}: row out of range [0, {n})")
        return group, rows + sl.start

    def read_rows(self, table: str, rows: np.ndarray) -> np.ndarray:
        """Current values ``[len(rows), dim]`` of the given rows of ``table`` (a copy)."""
        group, rows = self._checked_rows(table, rows)
        be = self.backend
        out = be.xp.empty((rows.size, group.dim), dtype=np.float32)
        if group.plan.value_code:
            be.gather_widen(group.values, be.xp.asarray(rows), out, group.plan.value_code)
        else:
            be.gather_rows(group.values, be.xp.asarray(rows), out)
        return out if be.xp is np else be.to_host(out)

    def read_slot(self, table: str, slot: str, rows: np.ndarray) -> np.ndarray:
        """Current values of optimizer slot ``slot`` for the given rows of ``table``."""
        names = self.slot_names
        if slot not in names:
            raise KeyError(f"unknown slot {slot!r}; slots: {names}")
        i = names.index(slot)
        group, rows = self._checked_rows(table, rows)
        out = group.slots[i][self.backend.xp.asarray(rows)]
        if self.backend.xp is not np:
            out = self.backend.to_host(out)
        if group.plan.slot_code:
            out = widen(out, group.plan.slot_code)
        return out.reshape(-1) if self._slot_specs[i].per_row else out

    # ------------------------------------------------------------------ step

    def _prepare(
        self, inputs: Mapping[str, SparseInput]
    ) -> tuple[int, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, int]]]:
        unknown = set(inputs) - set(self._feature_order)
        if unknown:
            raise ValueError(f"inputs for unknown features: {sorted(unknown)}")
        xp = self.backend.xp  # host inputs become the backend's arrays (no copy on CPU)
        freeze = self.backend.kernel_input
        no_weights = self.backend.no_weights()
        batch = -1
        arrays = {}
        for f in self._features:
            if f.name not in inputs:
                raise ValueError(f"missing input for feature {f.name!r}")
            inp = inputs[f.name]
            keys = freeze(_contiguous(xp, inp.keys, np.int64).reshape(-1))
            offs = freeze(_contiguous(xp, inp.offsets, np.int64).reshape(-1))
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
                w = freeze(_contiguous(xp, inp.weights, np.float32).reshape(-1))
                if w.shape[0] != keys.shape[0]:
                    raise ValueError(f"feature {f.name!r}: weights and keys differ in length")
            arrays[f.name] = (keys, offs, w, bag)
        return max(batch, 0), arrays


    def forward(
        self, inputs: Mapping[str, SparseInput], out: Sequence[np.ndarray] | None = None,
        training: bool = True, step: int = -1, pool: bool = True,
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

        ``pool=False``: only what :meth:`backward_update` needs (keys → rows), no range check
        and no pooling kernel, and nothing returned: for an update whose rows the caller
        knows to be valid (the data-parallel replicas' touched rows).
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
                keyed = self._keyed[gi]
                rows = keyed.resolve(keys, training, step)  # keys → rows, misses placed
                keyed.write_back(rows)  # evicted cache rows → their row stores
                keys = [be.kernel_input(r) for r in keyed.read_in(rows)]  # new rows filled
                group = self._groups[gi]  # rebuilt when it needed more scratch rows
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
            if not pool:  # the update's rows only
                steps.append(gstep)
                continue
            if out is None:
                dst = be.empty((batch, group.info.width), np.float32)
            else:
                dst = out[group.info.index]
                check_output(be, dst, (batch, group.info.width), group.info.index)
            if gstep is not None:
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

    def new_outputs(self, batch: int, dtype: Any = np.float32) -> list[np.ndarray]:
        """Fresh output arrays for ``forward(..., out=...)``, one ``[batch, width]`` per group;
        ``dtype`` float32, or one of :meth:`output_dtypes` (a network's compute dtype)."""
        dt = output_dtype(self.backend, dtype)
        return [self.backend.empty((batch, g.info.width), dt) for g in self._groups]

    def output_dtypes(self) -> tuple[str, ...]:
        """Half dtypes the forward writes besides float32 (:mod:`embtrain.embedding.outputs`)."""
        return output_dtypes(self.backend)

    def backward_update(self, grads: Sequence[np.ndarray], step: int) -> None:
        """Apply d(loss)/d(output) (one array per group) to the rows of the latest forward."""
        update = UpdateStep(self._opt_kind, hyperparams(self.optimizer, int(step)), int(step))
        self._settle()  # a look-ahead's lookup is done before the update and the TTL
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
        self._settle()
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
            grad = be.kernel_input(gradient_array(be, grad))  # bfloat16 kept where it is read
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
