"""``embtrain dump``: a checkpoint as a self-describing export any tool can read.

An export is a bundle of kind ``export``: the checkpoint's tables (``.npy`` by default, one
Parquet file per table with ``array_format: parquet``), the dense model as ``.npy``,
``state.json``, the run's ``recipe.yaml`` and a ``manifest.json`` (format version, recipe
fingerprint, table shapes and dtypes, every file's sha256, the step and times).

The ``.npy`` export copies the checkpoint's files with ``copy_file_range`` (in the kernel,
no pass through Python; a streamed copy where the target is on another file system) while
a thread pool hashes the sources; every hash must equal the
checkpoint's manifest, so a corrupt checkpoint never turns into a trusted export.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from embtrain.checkpoint import layout
from embtrain.checkpoint.bundle import Bundle, open_bundle
from embtrain.checkpoint.bundle_format import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    FileEntry,
    content_fingerprint,
    utc_now,
)
from embtrain.checkpoint.bundle_write import (
    BytesSource,
    FileSource,
    Source,
    WriterSource,
    write_bundle,
)
from embtrain.checkpoint.layout import TableData, bundle_row_bytes, iter_table_chunks, table_names
from embtrain.checkpoint.manager import find_checkpoint
from embtrain.embedding.halves import DTYPE_CODES, to_float32

ArrayFormat = Literal["npy", "parquet"]
RECIPE = "recipe.yaml"


def resolve_checkpoint(run_or_checkpoint: Path, step: int | None = None) -> Path:
    """A checkpoint directory from a run directory (latest or ``step``) or the checkpoint itself."""
    path = Path(run_or_checkpoint)
    if (path / MANIFEST).is_file():
        if step is not None:
            raise CheckpointError(f"{path}: is a checkpoint itself; --step needs a run directory")
        return path
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such run directory")
    return find_checkpoint(path, step)


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run directory holding ``checkpoint`` (``RUN/checkpoints/step-N``), if it is one."""
    parent = checkpoint.resolve().parent
    return parent.parent if parent.name == "checkpoints" else None


def _recipe_source(checkpoint: Bundle) -> BytesSource | None:
    run_dir = run_dir_of(checkpoint.path)
    if run_dir is not None and (run_dir / RECIPE).is_file():
        return BytesSource((run_dir / RECIPE).read_bytes())
    if RECIPE in checkpoint.files:
        return BytesSource(checkpoint.file(RECIPE).read_bytes())
    return None


def export_header(
    source: Bundle, kind: str = "export", array_format: str = "npy"
) -> dict[str, Any]:
    """The manifest fields an export shares with its source checkpoint."""
    m = source.manifest
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "array_format": array_format,
        "recipe_fingerprint": m["recipe_fingerprint"],
        "step": int(m["step"]),
        "time_utc": utc_now(),
        "checkpoint_time_utc": m["time_utc"],
        "tables": m.get("tables", {}),
        "slots": m.get("slots", []),
        "dense": m.get("dense", {}),
        "history": m.get("history", []),
        "source": {
            "path": str(source.path),
            "kind": m["kind"],
            "step": int(m["step"]),
            "content_fingerprint": m["content_fingerprint"],
        },
    }


def dump(
    run_dir: Path,
    out: Path,
    step: int | None = None,
    array_format: ArrayFormat = "npy",
    fsync: bool = True,
    workers: int | None = None,
    verify: str = "crc32",
) -> dict[str, Any]:
    """Export the latest (or ``step``) checkpoint of ``run_dir`` to the new directory ``out``.

    Returns the export's manifest. Every source file is verified against the checkpoint's
    manifest on the way (``verify``: ``crc32``, or ``sha256`` to re-hash fully); the export
    records the sha256 and crc32 the checkpoint computed from memory when it was saved, so a
    byte that changed on disk since then fails any later verification too. ``out`` appears
    only when complete.
    """
    if verify not in ("crc32", "sha256"):
        raise CheckpointError(f"--verify: expected crc32 or sha256, got {verify!r}")
    source = open_bundle(resolve_checkpoint(run_dir, step), kinds=("checkpoint", "export"))
    if source.manifest.get("array_format", "npy") != "npy":
        raise CheckpointError(f"{source.path}: is a Parquet export; dump reads checkpoints")
    recipe = _recipe_source(source)
    header = export_header(source, array_format=array_format)

    def files() -> Iterator[tuple[str, Source]]:
        for rel, entry in source.files.items():
            if rel == RECIPE:
                continue
            if array_format == "parquet" and rel.startswith("tables/"):
                continue
            yield rel, FileSource(source.path / rel, entry, verify)
        if array_format == "parquet":
            for name in table_names(source):
                yield from _parquet_files(source, name)
        if recipe is not None:
            yield RECIPE, recipe

    def finish(entries: list[FileEntry]) -> dict[str, Any]:
        if array_format == "npy" and content_fingerprint(entries) != source.fingerprint:
            raise CheckpointError(
                f"{source.path}: its arrays do not match its manifest's "
                "content fingerprint; the checkpoint is corrupt"
            )
        # Parquet: the fingerprint names the arrays (as .npy), so increments can name this base.
        return {**header, "content_fingerprint": source.fingerprint}

    return write_bundle(Path(out), files(), finish, fsync=fsync, workers=workers)


# rows per Parquet row group (and per chunk read to write one); fewer for a table whose rows
# are so wide that a group would exceed layout.CHUNK_BYTES
ROW_GROUP_ROWS = 1 << 20


def _parquet_files(source: Bundle, name: str) -> Iterator[tuple[str, Source]]:
    """One table's Parquet file, written a row group at a time from chunks of its ``.npy``
    files (hashed on the way: a corrupt source fails the export)."""
    row_bytes = max(1, bundle_row_bytes(source, name))
    group = max(1, min(int(ROW_GROUP_ROWS), int(layout.CHUNK_BYTES) // row_bytes))
    rows = max(1, int(source.manifest["tables"][name]["rows"]))
    nbytes = sum(e.bytes for rel, e in source.files.items() if rel.startswith(f"tables/{name}/"))
    in_memory = nbytes * min(group, rows) // rows * 2  # a chunk and its Arrow copy

    def write(path: Path) -> None:
        write_parquet_chunks(iter_table_chunks(source, name, rows=group, verify=True), path,
                             group)

    yield f"tables/{name}.parquet", WriterSource(write, in_memory)


def _arrow_table(data: TableData) -> Any:
    """A table's rows as a ``pyarrow.Table``: ``key``, ``values`` (fixed-size list of float32),
    slots, ``update_count``, ``last_step``."""
    import pyarrow as pa

    def fixed(arr: np.ndarray) -> pa.Array:
        if arr.ndim == 1:
            return pa.array(arr)
        width = int(arr.shape[1])
        flat = pa.array(np.ascontiguousarray(arr).reshape(-1))
        return pa.FixedSizeListArray.from_arrays(flat, width)

    # a half table's 16-bit patterns widened to float32 (exact; the manifest keeps the dtype)
    value_code, slot_code = DTYPE_CODES[data.dtype], DTYPE_CODES[data.state_dtype]
    columns = {"key": pa.array(data.keys), "values": fixed(to_float32(data.values, value_code))}
    for slot, arr in data.slots.items():
        columns[slot] = fixed(to_float32(arr, slot_code))
    columns["update_count"] = pa.array(data.update_count)
    columns["last_step"] = pa.array(data.last_step)
    return pa.table(columns)


def write_parquet_chunks(chunks: Iterable[TableData], path: Path,
                         row_group_rows: int = ROW_GROUP_ROWS) -> None:
    """One table as Parquet from key-ordered chunks (at least one), appended as they come:
    the same file :func:`write_parquet_table` writes for the whole table when every chunk
    but the last has ``row_group_rows`` rows."""
    import pyarrow.parquet as pq

    writer = None
    try:
        for data in chunks:
            table = _arrow_table(data)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="none",
                                          use_dictionary=False, write_statistics=False)
            writer.write_table(table, row_group_size=row_group_rows)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise ValueError(f"{path}: no chunk to write (an empty table is one empty chunk)")


def write_parquet_table(data: TableData, path: Path,
                        row_group_rows: int = ROW_GROUP_ROWS) -> None:
    """One table as Parquet: ``key``, ``values`` (fixed-size list), slots, ``update_count``,
    ``last_step``."""
    write_parquet_chunks([data], path, row_group_rows)
