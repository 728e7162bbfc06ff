"""Byte messages for the collectives: arrays packed back to back, and quantized vectors.

A message is the raw bytes of its arrays, each padded to a multiple of 8 bytes so that every
array can be read back in place (``np.frombuffer``) with its natural alignment. The reader
knows the order and the shapes; nothing self-describing travels but small int64 headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from embtrain.comm.halves import from_bfloat16, from_half, to_bfloat16, to_half

Quantize = Literal["none", "fp16", "int8"]  # the recipe's distributed.comm.quantize
# how one block of vectors travels: a quantization, or a half table's own dtype
Codec = Literal["none", "fp16", "int8", "bf16"]


def padded(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 8."""
    return (int(nbytes) + 7) & ~7


def packed_size(arrays: Sequence[Any]) -> int:
    """Bytes :func:`pack_into` writes for ``arrays``."""
    return sum(padded(a.nbytes) for a in arrays)


def pack_into(out: np.ndarray, at: int, arrays: Sequence[Any]) -> int:
    """Write ``arrays`` into the uint8 buffer ``out`` from byte ``at``; returns the end.

    ``out`` must be 8-byte aligned at ``at`` (every message starts aligned and each array is
    padded to 8 bytes), so each array is viewed in place with its own dtype."""
    for a in arrays:
        n = a.nbytes
        if n:  # one (strided, converting) copy straight into the message
            dest = out[at:at + n].view(a.dtype).reshape(a.shape)
            if isinstance(a, Cast) and a.bfloat16:
                to_bfloat16(a.source, dest)
            elif isinstance(a, Cast) and a.dtype == np.float16:
                to_half(a.source, dest)
            elif isinstance(a, Cast):
                dest[...] = a.source
            else:
                dest[...] = a
        end = at + padded(n)
        if end > at + n:
            out[at + n:end] = 0
        at = end
    return at


def pack(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``arrays`` as one uint8 message."""
    out = np.empty(packed_size(arrays), dtype=np.uint8)
    pack_into(out, 0, arrays)
    return out


class MessageBuffer:
    """A grow-only, 64-byte aligned send buffer reused by every exchange of one purpose (a
    fresh multi-megabyte buffer per step costs page faults), and the one copy into it."""

    def __init__(self) -> None:
        self._raw = np.empty(0, dtype=np.uint8)

    def pack(self, per_dest: Sequence[Sequence[Any]]) -> tuple[np.ndarray, list[int]]:
        """One message per destination rank, back to back; returns the bytes and the counts."""
        counts = [packed_size(arrays) for arrays in per_dest]
        total = sum(counts)
        if self._raw.shape[0] < total + 64:
            self._raw = np.empty(int(total * 1.25) + 64, dtype=np.uint8)
        start = -self._raw.ctypes.data % 64
        out = self._raw[start:start + total]
        at = 0
        for arrays in per_dest:
            at = pack_into(out, at, arrays)
        return out, counts


class Cursor:
    """Reads arrays back from a uint8 message in the order they were packed."""

    def __init__(self, buf: np.ndarray, at: int = 0):
        self.buf = buf
        self.at = at

    def take(self, dtype: np.dtype | type, count: int) -> np.ndarray:
        """The next ``count`` elements of ``dtype`` (a read-only view when aligned)."""
        dtype = np.dtype(dtype)
        n = dtype.itemsize * int(count)
        raw = self.buf[self.at:self.at + n]
        if raw.shape[0] != n:
            raise ValueError(f"message ends after {raw.shape[0]} of {n} bytes")
        self.at += padded(n)
        if raw.ctypes.data % dtype.alignment:
            raw = raw.copy()
        return raw.view(dtype)


def vector_bytes(rows: int, width: int, quantize: Codec) -> int:
    """Bytes of ``rows`` float32 vectors of ``width`` on the wire (padded)."""
    if quantize in ("fp16", "bf16"):
        return padded(rows * width * 2)
    if quantize == "int8":
        return padded(rows * width) + padded(rows * 4)
    return padded(rows * width * 4)


class Cast:
    """``source`` to be packed as ``dtype``: the conversion happens in the one copy into the
    message (see :func:`pack_into`), not in a separate pass."""

    def __init__(self, source: np.ndarray, dtype: type, bfloat16: bool = False):
        self.source = source
        self.bfloat16 = bool(bfloat16)  # dtype uint16: bfloat16 bit patterns
        self.dtype = np.dtype(np.uint16 if bfloat16 else dtype)
        self.shape = source.shape
        self.nbytes = int(source.size) * self.dtype.itemsize


def encode_vectors(x: np.ndarray, quantize: Codec) -> list[Any]:
    """``x`` ([rows, width] float32) as the arrays that travel: as is, fp16, bfloat16 (bit
    patterns, round to nearest even), or int8 with one float32 scale per row
    (``max |x| / 127``, as OneEmbedding quantizes)."""
    if quantize == "bf16":
        return [Cast(np.asarray(x, dtype=np.float32), np.uint16, bfloat16=True)]
    if quantize == "fp16":
        return [Cast(np.asarray(x, dtype=np.float32), np.float16)]
    if quantize == "int8":
        x = np.asarray(x, dtype=np.float32)
        amax = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
        scale = (amax / np.float32(127)).astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1))
        q = np.rint(x / safe[:, None]).clip(-127, 127).astype(np.int8)
        return [q, scale]
    return [np.asarray(x, dtype=np.float32)]  # packed as it is (a view is copied once)


def decode_vectors(cur: Cursor, rows: int, width: int, quantize: Codec) -> np.ndarray:
    """The ``[rows, width]`` float32 vectors :func:`encode_vectors` wrote (a view of the
    message for fp32)."""
    if quantize == "bf16":
        return from_bfloat16(cur.take(np.uint16, rows * width).reshape(rows, width))
    if quantize == "fp16":
        return from_half(cur.take(np.float16, rows * width).reshape(rows, width))
    if quantize == "int8":
        q = cur.take(np.int8, rows * width).reshape(rows, width)
        scale = cur.take(np.float32, rows)
        return q.astype(np.float32) * scale[:, None]
    return cur.take(np.float32, rows * width).reshape(rows, width)


def exchange_codec(table_dtype: str, quantize: Quantize, gradient: bool,
                   partial_sums: bool = False, mixed_precision: str = "none") -> Codec:
    """How one table's vectors travel between ranks.

    A quantization the recipe asks for (``distributed.comm.quantize``) applies to every table
    (lossy: N ranks then differ from one). Otherwise a half table's vectors travel in its dtype
    when the dense network computes in that dtype (``train.mixed_precision`` ``bf16`` for a
    ``bfloat16`` table, ``fp16`` for a ``float16`` one): the network rounds the pooled vectors
    to that dtype on entry anyway (to nearest even, as the wire does), and the gradients it
    returns are values of it, so the narrower wire loses nothing and N ranks still equal one
    bit for bit. Three cases travel as float32: float32 tables or a network of another dtype;
    partial sums (a row-sharded table's owners each pool a part, and the sender scales its
    gradient for ``mean``/``sqrtn``), which are not values of the dtype; and a float16 table's
    gradients, which under the loss scale are divided back and may fall below float16's range.
    """
    if quantize != "none":
        return quantize
    if partial_sums:
        return "none"
    if table_dtype == "bfloat16" and mixed_precision == "bf16":
        return "bf16"
    if table_dtype == "float16" and mixed_precision == "fp16" and not gradient:
        return "fp16"
    return "none"
