"""Is the host's memory system in its fast or slow state? A probe for shared VMs.

Once per interval it times a pure-arithmetic loop (registers only) and independent random
4-byte reads from a 512 MB array (one thread, no prefetch). On a VM whose memory system is
shared with other tenants the random reads switch between states within seconds while the
arithmetic stays put; memory-bound code (the embedding engine) follows the reads.

    .venv/bin/python benchmarks/host_state.py [--seconds 90] [--interval 1.0] [--quiet]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from numba import njit


@njit(cache=True)
def _arithmetic(n: int) -> float:
    x = 1.0
    y = 0.5
    for _ in range(n):
        x = x * 1.0000001 + y
        y = y * 0.9999999 + 1e-9
    return x + y


@njit(cache=True)
def _random_reads(a: np.ndarray, idx: np.ndarray) -> float:
    s = 0.0
    for i in range(idx.shape[0]):
        s += a[idx[i]]
    return s


def _quantiles(xs: list[float]) -> str:
    q = np.percentile(xs, [10, 50, 90])
    return f"p10 {q[0]:.1f}  median {q[1]:.1f}  p90 {q[2]:.1f}  (min {min(xs):.1f}, max {max(xs):.1f})"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--quiet", action="store_true", help="print only the summary")
    args = ap.parse_args(argv)
    a = np.ones(128 * 2**20, dtype=np.float32)  # 512 MB
    idx = np.random.default_rng(0).integers(0, a.shape[0], 2_000_000)
    _arithmetic(10)
    _random_reads(a, idx)
    arith_ms: list[float] = []
    read_ns: list[float] = []
    start = time.time()
    if not args.quiet:
        print("    s  arithmetic ms  random read ns/access")
    while time.time() - start < args.seconds:
        t0 = time.perf_counter()
        _arithmetic(20_000_000)
        t1 = time.perf_counter()
        _random_reads(a, idx)
        t2 = time.perf_counter()
        arith_ms.append((t1 - t0) * 1e3)
        read_ns.append((t2 - t1) / idx.shape[0] * 1e9)
        if not args.quiet:
            print(f"{time.time() - start:5.1f}  {arith_ms[-1]:13.1f}  {read_ns[-1]:21.1f}")
        time.sleep(args.interval)
    print(f"samples: {len(arith_ms)}")
    print(f"arithmetic ms:       {_quantiles(arith_ms)}")
    print(f"random read ns:      {_quantiles(read_ns)}")
    spread = statistics.pstdev(arith_ms) / statistics.mean(arith_ms)
    print(f"arithmetic relative spread {spread:.1%}; "
          f"random reads p90/p10 {np.percentile(read_ns, 90) / np.percentile(read_ns, 10):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
