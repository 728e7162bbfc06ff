"""Synthetic batches: power-law ids per input, random dense features and labels.

Batches are generated once, before anything is timed, written to a directory as ``.npy``
files and read back by both sides of the benchmark, so embtrain and the baseline train on
byte-identical batches (each side reports a digest of what it consumed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embtrain.bench.synthetic import InputSpec

# Ids below this bound are drawn from the exact discrete distribution; above it the tail is
# drawn by inverting the continuous density with the midpoint rule (relative error < 1e-9).
EXACT_HEAD = 1 << 16


def power_law_ids(rng: np.random.Generator, rows: int, alpha: float, size: int) -> np.ndarray:
    """``size`` ids in ``[0, rows)`` with ``P(k) ∝ (k + 1) ** -alpha`` (alpha 0: uniform)."""
    if rows <= 0:
        raise ValueError("rows must be positive")
    if alpha == 0:
        return rng.integers(0, rows, size=size, dtype=np.int64)
    head = min(rows, EXACT_HEAD)
    weights = np.arange(1, head + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(weights)
    head_mass = float(cdf[-1])
    tail_mass = 0.0
    if rows > head:
        lo, hi = head + 0.5, rows + 0.5
        tail_mass = _integral(lo, hi, alpha)
    total = head_mass + tail_mass
    u = rng.random(size) * total
    out = np.empty(size, dtype=np.int64)
    in_head = u < head_mass
    out[in_head] = np.searchsorted(cdf, u[in_head], side="right")
    if tail_mass > 0:
        v = (u[~in_head] - head_mass) / tail_mass
        x = _inverse(lo, hi, alpha, v)
        out[~in_head] = np.clip(np.floor(x + 0.5).astype(np.int64) - 1, head, rows - 1)
    np.minimum(out, rows - 1, out=out)
    return out


def _integral(lo: float, hi: float, alpha: float) -> float:
    """∫ x^-alpha dx over [lo, hi)."""
    if abs(alpha - 1.0) < 1e-12:
        return float(np.log(hi / lo))
    g = 1.0 - alpha
    return float((hi**g - lo**g) / g)


def _inverse(lo: float, hi: float, alpha: float, v: np.ndarray) -> np.ndarray:
    """Inverse CDF of the density ∝ x^-alpha on [lo, hi) at ``v`` in [0, 1)."""
    if abs(alpha - 1.0) < 1e-12:
        return lo * (hi / lo) ** v
    g = 1.0 - alpha
    return (lo**g + v * (hi**g - lo**g)) ** (1.0 / g)


class OnDisk:
    """A saved ``[count, ...]`` array read one batch at a time: ``a[k]`` maps the file, copies
    batch ``k`` and unmaps it, so the process holds the batches it uses, not all of them."""

    def __init__(self, path: Path):
        self.path = path
        mapped = np.load(path, mmap_mode="r")
        self.shape: tuple[int, ...] = tuple(mapped.shape)
        self.dtype = mapped.dtype
        del mapped

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array (on disk)."""
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __getitem__(self, k: int) -> np.ndarray:
        mapped = np.load(self.path, mmap_mode="r")
        out = np.array(mapped[k])
        del mapped  # unmapped: the file's pages leave this process
        return out


@dataclass
class Batches:
    """``count`` distinct batches: ids per input ``[count, batch, hotness]``, dense, labels."""

    ids: list[np.ndarray] | list[OnDisk]
    dense: np.ndarray | OnDisk
    labels: np.ndarray | OnDisk

    @property
    def count(self) -> int:
        """Number of distinct batches."""
        return int(self.dense.shape[0])

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return int(self.dense.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays."""
        return sum(a.nbytes for a in self.ids) + self.dense.nbytes + self.labels.nbytes

    def save(self, directory: Path) -> None:
        """One ``.npy`` per input plus dense and labels, and a small ``meta.json``."""
        directory.mkdir(parents=True, exist_ok=True)
        for i, ids in enumerate(self.ids):
            np.save(directory / f"ids_{i}.npy", ids)
        np.save(directory / "dense.npy", self.dense)
        np.save(directory / "labels.npy", self.labels)
        meta = {"inputs": len(self.ids), "count": self.count, "batch": self.batch_size}
        (directory / "meta.json").write_text(json.dumps(meta))

    @staticmethod
    def load(directory: Path, on_disk: bool = False) -> Batches:
        """Read what :meth:`save` wrote, fully into memory (no page faults while timing), or
        with ``on_disk`` a batch at a time when indexed (:class:`OnDisk`: a model whose tables
        do not fit in memory should not hold every batch either)."""
        meta = json.loads((directory / "meta.json").read_text())
        read = OnDisk if on_disk else np.load
        ids = [read(directory / f"ids_{i}.npy") for i in range(int(meta["inputs"]))]
        return Batches(
            ids=ids,  # type: ignore[arg-type]
            dense=read(directory / "dense.npy"),
            labels=read(directory / "labels.npy"),
        )


def generate(
    inputs: list[InputSpec], numerical: int, batch: int, count: int, alpha: float, seed: int = 0
) -> Batches:
    """``count`` batches of ``batch`` samples, reproducible from ``seed``."""
    ids = []
    for n, spec in enumerate(inputs):
        rng = np.random.default_rng([seed, 1, n])
        flat = power_law_ids(rng, spec.rows, alpha, count * batch * spec.hotness)
        ids.append(flat.reshape(count, batch, spec.hotness))
    rng = np.random.default_rng([seed, 2])
    dense = rng.standard_normal((count, batch, numerical), dtype=np.float32)
    labels = rng.integers(0, 2, size=(count, batch)).astype(np.float32)
    return Batches(ids=ids, dense=dense, labels=labels)
