"""The multi-rank step with and without the pipeline: quickstart model, 2 ranks, batch 2048.

    python benchmarks/pipeline_step.py [--np 2] [--rounds 3] [--steps 60]

Starts N ranks (as `embtrain run --np N`: shared memory on one machine, one thread each), builds the quickstart model of
``recipes/two_process.yaml`` twice through the one training step (pipeline on: the next
batch's ids exchanged on the communication thread; off: in the step), trains both on the same
random batches in interleaved rounds of ``--steps`` steps (both through the one step loop,
:class:`~embtrain.train.pipeline.StepPipeline`, ``overlap`` on and off) and prints each
side's median step and its collectives per step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCH = 2048


def rank_main(rounds: int, steps: int) -> None:
    """One rank: both sides, interleaved; rank 0 prints the medians as JSON."""
    import numpy as np

    from embtrain.comm import make_comm
    from embtrain.data.batch import Batch
    from embtrain.embedding import SparseInput
    from embtrain.plan import Topology, make_plan
    from embtrain.recipe.loader import load_recipe
    from embtrain.train.builder import build_trainer
    from embtrain.train.job import configure_tensorflow
    from embtrain.train.pipeline import StepPipeline

    comm = make_comm()
    recipe = load_recipe(REPO / "recipes" / "two_process.yaml")
    plan = make_plan(recipe, Topology(comm.size, None, 2**34, 2**34), BATCH)
    rng = np.random.default_rng(0)
    lo, hi = comm.rank * BATCH // comm.size, (comm.rank + 1) * BATCH // comm.size

    def batch() -> Batch:
        lens = rng.integers(0, 6, BATCH)
        keys = rng.integers(0, 1000, int(lens.sum()))
        offs = np.concatenate(([0], np.cumsum(lens)))
        sparse = {"user": SparseInput.one_hot(rng.integers(0, 300, BATCH)[lo:hi]),
                  "item": SparseInput.one_hot(rng.integers(0, 1000, BATCH)[lo:hi]),
                  "category": SparseInput.one_hot(rng.integers(0, 100, BATCH)[lo:hi]),
                  "history": SparseInput(keys[offs[lo]:offs[hi]], offs[lo:hi + 1] - offs[lo])}
        dense = rng.standard_normal((BATCH, 4)).astype(np.float32)[lo:hi].copy()
        return Batch(hi - lo, dense, (rng.random(BATCH) < 0.3).astype(np.float32)[lo:hi],
                     sparse, BATCH)

    data = [batch() for _ in range(8)]
    configure_tensorflow(0)
    sides = {"on": True, "off": False}
    trainers = {k: build_trainer(recipe, plan, comm) for k in sides}
    times: dict[str, list[float]] = {k: [] for k in sides}
    calls: dict[str, float] = {}
    for _ in range(rounds):
        for k, trainer in trainers.items():
            comm.traffic.reset()
            loop = StepPipeline(trainer, (data[s % 8] for s in range(steps)), steps,
                                overlap=sides[k])
            for s in range(steps):
                t0 = time.perf_counter()
                loop.step(s)
                if s >= 5:
                    times[k].append(time.perf_counter() - t0)
            calls[k] = sum(comm.traffic.calls.values()) / steps
    if comm.rank == 0:
        print(json.dumps({k: {"median_step_ms": round(float(np.median(v)) * 1000, 2),
                              "collectives_per_step": calls[k]} for k, v in times.items()}))
    comm.shutdown()


def main() -> int:
    """Start the ranks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    from embtrain.comm.launch import LaunchSpec, launch

    return launch([sys.executable, __file__, "--rank", str(args.rounds), str(args.steps)],
                  LaunchSpec(args.np), {"NUMBA_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
