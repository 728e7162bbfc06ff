"""Collectives over Horovod (Gloo on CPU, NCCL on GPU): the only module that imports it."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from embtrain.comm.base import TrafficCounter


class HorovodComm:
    """A :class:`~embtrain.comm.base.Communicator` over ``horovod.tensorflow``.

    ``hvd.init()`` runs here, once, when the job asks for the communicator; the rank, size
    and rendezvous come from the environment the launcher (``embtrain run --np``,
    ``horovodrun`` or ``mpirun``) set.
    """

    transport = "horovod"

    def __init__(self) -> None:
        import horovod.tensorflow as hvd
        import tensorflow as tf

        hvd.init()
        self._hvd = hvd
        self._tf = tf
        self.rank = int(hvd.rank())
        self.size = int(hvd.size())
        self.local_rank = int(hvd.local_rank())
        self.traffic = TrafficCounter()
        self._alltoalls: dict[str, Any] = {}
        # one traced all-to-all per purpose (input_signature: traced once each); TensorFlow's
        # retracing detector counts them together and would print a warning on every rank
        tf.get_logger().addFilter(_NotRetracing())

    def _tensor(self, arr: np.ndarray) -> Any:
        """A tensor over ``arr``: borrowed through DLPack when it is a writable, 64-byte aligned
        contiguous array (no copy), else copied."""
        arr = np.ascontiguousarray(arr)
        if arr.size and arr.flags.writeable and arr.ctypes.data % 64 == 0:
            try:
                return self._tf.experimental.dlpack.from_dlpack(arr.__dlpack__())
            except (BufferError, TypeError, ValueError, self._tf.errors.OpError):
                pass
        return self._tf.convert_to_tensor(arr)

    def alltoallv(self, send: np.ndarray, counts: Sequence[int], purpose: str = "other",
                  parts: Mapping[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        send = np.ascontiguousarray(send, dtype=np.uint8).reshape(-1)
        counts = [int(c) for c in counts]
        if len(counts) != self.size or sum(counts) != send.shape[0]:
            raise ValueError(f"alltoallv: counts {counts} do not cover {send.shape[0]} bytes")
        self.traffic.add(purpose, sum(counts) - counts[self.rank], parts)
        splits = self._tf.constant(counts, dtype=self._tf.int32)
        t0 = time.perf_counter()
        out, received = self._alltoall(purpose)(self._tensor(send), splits)
        result = np.asarray(out), np.asarray(received).astype(np.int64)
        self.traffic.waited(purpose, time.perf_counter() - t0)
        return result

    def nccl_built(self) -> bool:
        """Whether this Horovod reduces and exchanges GPU tensors with NCCL (the Dockerfile
        builds it with ``HOROVOD_GPU_OPERATIONS=NCCL``); CPU tensors always go through Gloo."""
        return bool(self._hvd.nccl_built())

    def alltoallv_rows(self, send: Any, counts: Sequence[int], purpose: str = "other") -> Any:
        """``counts[r]`` rows of the 2-D ``send`` to rank ``r``; the rows received, in rank
        order, as an array of ``send``'s own module. ``send`` crosses into TensorFlow and back
        by DLPack, so a CuPy array stays on its GPU and goes through NCCL (when built with
        it), a NumPy array through Gloo. Not yet used by the engine, whose exchanges are host
        byte buffers (:meth:`alltoallv`)."""
        counts = [int(c) for c in counts]
        if len(counts) != self.size or sum(counts) != int(send.shape[0]):
            raise ValueError(f"alltoallv_rows: counts {counts} do not cover {send.shape[0]} rows")
        tf = self._tf
        row_bytes = int(np.prod(send.shape[1:])) * send.dtype.itemsize
        self.traffic.add(purpose, (sum(counts) - counts[self.rank]) * row_bytes)
        t0 = time.perf_counter()
        if isinstance(send, np.ndarray):
            tensor = self._tensor(send)
        else:  # pragma: no cover - needs a GPU
            tensor = tf.experimental.dlpack.from_dlpack(send.toDlpack())
        out, _ = self._hvd.alltoall(tensor, splits=tf.constant(counts, dtype=tf.int32))
        if isinstance(send, np.ndarray):
            result = np.array(out)
        else:  # pragma: no cover - needs a GPU
            import cupy

            result = cupy.from_dlpack(tf.experimental.dlpack.to_dlpack(out))
        self.traffic.waited(purpose, time.perf_counter() - t0)
        return result

    def _alltoall(self, purpose: str) -> Any:
        """Horovod's all-to-all under a name of its own per purpose. Horovod matches
        collectives across ranks by name, and two in flight at once (the pipeline's
        communication thread beside the training thread) must not share one; an eager op's
        name is its type's, so the op runs in a graph (one ``tf.function`` per purpose, any
        size) where its node carries the purpose's name."""
        fn = self._alltoalls.get(purpose)
        if fn is None:
            tf, hvd = self._tf, self._hvd
            name = f"embtrain.alltoall.{purpose}"

            def exchange(send: Any, splits: Any) -> Any:
                return hvd.alltoall(send, splits=splits, name=name, ignore_name_scope=True)

            fn = self._alltoalls[purpose] = tf.function(exchange, input_signature=[
                tf.TensorSpec([None], tf.uint8), tf.TensorSpec([self.size], tf.int32)])
        return fn

    def allgatherv(self, send: np.ndarray, purpose: str = "other") -> tuple[np.ndarray, np.ndarray]:
        send = np.ascontiguousarray(send, dtype=np.uint8).reshape(-1)
        self.traffic.add(purpose, send.shape[0] * (self.size - 1))
        t0 = time.perf_counter()
        sizes = self._hvd.allgather(self._tf.constant([send.shape[0]], dtype=self._tf.int64))
        out = self._hvd.allgather(self._tensor(send))
        result = np.asarray(out), np.asarray(sizes).astype(np.int64)
        self.traffic.waited(purpose, time.perf_counter() - t0)
        return result

    def allreduce_sum(self, values: np.ndarray, purpose: str = "other") -> np.ndarray:
        arr = np.ascontiguousarray(values)
        self.traffic.add(purpose, arr.nbytes * (self.size - 1))
        t0 = time.perf_counter()
        out = np.asarray(self._hvd.allreduce(self._tensor(arr), op=self._hvd.Sum)).copy()
        self.traffic.waited(purpose, time.perf_counter() - t0)
        return out

    def allreduce_tensors(self, tensors: list[Any]) -> list[Any]:
        if not tensors:
            return []
        self.traffic.add("dense", sum(int(np.prod(t.shape)) * 4 for t in tensors)
                         * (self.size - 1))
        t0 = time.perf_counter()
        out = list(self._hvd.grouped_allreduce(list(tensors), op=self._hvd.Sum))
        self.traffic.waited("dense", time.perf_counter() - t0)
        return out

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        n = np.array([len(data) if self.rank == root and data is not None else 0], np.int64)
        n = np.asarray(self._hvd.broadcast(self._tensor(n), root_rank=root))
        payload = (np.frombuffer(data, np.uint8) if self.rank == root and data is not None
                   else np.zeros(int(n[0]), np.uint8))
        out = self._hvd.broadcast(self._tensor(payload), root_rank=root)
        return np.asarray(out).tobytes()

    def barrier(self) -> None:
        self._hvd.allreduce(self._tf.constant([0], self._tf.int64), op=self._hvd.Sum)

    def shutdown(self) -> None:
        self._hvd.shutdown()


class _NotRetracing(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning (see ``HorovodComm``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()
