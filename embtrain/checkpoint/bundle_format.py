"""The bundle format: what a ``manifest.json`` records of each file and the rules both the
writer (:mod:`embtrain.checkpoint.bundle_write`) and the verifying reader
(:mod:`embtrain.checkpoint.bundle`) follow: manifest entries, ``.npy`` headers, digests and
member names.

A bundle is a directory of ``.npy``/JSON/Parquet files described by its ``manifest.json``;
checkpoints, exports (dumps) and increments are all bundles. No pickle anywhere: ``.npy``
files are parsed by NumPy's header reader and object dtypes are refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.errors import UserInputError

FORMAT = "embtrain-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CHUNK = 32 << 20
HASH_CHUNK = 1 << 20  # both digests of a chunk while it is in cache
TMP_PREFIX = ".tmp-"


class CheckpointError(UserInputError):
    """A checkpoint, export or increment is missing, corrupt or does not fit: exit 2, one line."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a bundle as the manifest records it."""

    path: str
    sha256: str
    bytes: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    crc32: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
        }
        if self.crc32 is not None:
            out["crc32"] = self.crc32
        return out


def utc_now() -> str:
    """Current UTC time, ISO 8601 with microseconds and ``Z``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def json_bytes(obj: Any) -> bytes:
    """Deterministic, readable JSON."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def npy_header(array: np.ndarray) -> bytes:
    """The exact header ``np.save`` writes for ``array`` (C order)."""
    return npy_header_for(array.dtype, tuple(int(s) for s in array.shape))


def npy_header_for(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The exact header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape``."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise ValueError("object arrays cannot be checkpointed (no pickle)")
    buf = io.BytesIO()
    d = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
         "shape": tuple(int(s) for s in shape)}
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def byte_view(array: np.ndarray) -> memoryview:
    """The bytes of ``array`` in C order (a copy only when it is not C-contiguous)."""
    if array.nbytes == 0:
        return memoryview(b"")
    if not array.flags.c_contiguous:
        array = np.array(array, order="C")
    return memoryview(array.reshape(-1).view(np.uint8))


def content_fingerprint(entries: Iterable[FileEntry]) -> str:
    """sha256 over ``path sha256`` lines of the model-state arrays (``tables/``, ``dense/``)."""
    lines = sorted(
        f"{e.path} {e.sha256}\n"
        for e in entries
        if e.path.endswith(".npy") and e.path.startswith(("tables/", "dense/"))
    )
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def digests(views: list[memoryview], sha: bool = True, crc: bool = True) -> tuple[str, int]:
    """``(sha256 hex, crc32)`` of the concatenated views (``""`` / ``0`` for one not asked)."""
    h = hashlib.sha256() if sha else None
    c = 0
    for view in views:
        for i in range(0, len(view), HASH_CHUNK):
            part = view[i : i + HASH_CHUNK]
            if h is not None:
                h.update(part)
            if crc:
                c = zlib.crc32(part, c)
    return (h.hexdigest() if h is not None else ""), c


def file_digests(path: Path, sha: bool = True, crc: bool = True) -> tuple[str, int]:
    """Digests of a file, read through a read-only mapping (no copy into Python)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return digests([], sha, crc)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            try:
                return digests([view], sha, crc)
            finally:
                view.release()


def hash_file(path: Path) -> str:
    """sha256 of a file."""
    return file_digests(path, crc=False)[0]


def check_member_name(rel: str) -> None:
    """Refuse a bundle member path that is absolute or climbs out (``..``)."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid bundle member path {rel!r}")


