"""Writing bundles (:mod:`embtrain.checkpoint.bundle_format`) atomically: the files go into a
temporary sibling directory, each is fsynced, ``manifest.json`` is written last, then the
directory is renamed into place and its parent fsynced.

Throughput: files are written with large sequential writes straight from the arrays'
memory (no intermediate copy) while a thread pool hashes them; hashlib and file I/O
release the GIL, so hashing and writing overlap across files.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import shutil
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.checkpoint.bundle_format import (
    CHUNK,
    HASH_CHUNK,
    MANIFEST,
    TMP_PREFIX,
    CheckpointError,
    FileEntry,
    byte_view,
    check_member_name,
    content_fingerprint,
    digests,
    file_digests,
    json_bytes,
    npy_header,
    npy_header_for,
)
from embtrain.errors import StorageError, os_error_cause, os_error_line

_MAX_IN_FLIGHT = 2 << 30
_STREAM_WINDOW = 2  # chunks of a StreamSource being written and hashed at once


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
        view = byte_view(array)
        for i in range(0, len(view), HASH_CHUNK):
            part = view[i : i + HASH_CHUNK]
            self.sha.update(part)
            self.crc = zlib.crc32(part, self.crc)

    def write_at(self, array: np.ndarray, at: int) -> None:
        """``array``'s bytes at file offset ``at``."""
        assert self.fd is not None
        view = byte_view(array)
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
            item.hashed = self.pool.submit(file_digests, source.path, not use_crc, use_crc)
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
            views = [memoryview(npy_header(array)), byte_view(array)]
            dtype, shape = str(array.dtype), tuple(int(s) for s in array.shape)
        size = sum(len(v) for v in views)
        self._reserve(size)
        item = _Pending(rel, size, dtype, shape)
        item.hashed = self.pool.submit(digests, views)
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
        return sum(len(v) for v in views)

    def _produce(self, path: Path, source: WriterSource) -> tuple[int, tuple[str, int]]:
        source.write(path)
        if self.fsync:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return path.stat().st_size, file_digests(path)

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


