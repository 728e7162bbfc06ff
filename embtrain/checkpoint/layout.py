"""Where a table's and the dense model's arrays live inside a bundle, and how to read them.

Per table ``<name>`` (``.npy`` format)::

    tables/<name>/keys.npy          int64[rows], strictly increasing
    tables/<name>/values.npy        float32[rows, dim]; uint16[rows, dim] bit patterns for a
                                    float16 / bfloat16 table (the manifest's ``dtype``)
    tables/<name>/<slot>.npy        one per optimizer slot: [rows, dim] or [rows] (row-wise),
                                    float32 (uint16 patterns with the manifest's
                                    ``state_dtype`` a half type)
    tables/<name>/update_count.npy  int64[rows]: steps that updated the row
    tables/<name>/last_step.npy     int64[rows]: 0-based index of the last step that updated it, -1: never
    tables/<name>/removed_keys.npy  increments only: int64 keys deleted since the base
    tables/<name>/admission_keys.npy, admission_counts.npy   dynamic tables with count
                                    admission: keys counted and not admitted yet, their counts
    tables/<name>/bloom.npy         dynamic tables with Bloom admission: the uint8 counters

Parquet exports hold one ``tables/<name>.parquet`` per table instead (columns ``key``,
``values`` as ``fixed_size_list<float32>[dim]``, one column per slot, ``update_count``,
``last_step``; a half table's values and slots widened to float32, exactly). The dense model: ``dense/weights-000.npy ...`` and ``dense/optimizer-000.npy ...``
in the order of ``DenseModel.get_weights()`` / ``optimizer_state()``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from embtrain.checkpoint.bundle import Bundle, NpyRows, load_arrays, verify_bundle
from embtrain.checkpoint.bundle_format import CheckpointError
from embtrain.checkpoint.bundle_write import ArraySource, Source, StreamMember, StreamSource

META_ARRAYS = ("update_count", "last_step")
EXTRA_ARRAYS = ("admission_keys", "admission_counts", "bloom")
RESERVED_NAMES = frozenset({"keys", "values", "removed_keys", *META_ARRAYS, *EXTRA_ARRAYS})
CHUNK_ROWS = 1 << 20  # rows per chunk when a table streams (checkpoints, restores, exports)
CHUNK_BYTES = 16 << 20  # ... and at most about this many bytes of a table's arrays
CHUNK_ENV = "EMBTRAIN_TEST_CHUNK_ROWS"  # test hook: a smaller chunk in subprocesses


def chunk_rows(row_bytes: int = 0) -> int:
    """Rows per chunk of a streamed table whose row (keys, values, slots, metadata) takes
    ``row_bytes``: :data:`CHUNK_ROWS`, fewer where that would exceed :data:`CHUNK_BYTES`;
    the test hook's value when set."""
    env = os.environ.get(CHUNK_ENV)
    if env:
        return max(1, int(env))
    rows = max(1, int(CHUNK_ROWS))
    return max(1, min(rows, int(CHUNK_BYTES) // row_bytes)) if row_bytes > 0 else rows


def config_row_bytes(dim: int, slots: int) -> int:
    """Bytes of one exported row of a float32 table of width ``dim`` with ``slots`` optimizer
    slots (each counted ``dim`` wide): what :func:`chunk_rows` needs, from the recipe alone."""
    return 8 + 16 + 4 * int(dim) * (1 + int(slots))


def bundle_row_bytes(bundle: Bundle, name: str) -> int:
    """Bytes of one row of table ``name`` over its ``.npy`` members (0 for an empty table)."""
    meta = bundle.manifest["tables"][name]
    rows = int(meta.get("rows", 0))
    if not rows:
        return 0
    base = f"tables/{name}/"
    stems = ["keys", "values", *meta.get("slots", {}), *META_ARRAYS]
    return sum(bundle.files[f"{base}{s}.npy"].bytes for s in stems
               if f"{base}{s}.npy" in bundle.files) // rows


class TableStateLike(Protocol):
    """What ``EmbeddingEngine.export_table`` returns (``embtrain.embedding.TableState``)."""

    keys: np.ndarray
    values: np.ndarray
    slots: dict[str, np.ndarray]
    update_count: np.ndarray | None
    last_step: np.ndarray | None


class EngineLike(Protocol):
    """The engine methods checkpoints use."""

    @property
    def table_names(self) -> tuple[str, ...]: ...

    @property
    def slot_names(self) -> tuple[str, ...]: ...

    def export_table(self, name: str) -> Any: ...

    def import_table(self, name: str, state: Any) -> None: ...


class DenseModelLike(Protocol):
    """The dense-model methods checkpoints use."""

    def get_weights(self) -> list[np.ndarray]: ...

    def set_weights(self, weights: Sequence[np.ndarray]) -> None: ...

    def optimizer_state(self) -> list[np.ndarray]: ...

    def load_optimizer_state(self, arrays: Sequence[np.ndarray]) -> None: ...


@dataclass
class TableData:
    """One table's arrays; has the attributes of ``embtrain.embedding.TableState``."""

    keys: np.ndarray
    values: np.ndarray
    slots: dict[str, np.ndarray] = field(default_factory=dict)
    update_count: np.ndarray | None = None
    last_step: np.ndarray | None = None
    removed_keys: np.ndarray | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    # the table's dtype and its slots' (float32, or a half type stored as uint16 patterns)
    dtype: str = "float32"
    state_dtype: str = "float32"

    @property
    def rows(self) -> int:
        return int(self.keys.shape[0])

    @classmethod
    def from_state(cls, state: TableStateLike) -> TableData:
        """Copy-free view of an engine ``TableState``; rows sorted by key (copied only if unsorted)."""
        rows = int(np.asarray(state.keys).shape[0])
        update_count = (
            state.update_count if state.update_count is not None else np.zeros(rows, np.int64)
        )
        last_step = state.last_step if state.last_step is not None else np.full(rows, -1, np.int64)
        data = cls(
            np.asarray(state.keys, dtype=np.int64),
            np.asarray(state.values),
            {k: np.asarray(v) for k, v in state.slots.items()},
            np.asarray(update_count, dtype=np.int64),
            np.asarray(last_step, dtype=np.int64),
            extra={k: np.asarray(v) for k, v in (getattr(state, "extra", None) or {}).items()},
            dtype=getattr(state, "dtype", "float32"),
            state_dtype=getattr(state, "state_dtype", "float32"),
        )
        return data.sorted()

    def sorted(self) -> TableData:
        """The same rows ordered by key (a no-op when already strictly increasing)."""
        k = self.keys
        if k.shape[0] < 2 or bool(np.all(k[1:] > k[:-1])):
            return self
        order = np.argsort(k, kind="stable")
        return self.take(order)

    def take(self, index: np.ndarray) -> TableData:
        """The rows at ``index`` (a copy)."""
        return TableData(
            self.keys[index],
            self.values[index],
            {k: v[index] for k, v in self.slots.items()},
            None if self.update_count is None else self.update_count[index],
            None if self.last_step is None else self.last_step[index],
            extra=self.extra,
            dtype=self.dtype,
            state_dtype=self.state_dtype,
        )

    def arrays(self) -> Iterator[tuple[str, np.ndarray]]:
        """``(file stem, array)`` pairs in file order."""
        yield "keys", self.keys
        yield "values", self.values
        yield from self.slots.items()
        if self.update_count is not None:
            yield "update_count", self.update_count
        if self.last_step is not None:
            yield "last_step", self.last_step
        if self.removed_keys is not None:
            yield "removed_keys", self.removed_keys
        for stem in EXTRA_ARRAYS:
            if stem in self.extra:
                yield stem, self.extra[stem]


def dtypes_of(meta: dict[str, Any]) -> dict[str, str]:
    """``dtype`` / ``state_dtype`` of a table from its manifest description (bundles written
    before half tables: float32)."""
    return {"dtype": str(meta.get("dtype", "float32")),
            "state_dtype": str(meta.get("state_dtype", "float32"))}


def c_order(array: np.ndarray) -> np.ndarray:
    """``array`` itself when C-contiguous, else a C-ordered copy (0-d arrays stay 0-d)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.array(array, order="C")


def check_slot_names(slots: Sequence[str]) -> None:
    """Slot names must be usable as file stems and not clash with the fixed arrays."""
    for name in slots:
        if name in RESERVED_NAMES or not name or "/" in name or name.startswith("."):
            raise ValueError(f"optimizer slot name {name!r} cannot be checkpointed")


def table_meta(data: TableData) -> dict[str, Any]:
    """The manifest's description of a table."""
    meta = {
        "rows": data.rows,
        "dim": int(data.values.shape[1]) if data.values.ndim == 2 else 0,
        "dtype": data.dtype,
        "slots": {k: [int(s) for s in v.shape[1:]] for k, v in data.slots.items()},
    }
    if data.state_dtype != "float32":
        meta["state_dtype"] = data.state_dtype
    extra = [s for s in EXTRA_ARRAYS if s in data.extra]
    if extra:
        meta["extra"] = extra
    return meta


def table_files(name: str, data: TableData) -> Iterator[tuple[str, Source]]:
    """Bundle members of one table."""
    check_slot_names(list(data.slots))
    for stem, arr in data.arrays():
        yield f"tables/{name}/{stem}.npy", ArraySource(c_order(arr))


def stream_meta(total: int, head: TableData) -> dict[str, Any]:
    """:func:`table_meta` of a table of ``total`` rows whose first chunk is ``head``."""
    meta = table_meta(TableData(np.empty(0, np.int64), head.values, head.slots,
                                extra=head.extra, dtype=head.dtype,
                                state_dtype=head.state_dtype))
    meta["rows"] = int(total)
    return meta


def table_stream(
    name: str, total: int, chunks: Iterable[TableStateLike],
    removed_keys: np.ndarray | None = None,
) -> tuple[StreamSource, dict[str, Any]]:
    """One table written from key-ordered chunks of ``total`` rows in all (a dynamic table's
    admission state in the first chunk's ``extra``; an increment's ``removed_keys`` given
    whole): the bundle source of its members (the files :func:`table_files` writes for the
    whole table, byte for byte) and its manifest description. The first chunk is taken from
    ``chunks`` here."""
    it = iter(chunks)
    first = next(it, None)
    if first is None:
        raise ValueError(f"table {name!r}: no chunk at all (an empty table is one empty chunk)")
    head = TableData.from_state(first)
    check_slot_names(list(head.slots))
    slots = list(head.slots)
    extra = [s for s in EXTRA_ARRAYS if s in head.extra]
    whole = ([] if removed_keys is None else [np.asarray(removed_keys, np.int64)])
    whole += [head.extra[s] for s in extra]
    base = f"tables/{name}/"
    members = [StreamMember(base + "keys.npy", np.dtype(np.int64), (total,)),
               StreamMember(base + "values.npy", head.values.dtype,
                            (total, *head.values.shape[1:]))]
    members += [StreamMember(f"{base}{s}.npy", head.slots[s].dtype,
                             (total, *head.slots[s].shape[1:])) for s in slots]
    members += [StreamMember(f"{base}{s}.npy", np.dtype(np.int64), (total,))
                for s in META_ARRAYS]
    members += [StreamMember(f"{base}{s}.npy", a.dtype, a.shape) for s, a in zip(
        (["removed_keys"] if removed_keys is not None else []) + extra, whole, strict=True)]
    meta = stream_meta(total, head)

    def arrays() -> Iterator[list[np.ndarray]]:
        last: int | None = None
        data, i = head, 0
        while True:
            if set(data.slots) != set(slots):
                raise ValueError(f"table {name!r}: a chunk with slots {sorted(data.slots)}, "
                                 f"the first had {sorted(slots)}")
            if data.rows:
                if last is not None and int(data.keys[0]) <= last:
                    raise ValueError(f"table {name!r}: chunks out of key order")
                last = int(data.keys[-1])
            assert data.update_count is not None and data.last_step is not None
            out = [data.keys, data.values, *(data.slots[s] for s in slots), data.update_count,
                   data.last_step]
            out += [a if i == 0 else a[:0] for a in whole]
            yield out
            nxt = next(it, None)
            if nxt is None:
                return
            data, i = TableData.from_state(nxt), i + 1

    return StreamSource(tuple(members), arrays()), meta


def iter_table_chunks(bundle: Bundle, name: str, rows: int | None = None,
                      members: Sequence[str] | None = None, verify: bool = False
                      ) -> Iterator[TableData]:
    """Table ``name`` of a ``.npy`` bundle as consecutive chunks of ``rows`` rows (default
    :func:`chunk_rows`), each read from the files with ``pread`` (never mapped, never whole);
    extras (admission state) and ``removed_keys`` (increments) whole in the first chunk only.
    ``members``: only these stems (e.g. ``["keys", "last_step"]``); the others come as empty
    arrays. ``verify``: every file read is hashed on the way and checked against the
    manifest after the last chunk (an error then, from the iterator's end); else the bundle
    must have been verified already."""
    if name not in bundle.manifest.get("tables", {}):
        raise CheckpointError(f"{bundle.path}: has no table {name!r}")
    step = chunk_rows(bundle_row_bytes(bundle, name)) if rows is None else max(1, int(rows))
    slots = list(bundle.manifest["tables"][name].get("slots", {}))
    base = f"tables/{name}/"
    stems = [m[len(base):-4] for m in table_members(bundle, name)]
    wanted = set(stems if members is None else members)
    with ExitStack() as stack:
        readers = {s: stack.enter_context(NpyRows(bundle, f"{base}{s}.npy", verify))
                   for s in stems if s in wanted}
        whole = {s: r.read(0, r.rows) for s, r in readers.items()
                 if s in EXTRA_ARRAYS or s == "removed_keys"}
        total = int(bundle.manifest["tables"][name]["rows"])
        for s, r in readers.items():
            if s not in whole and r.rows != total:
                raise CheckpointError(f"{r.path}: {r.rows} rows, the manifest's table has "
                                      f"{total}; the checkpoint is corrupt")
        entries = {s: bundle.files[f"{base}{s}.npy"] for s in stems}

        def part(stem: str, lo: int, hi: int) -> np.ndarray:
            if stem in readers:
                return readers[stem].read(lo, hi)
            shape = entries[stem].shape or (0,)
            return np.empty((0, *shape[1:]), dtype=np.dtype(entries[stem].dtype or "int64"))

        for i, lo in enumerate(range(0, max(total, 1), step)):
            hi = min(total, lo + step)
            yield TableData(
                part("keys", lo, hi), part("values", lo, hi),
                {s: part(s, lo, hi) for s in slots},
                part("update_count", lo, hi), part("last_step", lo, hi),
                whole.get("removed_keys") if i == 0 and "removed_keys" in stems else None,
                extra={s: a for s, a in whole.items() if s in EXTRA_ARRAYS} if i == 0 else {},
                **dtypes_of(bundle.manifest["tables"][name]),
            )
        if verify:
            for r in readers.values():
                r.check()


def dense_files(
    weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray]
) -> Iterator[tuple[str, Source]]:
    """Bundle members of the dense model."""
    for i, w in enumerate(weights):
        yield f"dense/weights-{i:03d}.npy", ArraySource(c_order(w))
    for i, s in enumerate(optimizer):
        yield f"dense/optimizer-{i:03d}.npy", ArraySource(c_order(s))


def dense_meta(
    weights: Sequence[np.ndarray],
    optimizer: Sequence[np.ndarray],
    names: Sequence[str] | None = None,
    optimizer_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The manifest's description of the dense model."""
    meta: dict[str, Any] = {"weights": len(weights), "optimizer": len(optimizer)}
    if names is not None:
        meta["weight_names"] = list(names)
    if optimizer_names is not None:
        meta["optimizer_names"] = list(optimizer_names)
    return meta


def table_names(bundle: Bundle) -> list[str]:
    """Tables the manifest describes, in manifest order."""
    tables = bundle.manifest.get("tables")
    if not isinstance(tables, dict):
        raise CheckpointError(f"{bundle.path}/manifest.json: invalid manifest (no 'tables')")
    return list(tables)


def table_members(bundle: Bundle, name: str) -> list[str]:
    """Members of table ``name`` (``.npy`` layout) in file order."""
    meta = bundle.manifest["tables"][name]
    stems = ["keys", "values", *meta.get("slots", {}), *META_ARRAYS]
    if bundle.manifest.get("kind") == "increment":
        stems.append("removed_keys")
    stems += [s for s in meta.get("extra", []) if s in EXTRA_ARRAYS]
    return [f"tables/{name}/{stem}.npy" for stem in stems]


def array_format(bundle: Bundle) -> str:
    return str(bundle.manifest.get("array_format", "npy"))


def read_table(bundle: Bundle, name: str, verify: bool = True) -> TableData:
    """One table of a bundle (``.npy`` or Parquet), verified before it is returned."""
    if name not in bundle.manifest.get("tables", {}):
        raise CheckpointError(f"{bundle.path}: has no table {name!r}")
    if array_format(bundle) == "parquet":
        return _read_parquet_table(bundle, name, verify)
    meta = bundle.manifest["tables"][name]
    members = table_members(bundle, name)
    arrays = load_arrays(bundle, members, verify=verify)
    return _assemble(arrays, name, list(meta.get("slots", {})), meta)


def read_tables(
    bundle: Bundle, names: Sequence[str] | None = None, verify: bool = True
) -> dict[str, TableData]:
    """Several tables, all verified before any is returned (one pass over the files)."""
    names = table_names(bundle) if names is None else list(names)
    if array_format(bundle) == "parquet":
        if verify:
            verify_bundle(bundle, [f"tables/{n}.parquet" for n in names])
        return {n: _read_parquet_table(bundle, n, False) for n in names}
    members = {n: table_members(bundle, n) for n in names}
    arrays = load_arrays(bundle, [m for ms in members.values() for m in ms], verify=verify)
    return {
        n: _assemble(arrays, n, list(bundle.manifest["tables"][n].get("slots", {})),
                     bundle.manifest["tables"][n]) for n in names
    }


def _assemble(arrays: dict[str, np.ndarray], name: str, slots: list[str],
              meta: dict[str, Any]) -> TableData:
    base = f"tables/{name}/"
    removed = arrays.get(base + "removed_keys.npy")
    return TableData(
        arrays[base + "keys.npy"],
        arrays[base + "values.npy"],
        {s: arrays[f"{base}{s}.npy"] for s in slots},
        arrays[base + "update_count.npy"],
        arrays[base + "last_step.npy"],
        removed,
        {s: arrays[f"{base}{s}.npy"] for s in EXTRA_ARRAYS if f"{base}{s}.npy" in arrays},
        **dtypes_of(meta),
    )


def _read_parquet_table(bundle: Bundle, name: str, verify: bool) -> TableData:
    import pyarrow.parquet as pq

    rel = f"tables/{name}.parquet"
    if verify:
        verify_bundle(bundle, [rel])
    table = pq.read_table(bundle.file(rel))
    return _parquet_data(lambda col: table.column(col).combine_chunks(),
                         bundle.manifest["tables"][name])


def iter_parquet_chunks(bundle: Bundle, name: str, rows: int | None = None
                        ) -> Iterator[TableData]:
    """Table ``name`` of a verified Parquet export, a batch of at most ``rows`` rows (default
    :func:`chunk_rows`) at a time (never the whole file in memory)."""
    import pyarrow.parquet as pq

    meta = bundle.manifest["tables"][name]
    step = chunk_rows(config_row_bytes(int(meta["dim"]), len(meta.get("slots", {})))
                      ) if rows is None else max(1, int(rows))
    parquet = pq.ParquetFile(bundle.file(f"tables/{name}.parquet"))
    none = True
    for batch in parquet.iter_batches(batch_size=step):
        none = False
        yield _parquet_data(batch.column, meta)
    if none:  # an empty table: one empty chunk
        import pyarrow as pa

        schema = parquet.schema_arrow
        yield _parquet_data(lambda col: pa.array([], type=schema.field(col).type), meta)


def _parquet_data(column_of: Any, meta: dict[str, Any]) -> TableData:
    """A table's arrays from its Parquet columns (``column_of(name) -> pyarrow.Array``)."""
    dim = int(meta["dim"])

    def column(col: str, width: int | None) -> np.ndarray:
        arr = column_of(col)
        if width is None:
            return arr.to_numpy(zero_copy_only=False)
        return arr.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)

    slots = {
        s: column(s, int(shape[0]) if shape else None) for s, shape in meta.get("slots", {}).items()
    }
    return TableData(
        column("key", None).astype(np.int64, copy=False),
        column("values", dim),
        slots,
        column("update_count", None),
        column("last_step", None),
        **dtypes_of(meta),
    )


def dense_members(bundle: Bundle) -> tuple[list[str], list[str]]:
    """Members holding the dense weights and the dense optimizer state."""
    meta = bundle.manifest.get("dense") or {"weights": 0, "optimizer": 0}
    return (
        [f"dense/weights-{i:03d}.npy" for i in range(int(meta["weights"]))],
        [f"dense/optimizer-{i:03d}.npy" for i in range(int(meta["optimizer"]))],
    )


def read_dense(bundle: Bundle, verify: bool = True) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The dense weights and optimizer state, verified."""
    weights, optimizer = dense_members(bundle)
    arrays = load_arrays(bundle, weights + optimizer, verify=verify)
    return [arrays[m] for m in weights], [arrays[m] for m in optimizer]
