"""A fingerprint of a recipe's data, recorded in checkpoints and checked on resume.

Per split, per file (in the reader's sorted order): the path, its size in bytes, its row count,
a digest of its Parquet footer (schema, row groups and their sizes, key-value metadata), a
digest of its content, and its modification time (ns). A resume that would read other data
than the run trained on (a file removed, added, rewritten) would not continue bit-exactly; it
is refused unless ``--allow data``.

The content digest's cost rule (it runs at the start of every run and resume):

- a file of at most :data:`WHOLE_FILE_BYTES` (8 MiB) is hashed whole: any change is seen;
- a larger file: its raw footer bytes (every column chunk's offsets, sizes and statistics) and
  :data:`SAMPLES` (16) evenly spaced blocks of :data:`SAMPLE_BYTES` (64 KiB): at most ~1 MiB
  read per file, whatever its size (1 TB in 1 GB files: ~1 GB read, 0.1 %). An edit that keeps
  the size and footer and falls between the samples is not seen by the content digest;
- so the modification time is part of the fingerprint too: a sampled file rewritten since the
  checkpoint whose sampled content still matches is not called unchanged (the rule cannot
  tell): the resume is refused like any change, and ``--allow data`` continues. Copies that
  keep modification times (``cp -a``, ``rsync -a``) keep the fingerprint.

Checkpoints of older versions recorded only the first four fields; they are compared on those.
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


#: Files up to this size are hashed whole.
WHOLE_FILE_BYTES = 8 << 20
#: Larger files: this many evenly spaced blocks ...
SAMPLES = 16
#: ... of this many bytes, and the footer.
SAMPLE_BYTES = 64 << 10


def content_digest(path: str, size: int) -> str:
    """The content part of a file's fingerprint (see the cost rule above)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= WHOLE_FILE_BYTES:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return h.hexdigest()[:16]
        f.seek(size - 8)
        tail = f.read(8)
        footer = int.from_bytes(tail[:4], "little") if tail[4:] == b"PAR1" else 0
        start = max(0, size - 8 - min(footer, size - 8))
        f.seek(start)
        h.update(f.read(size - start))
        for i in range(SAMPLES):
            f.seek(i * (size - SAMPLE_BYTES) // (SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]


def split_fingerprint(patterns: str | list[str], what: str, fmt: str | None = None
                      ) -> list[list[Any]]:
    """``[[path, bytes, rows, footer digest, content digest, mtime ns], ...]`` of the files
    the split reads, sorted.

    CSV/TSV files (``fmt``: ``data.format``, else by extension): their line count and a digest
    of their size, first and last MiB in place of the rows and the footer digest."""
    from embtrain.data.reader import list_files
    from embtrain.data.sources import count_lines, file_format, text_digest

    out = []
    for path in list_files(patterns, what):
        if file_format(path, fmt) != "parquet":
            try:
                st = os.stat(path)
                out.append([os.path.normpath(path), st.st_size, count_lines(path),
                            text_digest(path), content_digest(path, st.st_size),
                            st.st_mtime_ns])
            except OSError as exc:
                raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
            continue
        try:
            meta = pq.read_metadata(path)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: not a readable Parquet file: {exc}") from None
        st = os.stat(path)
        out.append([os.path.normpath(path), st.st_size, meta.num_rows, _footer_digest(meta),
                    content_digest(path, st.st_size), st.st_mtime_ns])
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
            was = old[path]
            n = min(len(was), len(row))  # older checkpoints: the first four fields
            if row[:min(n, 5)] != was[:min(n, 5)]:
                size, rows = was[1], was[2]
                return (f"{what}: {path} changed ({size} bytes, {rows} rows then; "
                        f"{row[1]} bytes, {row[2]} rows now)")
            if row[:n] != was[:n] and int(row[1]) > WHOLE_FILE_BYTES:  # hashed whole: known
                return (f"{what}: {path} was rewritten (modified since; size, rows, footer and "
                        "sampled content agree, but the check samples files over 8 MiB, so "
                        "it cannot tell whether the content changed)")
    return None
