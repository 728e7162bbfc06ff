"""Median milliseconds of one `Trainer.step` on the CPU device (issue 32's check that the CPU
path is not slower): 8 tables x 100k rows x dim 16, one key per feature, batch 4096, DLRM,
Adagrad; 5 warm-up steps, then the median of 40. Prints one JSON line.

A/B against another checkout (this file run with each tree's package first on the path),
rounds interleaved (the machine is noisy):
    for i in 1 2 3; do for tree in /path/to/other $PWD; do
        PYTHONPATH=$tree python benchmarks/cpu_step.py; done; done
"""

from __future__ import annotations

import json
import time

import numpy as np

from embtrain.data.batch import Batch
from embtrain.embedding.config import SparseInput
from embtrain.plan import Topology, make_plan
from embtrain.recipe import parse_recipe_text
from embtrain.train.builder import build_trainer
from embtrain.train.job import configure_tensorflow

BATCH, TABLES, ROWS = 4096, 8, 100_000
FEATURES = "\n".join(f"  - {{kind: categorical, name: f{i}, column: c{i}, table: t{i}}}"
                     for i in range(TABLES))
TABLE_LINES = "\n".join(f"  - {{name: t{i}, dim: 16, rows: {ROWS}}}" for i in range(TABLES))
RECIPE = f"""
version: 1
data: {{train: unused/*.parquet, batch_size: {BATCH}}}
features:
  - {{kind: dense, name: num, columns: [a, b, c, d]}}
{FEATURES}
tables:
{TABLE_LINES}
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: dlrm, bottom: [64, 16], top: [64, 1]}}
train: {{steps: 10, seed: 1}}
"""


def main() -> None:
    recipe = parse_recipe_text(RECIPE)
    configure_tensorflow(1)
    trainer = build_trainer(recipe, make_plan(recipe, Topology(1, None, 64 << 30, 1 << 40)))
    rng = np.random.default_rng(0)

    def batch() -> Batch:
        sparse = {f"f{i}": SparseInput.fixed_hotness(rng.integers(0, ROWS, (BATCH, 1)))
                  for i in range(TABLES)}
        return Batch(dense=rng.standard_normal((BATCH, 4)).astype(np.float32),
                     label=(rng.random(BATCH) < 0.3).astype(np.float32), sparse=sparse,
                     size=BATCH)

    batches = [batch() for _ in range(5)]
    for i in range(5):
        trainer.step(batches[i], i)
    times = []
    for i in range(40):
        t0 = time.perf_counter()
        trainer.step(batches[i % 5], i + 5)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"median_ms": 1000 * float(np.median(times))}))


if __name__ == "__main__":
    main()
