"""Split the CPU engine's backward kernel into its two halves on DE tiny's tables.

    PYTHONPATH=<checkout> python benchmarks/backward_split.py [bench_engine flags, e.g.
        --steps 16 --warmup 2 --dtype bfloat16]

``kernels/cpu_update.py: backward_update`` does, per group, (1) the scatter: every key's row numbered
in ``row_map`` and its gradient added into the row's ``acc`` row, and (2) the optimizer loop over
the unique rows. This script compiles a copy of the kernel without (2) and runs
:mod:`embtrain.embedding.bench_engine` with each group's backward calls alternating between the
full kernel and the copy (even calls full, odd calls scatter only; the scatter-only steps leave
the tables unchanged, which does not change what later steps touch). It prints, per group
(dim, rows), the median full and scatter-only milliseconds after the first two calls of each,
and their difference: the optimizer loop's time.
"""

from __future__ import annotations

import inspect
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import embtrain.kernels.cpu as cpu
import embtrain.kernels.cpu_update as cpu_update
from embtrain.embedding import bench_engine


def _scatter_only() -> Any:
    src = inspect.getsource(cpu_update.backward_update.py_func)
    cut = src.index("        for wi in range(i0, i1):\n            us = item_start[wi]")
    src = (src[:cut] + "        pass\n").replace("def backward_update(", "def scatter_only(")
    namespace = dict(vars(cpu_update))
    exec(src.replace("cache=True", "cache=False"), namespace)  # our own kernel, one loop less
    return namespace["scatter_only"]


def main() -> None:
    full, scatter = cpu.backward_update, _scatter_only()
    times: dict[tuple[tuple[int, int], str], list[float]] = defaultdict(list)
    calls: dict[tuple[int, int], int] = defaultdict(int)

    def timed(*args: Any) -> None:
        values = args[25]  # backward_update's `values`: one group's table rows
        group = (int(values.shape[1]), int(values.shape[0]))
        kind = "full" if calls[group] % 2 == 0 else "scatter"
        calls[group] += 1
        start = time.perf_counter()
        (full if kind == "full" else scatter)(*args)
        times[(group, kind)].append((time.perf_counter() - start) * 1e3)

    cpu.backward_update = timed
    bench_engine.main(sys.argv[1:])
    for group in sorted({g for g, _ in times}):
        f = statistics.median(times[(group, "full")][2:])
        s = statistics.median(times[(group, "scatter")][2:])
        print(f"group dim {group[0]}, {group[1]:,} rows: full {f:.1f} ms, scatter only "
              f"{s:.1f} ms, optimizer loop ~{f - s:.1f} ms")


if __name__ == "__main__":
    main()
