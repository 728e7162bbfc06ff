"""The data-parallel replicas' update with and without the pooling pass, on DE tiny's replicas.

    NUMBA_NUM_THREADS=1 python benchmarks/dp_update_ab.py [--rounds 15]

Builds DE tiny's data-parallel tables as the 2-rank plan places them (one rank's replicas),
pools half of a 65536 batch of power-law ids, forms the row sums, then times
``DataParallelTables.apply_sums`` in interleaved rounds: ``before`` stages the touched rows
with the pooling forward (what the update did until issue 31), ``after`` with
``EmbeddingEngine.forward(pool=False)``. Prints the median ms of each (first 3 rounds dropped).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from embtrain.bench.synthetic import build_recipe, load_model
from embtrain.embedding import SparseInput
from embtrain.embedding.from_recipe import (
    feature_configs,
    sparse_optimizer_config,
    table_configs,
)
from embtrain.embedding.sharding.data_parallel import DataParallelTables
from embtrain.plan import Topology, make_plan

BATCH = 65536


def main() -> None:
    """Build, pool once, time the update both ways."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    recipe = build_recipe(load_model("tiny"), optimizer="adagrad", batch=BATCH, scale=1.0,
                          steps=10, seed=0)
    plan = make_plan(recipe, Topology(2, None, 2**36, 2**36), BATCH)
    names = {t.name for t in plan.tables if t.sharding == "data_parallel"}
    tables = [t for t in table_configs(recipe) if t.name in names]
    feats = [f for f in feature_configs(recipe) if f.table in names]
    dp = DataParallelTables(tables, feats, sparse_optimizer_config(recipe.optimizer.sparse), 0,
                            "cpu")
    rng = np.random.default_rng(0)
    batch = BATCH // 2
    rows = {t.name: t.rows for t in tables}
    inputs = {f.name: SparseInput.one_hot(
        np.minimum(rng.zipf(1.05, batch) - 1, rows[f.table] - 1).astype(np.int64))
        for f in feats}
    outs = dp.forward(inputs, batch)
    grads = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
    sums = dp.local_sums(grads, batch, dict(dp.engine.layout)) * 2  # as if summed over 2 ranks
    staged = dp.engine.forward

    def pooled(inp: dict, *a: object, pool: bool = True, **k: object) -> list:
        return staged(inp, *a, **k)  # type: ignore[arg-type]  # the pooling forward, as before

    times: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for side, fn in (("before", pooled), ("after", staged)):
            dp.engine.forward = fn  # type: ignore[method-assign]
            t0 = time.perf_counter()
            dp.apply_sums(sums.copy(), r)
            times[side].append(time.perf_counter() - t0)
    print(f"{len(tables)} replicas, {sum(rows.values())} rows, {batch} samples")
    for side, v in times.items():
        print(f"{side}: {float(np.median(v[3:])) * 1000:.2f} ms (median)")


if __name__ == "__main__":
    main()
