"""The ids ``embtrain gen-data`` writes and the hashed random values behind them: the
encodings of logical ids (``dense``, ``int64``: splitmix64 of ``k ^ hash(table)``, ``uint63``:
its 63-bit form) and their inverses, and uniform / normal values drawn from a hash of a key
(:mod:`embtrain.kernels.array_hashing`)."""

from __future__ import annotations

import numpy as np

from embtrain.data.kernels import hash_strings
from embtrain.kernels.array_hashing import (
    MASK63,
    finalize63,
    finalize64,
    unfinalize63,
    unfinalize64,
)

ENCODINGS: tuple[str, ...] = ("dense", "int64", "uint63")


def encode_ids(k: np.ndarray, table: str, encoding: str) -> np.ndarray:
    """The int64 ids written for logical ids ``k`` of ``table`` (see the module docstring)."""
    key = name_key(table)
    if encoding == "int64":
        return finalize64(k.astype(np.uint64) ^ key).view(np.int64)
    if encoding == "uint63":
        return finalize63(k.astype(np.uint64) ^ (key & MASK63)).view(np.int64)
    if encoding == "dense":
        return np.asarray(k, dtype=np.int64)
    raise ValueError(f"unknown id encoding {encoding!r}")


def logical_ids(ids: np.ndarray, table: str, encoding: str) -> np.ndarray:
    """Inverse of :func:`encode_ids`: the logical ids (``0..space-1``) behind written ids."""
    key = name_key(table)
    raw = np.asarray(ids, dtype=np.int64).view(np.uint64)
    if encoding == "int64":
        return (unfinalize64(raw) ^ key).view(np.int64)
    if encoding == "uint63":
        if (raw > MASK63).any():
            raise ValueError("uint63 ids are never negative")
        return (unfinalize63(raw) ^ (key & MASK63)).view(np.int64)
    if encoding == "dense":
        return np.asarray(ids, dtype=np.int64).copy()
    raise ValueError(f"unknown id encoding {encoding!r}")


def name_key(name: str) -> np.uint64:
    return np.uint64(hash_strings([name]).view(np.uint64)[0])


def hashed_uniform(keys: np.ndarray, stream: int) -> np.ndarray:
    """A uniform (0, 1) float64 per uint64 key, independent across ``stream``."""
    salt = np.uint64((0x9E3779B97F4A7C15 * (stream + 1)) & 0xFFFFFFFFFFFFFFFF)
    h = finalize64(keys + salt)
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))


def hashed_normal(keys: np.ndarray, stream: int) -> np.ndarray:
    """A standard normal per key (Box–Muller on two hashed uniforms)."""
    u1, u2 = hashed_uniform(keys, 2 * stream), hashed_uniform(keys, 2 * stream + 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


