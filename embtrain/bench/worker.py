"""One side of the benchmark in its own process: ``python -m embtrain.bench.worker SPEC.json``.

Each side (``embtrain`` or ``native-tf``) runs in a fresh child process so that its peak
RSS (``VmHWM``) is its own. Both read the same pre-generated batches from the directory
named in the spec, report a digest of the inputs they fed to their steps, the per-phase
times of every timed step (seconds), and write the result as JSON to ``spec.out``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.bench.inputs import Batches
from embtrain.bench.measure import (
    CpuShare,
    MemoryMarks,
    PhaseLog,
    check_loss,
    digest,
    measure_steps,
    rss_bytes,
)
from embtrain.bench.precision import FLOAT32_SIDE, engine_bytes, precision_recipe
from embtrain.bench.synthetic import build_recipe, load_model
from embtrain.comm.env import launched_rank


@dataclass(frozen=True)
class SideSpec:
    """What a worker runs: one side, one model, pre-generated batches in ``batches_dir``."""

    side: str
    model: str
    scale: float
    batch: int
    optimizer: str
    steps: int
    warmup: int
    seed: int
    batches_dir: str
    out: str
    processes: int = 1
    quantize: str = "none"
    device: str = "cpu"  # train.device (embtrain's side)
    dynamic: bool = False  # every table a dynamic (hash) table of capacity = its rows
    # storage tiers by table (``[{"tier": ..., "budget": ..., "path": ...}, ...]``), if any
    storage: dict[str, list[dict[str, Any]]] | None = None
    # read each batch from the batch files when a step needs it instead of holding them all
    # (tier runs: the point is a process smaller than the model)
    batches_on_disk: bool = False
    # half precision (`--precision`): the tables' dtype and the dense network's compute dtype
    table_dtype: str = "float32"
    mixed_precision: str = "none"
    optimizer_state: str | None = None  # half tables' slots: float32 (default) or table
    # the pipeline stage (ids ahead on several ranks, dynamic tables' lookups ahead on one)
    pipeline: bool = True

    def to_json(self) -> str:
        """The spec as JSON."""
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> SideSpec:
        """Read what :meth:`to_json` wrote."""
        return SideSpec(**json.loads(text))


# --------------------------------------------------------------------------- embtrain


def dynamic_recipe(recipe: Any) -> Any:
    """``recipe`` with every table a dynamic table of capacity = its rows (LRU, no admission):
    the same ids then train exactly as in static tables, through the hash tables."""
    from embtrain.recipe.models import Dynamic

    tables = [t.model_copy(update={"rows": None, "dynamic": Dynamic(capacity=t.capacity)})
              for t in recipe.tables]
    return recipe.model_copy(update={"tables": tables})


def run_embtrain(spec: SideSpec, batches: Batches) -> dict[str, Any]:
    """embtrain: sharded forward → dense train_step → fused backward + sparse update, through
    the one step of `embtrain run` (:class:`~embtrain.train.builder.Trainer`), on this rank's
    rows of every batch when several ranks run it."""
    from embtrain.comm import make_comm
    from embtrain.data.batch import Batch
    from embtrain.embedding import SparseInput
    from embtrain.plan import Topology, make_plan
    from embtrain.recipe.models import Tier
    from embtrain.train.builder import build_trainer
    from embtrain.train.pipeline import StepPipeline

    model_def = load_model(spec.model)
    recipe = build_recipe(
        model_def,
        optimizer=spec.optimizer,
        batch=spec.batch,
        scale=spec.scale,
        steps=spec.steps,
        seed=spec.seed,
        storage_by_table=None if spec.storage is None else {
            name: [Tier(**t) for t in tiers] for name, tiers in spec.storage.items()},
    )
    if spec.dynamic:
        recipe = dynamic_recipe(recipe)
    recipe = precision_recipe(recipe, spec.table_dtype, spec.mixed_precision,
                              spec.optimizer_state)
    if spec.quantize != "none":
        recipe = recipe.model_copy(update={"distributed": recipe.distributed.model_copy(
            update={"comm": recipe.distributed.comm.model_copy(
                update={"quantize": spec.quantize})})})
    recipe = recipe.model_copy(update={"train": recipe.train.model_copy(
        update={"device": spec.device})})
    names = [f.name for f in recipe.categorical_features]
    comm = make_comm()
    lo = comm.rank * spec.batch // comm.size
    hi = (comm.rank + 1) * spec.batch // comm.size

    def inputs(k: int) -> Batch:
        sparse = {n: SparseInput.fixed_hotness(batches.ids[i][k][lo:hi])
                  for i, n in enumerate(names)}
        return Batch(hi - lo, batches.dense[k][lo:hi], batches.labels[k][lo:hi], sparse,
                     spec.batch)

    def fed() -> Iterator[np.ndarray]:  # whole batches: every rank reads the same ones
        for k in range(batches.count):
            yield from (np.ascontiguousarray(batches.ids[i][k], dtype=np.int64)
                        for i in range(len(names)))
            yield from (batches.dense[k], batches.labels[k])

    batch_digest = digest(fed())
    started = time.perf_counter()
    plan = make_plan(recipe, Topology.detect(comm.size), batch_size=spec.batch)
    trainer = build_trainer(recipe, plan, comm, seed=spec.seed)
    build_seconds = time.perf_counter() - started
    memory = MemoryMarks()
    memory.built()
    held = engine_bytes(trainer.embedding)
    cpu = CpuShare()
    log = PhaseLog()
    losses = []
    tier_start: dict[str, dict[str, float]] = {}
    busy_start = 0.0
    total = spec.warmup + spec.steps
    # each step with the next batch on its way: the step loop of `run` (embtrain.train.pipeline)
    steps = StepPipeline(trainer, (inputs(s % batches.count) for s in range(total)), total,
                         overlap=spec.pipeline)
    for s in range(total):
        if s == spec.warmup:
            tier_start = _tier_totals(trainer)
            busy_start = _read_busy()
            memory.warmed_up()
            comm.barrier()
            comm.traffic.reset()
            t = os.times()
            cpu.begin(_summed(comm, t.user + t.system) if comm.size > 1 else None)
        times: dict[str, float] = {}
        done = steps.step(s, times)
        if done is None:  # the generator above yields every step's batch
            raise RuntimeError(f"no batch for step {s}")
        loss = done[1]
        check_loss(loss, "embtrain", s)
        losses.append(float(loss))
        hidden = times.pop("hidden_communication", 0.0)
        lookup_ahead = times.pop("lookup_ahead_share", None)
        if s >= spec.warmup:
            log.add({"input": steps.input_seconds, **times})
            log.hidden.append(hidden)
            if lookup_ahead is not None:
                log.lookup_ahead.append(lookup_ahead)
    tier_end = _tier_totals(trainer) if tier_start else {}
    tiers = _tier_delta(tier_start, tier_end, spec.steps) if tier_start else None
    if tiers is not None:  # wall seconds any tier file was reading rows
        tiers["read_busy_seconds_per_step"] = (_read_busy() - busy_start) / max(spec.steps, 1)
    memory.finished()
    own = os.times()
    shares = cpu.end(_summed(comm, own.user + own.system) if comm.size > 1 else None)
    result: dict[str, Any] = {
        "build_seconds": build_seconds,
        "batch_digest": batch_digest,
        "losses": losses,
        "timed": log.to_dict(),
        "processes": comm.size,
        "engine_bytes": held,
        "table_dtype": spec.table_dtype,
        "mixed_precision": spec.mixed_precision,
        "dynamic_tables": spec.dynamic,
        "tiered_tables": spec.storage is not None,
        **memory.marks,
        **shares,
    }
    if tiers is not None:  # the parent compares each table's counts with the oracle
        result["tiers"] = {**tiers, "by_table": {"warmup": tier_start, "end": tier_end}}
    if comm.size > 1:
        sent = comm.traffic.sent
        exchange = sum(sent.get(p, 0) for p in ("ids", "forward", "backward", "dp"))
        totals = comm.allreduce_sum(np.array(
            [exchange, sent.get("dp", 0), sent.get("dense", 0)], np.float64))
        result["comm"] = {
            "transport": comm.transport,
            "quantize": spec.quantize,
            "exchange_bytes_per_step": float(totals[0]) / spec.steps,
            "dp_allreduce_bytes_per_step": float(totals[1]) / spec.steps,
            "dense_allreduce_bytes_per_step": float(totals[2]) / spec.steps,
            "plan_exchange_bytes_per_step": float(plan.traffic.alltoall_bytes
                                                  + plan.traffic.allreduce_bytes),
            "seconds_per_step": comm.traffic.total_seconds() / spec.steps,
        }
        peaks = comm.allreduce_sum(np.array([rss_bytes()[1],
                                             int(memory.marks.get("warmup_peak_rss_bytes") or 0)],
                                            np.float64))
        result["ranks_peak_rss_bytes"] = int(max(peaks))
    return result


_TIER_COUNTS = ("lookups", "misses", "distinct_misses", "evictions", "rows_read",
                "rows_ahead", "rows_written", "bytes_read", "bytes_written", "read_blocks",
                "read_seconds", "wait_seconds")


def _read_busy() -> float:
    """Wall seconds this process has spent reading rows from tier files."""
    from embtrain.storage.disk import READ_CLOCK

    return READ_CLOCK.seconds


def _tier_totals(trainer: Any) -> dict[str, dict[str, float]]:
    """Cumulative counters of every tiered table (empty without tiers)."""
    metrics = getattr(trainer.embedding, "tier_metrics", None)
    return {} if metrics is None else {
        name: {k: float(m.get(k, 0)) for k in _TIER_COUNTS} for name, m in metrics().items()}


def _tier_delta(start: dict[str, dict[str, float]], end: dict[str, dict[str, float]],
                steps: int) -> dict[str, float]:
    """What the tiers did during the timed steps, all tables together, per step."""
    total = {k: sum(end[t][k] - start[t][k] for t in end) for k in _TIER_COUNTS}
    return {"tables": len(end), "hit_rate": 1 - total["misses"] / total["lookups"]
            if total["lookups"] else 1.0,
            **{f"{k}_per_step": v / max(steps, 1) for k, v in total.items()}}


def _summed(comm: Any, value: float) -> float:
    """``value`` summed over the ranks."""
    return float(comm.allreduce_sum(np.array([value], np.float64))[0])


# -------------------------------------------------------------------------- native-tf


def run_native_tf(spec: SideSpec, batches: Batches) -> dict[str, Any]:
    """The plain-TensorFlow baseline: fused steps for the step time, phased ones for the split."""
    from embtrain.bench.baseline_tf import NativeTF

    model_def = load_model(spec.model)

    def inputs(k: int) -> Any:
        return NativeTF.to_tensors(
            [ids[k] for ids in batches.ids], batches.dense[k], batches.labels[k]
        )

    def fed() -> Iterator[np.ndarray]:
        for k in range(batches.count):
            ids, dense, labels = inputs(k)
            yield from (x.numpy() for x in ids)
            yield from (dense.numpy(), labels.numpy())

    batch_digest = digest(fed())
    started = time.perf_counter()
    net = NativeTF(
        model_def.tables(spec.scale),
        model_def.inputs(spec.scale),
        model_def.numerical,
        model_def.mlp,
        spec.optimizer,
        seed=spec.seed,
        interact_stride=model_def.interact_stride,
    )
    build_seconds = time.perf_counter() - started
    measured = measure_steps(
        "native-tf", inputs, batches.count, spec.warmup, spec.steps, net.step, net.phased_step,
        lambda x, _dense, grads: net.emb_step(x, grads))
    return {"build_seconds": build_seconds, "batch_digest": batch_digest, **measured}


SIDES: dict[str, Callable[[SideSpec, Batches], dict[str, Any]]] = {
    "embtrain": run_embtrain,
    "one-process": run_embtrain,
    "static": run_embtrain,
    FLOAT32_SIDE: run_embtrain,
    "native-tf": run_native_tf,
}


def run(spec: SideSpec) -> dict[str, Any]:
    """Load the batches, run the side, add memory figures."""
    batches = Batches.load(Path(spec.batches_dir), on_disk=spec.batches_on_disk)
    result = SIDES[spec.side](spec, batches)
    # The peak over the whole run: VmHWM was reset after warm-up, so take the larger of the
    # peak up to then and the peak since.
    peak = max(rss_bytes()[1], int(result.get("warmup_peak_rss_bytes") or 0))
    result.update({"side": spec.side, "peak_rss_bytes": peak, "batch_bytes": batches.nbytes})
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child process."""
    args = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    spec = SideSpec.from_json(Path(args[0]).read_text())
    threads = os.environ.get("EMBTRAIN_THREADS")
    if threads:  # several ranks on one machine: each gets its share of the cores
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(int(threads))
        tf.config.threading.set_inter_op_parallelism_threads(int(threads))
    result = run(spec)
    launched = launched_rank()
    if launched is None or launched[0] == 0:  # rank 0 writes, whichever launcher (mpirun too)
        if "ranks_peak_rss_bytes" in result:  # the side's memory is all its ranks'
            result["peak_rss_bytes"] = result["ranks_peak_rss_bytes"]
        Path(spec.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
