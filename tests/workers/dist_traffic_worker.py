"""One rank of the plan-vs-wire traffic test (started by tests/test_sharding.py).

Every rank plans the same recipe (table, column and data-parallel tables; one-hot, fixed
multi-hot and concat features) for the world size it runs in, builds a
:class:`ShardedEmbedding` from the plan's placements, runs one forward and backward on a
global batch of ``BATCH`` samples, and writes ``OUT/rank-R.json``: the bytes it sent per
purpose (``ids``, ``forward``, ``backward``, ``dp``) and the plan's traffic, per rank and
in total.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from embtrain.comm import make_comm
from embtrain.embedding import FeatureConfig, SparseInput, SparseOptimizerConfig, TableConfig
from embtrain.embedding.sharded import ShardedEmbedding, placements_from_plan
from embtrain.plan import Topology, make_plan
from embtrain.recipe.loader import parse_recipe_text

BATCH = 32  # 16 samples per rank at 2 ranks: every pooled block is 64-byte aligned

RECIPE = """
version: 1
name: wire
data: {train: none/*.parquet, label: label, batch_size: 32}
features:
  - {kind: categorical, name: a, column: a, table: whole}
  - {kind: categorical, name: b, column: b, table: whole, hotness: 3, combiner: mean}
  - {kind: categorical, name: c, column: c, table: cols, hotness: 2, combiner: concat}
  - {kind: categorical, name: d, column: d, table: cols}
  - {kind: categorical, name: e, column: e, table: rep, hotness: 2}
tables:
  - {name: whole, dim: 8, rows: 100, sharding: table}
  - {name: cols, dim: 6, rows: 50, sharding: column}
  - {name: rep, dim: 4, rows: 30, sharding: data_parallel}
optimizer: {sparse: {type: adagrad, lr: 0.05}, dense: {type: adam, lr: 0.001}}
model: {type: mlp, hidden: [8, 1]}
train: {steps: 1}
"""


def main() -> int:
    out = Path(sys.argv[1])
    comm = make_comm()
    world, rank = comm.size, comm.rank
    recipe = parse_recipe_text(RECIPE, "wire.yaml")
    plan = make_plan(recipe, Topology(world, None, 2**34, 2**34), BATCH)
    tables = [TableConfig(t.name, t.rows, t.dim) for t in recipe.tables]
    rows = {t.name: t.rows for t in recipe.tables}
    features = [FeatureConfig(f.name, f.table, f.combiner, int(f.hotness))
                for f in recipe.categorical_features]
    emb = ShardedEmbedding(tables, features, SparseOptimizerConfig(kind="adagrad", lr=0.05),
                           seed=3, placements=placements_from_plan(plan), comm=comm)
    rng = np.random.default_rng(7)
    lo, hi = rank * BATCH // world, (rank + 1) * BATCH // world
    inputs = {}
    for f in features:
        keys = rng.integers(0, rows[f.table], (BATCH, int(f.hotness or 1)))[lo:hi]
        inputs[f.name] = (SparseInput.one_hot(keys[:, 0]) if f.hotness == 1
                          else SparseInput.fixed_hotness(keys))
    comm.traffic.reset()
    pooled = emb.forward(inputs, BATCH, step=0)
    emb.backward_update([rng.standard_normal(p.shape).astype(np.float32) for p in pooled], 0)
    mine = plan.ranks[rank]
    (out / f"rank-{rank}.json").write_text(json.dumps({
        "sent": dict(comm.traffic.sent),
        "plan_rank": {"ids": mine.ids_bytes, "forward": mine.forward_bytes,
                      "backward": mine.backward_bytes, "dp": mine.allreduce_bytes},
        "plan_total": {"ids": plan.traffic.ids_bytes, "forward": plan.traffic.forward_bytes,
                       "backward": plan.traffic.backward_bytes,
                       "dp": plan.traffic.allreduce_bytes},
        "modes": {t.name: t.sharding for t in plan.tables},
    }))
    comm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
