"""Latency and bandwidth of the collectives embtrain uses, over Horovod (Gloo here).

    horovodrun -np 2 -H localhost:2 python benchmarks/gloo_collectives.py [--reps 15]

Times ``alltoallv`` and ``allreduce_sum`` of :class:`embtrain.comm.horovod.HorovodComm` (the
communicator the job uses) at message sizes from 8 B to 64 MiB per rank: each size ``reps``
times after a barrier, the median. Rank 0 prints one JSON document: the medians and, per
collective, a least-squares fit ``t = alpha + bytes / beta`` over the sizes (alpha: the
per-call latency, beta: bytes per second a rank sends). On one machine over loopback this is
Gloo's software cost and memory copies, not a network's: docs/SCALING.md uses alpha as the
per-call software overhead and takes wire figures from the network's specification.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from embtrain.comm.horovod import HorovodComm

SIZES = [8, 1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24, 1 << 26]


def _fit(points: list[tuple[int, float]]) -> dict[str, float | None]:
    """``t = alpha + bytes / beta``: alpha the fastest call of at most 16 KiB, beta from the
    two largest sizes (a least-squares fit is ruled by the largest sizes and gave negative
    latencies)."""
    alpha = min(t for size, t in points if size <= 1 << 14)
    (s1, t1), (s2, t2) = points[-2], points[-1]
    return {"alpha_us": alpha * 1e6, "beta_gb_s": (s2 - s1) / (t2 - t1) / 1e9 if t2 > t1 else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    comm = HorovodComm()
    n = comm.size
    out: dict[str, object] = {"ranks": n, "reps": args.reps, "sizes": SIZES}
    for name in ("alltoallv", "allreduce_sum"):
        medians = []
        for size in SIZES:
            if name == "alltoallv":  # ``size`` bytes to every other rank
                send = np.ones(size * n, dtype=np.uint8)
                counts = [size] * n

                def call(send=send, counts=counts) -> None:
                    comm.alltoallv(send, counts)
            else:  # ``size`` bytes of float32 summed over the ranks
                arr = np.ones(max(1, size // 4), dtype=np.float32)

                def call(arr=arr) -> None:
                    comm.allreduce_sum(arr)
            call()  # warm
            times = []
            for _ in range(args.reps):
                comm.barrier()
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            medians.append(statistics.median(times))
        out[name] = {"median_s": medians, **_fit(list(zip(SIZES, medians, strict=True)))}
        out[name]["small_message_us"] = medians[0] * 1e6  # type: ignore[index]
    if comm.rank == 0:
        print(json.dumps(out))
    comm.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
