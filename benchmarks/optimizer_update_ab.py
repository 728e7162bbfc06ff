"""CPU process time of one engine ``backward_update`` (deduplication, summation and the fused
sparse optimizer), to compare two checkouts of the kernels on the same batches.

Usage (one process per checkout and optimizer; alternate them, the machine is shared)::

    NUMBA_NUM_THREADS=1 PYTHONPATH=<checkout> python benchmarks/optimizer_update_ab.py adagrad

Tables ``t`` (2M × 16) and ``u`` (200k × 32); features: ``t`` one-hot, ``t`` 8-hot, ``u``
4-hot mean; batch 65536; power-law ids (``rows · U^4``); 12 steps, the median of the last
10 printed in ms of process time (less sensitive than wall time to other processes).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from embtrain.embedding import (
    EmbeddingEngine,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)

BATCH = 65536


def main(opt: str) -> float:
    tables = [TableConfig("t", 2_000_000, 16), TableConfig("u", 200_000, 32)]
    feats = [FeatureConfig("a", "t", "sum", 1), FeatureConfig("b", "t", "sum", 8),
             FeatureConfig("c", "u", "mean", 4)]
    eng = EmbeddingEngine(tables, feats, SparseOptimizerConfig(opt, lr=0.01), seed=0)
    rng = np.random.default_rng(0)

    def bags(rows: int, hot: int) -> SparseInput:
        keys = (rows * rng.random(BATCH * hot) ** 4).astype(np.int64)
        return SparseInput(keys, np.arange(0, BATCH * hot + 1, hot, dtype=np.int64), None,
                           bag_size=hot)

    times = []
    for step in range(12):
        inputs = {"a": bags(2_000_000, 1), "b": bags(2_000_000, 8), "c": bags(200_000, 4)}
        outs = eng.forward(inputs)
        grads = [np.full_like(o, 0.01) for o in outs]
        t0 = time.process_time()
        eng.backward_update(grads, step)
        times.append(time.process_time() - t0)
    return 1000 * float(np.median(times[2:]))


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "adagrad"
    print(f"{name} backward median ms {main(name):.2f}")
