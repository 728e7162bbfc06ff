"""One rank of the pipelined-equals-unpipelined test (started by tests/test_pipeline.py).

Every rank builds the same small model twice through the one training step
(:func:`embtrain.train.builder.build_trainer`): once with the pipeline off and once on (the
next batch's ids exchanged on the communication thread while a step computes). Both train
the same batches, whose keys come from a few rows so that consecutive batches read rows the
step before updated; then the rank writes ``OUT/rank-R.json``: every step's loss and a
digest of every table (values and optimizer slots, gathered whole on rank 0) and of the
dense weights, per side, and the collectives each side ran per step. First, two threads run
all-to-alls of two purposes at once (as the pipeline's thread and the training thread do),
each checking what it received.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from embtrain.comm import make_comm
from embtrain.data.batch import Batch
from embtrain.embedding import SparseInput
from embtrain.plan import Topology, make_plan
from embtrain.recipe.loader import parse_recipe_text
from embtrain.train.builder import build_trainer
from embtrain.train.job import configure_tensorflow
from embtrain.train.pipeline import StepPipeline

BATCH = 32
STEPS = 6

RECIPE = """
version: 1
name: pipe
data: {train: none/*.parquet, label: label, batch_size: 32}
features:
  - {kind: dense, name: num, columns: [x1, x2]}
  - {kind: categorical, name: a, column: a, table: whole}
  - {kind: categorical, name: b, column: b, table: rows, hotness: variable, combiner: mean}
  - {kind: categorical, name: c, column: c, table: cols, hotness: 2, combiner: concat}
  - {kind: categorical, name: e, column: e, table: rep, hotness: 2}
tables:
  - {name: whole, dim: 8, rows: 40, sharding: table}
  - {name: rows, dim: 4, rows: 30, sharding: row}
  - {name: cols, dim: 6, rows: 20, sharding: column}
  - {name: rep, dim: 4, rows: 10, sharding: data_parallel}
optimizer: {sparse: {type: adagrad, lr: 0.3}, dense: {type: adam, lr: 0.01}}
model: {type: mlp, hidden: [8, 1]}
train: {steps: 6, seed: 5}
"""


def batches(rank: int, world: int) -> list[Batch]:
    """The same global batches on every rank; this rank's slice of each."""
    rng = np.random.default_rng(11)
    lo, hi = rank * BATCH // world, (rank + 1) * BATCH // world
    out = []
    for _ in range(STEPS + 1):
        lens = rng.integers(0, 4, BATCH)
        b_keys = rng.integers(0, 30, int(lens.sum()))
        offs = np.concatenate(([0], np.cumsum(lens)))
        sparse = {
            "a": SparseInput.one_hot(rng.integers(0, 40, BATCH)[lo:hi]),
            "b": SparseInput(b_keys[offs[lo]:offs[hi]], offs[lo:hi + 1] - offs[lo]),
            "c": SparseInput.fixed_hotness(rng.integers(0, 20, (BATCH, 2))[lo:hi]),
            "e": SparseInput.fixed_hotness(rng.integers(0, 10, (BATCH, 2))[lo:hi]),
        }
        dense = rng.standard_normal((BATCH, 2)).astype(np.float32)[lo:hi]
        label = (rng.random(BATCH) < 0.4).astype(np.float32)[lo:hi]
        out.append(Batch(hi - lo, np.ascontiguousarray(dense), label, sparse, BATCH))
    return out


def train(comm, recipe, plan, pipeline: bool) -> dict:  # type: ignore[no-untyped-def]
    configure_tensorflow(5)
    trainer = build_trainer(recipe, plan, comm)
    steps = StepPipeline(trainer, iter(batches(comm.rank, comm.size)), STEPS, overlap=pipeline)
    losses = []
    comm.traffic.reset()
    for s in range(STEPS):
        done = steps.step(s)
        assert done is not None
        losses.append(done[1])
    calls = sum(comm.traffic.calls.values()) / STEPS
    tables = {}
    for name in trainer.embedding.table_names:
        state = trainer.embedding.export_table(name)  # collective
        if state is not None:
            h = hashlib.sha256(np.ascontiguousarray(state.values).tobytes())
            for slot in sorted(state.slots):
                h.update(np.ascontiguousarray(state.slots[slot]).tobytes())
            tables[name] = h.hexdigest()
    dense = hashlib.sha256(b"".join(np.asarray(v).tobytes()
                                    for v in trainer.model.get_weights())).hexdigest()
    return {"losses": losses, "tables": tables, "dense": dense, "collectives_per_step": calls,
            "ahead_exchanges": comm.traffic.calls.get("ids.ahead", 0)}


def concurrent_alltoalls(comm, rounds: int = 30) -> list[str]:  # type: ignore[no-untyped-def]
    """All-to-alls of purpose ``ids.ahead`` on a thread while the caller runs ``backward``
    ones: each message names its sender, purpose and round; returns what arrived wrong."""
    from embtrain.embedding.sharding.pipeline import Background

    def exchange(purpose: str, tag: int) -> list[str]:
        wrong = []
        for k in range(rounds):
            counts = [8 * (1 + d + k % 3) for d in range(comm.size)]
            send = np.concatenate([np.full(c // 8, comm.rank * 1_000_000 + tag * 1000 + k,
                                           np.int64) for c in counts]).view(np.uint8)
            got, sizes = comm.alltoallv(send, counts, purpose)
            at = 0
            for src, n in enumerate(sizes.tolist()):
                vals = got[at:at + n].view(np.int64)
                at += n
                if n != 8 * (1 + comm.rank + k % 3) or set(vals.tolist()) != {
                        src * 1_000_000 + tag * 1000 + k}:
                    wrong.append(f"{purpose} round {k} from rank {src}")
        return wrong

    job = Background(lambda: exchange("ids.ahead", 1))
    return exchange("backward", 2) + job.result()


def main() -> int:
    out = Path(sys.argv[1])
    comm = make_comm()
    wrong = concurrent_alltoalls(comm)
    text = RECIPE
    if len(sys.argv) > 2 and sys.argv[2] == "wide":  # a dense network over 64 KiB: all-reduced
        text = text.replace("hidden: [8, 1]", "hidden: [600, 1]")
    recipe = parse_recipe_text(text, "pipe.yaml")
    plan = make_plan(recipe, Topology(comm.size, None, 2**34, 2**34), BATCH)
    report = {"concurrent_wrong": wrong, "modes": {t.name: t.sharding for t in plan.tables},
              "off": train(comm, recipe, plan, pipeline=False),
              "on": train(comm, recipe, plan, pipeline=True)}
    (out / f"rank-{comm.rank}.json").write_text(json.dumps(report))
    comm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
