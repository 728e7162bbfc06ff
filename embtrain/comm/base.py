"""The collective protocol and its one-process implementation."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

#: purposes of collectives run on the pipeline's communication thread (their time overlaps the
#: step's compute, so the step's phases do not count it as waiting)
BACKGROUND = frozenset({"ids.ahead"})


@dataclass
class TrafficCounter:
    """Bytes this rank sent to *other* ranks, by purpose (e.g. ``ids``, ``forward``).

    Thread-safe: the pipeline's communication thread counts beside the training thread."""

    sent: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, purpose: str, nbytes: int, parts: Mapping[str, int] | None = None) -> None:
        """Count ``nbytes`` sent for ``purpose`` (one collective call); ``parts``: bytes of
        that call that belong to other purposes (a fused exchange carries several)."""
        with self._lock:
            rest = int(nbytes)
            for name, n in (parts or {}).items():
                self.sent[name] = self.sent.get(name, 0) + int(n)
                rest -= int(n)
            self.sent[purpose] = self.sent.get(purpose, 0) + rest
            self.calls[purpose] = self.calls.get(purpose, 0) + 1

    def waited(self, purpose: str, seconds: float) -> None:
        """Count time spent inside a collective for ``purpose``."""
        with self._lock:
            self.seconds[purpose] = self.seconds.get(purpose, 0.0) + float(seconds)

    def total_seconds(self) -> float:
        """All time spent in collectives so far."""
        with self._lock:
            return sum(self.seconds.values())

    def blocking_seconds(self) -> float:
        """Time the training thread spent inside collectives (the pipeline's background
        exchanges, :data:`BACKGROUND`, excluded: they overlap compute)."""
        with self._lock:
            return sum(v for k, v in self.seconds.items() if k not in BACKGROUND)

    def background_seconds(self) -> float:
        """Time the pipeline's communication thread spent inside collectives."""
        with self._lock:
            return sum(v for k, v in self.seconds.items() if k in BACKGROUND)

    def total(self) -> int:
        """All bytes sent so far."""
        return sum(self.sent.values())

    def reset(self) -> None:
        """Forget everything counted."""
        with self._lock:
            self.sent.clear()
            self.calls.clear()
            self.seconds.clear()


class Communicator(Protocol):
    """Collectives over ``size`` ranks; every rank calls each one in the same order.

    Byte payloads are 1-D ``uint8`` arrays; ``counts`` are byte counts per rank.
    """

    rank: int
    size: int
    traffic: TrafficCounter
    #: how the ranks exchange: ``none`` (one process), ``shared_memory`` or ``horovod``
    transport: str

    def alltoallv(self, send: np.ndarray, counts: Sequence[int], purpose: str = "other",
                  parts: Mapping[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Send ``send[sum(counts[:d]):sum(counts[:d+1])]`` to rank ``d``; returns the bytes
        received (concatenated in rank order) and the count from each rank. ``parts``: bytes
        sent to other ranks that the traffic counter books under other purposes (a fused
        exchange). Collectives of different purposes may run on different threads at once
        (the pipeline's communication thread); one purpose is used by one thread at a time."""
        ...

    def allgatherv(self, send: np.ndarray, purpose: str = "other") -> tuple[np.ndarray, np.ndarray]:
        """Every rank's bytes concatenated in rank order, and each rank's count."""
        ...

    def allreduce_sum(self, values: np.ndarray, purpose: str = "other") -> np.ndarray:
        """Element-wise sum over ranks of a float64 or int64 array."""
        ...

    def allreduce_tensors(self, tensors: list[Any]) -> list[Any]:
        """Sum over ranks of TensorFlow tensors (the dense gradients), in one grouped call."""
        ...

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        """``data`` of ``root`` on every rank (other ranks pass None)."""
        ...

    def barrier(self) -> None:
        """Return once every rank has called it."""
        ...

    def shutdown(self) -> None:
        """Release the collective backend."""
        ...


class LocalComm:
    """One process: every collective is the identity."""

    rank = 0
    size = 1
    transport = "none"

    def __init__(self) -> None:
        self.traffic = TrafficCounter()

    def alltoallv(self, send: np.ndarray, counts: Sequence[int], purpose: str = "other",
                  parts: Mapping[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        return send, np.asarray(counts, dtype=np.int64)

    def allgatherv(self, send: np.ndarray, purpose: str = "other") -> tuple[np.ndarray, np.ndarray]:
        return send, np.array([send.shape[0]], dtype=np.int64)

    def allreduce_sum(self, values: np.ndarray, purpose: str = "other") -> np.ndarray:
        return np.asarray(values).copy()

    def allreduce_tensors(self, tensors: list[Any]) -> list[Any]:
        return list(tensors)

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        if data is None:
            raise ValueError("the root must pass data")
        return data

    def barrier(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


def gather_to_root(comm: Communicator, payload: bytes, root: int = 0,
                   purpose: str = "checkpoint") -> list[bytes] | None:
    """Every rank's ``payload`` on ``root`` (in rank order), None elsewhere; one alltoallv."""
    counts = [0] * comm.size
    counts[root] = len(payload)
    got, sizes = comm.alltoallv(np.frombuffer(payload, dtype=np.uint8), counts, purpose)
    if comm.rank != root:
        return None
    out, at = [], 0
    for n in sizes.tolist():
        out.append(got[at:at + n].tobytes())
        at += n
    return out


def agree(comm: Communicator, value: str) -> list[str]:
    """Every rank's ``value`` (e.g. a fingerprint), in rank order, on every rank."""
    data = value.encode()
    got, sizes = comm.allgatherv(np.frombuffer(data, dtype=np.uint8), "control")
    out, at = [], 0
    for n in sizes.tolist():
        out.append(got[at:at + n].tobytes().decode())
        at += n
    return out
