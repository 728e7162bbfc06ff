"""Interleaved A/B timing of whole embedding engines from different git revisions, in one process.

This VM's absolute times drift by up to ~50 % within an hour, so two bench runs minutes apart
cannot settle a 5 % question. Here each revision's ``embtrain`` package is exported into a
temporary folder under its own name (``embtrain_r0``, ``embtrain_r1``, ...), one engine per
revision is built on the DE "tiny" tables, all engines share one set of table arrays (values,
slots, metadata: one copy in memory; each engine has its own row map), and the engines take
turns step by step on the same batches and gradients, so drift hits them alike. ``.`` means the working tree.

    .venv/bin/python benchmarks/engine_ab.py HEAD~1 . [--steps 40] [--batch 65536] [--scale 1.0]

Prints, per revision, the median forward, backward + update and total ms, and the median of
the per-round ratio of the first revision's total to this one's (> 1: faster than the first).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.embedding import bench_engine

ROOT = Path(__file__).resolve().parent.parent


def export(rev: str, name: str, workdir: Path) -> None:
    """Write revision ``rev``'s ``embtrain`` package to ``workdir/name`` with imports renamed."""
    dst = workdir / name
    if rev == ".":
        shutil.copytree(ROOT / "embtrain", dst, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "embtrain"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(workdir)], input=tar, check=True)
        (workdir / "embtrain").rename(dst)
    pattern = re.compile(r"\bembtrain(?=[. ])")
    for path in dst.rglob("*.py"):
        path.write_text(pattern.sub(name, path.read_text()))


def build(name: str, batch_source: list[dict[str, Any]], shared: Any,
          scale: float = 1.0) -> tuple[Any, list]:
    """An engine of package ``name`` on the tiny tables (rows × ``scale``; sharing
    ``shared``'s arrays)."""
    engine_mod = importlib.import_module(f"{name}.embedding.engine")
    cfg = importlib.import_module(f"{name}.embedding.config")
    tables, feats = bench_engine.tiny_model(scale)
    cls = engine_mod.EmbeddingEngine
    if shared is not None:
        cls._allocate = lambda self, group: None  # the arrays come from `shared`
    engine = cls(
        [cfg.TableConfig(t.name, t.rows, t.dim) for t in tables],
        [cfg.FeatureConfig(f.name, f.table, f.combiner, f.hotness) for f, _ in feats],
        cfg.SparseOptimizerConfig(kind="adagrad", lr=0.01),
        seed=0,
    )
    if shared is not None:
        for mine, theirs in zip(engine._groups, shared._groups, strict=True):
            if mine.values.shape[1:] != theirs.values.shape[1:] or mine.total_rows != theirs.total_rows:
                raise SystemExit(f"{name}: table groups differ; cannot share state")
            mine.values, mine.slots = theirs.values, theirs.slots
            mine.meta = theirs.meta
            # own row map: revisions may differ in what the map holds between steps (since
            # issue 19 it lives in the backend's per-group scratch, made by the engine itself)
            if hasattr(mine, "row_map"):
                mine.row_map = engine.backend.zeros((theirs.total_rows,), np.int32)
    # revisions before `bag_size` existed read every bag's offsets
    fixed = "bag_size" in {f.name for f in dataclasses.fields(cfg.SparseInput)}
    batches = [
        {
            k: cfg.SparseInput(v.keys, v.offsets, **({"bag_size": v.bag_size} if fixed else {}))
            for k, v in b.items()
        }
        for b in batch_source
    ]
    return engine, batches


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revisions", nargs="+", help="git revisions; '.' is the working tree")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per revision")
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--scale", type=float, default=1.0, help="table rows × this")
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="engine_ab_"))
    sys.path.insert(0, str(workdir))
    names = [f"embtrain_r{i}" for i in range(len(args.revisions))]
    for rev, name in zip(args.revisions, names, strict=True):
        export(rev, name, workdir)
    tables, feats = bench_engine.tiny_model(args.scale)
    data = bench_engine.make_batches(tables, feats, args.batch, 3, 1.05, 0)
    engines, batches, outs = [], [], []
    for name in names:
        engine, b = build(name, data, engines[0] if engines else None, args.scale)
        engines.append(engine)
        batches.append(b)
        outs.append(engine.new_outputs(args.batch))
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(o.shape, dtype=np.float32) * 1e-3 for o in outs[0]]
    times: list[tuple[list[float], list[float]]] = [([], []) for _ in names]
    warmup = 2
    for s in range(warmup + args.steps):
        order = list(range(len(names)))
        order = order[s % len(order) :] + order[: s % len(order)]  # rotate who goes first
        for i in order:
            t0 = time.perf_counter()
            engines[i].forward(batches[i][s % len(data)], out=outs[i])
            t1 = time.perf_counter()
            engines[i].backward_update(grads, s)
            t2 = time.perf_counter()
            if s >= warmup:
                times[i][0].append(t1 - t0)
                times[i][1].append(t2 - t1)
    first = [a + b for a, b in zip(*times[0], strict=True)]
    for rev, (fwd, bwd) in zip(args.revisions, times, strict=True):
        tot = [a + b for a, b in zip(fwd, bwd, strict=True)]
        ratio = statistics.median(x / y for x, y in zip(first, tot, strict=True))
        print(
            f"{rev:>12}: forward {1e3 * statistics.median(fwd):6.1f} ms   backward+update "
            f"{1e3 * statistics.median(bwd):6.1f} ms   total {1e3 * statistics.median(tot):6.1f} ms"
            f"   speed vs {args.revisions[0]}: {ratio:.3f}"
        )
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
