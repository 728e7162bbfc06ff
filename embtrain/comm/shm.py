"""Collectives through shared memory, for the ranks of a job that all run on one machine.

Horovod over Gloo moves bytes between local ranks through loopback TCP and its own background
thread: on this project's machines a collective of a few bytes costs over a millisecond and a
large one moves ~0.9 GB/s (docs/SCALING.md). Ranks on one machine can instead read each other's
memory. :class:`SharedMemoryComm` is the :class:`~embtrain.comm.base.Communicator` for them: the
launcher (``embtrain run --np N`` on one node) makes a directory on ``/dev/shm`` for the job,
and every collective is a *channel* there, one per purpose (so the pipeline's communication
thread and the training thread never share one).

A channel holds, per rank, a header (a few int64 words) and a data file that grows to the
largest message. Call ``k`` on a channel, on every rank:

1. wait until every peer has finished call ``k - 1`` (so none still reads this rank's data);
2. write the message into this rank's data file, the (offset, length) each peer takes into
   the header, then publish ``seq = k``;
3. for each peer, wait for its ``seq >= k`` and copy the part addressed to this rank;
4. publish ``done = k``.

Stores become visible in program order on x86-64 (total store order), so a peer that sees
``seq = k`` sees the message; :func:`available` refuses other machines, which keep Horovod.
Reductions sum the ranks' contributions in rank order on every rank: every rank gets the same
bits. A rank that waits checks its peers' liveness: each rank holds an exclusive ``flock`` on a
file of its own for its whole life, which the kernel drops when the process ends however it
ends, so a waiting rank learns within a second that a peer is gone and raises :class:`PeerLost`.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import platform
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from embtrain.comm.base import TrafficCounter
from embtrain.errors import StorageError

#: the launcher's job directory on a shared-memory file system (set only when every rank of
#: the job runs on this machine)
SHM_DIR_ENV = "EMBTRAIN_SHM_DIR"
#: ``horovod`` keeps Horovod for the ranks of one machine too; ``auto`` (default) uses shared
#: memory where :func:`available` says it can
TRANSPORT_ENV = "EMBTRAIN_TRANSPORT"
#: where the launcher makes job directories
SHM_ROOT = "/dev/shm"
#: ``auto`` picks shared memory only with this much free on :data:`SHM_ROOT` (a container's
#: default 64 MiB would not hold a large model's exchanges)
MIN_FREE_BYTES = 1 << 30

#: a data file larger than this is given back after the call that needed it (a checkpoint's
#: gather, say), not kept for the next: pages of /dev/shm stay in memory while a file or a
#: mapping holds them. The step's own exchanges stay below it and keep their files.
KEEP_BYTES = 256 << 20

_SEQ, _DONE, _GEN = 0, 8, 9  # header words (seq on its own cache line)
_FIXED_WORDS = 16
_LIVENESS_EVERY_S = 0.25
_SPIN_S = 0.002  # yield the core while waiting this long, then sleep in short naps
_NAP_S = 5e-5
_LONG_WAIT_S = 0.02
_LONG_NAP_S = 5e-4


class PeerLost(RuntimeError):
    """A peer rank's process ended while this rank waited for it in a collective."""


def free_bytes() -> int:
    """Free bytes on :data:`SHM_ROOT` (0 where it cannot be read)."""
    try:
        fs = os.statvfs(SHM_ROOT)
    except OSError:
        return 0
    return fs.f_bavail * fs.f_frsize


def available(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the ranks of a one-machine job should talk through shared memory: a Linux
    x86-64 machine with ``/dev/shm``, unless ``EMBTRAIN_TRANSPORT=horovod``."""
    env = os.environ if environ is None else environ
    transport = env.get(TRANSPORT_ENV, "auto").strip().lower()
    if transport == "horovod":
        return False
    return (platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
            and os.path.isdir(SHM_ROOT) and os.access(SHM_ROOT, os.W_OK))


class _Mapped:
    """A file mapped into memory, as a flat ``uint8`` array (and an int64 view of it)."""

    def __init__(self, path: str, nbytes: int | None = None) -> None:
        """Map the existing file ``path``; with ``nbytes``, create it first with that size
        (written under a temporary name and renamed, so a peer never maps it half-made)."""
        if nbytes is not None:
            tmp = f"{path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, max(nbytes, 64))
                # claim the pages now: a full /dev/shm fails here, not with SIGBUS mid-step
                os.posix_fallocate(fd, 0, max(nbytes, 64))
            except OSError as exc:
                os.close(fd)
                os.unlink(tmp)
                raise StorageError(
                    f"shared memory: cannot make {path} ({nbytes:,} bytes) for the ranks' "
                    f"exchanges: {exc.strerror or exc}; give {SHM_ROOT} more room (docker: "
                    "--shm-size) or set distributed.comm.transport: horovod") from None
            os.rename(tmp, path)
        else:
            fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.bytes = np.frombuffer(self._map, dtype=np.uint8)
        self.words = self.bytes[: size - size % 8].view(np.int64)

    def close(self) -> None:
        self.bytes = self.words = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):  # a view still alive keeps the mapping
            self._map.close()


class _Channel:
    """One purpose's collectives (see the module's docstring for the protocol)."""

    def __init__(self, root: str, name: str, purpose: str, rank: int, size: int,
                 wait: Callable[[Callable[[], bool], int, str], None]) -> None:
        self.root, self.name, self.rank, self.size = root, name, rank, size
        self.purpose = purpose
        self._wait = wait
        self.calls = 0
        words = _FIXED_WORDS + 2 * size
        self.header = _Mapped(self._path("h", rank), words * 8)
        self._data: _Mapped | None = None
        self._gen = 0
        self._peer_headers: dict[int, _Mapped] = {}
        self._peer_data: dict[int, tuple[int, _Mapped]] = {}

    def _path(self, kind: str, rank: int, gen: int = 0) -> str:
        return os.path.join(self.root, f"{self.name}.{rank}.{kind}{gen if kind == 'd' else ''}")

    def _peer_header(self, peer: int) -> np.ndarray:
        mapped = self._peer_headers.get(peer)
        if mapped is None:
            path = self._path("h", peer)
            self._wait(lambda: os.path.exists(path), peer, self.purpose)
            mapped = self._peer_headers[peer] = _Mapped(path)
        return mapped.words

    def _room(self, nbytes: int) -> np.ndarray:
        """This rank's data file, grown (a new file, a new generation) to hold ``nbytes``."""
        if self._data is None or self._data.bytes.shape[0] < nbytes:
            old = self._data
            self._gen += 1
            capacity = 1 << max(16, int(nbytes - 1).bit_length())
            self._data = _Mapped(self._path("d", self.rank, self._gen), capacity)
            if old is not None:  # every peer has finished reading it (step 1)
                old.close()
                os.unlink(self._path("d", self.rank, self._gen - 1))
        return self._data.bytes

    def _peer_bytes(self, peer: int, gen: int) -> np.ndarray:
        have = self._peer_data.get(peer)
        if have is None or have[0] != gen:
            if have is not None:
                have[1].close()
            have = self._peer_data[peer] = (gen, _Mapped(self._path("d", peer, gen)))
        return have[1].bytes

    def exchange(self, payload: np.ndarray, offsets: Sequence[int], lengths: Sequence[int]
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Offer ``payload[offsets[d]:offsets[d] + lengths[d]]`` to rank ``d``; the parts the
        ranks offered this one, concatenated in rank order, and their lengths."""
        k = self.calls + 1
        peers = [p for p in range(self.size) if p != self.rank]
        headers = {p: self._peer_header(p) for p in peers}
        for p in peers:
            h = headers[p]
            self._wait(lambda h=h: int(h[_DONE]) >= k - 1, p, self.purpose)
        mine = self.header.words
        n = int(payload.shape[0])
        if n:
            self._room(n)[:n] = payload
        top = _FIXED_WORDS
        mine[top:top + self.size] = np.asarray(offsets, dtype=np.int64)
        mine[top + self.size:top + 2 * self.size] = np.asarray(lengths, dtype=np.int64)
        mine[_GEN] = self._gen
        mine[_SEQ] = k  # publish: the message and its header words are written
        sizes = np.zeros(self.size, dtype=np.int64)
        sizes[self.rank] = int(lengths[self.rank])
        for p in peers:
            h = headers[p]
            self._wait(lambda h=h: int(h[_SEQ]) >= k, p, self.purpose)
            sizes[p] = int(h[top + self.size + self.rank])
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        at = 0
        for p in range(self.size):
            m = int(sizes[p])
            if m:
                if p == self.rank:
                    start = int(offsets[p])
                    out[at:at + m] = payload[start:start + m]
                else:
                    h = headers[p]
                    start = int(h[top + self.rank])
                    theirs = self._peer_bytes(p, int(h[_GEN]))
                    out[at:at + m] = theirs[start:start + m]
                    big = theirs.shape[0] > KEEP_BYTES
                    del theirs
                    if big:  # let its pages go (see KEEP_BYTES)
                        self._peer_data.pop(p)[1].close()
            at += m
        mine[_DONE] = k
        self.calls = k
        if self._data is not None and self._data.bytes.shape[0] > KEEP_BYTES:
            for p in peers:  # every peer has copied its part: give the file back
                h = headers[p]
                self._wait(lambda h=h: int(h[_DONE]) >= k, p, self.purpose)
            self._data.close()
            self._data = None
            os.unlink(self._path("d", self.rank, self._gen))
        return out, sizes


class SharedMemoryComm:
    """A :class:`~embtrain.comm.base.Communicator` for ranks on one machine, through files on
    a shared-memory file system (the module's docstring has the protocol)."""

    transport = "shared_memory"

    def __init__(self, rank: int, size: int, root: str) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} of {size}")
        self.rank, self.size, self.local_rank = rank, size, rank
        self.root = root
        self.traffic = TrafficCounter()
        self._channels: dict[str, _Channel] = {}
        self._lock = threading.Lock()
        self._alive_fd = self._hold_alive_lock()
        self._peer_alive_fds: dict[int, int] = {}
        self._checked: dict[int, float] = {}

    # -- liveness -------------------------------------------------------------------------
    def _alive_path(self, rank: int) -> str:
        return os.path.join(self.root, f"alive.{rank}")

    def _hold_alive_lock(self) -> int:
        """Lock this rank's liveness file for the life of the process (locked before it
        appears under its name, so a file that exists is held by a live rank)."""
        path = self._alive_path(self.rank)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, str(os.getpid()).encode())
        os.rename(tmp, path)
        return fd

    def _peer_alive(self, peer: int) -> bool:
        """False once ``peer``'s process has ended (its lock was dropped); True while it
        lives or has not yet started."""
        fd = self._peer_alive_fds.get(peer)
        if fd is None:
            try:
                fd = os.open(self._alive_path(peer), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return True  # not started yet: the launcher stops the job if it never does
            self._peer_alive_fds[peer] = fd
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False

    def _wait(self, ready: Callable[[], bool], peer: int, purpose: str) -> None:
        """Return once ``ready()``; raise :class:`PeerLost` if ``peer`` ends first."""
        if ready():
            return
        start = time.monotonic()
        check = start + _LIVENESS_EVERY_S
        while True:
            now = time.monotonic()
            waited = now - start
            if waited < _SPIN_S:
                os.sched_yield()
            else:
                time.sleep(_NAP_S if waited < _LONG_WAIT_S else _LONG_NAP_S)
            if ready():
                return
            if now >= check:
                check = now + _LIVENESS_EVERY_S
                if not self._peer_alive(peer):
                    raise PeerLost(f"rank {peer} ended while rank {self.rank} waited for it "
                                   f"in a collective ({purpose})")

    # -- collectives ----------------------------------------------------------------------
    def _channel(self, purpose: str) -> _Channel:
        channel = self._channels.get(purpose)
        if channel is None:
            with self._lock:
                channel = self._channels.get(purpose)
                if channel is None:
                    name = re.sub(r"[^A-Za-z0-9_.-]", "_", purpose)
                    channel = self._channels[purpose] = _Channel(
                        self.root, f"c.{name}", purpose, self.rank, self.size, self._wait)
        return channel

    def alltoallv(self, send: np.ndarray, counts: Sequence[int], purpose: str = "other",
                  parts: Mapping[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        send = np.ascontiguousarray(send, dtype=np.uint8).reshape(-1)
        counts = [int(c) for c in counts]
        if len(counts) != self.size or sum(counts) != send.shape[0]:
            raise ValueError(f"alltoallv: counts {counts} do not cover {send.shape[0]} bytes")
        self.traffic.add(purpose, sum(counts) - counts[self.rank], parts)
        offsets = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        t0 = time.perf_counter()
        result = self._channel(purpose).exchange(send, offsets, counts)
        self.traffic.waited(purpose, time.perf_counter() - t0)
        return result

    def alltoallv_rows(self, send: Any, counts: Sequence[int], purpose: str = "other") -> Any:
        """``counts[r]`` rows of the 2-D ``send`` to rank ``r``; the rows received, in rank
        order, as an array of ``send``'s own module (a CuPy array crosses through host
        memory: this transport has no device path)."""
        counts = [int(c) for c in counts]
        if len(counts) != self.size or sum(counts) != int(send.shape[0]):
            raise ValueError(f"alltoallv_rows: counts {counts} do not cover {send.shape[0]} rows")
        host = np.ascontiguousarray(send if isinstance(send, np.ndarray) else send.get())
        row_bytes = int(np.prod(host.shape[1:], dtype=np.int64)) * host.dtype.itemsize
        got, _ = self.alltoallv(host.reshape(-1).view(np.uint8),
                                [c * row_bytes for c in counts], purpose)
        rows = got.view(host.dtype).reshape(-1, *host.shape[1:])
        if isinstance(send, np.ndarray):
            return rows
        import cupy  # pragma: no cover - needs a GPU

        return cupy.asarray(rows)  # pragma: no cover

    def nccl_built(self) -> bool:
        """False: this transport moves host memory only."""
        return False

    def allgatherv(self, send: np.ndarray, purpose: str = "other") -> tuple[np.ndarray, np.ndarray]:
        send = np.ascontiguousarray(send, dtype=np.uint8).reshape(-1)
        n = int(send.shape[0])
        self.traffic.add(purpose, n * (self.size - 1))
        t0 = time.perf_counter()
        result = self._channel(purpose).exchange(send, [0] * self.size, [n] * self.size)
        self.traffic.waited(purpose, time.perf_counter() - t0)
        return result

    def allreduce_sum(self, values: np.ndarray, purpose: str = "other") -> np.ndarray:
        arr = np.ascontiguousarray(values)
        self.traffic.add(purpose, arr.nbytes * (self.size - 1))
        t0 = time.perf_counter()
        total = self._sum(arr, purpose)
        self.traffic.waited(purpose, time.perf_counter() - t0)
        return total

    def _sum(self, arr: np.ndarray, purpose: str) -> np.ndarray:
        """The ranks' ``arr`` summed in rank order (the same bits on every rank)."""
        got, _ = self._channel(purpose).exchange(
            arr.reshape(-1).view(np.uint8), [0] * self.size, [arr.nbytes] * self.size)
        each = got.view(arr.dtype).reshape(self.size, *arr.shape)
        total = each[0].copy()
        for part in each[1:]:
            total += part
        return total

    def allreduce_tensors(self, tensors: list[Any]) -> list[Any]:
        if not tensors:
            return []
        import tensorflow as tf

        arrays = [np.asarray(t) for t in tensors]
        self.traffic.add("dense", sum(a.nbytes for a in arrays) * (self.size - 1))
        t0 = time.perf_counter()
        out: list[Any] = [None] * len(arrays)
        for dtype in dict.fromkeys(a.dtype for a in arrays):  # one exchange per dtype
            idx = [i for i, a in enumerate(arrays) if a.dtype == dtype]
            flat = np.concatenate([arrays[i].reshape(-1) for i in idx])
            total, at = self._sum(flat, f"dense.{dtype}"), 0
            for i in idx:
                m = arrays[i].size
                out[i] = tf.convert_to_tensor(total[at:at + m].reshape(arrays[i].shape))
                at += m
        self.traffic.waited("dense", time.perf_counter() - t0)
        return out

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        if self.rank == root and data is None:
            raise ValueError("the root must pass data")
        payload = np.frombuffer(data, np.uint8) if self.rank == root and data else \
            np.zeros(0, np.uint8)
        n = int(payload.shape[0])
        got, sizes = self._channel("broadcast").exchange(payload, [0] * self.size,
                                                         [n] * self.size)
        start = int(sizes[:root].sum())
        return got[start:start + int(sizes[root])].tobytes()

    def barrier(self) -> None:
        empty = np.zeros(0, np.uint8)
        self._channel("barrier").exchange(empty, [0] * self.size, [0] * self.size)

    def shutdown(self) -> None:
        """Unmap the channels; the files stay for peers still reading this rank's last
        message (the launcher removes the job's directory when every rank has ended)."""
        for channel in self._channels.values():
            channel.header.close()
        self._channels.clear()
        for fd in self._peer_alive_fds.values():
            os.close(fd)
        self._peer_alive_fds.clear()
