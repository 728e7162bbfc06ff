"""Where a multi-rank training step goes: DE tiny on N ranks, time per phase of the exchange.

    python benchmarks/sharded_profile.py [--np 2] [--steps 8] [--quantize none|fp16|int8]
                                         [--pipeline on|off] [--batch 65536]

Starts N ranks (shared memory on one machine, one thread each, as ``embtrain bench --np N``
runs them),
trains DE tiny at batch 65536 on generated power-law batches through the one training step
(:class:`embtrain.train.builder.Trainer`), and prints each rank's median step and the
milliseconds per step spent in the sharded embedding's parts (the engine's kernels, the
exchanges with and without their collectives, the data-parallel path) and in the collectives.
Nested timings overlap (``emb.forward`` contains ``owner.forward``); with the pipeline on,
``comm.alltoallv`` includes the next batch's id exchange on the communication thread
(``comm.ids.ahead (thread)``), which overlaps the step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

BATCH = 65536


def _wrap(obj: Any, name: str, label: str, totals: dict[str, float]) -> None:
    inner: Callable[..., Any] = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - t0

    setattr(obj, name, timed)


class _Timed:
    """A callable exchange timed under ``label`` (its other attributes passed through)."""

    def __init__(self, inner: Any, label: str, totals: dict[str, float]):
        self._inner, self._label, self._totals = inner, label, totals

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._inner(*args, **kwargs)
        finally:
            self._totals[self._label] += time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def rank_main(batches_dir: str, steps: int, quantize: str, out: str, pipeline: bool,
              batch_size: int) -> None:
    """One rank: build, instrument, train ``steps`` timed steps after 3 warm-up ones."""
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from embtrain.bench.inputs import Batches
    from embtrain.bench.synthetic import build_recipe, load_model
    from embtrain.comm import make_comm
    from embtrain.data.batch import Batch
    from embtrain.embedding import SparseInput
    from embtrain.plan import Topology, make_plan
    from embtrain.train.builder import build_trainer
    from embtrain.train.pipeline import StepPipeline

    batches = Batches.load(Path(batches_dir))
    recipe = build_recipe(load_model("tiny"), optimizer="adagrad", batch=batch_size, scale=1.0,
                          steps=steps, seed=0)
    recipe = recipe.model_copy(update={"distributed": recipe.distributed.model_copy(
        update={"comm": recipe.distributed.comm.model_copy(update={"quantize": quantize})})})
    comm = make_comm()
    trainer = build_trainer(recipe, make_plan(recipe, Topology.detect(comm.size), batch_size),
                            comm)
    emb, totals = trainer.embedding, defaultdict(float)
    for name in ("forward", "backward_update"):
        _wrap(emb, name, f"emb.{name}", totals)
    ex = emb.exchanges
    _wrap(ex.ids, "start", "emb.ids.start (key check)", totals)
    buffers = {**getattr(ex.ids, "buffers", {}), "forward": getattr(ex.pooled, "buffer", None),
               "backward": getattr(ex.gradients, "buffer", None)}
    emb.exchanges = ex._replace(ids=_Timed(ex.ids, "emb.exchange_ids", totals),
                                pooled=_Timed(ex.pooled, "emb.exchange_pooled", totals),
                                gradients=_Timed(ex.gradients, "emb.exchange_gradients",
                                                 totals))
    _wrap(emb.engine, "forward", "owner.forward (kernel)", totals)
    _wrap(emb.engine, "backward_update", "owner.backward (kernel)", totals)
    if emb.dp is not None:
        _wrap(emb.dp, "forward", "dp.forward (kernel)", totals)
        _wrap(emb.dp, "local_sums", "dp.local_sums (copy + kernel)", totals)
        _wrap(emb.dp, "apply_sums", "dp.apply_sums", totals)
        _wrap(emb.dp.engine, "backward_row_sums", "dp.row_sums (kernel)", totals)
    for label, buf in buffers.items():
        if buf is not None:
            _wrap(buf, "pack", f"pack.{label}", totals)
    for name in ("alltoallv", "allreduce_sum", "allreduce_tensors"):
        _wrap(comm, name, f"comm.{name}", totals)
    _wrap(trainer.model, "train_step", "dense.train_step", totals)
    names = [f.name for f in recipe.categorical_features]
    lo, hi = comm.rank * batch_size // comm.size, (comm.rank + 1) * batch_size // comm.size

    def batch(k: int) -> Batch:
        sparse = {n: SparseInput.fixed_hotness(batches.ids[i][k][lo:hi])
                  for i, n in enumerate(names)}
        return Batch(hi - lo, batches.dense[k][lo:hi], batches.labels[k][lo:hi], sparse,
                     batch_size)

    times = []
    data = [batch(k) for k in range(batches.count)]
    loop = StepPipeline(trainer, (data[s % batches.count] for s in range(steps + 3)), steps + 3,
                        overlap=pipeline)
    for s in range(steps + 3):
        if s == 3:
            totals.clear()
            comm.traffic.reset()
        t0 = time.perf_counter()
        loop.step(s)
        if s >= 3:
            times.append(time.perf_counter() - t0)
    for purpose, sec in comm.traffic.seconds.items():
        totals[f"comm.{purpose}" + (" (thread)" if purpose == "ids.ahead" else "")] = sec
    report = {"rank": comm.rank, "step_ms": float(np.median(times)) * 1000,
              "parts_ms": {k: v / steps * 1000 for k, v in sorted(totals.items(),
                                                                   key=lambda kv: -kv[1])}}
    Path(out, f"rank-{comm.rank}.json").write_text(json.dumps(report))


def main() -> int:
    """Generate batches, start the ranks, print their reports."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--quantize", default="none", choices=("none", "fp16", "int8"))
    parser.add_argument("--pipeline", default="on", choices=("on", "off"))
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args()
    from embtrain.bench.inputs import generate
    from embtrain.bench.synthetic import load_model
    from embtrain.comm.launch import LaunchSpec, launch

    model = load_model("tiny")
    with tempfile.TemporaryDirectory(prefix="embtrain-profile-") as tmp:
        generate(model.inputs(1.0), model.numerical, args.batch, 4, 1.05, seed=0).save(
            Path(tmp) / "batches")
        threads = str(max(1, (os.cpu_count() or 1) // args.np))
        code = launch([sys.executable, __file__, "--rank-of", str(Path(tmp) / "batches"), tmp,
                       str(args.steps), args.quantize, args.pipeline, str(args.batch)],
                      LaunchSpec(args.np),
                      {"NUMBA_NUM_THREADS": threads, "TF_CPP_MIN_LOG_LEVEL": "3"})
        for r in range(args.np):
            path = Path(tmp, f"rank-{r}.json")
            if path.exists():
                rep = json.loads(path.read_text())
                print(f"rank {r}: step {rep['step_ms']:.1f} ms (median)")
                for k, v in rep["parts_ms"].items():
                    print(f"  {k:28s} {v:7.1f} ms/step")
    return code


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-of":
        rank_main(sys.argv[2], int(sys.argv[4]), sys.argv[5], sys.argv[3],
                  sys.argv[6] == "on", int(sys.argv[7]))
        sys.exit(0)
    sys.exit(main())
