"""Interleaved A/B of ``embtrain bench`` between git revisions, on one process or several ranks.

:mod:`benchmarks.engine_ab` times engines of several revisions inside one process; this script
times the whole bench step (the sharded exchanges, the pipeline, the dense part) of each
revision as a user runs it: each revision's tree is exported (``git archive``) into a temporary
folder, and every round runs ``python -m embtrain bench --json`` once per revision, in a rotated
order, with ``PYTHONPATH`` at that revision's tree. Same seed, same batches (the batch digests
are checked equal). ``.`` means the working tree.

    .venv/bin/python benchmarks/revision_ab.py BASE . [--np 2] [--rounds 3] [--steps 20]
        [--model tiny] [--batch 65536] [--scale 1.0]

Prints one JSON document: per revision the rounds' median step and embedding-part times (ms),
the median over rounds, and the median of the per-round ratio BASE ÷ revision (> 1: faster
than BASE). The first run of a revision whose kernel sources differ compiles them (minutes);
an untimed ``--prime`` round runs each revision once first for that.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def export(rev: str, dst: Path) -> Path:
    """Revision ``rev``'s ``embtrain`` package under ``dst`` (the working tree for ``.``)."""
    dst.mkdir(parents=True)
    if rev == ".":
        shutil.copytree(ROOT / "embtrain", dst / "embtrain",
                        ignore=shutil.ignore_patterns("__pycache__"))
    else:
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "embtrain"],
                             check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dst)], input=tar, check=True)
    return dst


def bench_once(tree: Path, args: argparse.Namespace, steps: int) -> dict[str, Any]:
    """One ``embtrain bench --json`` of the package in ``tree``; its embtrain result."""
    command = [sys.executable, "-m", "embtrain", "bench", "--model", args.model,
               "--np", str(args.np), "--baseline", "none", "--steps", str(steps),
               "--warmup", str(args.warmup), "--batch", str(args.batch),
               "--scale", str(args.scale), "--json"]
    env = {**os.environ, "PYTHONPATH": str(tree), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree.name}: bench exited {done.returncode}: "
                         f"{done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)["results"]["embtrain"]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revisions", nargs="+", help="git revisions; '.' is the working tree")
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--prime", action="store_true",
                    help="run each revision once, untimed, first (compiles its kernels)")
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="revision_ab_"))
    try:
        trees = [export(rev, workdir / f"r{i}") for i, rev in enumerate(args.revisions)]
        if args.prime:
            for tree in trees:
                bench_once(tree, args, 1)
        steps: list[list[float]] = [[] for _ in trees]
        embedding: list[list[float]] = [[] for _ in trees]
        digests: set[str] = set()
        for r in range(args.rounds):
            order = list(range(len(trees)))
            order = order[r % len(order):] + order[:r % len(order)]  # rotate who goes first
            for i in order:
                result = bench_once(trees[i], args, args.steps)
                steps[i].append(result["step_ms"]["median"])
                embedding[i].append(result["embedding_ms"]["median"])
                digests.add(result["batch_digest"])
        report: dict[str, Any] = {
            "command": " ".join(sys.argv), "identical_batches": len(digests) == 1,
            "revisions": {}}
        for rev, st, em in zip(args.revisions, steps, embedding, strict=True):
            report["revisions"][rev] = {
                "step_ms_rounds": st, "embedding_ms_rounds": em,
                "step_ms": statistics.median(st), "embedding_ms": statistics.median(em),
                "speed_vs_base": statistics.median(b / x for b, x in zip(steps[0], st, strict=True)),
                "embedding_speed_vs_base": statistics.median(
                    b / x for b, x in zip(embedding[0], em, strict=True)),
            }
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
