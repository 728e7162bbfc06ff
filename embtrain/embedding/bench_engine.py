"""Benchmark the embedding engine on the tables of Merlin distributed-embeddings' "tiny" model.

    python -m embtrain.embedding.bench_engine [--batch 65536] [--scale 1.0] [--steps 10]
        [--dtype float32|bfloat16|float16]

55 tables / 58 inputs: 3 shared multi-hot tables (10k×8, 1M×16, 25M×16) each read by two
inputs of hotness 1 and 10; one 25M×16 one-hot; 16× 10×8; 10× 1000×8; 4× 10k×8;
2× 100k×16; 19× 1M×16. Ids follow a power law, P(id = k) ∝ (k+1)^-alpha within each table.
Reports median forward, backward+update and total time per step after warm-up steps, the
per-kernel split (``--phases``), initialisation time and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np

from embtrain.embedding.config import (
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.engine import EmbeddingEngine
from embtrain.recipe.kinds import TABLE_DTYPES

# (number of tables, hotness of each input reading it, rows, dim, shared)
TINY_MODEL: tuple[tuple[int, tuple[int, ...], int, int, bool], ...] = (
    (1, (1, 10), 10_000, 8, True),
    (1, (1, 10), 1_000_000, 16, True),
    (1, (1, 10), 25_000_000, 16, True),
    (1, (1,), 25_000_000, 16, False),
    (16, (1,), 10, 8, False),
    (10, (1,), 1_000, 8, False),
    (4, (1,), 10_000, 8, False),
    (2, (1,), 100_000, 16, False),
    (19, (1,), 1_000_000, 16, False),
)


def tiny_model(scale: float = 1.0) -> tuple[list[TableConfig], list[tuple[FeatureConfig, int]]]:
    """Tables and (feature, hotness) pairs of the tiny model; ``scale`` multiplies rows."""
    tables: list[TableConfig] = []
    features: list[tuple[FeatureConfig, int]] = []
    for gi, (count, hots, rows, dim, _shared) in enumerate(TINY_MODEL):
        for i in range(count):
            name = f"t{gi}_{i}"
            tables.append(TableConfig(name, max(1, int(rows * scale)), dim))
            for h in hots:
                fname = f"{name}_h{h}"
                features.append((FeatureConfig(fname, name, "sum", h), h))
    return tables, features


class PowerLaw:
    """Sampler of ids in ``[0, rows)`` with P(k) ∝ (k+1)^-alpha.

    Exact (inverse CDF on a table) for the first 2^20 ids; beyond that the tail is drawn
    from the continuous density on ``[head+0.5, rows+0.5)`` and rounded (error < 1e-6).
    """

    HEAD = 1 << 20

    def __init__(self, rows: int, alpha: float):
        self.rows = rows
        self.alpha = alpha
        head = min(rows, self.HEAD)
        p = np.arange(1, head + 1, dtype=np.float64) ** -alpha
        self.cdf = np.cumsum(p)
        head_mass = self.cdf[-1]
        a, b = head + 0.5, rows + 0.5
        tail_mass = (a ** (1 - alpha) - b ** (1 - alpha)) / (alpha - 1) if rows > head else 0.0
        self.p_head = head_mass / (head_mass + tail_mass)
        self.cdf /= head_mass
        self.a, self.b = a, b

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` ids."""
        u = rng.random(n)
        out = np.searchsorted(self.cdf, u, side="right").astype(np.int64)
        if self.rows > self.HEAD:
            tail = rng.random(n) >= self.p_head
            nt = int(tail.sum())
            if nt:
                e = 1.0 - self.alpha
                v = rng.random(nt)
                x = (self.a**e + v * (self.b**e - self.a**e)) ** (1.0 / e)
                out[tail] = np.clip(np.floor(x - 0.5).astype(np.int64), self.HEAD, self.rows - 1)
        return np.minimum(out, self.rows - 1)


def make_batches(
    tables: list[TableConfig],
    features: list[tuple[FeatureConfig, int]],
    batch: int,
    count: int,
    alpha: float,
    seed: int,
) -> list[dict[str, SparseInput]]:
    """``count`` pre-generated batches of power-law ids."""
    rng = np.random.default_rng(seed)
    rows = {t.name: t.rows for t in tables}
    samplers = {name: PowerLaw(r, alpha) for name, r in rows.items()}
    out = []
    for _ in range(count):
        inputs = {}
        for f, h in features:
            keys = samplers[f.table].sample(rng, batch * h)
            offsets = np.arange(0, batch * h + 1, h, dtype=np.int64)
            inputs[f.name] = SparseInput(keys, offsets, bag_size=h)
        out.append(inputs)
    return out


class TimingBackend:
    """Wraps a kernel backend and accumulates wall time per kernel call."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.times: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name in ("num_workers",):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            c0 = cpu_seconds()
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.times[name] += time.perf_counter() - t0
                self.cpu[name] += cpu_seconds() - c0

        return timed


def cpu_seconds() -> float:
    """User + system CPU time of this process (all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_rss_gib() -> float:
    """Peak resident set size of this process in GiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run(
    batch: int = 65536,
    scale: float = 1.0,
    steps: int = 10,
    warmup: int = 2,
    optimizer: str = "adagrad",
    alpha: float = 1.05,
    n_batches: int = 3,
    seed: int = 0,
    phases: bool = False,
    reuse_outputs: bool = True,
    log: Any = None,
    dynamic: bool = False,
    dtype: str = "float32",
) -> dict[str, Any]:
    """Run the benchmark and return its figures (milliseconds, GiB, seconds); ``dtype``:
    every table's (half tables round stochastically)."""

    def say(msg: str) -> None:
        if log is not None:
            print(msg, file=log, flush=True)

    tables, feats = tiny_model(scale)
    if dynamic:  # every table a hash table of capacity = its rows, on the same ids
        from dataclasses import replace

        from embtrain.embedding.config import DynamicConfig

        tables = [replace(t, dynamic=DynamicConfig()) for t in tables]
    if dtype != "float32":
        from dataclasses import replace

        tables = [replace(t, dtype=dtype) for t in tables]
    t0 = time.perf_counter()
    data = make_batches(tables, feats, batch, n_batches, alpha, seed)
    t_data = time.perf_counter() - t0
    say(f"data: {n_batches} batches in {t_data:.1f}s")
    opt = SparseOptimizerConfig(kind=optimizer, lr=0.01)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    engine = EmbeddingEngine(tables, [f for f, _ in feats], opt, seed=seed)
    t_init = time.perf_counter() - t0
    say(f"init: {sum(t.rows for t in tables):,} rows in {t_init:.1f}s")
    timing = TimingBackend(engine.backend)
    engine.backend = timing
    rng = np.random.default_rng(seed + 1)
    grads = None
    out = engine.new_outputs(batch) if reuse_outputs else None
    fwd, bwd, tot, cfwd, cbwd = [], [], [], [], []
    kernel_ms: dict[str, list[float]] = defaultdict(list)
    kernel_cpu_ms: dict[str, list[float]] = defaultdict(list)
    for step in range(warmup + steps):
        inputs = data[step % n_batches]
        timing.times.clear()
        timing.cpu.clear()
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        outs = engine.forward(inputs, out=out)
        t1 = time.perf_counter()
        c1 = cpu_seconds()
        if grads is None:
            grads = [rng.standard_normal(o.shape, dtype=np.float32) * 1e-3 for o in outs]
        c2 = cpu_seconds()
        t2 = time.perf_counter()
        engine.backward_update(grads, step)
        t3 = time.perf_counter()
        c3 = cpu_seconds()
        t2 = t1 + (t3 - t2)
        if step >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            tot.append(t2 - t0)
            cfwd.append(c1 - c0)
            cbwd.append(c3 - c2)
            for k, v in timing.times.items():
                kernel_ms[k].append(v * 1e3)
                kernel_cpu_ms[k].append(timing.cpu[k] * 1e3)
        say(
            f"step {step}: forward {1e3 * (t1 - t0):.1f} ms, backward+update "
            f"{1e3 * (t2 - t1):.1f} ms"
        )
    nnz = sum(int(v.keys.shape[0]) for v in data[0].values())
    result: dict[str, Any] = {
        "batch": batch,
        "scale": scale,
        "tables": len(tables),
        "inputs": len(feats),
        "keys_per_step": nnz,
        "optimizer": optimizer,
        "threads": engine.backend.num_workers(),
        "init_s": round(t_init, 2),
        "forward_ms": round(1e3 * statistics.median(fwd), 1),
        "backward_update_ms": round(1e3 * statistics.median(bwd), 1),
        "total_ms": round(1e3 * statistics.median(tot), 1),
        "forward_cpu_ms": round(1e3 * statistics.median(cfwd), 1),
        "backward_update_cpu_ms": round(1e3 * statistics.median(cbwd), 1),
        "reuse_outputs": reuse_outputs,
        "peak_rss_gib": round(peak_rss_gib(), 2),
    }
    if phases:
        result["kernels_ms"] = {k: round(statistics.median(v), 1) for k, v in kernel_ms.items()}
        result["kernels_cpu_ms"] = {
            k: round(statistics.median(v), 1) for k, v in kernel_cpu_ms.items()
        }
    return result


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every table's rows")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--optimizer", default="adagrad")
    ap.add_argument("--alpha", type=float, default=1.05)
    ap.add_argument("--phases", action="store_true", help="report time per kernel")
    ap.add_argument(
        "--fresh-outputs",
        action="store_true",
        help="allocate new forward outputs every step instead of reusing engine.new_outputs()",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--dynamic", action="store_true", help="every table a dynamic hash table")
    ap.add_argument("--dtype", default="float32", choices=TABLE_DTYPES,
                    help="every table's dtype")
    args = ap.parse_args(argv)
    res = run(
        batch=args.batch,
        scale=args.scale,
        steps=max(1, args.steps),
        warmup=args.warmup,
        optimizer=args.optimizer,
        alpha=args.alpha,
        phases=args.phases,
        reuse_outputs=not args.fresh_outputs,
        log=None if args.json else sys.stderr,
        dynamic=args.dynamic,
        dtype=args.dtype,
    )
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:>20}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
