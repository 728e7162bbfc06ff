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

from embtrain.bench.inputs import Batches, digest
from embtrain.bench.synthetic import build_recipe, load_model

PHASES = ("input", "embedding_forward", "dense", "embedding_update", "communication")


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

    def to_json(self) -> str:
        """The spec as JSON."""
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> SideSpec:
        """Read what :meth:`to_json` wrote."""
        return SideSpec(**json.loads(text))


def rss_bytes() -> tuple[int, int]:
    """``(current RSS, peak RSS)`` of this process in bytes, from /proc/self/status."""
    fields = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(rest.split()[0]) * 1024
    except OSError:  # pragma: no cover - not Linux
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return peak, peak
    return fields.get("VmRSS", 0), fields.get("VmHWM", 0)


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0: ``5`` into /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class CpuShare:
    """How much of the machine's CPU went elsewhere while a side was timed.

    From /proc/stat and this process's CPU time: ``steal_pct`` is time the hypervisor gave
    to other machines, ``others_pct`` is CPU used by other processes of this machine, both
    in percent of all cores × wall time. Either one above a few percent makes timings slower.
    """

    def __init__(self) -> None:
        self.start: tuple[list[int], float] | None = None

    @staticmethod
    def _read() -> tuple[list[int], float]:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:9]
        times = os.times()
        return [int(x) for x in fields], times.user + times.system

    def begin(self) -> None:
        """Start of the timed steps."""
        try:
            self.start = self._read()
        except (OSError, ValueError, IndexError):
            self.start = None

    def end(self) -> dict[str, float | None]:
        """Shares since :meth:`begin` (None where /proc/stat cannot be read)."""
        if self.start is None:
            return {"steal_pct": None, "others_pct": None}
        try:
            ticks, own = self._read()
        except (OSError, ValueError, IndexError):
            return {"steal_pct": None, "others_pct": None}
        d = [b - a for a, b in zip(self.start[0], ticks, strict=True)]
        total = sum(d) or 1
        busy = total - d[3] - d[4] - d[7]
        own_ticks = (own - self.start[1]) * os.sysconf("SC_CLK_TCK")
        return {
            "steal_pct": 100.0 * d[7] / total,
            "others_pct": max(0.0, 100.0 * (busy - own_ticks) / total),
        }


class MemoryMarks:
    """RSS figures of a side: after building, at the end of warm-up, during the timed steps."""

    def __init__(self) -> None:
        self.marks: dict[str, int | None] = {}

    def built(self) -> None:
        """Right after the tables, model and optimizers exist."""
        self.marks["built_rss_bytes"], self.marks["built_peak_rss_bytes"] = rss_bytes()

    def warmed_up(self) -> None:
        """After the warm-up steps: record the peak so far, then reset it for the timed steps."""
        self.marks["warmup_peak_rss_bytes"] = rss_bytes()[1]
        self.marks["timed_reset"] = int(reset_peak_rss())

    def finished(self) -> None:
        """After the timed steps, before anything is freed."""
        current, peak = rss_bytes()
        self.marks["end_rss_bytes"] = current
        self.marks["timed_peak_rss_bytes"] = peak if self.marks.get("timed_reset") else None


class PhaseLog:
    """Per-phase seconds of every timed step."""

    def __init__(self) -> None:
        self.phases: dict[str, list[float]] = {p: [] for p in PHASES}
        self.step: list[float] = []

    def add(self, times: dict[str, float], step: float | None = None) -> None:
        """Record one step's phases; ``step`` defaults to their sum."""
        for name in PHASES:
            self.phases[name].append(float(times.get(name, 0.0)))
        self.step.append(float(step) if step is not None else sum(times.values()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the per-step lists."""
        return {"phases": self.phases, "step": self.step}


def _check_loss(loss: float, side: str, step: int) -> None:
    if not np.isfinite(loss):
        raise FloatingPointError(f"{side}: loss became {loss} at step {step}")


# --------------------------------------------------------------------------- embtrain


def run_embtrain(spec: SideSpec, batches: Batches) -> dict[str, Any]:
    """embtrain: engine forward → dense train_step → fused backward + sparse update."""
    from embtrain.embedding import EmbeddingEngine, SparseInput
    from embtrain.models import build_model
    from embtrain.train.convert import (
        feature_configs,
        feature_slots,
        sparse_optimizer_config,
        table_configs,
    )

    model_def = load_model(spec.model)
    recipe = build_recipe(
        model_def,
        optimizer=spec.optimizer,
        batch=spec.batch,
        scale=spec.scale,
        steps=spec.steps,
        seed=spec.seed,
    )
    names = [f.name for f in recipe.categorical_features]

    def inputs(k: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        sparse = {n: SparseInput.fixed_hotness(batches.ids[i][k]) for i, n in enumerate(names)}
        return sparse, batches.dense[k], batches.labels[k]

    def fed() -> Iterator[np.ndarray]:
        for k in range(batches.count):
            sparse, dense, labels = inputs(k)
            yield from (sparse[n].keys.reshape(spec.batch, -1) for n in names)
            yield from (dense, labels)

    batch_digest = digest(fed())
    started = time.perf_counter()
    engine = EmbeddingEngine(
        table_configs(recipe),
        feature_configs(recipe),
        sparse_optimizer_config(recipe.optimizer.sparse),
        seed=spec.seed,
    )
    slots = feature_slots(recipe, engine.layout)
    model = build_model(recipe.model, num_dense=model_def.numerical, slots=slots, seed=spec.seed)
    model.make_optimizer(recipe.optimizer.dense)
    build_seconds = time.perf_counter() - started
    memory = MemoryMarks()
    memory.built()
    cpu = CpuShare()

    # As `embtrain run` does: the pooled outputs go into buffers reused by every step.
    outputs = engine.new_outputs(spec.batch)
    log = PhaseLog()
    losses = []
    for s in range(spec.warmup + spec.steps):
        if s == spec.warmup:
            memory.warmed_up()
            cpu.begin()
        k = s % batches.count
        t0 = time.perf_counter()
        sparse, dense, labels = inputs(k)
        t1 = time.perf_counter()
        groups = engine.forward(sparse, out=outputs)
        t2 = time.perf_counter()
        loss, grads = model.train_step(dense, groups, labels)
        t3 = time.perf_counter()
        engine.backward_update(grads, s)
        t4 = time.perf_counter()
        _check_loss(loss, "embtrain", s)
        losses.append(float(loss))
        if s >= spec.warmup:
            log.add(
                {
                    "input": t1 - t0,
                    "embedding_forward": t2 - t1,
                    "dense": t3 - t2,
                    "embedding_update": t4 - t3,
                    "communication": 0.0,
                }
            )
    memory.finished()
    shares = cpu.end()
    return {
        "build_seconds": build_seconds,
        "batch_digest": batch_digest,
        "losses": losses,
        "timed": log.to_dict(),
        **memory.marks,
        **shares,
    }


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
    memory = MemoryMarks()
    memory.built()
    cpu = CpuShare()

    fused = PhaseLog()
    losses = []
    for s in range(spec.warmup + spec.steps):
        if s == spec.warmup:
            memory.warmed_up()
            cpu.begin()
        k = s % batches.count
        t0 = time.perf_counter()
        ids, dense, labels = inputs(k)
        t1 = time.perf_counter()
        loss = float(net.step(ids, dense, labels))
        t2 = time.perf_counter()
        _check_loss(loss, "native-tf", s)
        losses.append(loss)
        if s >= spec.warmup:
            fused.add({"input": t1 - t0}, step=t2 - t0)

    phased = PhaseLog()
    for s in range(spec.warmup + spec.steps):
        k = s % batches.count
        t0 = time.perf_counter()
        ids, dense, labels = inputs(k)
        t1 = time.perf_counter()
        pooled = net.emb_forward(ids)
        t2 = time.perf_counter()
        loss_t, grads = net.dense_step(pooled, dense, labels)
        t3 = time.perf_counter()
        net.emb_update(ids, grads)
        t4 = time.perf_counter()
        _check_loss(float(loss_t), "native-tf", s)
        if s >= spec.warmup:
            phased.add(
                {
                    "input": t1 - t0,
                    "embedding_forward": t2 - t1,
                    "dense": t3 - t2,
                    "embedding_update": t4 - t3,
                    "communication": 0.0,
                }
            )
    # The embedding part alone as one fused tf.function, fed the last dense gradients.
    embedding_only = []
    for s in range(spec.warmup + spec.steps):
        ids, _dense, _labels = inputs(s % batches.count)
        t0 = time.perf_counter()
        net.emb_step(ids, grads)
        if s >= spec.warmup:
            embedding_only.append(time.perf_counter() - t0)
    memory.finished()
    shares = cpu.end()
    return {
        "build_seconds": build_seconds,
        "batch_digest": batch_digest,
        "losses": losses,
        "embedding_only": embedding_only,
        "timed": phased.to_dict(),
        "fused": fused.to_dict(),
        **memory.marks,
        **shares,
    }


SIDES: dict[str, Callable[[SideSpec, Batches], dict[str, Any]]] = {
    "embtrain": run_embtrain,
    "native-tf": run_native_tf,
}


def run(spec: SideSpec) -> dict[str, Any]:
    """Load the batches, run the side, add memory figures."""
    batches = Batches.load(Path(spec.batches_dir))
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
    result = run(spec)
    Path(spec.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
