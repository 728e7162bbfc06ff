"""The raw disk, measured the way the disk tier uses it: what ``bench`` compares the tier to.

Random 4 KiB direct reads per second at 1, 4 and 16 requests in flight (threads each issuing
one ``pread`` at a time, :class:`~embtrain.storage.aligned.IOPool`, the tier's own reader),
and the sequential direct write rate, on a scratch file under the given directory that is
removed afterwards.

    python -m embtrain.storage.diskbench /work --size 2GiB --seconds 3
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embtrain.storage.aligned import BLOCK, IOPool, aligned_blocks, open_direct

WRITE_CHUNK = 8 << 20  # bytes per sequential write


@dataclass
class DiskRates:
    """Measured rates of a directory's file system."""

    path: str
    file_bytes: int
    direct: bool
    sequential_write_bytes_per_s: float
    random_reads_per_s: dict[int, float] = field(default_factory=dict)  # by requests in flight

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready mapping."""
        return {"path": self.path, "file_bytes": self.file_bytes, "direct": self.direct,
                "sequential_write_bytes_per_s": self.sequential_write_bytes_per_s,
                "random_4k_reads_per_s": {str(k): v for k, v in
                                          self.random_reads_per_s.items()}}


def measure_disk(directory: str | Path, size: int = 2 << 30, depths: tuple[int, ...] = (1, 4, 16),
                 seconds: float = 3.0, seed: int = 0) -> DiskRates:
    """Write a scratch file of ``size`` bytes sequentially, then read random 4 KiB blocks of it
    for about ``seconds`` at each number of requests in flight in ``depths``."""
    directory = Path(directory)
    path = directory / f".embtrain-diskbench-{os.getpid()}"
    size = max(BLOCK, size // WRITE_CHUNK * WRITE_CHUNK or BLOCK)
    fd, direct = open_direct(str(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        rng = np.random.default_rng(seed)
        chunk = min(size, WRITE_CHUNK)
        buf = aligned_blocks(chunk // BLOCK)
        buf[:] = rng.integers(0, 256, buf.shape, dtype=np.uint8)  # incompressible
        view = memoryview(buf.reshape(-1))
        t0 = time.perf_counter()
        for off in range(0, size, chunk):
            if os.pwritev(fd, [view], off) != chunk:
                raise OSError(28, f"{path}: short write")
        os.fsync(fd)
        write_rate = size / (time.perf_counter() - t0)
        if not direct:
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
        blocks = size // BLOCK
        rates: dict[int, float] = {}
        for depth in depths:
            pool = IOPool(fd, 0, depth=depth, direct=direct, max_run=1)
            try:
                batch = 256 * depth
                out = aligned_blocks(batch)
                done = 0
                t0 = time.perf_counter()
                while True:
                    ids = np.unique(rng.integers(0, blocks, batch))
                    pool.read(ids, out)
                    done += int(ids.shape[0])
                    elapsed = time.perf_counter() - t0
                    if elapsed >= seconds:
                        break
                rates[depth] = done / elapsed
            finally:
                pool.close()
        return DiskRates(str(directory), size, direct, write_rate, rates)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    """Command line: print the rates of a directory as JSON."""
    from embtrain.recipe.units import parse_bytes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--size", default="2GiB")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--depths", default="1,4,16")
    args = p.parse_args(argv)
    rates = measure_disk(args.directory, parse_bytes(args.size),
                         tuple(int(d) for d in args.depths.split(",")), args.seconds)
    print(json.dumps(rates.to_dict(), indent=2))


if __name__ == "__main__":
    main()
