"""A fingerprint of a recipe's data, recorded in checkpoints and checked on resume.

Per split, per file (in the reader's sorted order): the path, its size in bytes, its row count
and a digest of its Parquet footer (schema, row groups and their sizes, key-value metadata).
Only footers are read. A resume that would read other data than the run trained on (a file
removed, added, rewritten) would not continue bit-exactly; it is refused unless
``--allow data``.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from embtrain.errors import DataError
from embtrain.recipe.models import Recipe


def _footer_digest(meta: pq.FileMetaData) -> str:
    h = hashlib.sha256()
    h.update(meta.schema.to_arrow_schema().to_string().encode())
    h.update(repr((meta.num_rows, meta.num_row_groups, meta.num_columns, meta.created_by)).encode())
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        h.update(repr((group.num_rows, group.total_byte_size)).encode())
    for key, value in sorted((meta.metadata or {}).items()):
        h.update(key + b"=" + value)
    return h.hexdigest()[:16]


def split_fingerprint(patterns: str | list[str], what: str, fmt: str | None = None
                      ) -> list[list[Any]]:
    """``[[path, bytes, rows, footer digest], ...]`` of the files the split reads, sorted.

    CSV/TSV files (``fmt``: ``data.format``, else by extension): their line count and a digest
    of their size, first and last MiB."""
    from embtrain.data.reader import list_files
    from embtrain.data.sources import count_lines, file_format, text_digest

    out = []
    for path in list_files(patterns, what):
        if file_format(path, fmt) != "parquet":
            try:
                out.append([os.path.normpath(path), os.path.getsize(path), count_lines(path),
                            text_digest(path)])
            except OSError as exc:
                raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
            continue
        try:
            meta = pq.read_metadata(path)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: not a readable Parquet file: {exc}") from None
        out.append([os.path.normpath(path), os.path.getsize(path), meta.num_rows,
                    _footer_digest(meta)])
    return out


def data_fingerprint(recipe: Recipe) -> dict[str, Any]:
    """The fingerprint of both splits (``eval`` is ``None`` without ``data.eval``)."""
    data = recipe.data
    return {
        "train": split_fingerprint(data.train, "data.train", data.format),
        "eval": None if data.eval is None else split_fingerprint(data.eval, "data.eval",
                                                                 data.format),
    }


def describe_change(then: dict[str, Any], now: dict[str, Any]) -> str | None:
    """``None`` when the data is the same, else the first difference in words."""
    for split in ("train", "eval"):
        a, b = then.get(split) or [], now.get(split) or []
        old = {row[0]: row for row in a}
        new = {row[0]: row for row in b}
        what = f"data.{split}"
        for path in old:
            if path not in new:
                return f"{what}: {path} was removed ({len(a)} files then, {len(b)} now)"
        for path in new:
            if path not in old:
                return f"{what}: {path} was added ({len(a)} files then, {len(b)} now)"
        for path, row in new.items():
            if row != old[path]:
                _, size, rows, _ = old[path]
                return (f"{what}: {path} changed ({size} bytes, {rows} rows then; "
                        f"{row[1]} bytes, {row[2]} rows now)")
    return None
