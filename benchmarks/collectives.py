"""Latency and bandwidth of the collectives embtrain uses, per transport.

    python benchmarks/collectives.py --np 2 --transport shared_memory [--reps 15]
    python benchmarks/collectives.py --np 2 --transport horovod
    horovodrun -np 2 -H localhost:2 python benchmarks/collectives.py   # Horovod, as started

With ``--np`` the script starts its ranks through embtrain's launcher (as ``embtrain run --np``
does, with ``distributed.comm.transport`` set to ``--transport``); started as a rank, it times
the communicator the job would use (:func:`embtrain.comm.make_comm`):
``alltoallv`` and ``allreduce_sum`` at message sizes from 8 B to 64 MiB per rank: each size ``reps``
times after a barrier, the median. Rank 0 prints one JSON document: the medians and, per
collective, a least-squares fit ``t = alpha + bytes / beta`` over the sizes (alpha: the
per-call latency, beta: bytes per second a rank sends). On one machine over loopback Horovod's
figures are Gloo's software cost and memory copies, not a network's: docs/SCALING.md uses alpha
as the per-call software overhead and takes wire figures from the network's specification.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from embtrain.comm import launched_rank, make_comm
from embtrain.comm.launch import LaunchSpec, launch

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
    ap.add_argument("--np", type=int, default=None, help="start this many ranks here")
    ap.add_argument("--transport", choices=["auto", "shared_memory", "horovod"], default="auto")
    args = ap.parse_args()
    if launched_rank() is None:
        if not args.np or args.np < 2:
            ap.error("give --np N (N >= 2), or start it as a rank (horovodrun)")
        return launch([sys.executable, __file__, "--reps", str(args.reps)],
                      LaunchSpec(args.np, transport=args.transport))
    comm = make_comm()
    n = comm.size
    out: dict[str, object] = {"ranks": n, "transport": comm.transport, "reps": args.reps,
                              "sizes": SIZES}
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
