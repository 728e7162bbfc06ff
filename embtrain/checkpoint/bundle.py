"""Reading bundles (:mod:`embtrain.checkpoint.bundle_format`): every file named by the
manifest is verified (size, ``.npy`` header dtype and shape, sha256) before anything is
returned; ``.npy`` files are parsed by NumPy's header reader and object dtypes are refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.checkpoint.bundle_format import (
    CHUNK,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    FileEntry,
    byte_view,
    check_member_name,
    content_fingerprint,
    hash_file,
)

# ------------------------------------------------------------------------ reading


@dataclass
class Bundle:
    """An opened bundle: its directory, parsed manifest and files by relative path."""

    path: Path
    manifest: dict[str, Any]
    files: dict[str, FileEntry]

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["content_fingerprint"])

    def file(self, rel: str) -> Path:
        """Absolute path of member ``rel`` (which the manifest must list)."""
        if rel not in self.files:
            raise CheckpointError(f"{self.path / MANIFEST}: does not list {rel}")
        return self.path / rel


def _article(word: str) -> str:
    """``an export``, ``an increment``, ``a checkpoint``."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _bad_manifest(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path}: invalid manifest ({why}); the directory is incomplete or corrupt"
    )


def _parse_entry(mpath: Path, raw: Any) -> FileEntry:
    if not isinstance(raw, dict):
        raise _bad_manifest(mpath, "a files entry is not an object")
    try:
        rel, digest, size = raw["path"], raw["sha256"], raw["bytes"]
        dtype, shape, crc = raw.get("dtype"), raw.get("shape"), raw.get("crc32")
    except KeyError as exc:
        raise _bad_manifest(mpath, f"a files entry lacks {exc.args[0]!r}") from None
    if not isinstance(rel, str) or not isinstance(digest, str) or len(digest) != 64:
        raise _bad_manifest(mpath, f"bad files entry {raw!r:.80}")
    if not isinstance(size, int) or size < 0:
        raise _bad_manifest(mpath, f"{rel}: bad byte count")
    if shape is not None and (
        not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape)
    ):
        raise _bad_manifest(mpath, f"{rel}: bad shape")
    if dtype is not None and not isinstance(dtype, str):
        raise _bad_manifest(mpath, f"{rel}: bad dtype")
    if crc is not None and (not isinstance(crc, int) or not 0 <= crc < 2**32):
        raise _bad_manifest(mpath, f"{rel}: bad crc32")
    return FileEntry(rel, digest, size, dtype, None if shape is None else tuple(shape), crc)


def _safe_member(root: Path, mpath: Path, rel: str) -> Path:
    try:
        check_member_name(rel)
    except ValueError:
        raise CheckpointError(
            f"{mpath}: file path {rel!r} points outside the directory; refused"
        ) from None
    full = root / rel
    real_root = os.path.realpath(root)
    real = os.path.realpath(full)
    if os.path.commonpath([real, real_root]) != real_root:
        raise CheckpointError(
            f"{mpath}: file path {rel!r} resolves outside the directory "
            f"(symlink to {real}); refused"
        )
    return full


def open_bundle(path: Path, kinds: tuple[str, ...] | None = None) -> Bundle:
    """Parse and sanity-check ``path/manifest.json``; cheap checks on every listed file.

    Checks: the manifest is complete JSON of this format, every path stays inside the
    directory, every file exists with the recorded size. Checksums are checked by
    :func:`verify_bundle` / :func:`load_arrays`.
    """
    path = Path(path)
    mpath = path / MANIFEST
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint or export directory")
    try:
        text = mpath.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(
            f"{mpath}: missing; {path} is not a complete checkpoint or export"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{mpath}: cannot read manifest: {exc}") from None
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise _bad_manifest(mpath, f"truncated or not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _bad_manifest(mpath, f"not an {FORMAT} manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise CheckpointError(
            f"{mpath}: format version {version!r} is not supported "
            f"(this embtrain reads up to {FORMAT_VERSION})"
        )
    for key in ("kind", "step", "files", "content_fingerprint", "recipe_fingerprint", "time_utc"):
        if key not in manifest:
            raise _bad_manifest(mpath, f"no {key!r}")
    if not isinstance(manifest["files"], list) or not isinstance(manifest["step"], int):
        raise _bad_manifest(mpath, "'files' must be a list and 'step' an integer")
    if kinds is not None and manifest["kind"] not in kinds:
        raise CheckpointError(
            f"{mpath}: is {_article(str(manifest['kind']))}, expected "
            f"{' or '.join(_article(k) for k in kinds)}"
        )
    files: dict[str, FileEntry] = {}
    for raw in manifest["files"]:
        entry = _parse_entry(mpath, raw)
        full = _safe_member(path, mpath, entry.path)
        if entry.path in files:
            raise _bad_manifest(mpath, f"{entry.path} listed twice")
        try:
            size = full.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"{full}: missing (listed in {mpath})") from None
        if size != entry.bytes:
            raise CheckpointError(
                f"{full}: {size} bytes, manifest says {entry.bytes}; "
                "the file is truncated or corrupt"
            )
        files[entry.path] = entry
    return Bundle(path, manifest, files)


# NumPy parses a .npy header with ast.literal_eval; CPython 3.11 can fail two threads that
# build an AST at once ("SystemError: AST constructor recursion depth mismatch", seen when a
# restore checked its files in parallel), so the checking threads take turns on that part.
_HEADER_PARSE = threading.Lock()


def _check_header(
    full: Path, entry: FileEntry, f: io.BufferedReader
) -> tuple[np.dtype, tuple[int, ...], int]:
    try:
        version = np.lib.format.read_magic(f)
        with _HEADER_PARSE:
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"npy version {version}")
    except (ValueError, SyntaxError, OSError) as exc:
        raise CheckpointError(
            f"{full}: not a valid .npy file ({exc}); the file is corrupt"
        ) from None
    if dtype.hasobject:
        raise CheckpointError(f"{full}: object arrays are refused (no pickle)")
    if fortran and len(shape) > 1:
        raise CheckpointError(f"{full}: Fortran-order arrays are not written by embtrain; refused")
    offset = f.tell()
    if str(dtype) != entry.dtype or tuple(shape) != entry.shape:
        raise CheckpointError(
            f"{full}: holds {dtype}{list(shape)}, manifest says "
            f"{entry.dtype}{list(entry.shape or ())}; the file is corrupt"
        )
    if offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != entry.bytes:
        raise CheckpointError(f"{full}: size does not match its header; the file is corrupt")
    return dtype, tuple(int(s) for s in shape), offset


def _mismatch(full: Path, digest: str, entry: FileEntry) -> CheckpointError:
    return CheckpointError(
        f"{full}: checksum mismatch (sha256 {digest[:16]}…, manifest says "
        f"{entry.sha256[:16]}…); the file is corrupt"
    )


def _verify_one(bundle: Bundle, rel: str) -> None:
    entry = bundle.files[rel]
    full = bundle.path / rel
    if entry.dtype is not None:
        with open(full, "rb") as f:
            _check_header(full, entry, f)
    digest = hash_file(full)
    if digest != entry.sha256:
        raise _mismatch(full, digest, entry)


def _read_one(bundle: Bundle, rel: str) -> np.ndarray:
    """Read one ``.npy`` member into memory, hashing it on the way."""
    entry = bundle.files[rel]
    full = bundle.path / rel
    if entry.dtype is None:
        raise CheckpointError(f"{full}: not an array file")
    with open(full, "rb", buffering=0) as raw:
        f = io.BufferedReader(raw, buffer_size=1 << 16)
        dtype, shape, offset = _check_header(full, entry, f)
        raw.seek(0)
        head = raw.read(offset)
        h = hashlib.sha256(head)
        array = np.empty(shape, dtype=dtype)
        view = byte_view(array)
        n = len(view)
        done = 0
        while done < n:
            got = raw.readinto(view[done : min(n, done + CHUNK)])
            if not got:
                raise CheckpointError(f"{full}: truncated; the file is corrupt")
            h.update(view[done : done + got])
            done += got
    digest = h.hexdigest()
    if digest != entry.sha256:
        raise _mismatch(full, digest, entry)
    return array


class NpyRows:
    """Row ranges of one ``.npy`` member of an already verified bundle, read with ``pread``
    into fresh arrays: never a memory mapping, whose pages would count in the process's
    memory, and never the whole array unless asked for."""

    def __init__(self, bundle: Bundle, rel: str, verify: bool = False):
        full = bundle.file(rel)
        entry = bundle.files[rel]
        if entry.dtype is None:
            raise CheckpointError(f"{full}: not an array file")
        with open(full, "rb") as f:
            self.dtype, self.shape, self.offset = _check_header(full, entry, f)
            f.seek(0)
            head = f.read(self.offset)
        if not self.shape:
            raise CheckpointError(f"{full}: a 0-d array, expected rows")
        self.path, self.entry = full, entry
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        # verify: rows must be read in order from 0; :meth:`check` compares the sha256
        self.sha = hashlib.sha256(head) if verify else None
        self.next_row = 0
        self.fd: int | None = os.open(full, os.O_RDONLY)

    @property
    def rows(self) -> int:
        return int(self.shape[0])

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)`` (clipped to the array) as a new array."""
        lo, hi = max(0, int(lo)), min(self.rows, int(hi))
        out = np.empty((max(hi - lo, 0), *self.shape[1:]), dtype=self.dtype)
        if out.nbytes == 0:
            return out
        assert self.fd is not None
        view = byte_view(out)
        at = self.offset + lo * self.row_bytes
        done = 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done : done + CHUNK]], at + done)
            if not got:
                raise CheckpointError(f"{self.path}: truncated; the file is corrupt")
            done += got
        if self.sha is not None:
            if lo != self.next_row:
                raise ValueError(f"{self.path}: a verified read must be in order")
            self.sha.update(view)
            self.next_row = hi
        return out

    def check(self) -> None:
        """After every row was read in order: the file's sha256 must be the manifest's."""
        assert self.sha is not None and self.next_row == self.rows
        digest = self.sha.hexdigest()
        if digest != self.entry.sha256:
            raise _mismatch(self.path, digest, self.entry)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> NpyRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parallel(
    fn: Callable[[Bundle, str], Any], bundle: Bundle, rels: list[str], workers: int | None
) -> list[Any]:
    if not rels:
        return []
    order = sorted(range(len(rels)), key=lambda i: -bundle.files[rels[i]].bytes)
    results: list[Any] = [None] * len(rels)
    with ThreadPoolExecutor(max_workers=workers or max(2, os.cpu_count() or 2)) as pool:
        futures = {i: pool.submit(fn, bundle, rels[i]) for i in order}
        errors: dict[int, BaseException] = {}
        for i, future in futures.items():
            try:
                results[i] = future.result()
            except BaseException as exc:  # re-raised below, first in path order
                errors[i] = exc
    if errors:
        raise errors[min(errors)]
    return results


def verify_bundle(
    bundle: Bundle, rels: Iterable[str] | None = None, workers: int | None = None
) -> None:
    """Hash every listed file (or ``rels``) and check ``.npy`` headers; raise on the first problem."""
    names = list(bundle.files) if rels is None else list(rels)
    for rel in names:
        bundle.file(rel)
    if rels is None:
        check_content_fingerprint(bundle)
    _parallel(_verify_one, bundle, names, workers)


def check_content_fingerprint(bundle: Bundle) -> None:
    """A checkpoint's or ``.npy`` export's ``content_fingerprint`` must match its file list.

    A manifest edited by hand (a file swapped and its entry updated, the fingerprint left
    stale) is refused here, before anything is loaded.
    """
    if bundle.kind not in ("checkpoint", "export"):
        return
    if bundle.manifest.get("array_format", "npy") != "npy":
        return  # a Parquet export keeps the fingerprint of the .npy arrays it came from
    if content_fingerprint(bundle.files.values()) != bundle.fingerprint:
        raise CheckpointError(
            f"{bundle.path / MANIFEST}: content fingerprint does not match the files it lists; "
            "the manifest was edited or is corrupt"
        )


def load_arrays(
    bundle: Bundle, rels: Iterable[str], verify: bool = True, workers: int | None = None
) -> dict[str, np.ndarray]:
    """Arrays of the given members, all read and verified before any is returned."""
    names = list(rels)
    for rel in names:
        bundle.file(rel)
    if verify:
        arrays = _parallel(_read_one, bundle, names, workers)
    else:
        arrays = [np.load(bundle.path / rel, allow_pickle=False) for rel in names]
    return dict(zip(names, arrays, strict=True))


def read_json_member(bundle: Bundle, rel: str) -> Any:
    """A JSON member, verified against its checksum."""
    full = bundle.file(rel)
    data = full.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != bundle.files[rel].sha256:
        raise _mismatch(full, digest, bundle.files[rel])
    try:
        return json.loads(data)
    except ValueError as exc:
        raise CheckpointError(f"{full}: not valid JSON ({exc})") from None


def iter_members(bundle: Bundle, prefix: str) -> Iterator[str]:
    """Member paths under ``prefix`` in manifest order."""
    return (rel for rel in bundle.files if rel.startswith(prefix))
