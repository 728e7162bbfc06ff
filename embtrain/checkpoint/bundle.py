"""Bundles: a directory of ``.npy``/JSON/Parquet files described by a ``manifest.json``.

Checkpoints, exports (dumps) and increments are all bundles. Writing is atomic: the files
go into a temporary sibling directory, each is fsynced, ``manifest.json`` is written last,
then the directory is renamed into place and its parent fsynced. Reading verifies every
file named by the manifest (size, ``.npy`` header dtype and shape, sha256) before anything
is returned. No pickle anywhere: ``.npy`` files are parsed by NumPy's header reader and
object dtypes are refused.

Throughput: files are written with large sequential writes straight from the arrays'
memory (no intermediate copy) while a thread pool hashes them; hashlib and file I/O
release the GIL, so hashing and writing overlap across files.

Over 700 lines because the format's writer pipeline (sources, streamed members, the hashing
pool) and its verifying reader share one set of rules (manifest entries, ``.npy`` headers,
digests, member names) that must not drift apart; tests patch the writer's private classes
in this module. The next split: the writer pipeline into its own module.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import mmap
import os
import secrets
import shutil
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.errors import StorageError, UserInputError, os_error_cause, os_error_line

FORMAT = "embtrain-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CHUNK = 32 << 20
_HASH_CHUNK = 1 << 20  # both digests of a chunk while it is in cache
TMP_PREFIX = ".tmp-"
# Test hook: seconds to sleep after each file is written (kill-during-write tests).
DELAY_ENV = "EMBTRAIN_TEST_CHECKPOINT_FILE_DELAY"
_MAX_IN_FLIGHT = 2 << 30
_STREAM_WINDOW = 2  # chunks of a StreamSource being written and hashed at once


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


# ------------------------------------------------------------------------ sources


@dataclass(frozen=True)
class ArraySource:
    """An in-memory array written as ``.npy`` (C order, no copy when already contiguous)."""

    array: np.ndarray


@dataclass(frozen=True)
class BytesSource:
    """Small literal content (JSON, YAML)."""

    data: bytes


@dataclass(frozen=True)
class FileSource:
    """An existing file copied (in the kernel where possible) and verified against ``expected``.

    ``verify``: ``crc32`` (used when ``expected`` has one: 3x cheaper than sha256 and certain
    to catch any flipped byte) or ``sha256``. The copy's entry keeps ``expected``'s digests,
    which were computed from memory when the source was written.
    """

    path: Path
    expected: FileEntry
    verify: str = "crc32"


@dataclass(frozen=True)
class WriterSource:
    """A file produced by ``write(path)`` (e.g. Parquet), then hashed; ``nbytes``: memory it holds."""

    write: Callable[[Path], None]
    nbytes: int = 0


@dataclass(frozen=True)
class StreamMember:
    """One ``.npy`` member of a :class:`StreamSource`: its path, dtype and whole shape."""

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class StreamSource:
    """Several ``.npy`` members written together from chunks, never whole in memory.

    ``chunks`` yields, per chunk, one array per member (in ``members`` order; rows along axis
    0, any number including none); each member's chunks together must make its ``shape``.
    The headers are written first, then every chunk is appended while both digests are
    updated, so the files and manifest entries equal those of :class:`ArraySource` arrays.
    The iterator is consumed by the thread that adds the source (it may run collectives).
    """

    members: tuple[StreamMember, ...]
    chunks: Iterable[Sequence[np.ndarray]]


Source = ArraySource | BytesSource | FileSource | WriterSource | StreamSource


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


def _byte_view(array: np.ndarray) -> memoryview:
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, view: memoryview) -> None:
    n = len(view)
    done = 0
    while done < n:
        done += os.write(fd, view[done : min(n, done + CHUNK)])


def _digests(views: list[memoryview], sha: bool = True, crc: bool = True) -> tuple[str, int]:
    """``(sha256 hex, crc32)`` of the concatenated views (``""`` / ``0`` for one not asked)."""
    h = hashlib.sha256() if sha else None
    c = 0
    for view in views:
        for i in range(0, len(view), _HASH_CHUNK):
            part = view[i : i + _HASH_CHUNK]
            if h is not None:
                h.update(part)
            if crc:
                c = zlib.crc32(part, c)
    return (h.hexdigest() if h is not None else ""), c


def _file_digests(path: Path, sha: bool = True, crc: bool = True) -> tuple[str, int]:
    """Digests of a file, read through a read-only mapping (no copy into Python)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return _digests([], sha, crc)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            try:
                return _digests([view], sha, crc)
            finally:
                view.release()


def _hash_file(path: Path) -> str:
    """sha256 of a file."""
    return _file_digests(path, crc=False)[0]


def _test_delay() -> None:
    delay = os.environ.get(DELAY_ENV)
    if delay:
        time.sleep(float(delay))


# ------------------------------------------------------------------------ writing


# copy_file_range fails with these where the kernel cannot copy between the two files
# (EXDEV: another file system on kernels before 5.19 and between different types; the others:
# not supported by the file system or the kernel); the copy then streams through user space.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM,
                   errno.ENOTSUP, errno.EBADF}


def copy_fd(src: int, dst: int, size: int) -> int:
    """Copy ``size`` bytes from ``src``'s start to ``dst``'s start; returns the bytes copied.

    ``copy_file_range`` first; any failure that means "not between these two files" falls
    back to a plain streamed copy of what is left (``CHUNK`` bytes at a time).
    """
    done = 0
    kernel = hasattr(os, "copy_file_range")
    while done < size:
        if kernel:
            try:
                n = os.copy_file_range(src, dst, min(size - done, 1 << 30), done, done)
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY:
                    raise
                kernel = False
                continue
        else:
            data = os.pread(src, min(size - done, CHUNK), done)
            n = len(data)
            if n:
                view = memoryview(data)
                written = 0
                while written < n:
                    written += os.pwrite(dst, view[written:], done + written)
        if n == 0:
            break
        done += n
    return done




class _Pending:
    """One scheduled file: its hash and write futures and what the manifest records."""

    def __init__(
        self,
        rel: str,
        size: int,
        dtype: str | None,
        shape: tuple[int, ...] | None,
        expected: FileEntry | None = None,
        source: Path | None = None,
    ):
        self.rel, self.size, self.dtype, self.shape = rel, size, dtype, shape
        self.expected, self.source = expected, source
        self.hashed: Future[Any] | None = None
        self.written: Future[Any] | None = None


class _StreamFile:
    """One member of a :class:`StreamSource` being written: header first, then appended chunks
    with both digests updated on the way."""

    def __init__(self, member: StreamMember, path: Path):
        if not member.shape:
            raise ValueError(f"{member.path}: a streamed member needs rows (shape {member.shape})")
        self.member = member
        self.dtype = np.dtype(member.dtype)
        self.tail = tuple(int(s) for s in member.shape[1:])
        self.rows = 0
        header = npy_header_for(self.dtype, member.shape)
        self.size = len(header) + int(np.prod(member.shape, dtype=np.int64)) * self.dtype.itemsize
        self.sha = hashlib.sha256(header)
        self.crc = zlib.crc32(header)
        self.fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        _write_all(self.fd, memoryview(header))
        self.at = len(header)
        self.lane = ThreadPoolExecutor(max_workers=1)  # the digests: in file order

    def place(self, array: np.ndarray) -> tuple[np.ndarray, int]:
        """``array`` as this member's next rows (C order, its dtype) and the file offset
        where they go."""
        array = np.ascontiguousarray(array, dtype=self.dtype)
        if array.ndim != len(self.member.shape) or tuple(array.shape[1:]) != self.tail:
            raise ValueError(f"{self.member.path}: a chunk of shape {array.shape}, the member is "
                             f"{self.member.shape}")
        self.rows += int(array.shape[0])
        if self.rows > self.member.shape[0]:
            raise ValueError(f"{self.member.path}: more than {self.member.shape[0]} rows given")
        at = self.at
        self.at += array.nbytes
        return array, at

    def hash(self, array: np.ndarray) -> None:
        """Both digests over ``array``'s bytes (called in file order, on :attr:`lane`)."""
        view = _byte_view(array)
        for i in range(0, len(view), _HASH_CHUNK):
            part = view[i : i + _HASH_CHUNK]
            self.sha.update(part)
            self.crc = zlib.crc32(part, self.crc)

    def write_at(self, array: np.ndarray, at: int) -> None:
        """``array``'s bytes at file offset ``at``."""
        assert self.fd is not None
        view = _byte_view(array)
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done : done + CHUNK], at + done)

    def finish(self, fsync: bool) -> None:
        """Check every row came, then fsync and close."""
        want = self.member.shape[0]
        if self.rows != want:
            raise ValueError(f"{self.member.path}: {self.rows} rows given, {want} declared")
        assert self.fd is not None
        if fsync:
            os.fsync(self.fd)
        self.close()

    def close(self) -> None:
        self.lane.shutdown(wait=True)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Writer:
    """Writes and hashes a bundle's files on a thread pool, bounding the bytes in flight.

    Pool tasks never wait on other pool tasks; entries are assembled by :meth:`wait`.
    """

    def __init__(self, root: Path, fsync: bool, workers: int | None = None):
        self.root = root
        self.fsync = fsync
        self.pool = ThreadPoolExecutor(max_workers=workers or max(4, 2 * (os.cpu_count() or 2)))
        self.pending: list[_Pending] = []
        self.dirs: set[Path] = {root}
        self.in_flight = 0
        self.cond = threading.Condition()

    def _target(self, rel: str) -> Path:
        path = self.root / rel
        if path.parent not in self.dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
            p = path.parent
            while p != self.root and p not in self.dirs:
                self.dirs.add(p)
                p = p.parent
        return path

    def _reserve(self, n: int) -> None:
        with self.cond:
            while self.in_flight and self.in_flight + n > _MAX_IN_FLIGHT:
                self.cond.wait()
            self.in_flight += n

    def _release_when_done(self, n: int, futures: list[Future[Any]]) -> None:
        remaining = [len(futures)]
        lock = threading.Lock()

        def done(_: Future[Any]) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                with self.cond:
                    self.in_flight -= n
                    self.cond.notify_all()

        for future in futures:
            future.add_done_callback(done)

    def add(self, rel: str, source: Source) -> None:
        """Schedule one file; returns once it is queued (may wait for memory to free up)."""
        if isinstance(source, StreamSource):
            self.add_stream(source)
            return
        path = self._target(rel)
        if isinstance(source, FileSource):
            exp = source.expected
            item = _Pending(rel, exp.bytes, exp.dtype, exp.shape, exp, source.path)
            use_crc = source.verify == "crc32" and exp.crc32 is not None
            item.hashed = self.pool.submit(_file_digests, source.path, not use_crc, use_crc)
            item.written = self.pool.submit(self._copy, path, source.path)
            self.pending.append(item)
            return
        if isinstance(source, WriterSource):
            self._reserve(source.nbytes)
            item = _Pending(rel, -1, None, None)
            item.written = self.pool.submit(self._produce, path, source)
            item.hashed = item.written  # the digest comes with the size
            self._release_when_done(source.nbytes, [item.written])
            self.pending.append(item)
            return
        if isinstance(source, BytesSource):
            views, dtype, shape = [memoryview(source.data)], None, None
        else:
            array = source.array
            views = [memoryview(npy_header(array)), _byte_view(array)]
            dtype, shape = str(array.dtype), tuple(int(s) for s in array.shape)
        size = sum(len(v) for v in views)
        self._reserve(size)
        item = _Pending(rel, size, dtype, shape)
        item.hashed = self.pool.submit(_digests, views)
        item.written = self.pool.submit(self._write, path, views)
        self._release_when_done(size, [item.hashed, item.written])
        self.pending.append(item)

    def add_stream(self, source: StreamSource) -> None:
        """Write ``source``'s members now, chunk by chunk; returns once all are on disk.

        The iterator runs in this thread while earlier chunks are written (``pwrite`` at their
        offsets, on the pool) and hashed (in order, on one thread per member); at most
        :data:`_STREAM_WINDOW` chunks are in flight, so memory stays at a few chunks."""
        files: list[_StreamFile] = []
        window: list[list[Future[Any]]] = []
        try:
            for m in source.members:
                check_member_name(m.path)
                files.append(_StreamFile(m, self._target(m.path)))
            for chunk in source.chunks:
                if len(chunk) != len(files):
                    raise ValueError(f"a chunk of {len(chunk)} arrays for {len(files)} members")
                placed = [f.place(a) for f, a in zip(files, chunk, strict=True)]
                while len(window) >= _STREAM_WINDOW:
                    for future in window.pop(0):
                        future.result()
                futures = []
                for f, (array, at) in zip(files, placed, strict=True):
                    if array.size:
                        futures.append(f.lane.submit(f.hash, array))
                        futures.append(self.pool.submit(f.write_at, array, at))
                window.append(futures)
            for futures in window:
                for future in futures:
                    future.result()
            window = []
            for f in files:
                f.finish(self.fsync)
                _test_delay()
        finally:
            for futures in window:  # an error: let what is running finish before closing
                for future in futures:
                    future.cancel()
                wait(futures)
            for f in files:
                f.close()
        for f in files:
            item = _Pending(f.member.path, f.size, str(f.member.dtype), f.member.shape)
            item.written, item.hashed = Future(), Future()
            item.written.set_result(f.size)
            item.hashed.set_result((f.sha.hexdigest(), f.crc))
            self.pending.append(item)

    def _write(self, path: Path, views: list[memoryview]) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for view in views:
                _write_all(fd, view)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        _test_delay()
        return sum(len(v) for v in views)

    def _produce(self, path: Path, source: WriterSource) -> tuple[int, tuple[str, int]]:
        source.write(path)
        if self.fsync:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _test_delay()
        return path.stat().st_size, _file_digests(path)

    def _copy(self, path: Path, source: Path) -> int:
        """Copy ``source`` to a new file ``path``, fsynced; returns the bytes copied.

        In the kernel (``copy_file_range``) where the two files' file systems allow it,
        else (another file system, or a kernel or file system without it) a streamed copy.
        """
        with open(source, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                done = copy_fd(src.fileno(), fd, size)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        _test_delay()
        return done

    def wait(self) -> list[FileEntry]:
        """Every file's entry, in the order added; the first failure is raised."""
        try:
            entries = []
            for item in self.pending:
                assert item.hashed is not None and item.written is not None
                if item.size < 0:
                    size, (digest, crc) = item.written.result()
                    entries.append(FileEntry(item.rel, digest, size, None, None, crc))
                    continue
                size = item.written.result()
                digest, crc = item.hashed.result()
                exp = item.expected
                if exp is None:
                    entry = FileEntry(item.rel, digest, item.size, item.dtype, item.shape, crc)
                    entries.append(entry)
                    continue
                if size != exp.bytes:
                    raise CheckpointError(
                        f"{item.source}: {size} bytes, manifest says {exp.bytes}; "
                        "the file is truncated or corrupt"
                    )
                if digest and digest != exp.sha256:
                    raise CheckpointError(
                        f"{item.source}: checksum mismatch (sha256 {digest[:16]}…, manifest says "
                        f"{exp.sha256[:16]}…); the file is corrupt"
                    )
                if not digest and crc != exp.crc32:
                    raise CheckpointError(
                        f"{item.source}: checksum mismatch (crc32 {crc:08x}, manifest says "
                        f"{exp.crc32:08x}); the file is corrupt"
                    )
                entries.append(
                    FileEntry(item.rel, exp.sha256, exp.bytes, exp.dtype, exp.shape, exp.crc32)
                )
            return entries
        finally:
            self.abort()

    def abort(self) -> None:
        """Cancel what has not started and wait for the rest."""
        for item in self.pending:
            for future in (item.hashed, item.written):
                if future is not None:
                    future.cancel()
        self.pool.shutdown(wait=True)


def write_bundle(
    dest: Path,
    files: Iterable[tuple[str, Source]],
    finish: Callable[[list[FileEntry]], dict[str, Any]],
    *,
    fsync: bool = True,
    tmp_name: str | None = None,
    workers: int | None = None,
    replace: bool = False,
) -> dict[str, Any]:
    """Atomically create directory ``dest`` from ``files``; returns the manifest written.

    ``files`` may be a generator (it is consumed while earlier files are written).
    ``finish(entries)`` returns the manifest's other fields; ``files`` and
    ``content_fingerprint`` are added here. ``dest`` must not exist unless ``replace``: then
    the old directory is moved aside only once the new one is complete.
    """
    dest = Path(dest)
    if dest.exists() and not replace:
        raise CheckpointError(f"{dest}: already exists; choose another output directory")
    try:
        return _write_bundle(dest, files, finish, fsync, tmp_name, workers, replace)
    except OSError as exc:
        where = os_error_line(exc) if exc.filename is not None else os_error_cause(exc)
        raise StorageError(
            f"{dest}: not written: {where}; nothing that existed before was changed"
        ) from exc


def _write_bundle(
    dest: Path,
    files: Iterable[tuple[str, Source]],
    finish: Callable[[list[FileEntry]], dict[str, Any]],
    fsync: bool,
    tmp_name: str | None,
    workers: int | None,
    replace: bool,
) -> dict[str, Any]:
    parent = dest.parent
    if parent.exists() and not parent.is_dir():
        raise NotADirectoryError(20, "Not a directory", str(parent))
    parent.mkdir(parents=True, exist_ok=True)
    from embtrain.checkpoint.tmpdirs import owned_name, sweep_dead

    sweep_dead(parent)  # what killed writers left here
    tmp = parent / (tmp_name or owned_name(dest.name))
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    writer = _Writer(tmp, fsync, workers)
    ok = False
    try:
        try:
            for rel, source in files:
                check_member_name(rel)
                writer.add(rel, source)
        except BaseException:
            writer.abort()
            raise
        entries = writer.wait()
        manifest = dict(finish(entries))
        manifest["files"] = [e.to_json() for e in entries]
        manifest["content_fingerprint"] = manifest.get(
            "content_fingerprint"
        ) or content_fingerprint(entries)
        data = json_bytes(manifest)
        fd = os.open(tmp / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, memoryview(data))
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if fsync:
            for d in sorted(writer.dirs, key=lambda p: len(p.parts), reverse=True):
                _fsync_dir(d)
        old = None
        if replace and dest.exists():
            old = parent / f"{TMP_PREFIX}old-{dest.name}-{secrets.token_hex(3)}"
            os.rename(dest, old)
        os.rename(tmp, dest)
        if fsync:
            _fsync_dir(parent)
        ok = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return manifest
    finally:
        if not ok:
            shutil.rmtree(tmp, ignore_errors=True)


def check_member_name(rel: str) -> None:
    """Refuse a bundle member path that is absolute or climbs out (``..``)."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid bundle member path {rel!r}")


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
    digest = _hash_file(full)
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
        view = _byte_view(array)
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
        view = _byte_view(out)
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
