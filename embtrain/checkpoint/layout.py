"""Where a table's and the dense model's arrays live inside a bundle, and how to read them.

Per table ``<name>`` (``.npy`` format)::

    tables/<name>/keys.npy          int64[rows], strictly increasing
    tables/<name>/values.npy        float32[rows, dim]
    tables/<name>/<slot>.npy        one per optimizer slot: [rows, dim] or [rows] (row-wise)
    tables/<name>/update_count.npy  int64[rows]: steps that updated the row
    tables/<name>/last_step.npy     int64[rows]: 0-based index of the last step that updated it, -1: never
    tables/<name>/removed_keys.npy  increments only: int64 keys deleted since the base
    tables/<name>/admission_keys.npy, admission_counts.npy   dynamic tables with count
                                    admission: keys counted and not admitted yet, their counts
    tables/<name>/bloom.npy         dynamic tables with Bloom admission: the uint8 counters

Parquet exports hold one ``tables/<name>.parquet`` per table instead (columns ``key``,
``values`` as ``fixed_size_list<float32>[dim]``, one column per slot, ``update_count``,
``last_step``). The dense model: ``dense/weights-000.npy ...`` and ``dense/optimizer-000.npy ...``
in the order of ``DenseModel.get_weights()`` / ``optimizer_state()``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from embtrain.checkpoint.bundle import (
    ArraySource,
    Bundle,
    CheckpointError,
    Source,
    load_arrays,
    verify_bundle,
)

META_ARRAYS = ("update_count", "last_step")
EXTRA_ARRAYS = ("admission_keys", "admission_counts", "bloom")
RESERVED_NAMES = frozenset({"keys", "values", "removed_keys", *META_ARRAYS, *EXTRA_ARRAYS})


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
        "dtype": str(data.values.dtype),
        "slots": {k: [int(s) for s in v.shape[1:]] for k, v in data.slots.items()},
    }
    extra = [s for s in EXTRA_ARRAYS if s in data.extra]
    if extra:
        meta["extra"] = extra
    return meta


def table_files(name: str, data: TableData) -> Iterator[tuple[str, Source]]:
    """Bundle members of one table."""
    check_slot_names(list(data.slots))
    for stem, arr in data.arrays():
        yield f"tables/{name}/{stem}.npy", ArraySource(c_order(arr))


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
    return _assemble(arrays, name, list(meta.get("slots", {})))


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
        n: _assemble(arrays, n, list(bundle.manifest["tables"][n].get("slots", {}))) for n in names
    }


def _assemble(arrays: dict[str, np.ndarray], name: str, slots: list[str]) -> TableData:
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
    )


def _read_parquet_table(bundle: Bundle, name: str, verify: bool) -> TableData:
    import pyarrow.parquet as pq

    rel = f"tables/{name}.parquet"
    if verify:
        verify_bundle(bundle, [rel])
    meta = bundle.manifest["tables"][name]
    table = pq.read_table(bundle.file(rel))
    dim = int(meta["dim"])

    def column(col: str, width: int | None) -> np.ndarray:
        arr = table.column(col).combine_chunks()
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
