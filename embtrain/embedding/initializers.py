"""Counter-based table initialisation: a value depends only on (seed, table name, row, column).

The recipe, for a table called ``name`` and the engine seed ``seed``::

    mix64(z)   = splitmix64 output of state z: z += 0x9E3779B97F4A7C15, then
                 z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB;
                 z ^ z>>31                                   (all arithmetic mod 2^64)
    name_hash  = first 8 bytes of blake2b(name UTF-8), little-endian
    base       = mix64(mix64(seed mod 2^64) ^ name_hash)
    row_hash   = mix64(base ^ mix64(row))
    bits(c, j) = mix64(row_hash ^ mix64(c << 8 | j))          column c, stream j < 256
    unit(x)    = (x >> 11) * 2^-53                            in [0, 1)

``uniform``: ``scale * (2 unit(bits(c, 0)) - 1)``. ``normal``: Box-Muller
``sqrt(-2 ln u1) cos(2π u2)`` with ``u1 = ((bits(c, 0) >> 11) + 1) 2^-53``,
``u2 = unit(bits(c, 1))``, times ``std``; ``truncated_normal`` redraws with streams
``(2a, 2a+1)`` for attempt ``a`` until ``|z| <= 2``. Computed in float64, stored as float32.

So a row's initial value never depends on grouping, sharding or which process holds it, and
:func:`initial_rows` reproduces any subset of a table exactly.
"""

from __future__ import annotations

import hashlib

import numpy as np

from embtrain.embedding.config import InitializerConfig, TableConfig
from embtrain.kernels import get_backend
from embtrain.kernels.codes import (
    INIT_CONSTANT,
    INIT_NORMAL,
    INIT_TRUNCATED_NORMAL,
    INIT_UNIFORM,
    INIT_ZEROS,
)
from embtrain.kernels.rules.hashing import mix64_int

_MASK = (1 << 64) - 1

_KIND_CODES = {
    "zeros": INIT_ZEROS,
    "constant": INIT_CONSTANT,
    "uniform": INIT_UNIFORM,
    "normal": INIT_NORMAL,
    "truncated_normal": INIT_TRUNCATED_NORMAL,
}


def mix64(z: int) -> int:
    """splitmix64 output function of a Python integer (for per-table constants; the rule is
    :func:`embtrain.kernels.rules.hashing.mix64`, shared with the kernels)."""
    return mix64_int(z)


def name_hash(name: str) -> int:
    """Stable 64-bit hash of a table name: first 8 bytes of blake2b, little-endian."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


def table_base(seed: int, name: str) -> np.uint64:
    """Per-table hash base mixing the seed and the table name."""
    return np.uint64(mix64(mix64(seed & _MASK) ^ name_hash(name)))


def initializer_code(init: InitializerConfig) -> tuple[int, float]:
    """Kernel code and parameter (scale, std or value) of an initializer."""
    kind = _KIND_CODES[init.kind]
    if init.kind == "uniform":
        return kind, float(init.scale)
    if init.kind in ("normal", "truncated_normal"):
        return kind, float(init.std)
    if init.kind == "constant":
        return kind, float(init.value)
    return kind, 0.0


def initial_rows(
    table: TableConfig, seed: int, rows: np.ndarray, backend: str = "cpu"
) -> np.ndarray:
    """Initial values ``[len(rows), dim]`` of the given rows of ``table``; equal to the full init."""
    be = get_backend(backend)
    rows = be.xp.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
    out = be.xp.empty((rows.shape[0], table.dim), dtype=np.float32)
    kind, param = initializer_code(table.initializer)
    be.init_rows(out, rows, table_base(seed, table.name), kind, param)
    return out
