"""The bench's 2-rank step over each same-machine transport, in interleaved rounds.

    python benchmarks/transport_ab.py [--model tiny] [--rounds 3] [--steps 20] [--batch 65536]
        [--transports shared_memory,horovod,mpi]

One set of batches (as ``embtrain bench`` makes them) and one side spec (embtrain on ``--np``
ranks); each round runs the side once per transport, in turn: ``shared_memory``
(:mod:`embtrain.comm.shm`, embtrain's launcher), ``horovod`` (Horovod over Gloo, embtrain's
launcher) and ``mpi`` (Horovod started by ``mpirun -np N``, as ``horovodrun``/``mpirun`` users
get it: Open MPI's shared-memory transport; needs a Horovod built with MPI in this Python, see
docs/DESIGN_NOTES.md). Prints one JSON document: per transport the rounds' medians of the
whole step, the embedding part and the communication phase (ms), their medians, and each
transport's step ÷ shared_memory's, round by round and the median.
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

from embtrain.bench.inputs import generate
from embtrain.bench.results import side_report
from embtrain.bench.synthetic import load_model
from embtrain.bench.worker import SideSpec
from embtrain.comm.launch import LaunchSpec, launch, thread_share

TRANSPORTS = ("shared_memory", "horovod", "mpi")


def run_once(transport: str, spec_path: Path, ranks: int) -> None:
    """One run of the side on ``transport``."""
    command = [sys.executable, "-m", "embtrain.bench.worker", str(spec_path)]
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    extra = {"EMBTRAIN_THREADS": threads, "NUMBA_NUM_THREADS": threads}
    if transport != "mpi":
        code = launch(command, LaunchSpec(ranks, transport=transport), extra)
    else:
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise SystemExit("transport_ab: mpi needs mpirun (Open MPI) on the PATH")
        env = {**thread_share(ranks), **os.environ, **extra}
        code = subprocess.call([mpirun, "--allow-run-as-root", "-np", str(ranks),
                                "--bind-to", "none", "--mca", "btl", "self,vader", *command],
                               env=env)
    if code != 0:
        raise SystemExit(f"transport_ab: the {transport} run failed (exit {code})")


def main() -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--transports", default=",".join(TRANSPORTS))
    args = ap.parse_args()
    transports = args.transports.split(",")
    unknown = set(transports) - set(TRANSPORTS)
    if unknown:
        raise SystemExit(f"transport_ab: unknown transport(s) {sorted(unknown)}")
    model = load_model(args.model)
    out: dict[str, Any] = {"model": model.name, "batch": args.batch, "ranks": args.np,
                           "steps": args.steps, "load_before": list(os.getloadavg())}
    figures: dict[str, list[dict[str, float]]] = {t: [] for t in transports}
    with tempfile.TemporaryDirectory(prefix="embtrain-transport-ab-") as tmp:
        work = Path(tmp)
        count = min(args.steps + args.warmup, 8)
        generate(model.inputs(args.scale), model.numerical, args.batch, count, 1.05,
                 seed=0).save(work / "batches")
        spec = SideSpec(side="embtrain", model=model.name, scale=args.scale, batch=args.batch,
                        optimizer="adagrad", steps=args.steps, warmup=args.warmup, seed=0,
                        batches_dir=str(work / "batches"), out=str(work / "out.json"),
                        processes=args.np)
        spec_path = work / "spec.json"
        spec_path.write_text(spec.to_json())
        for r in range(args.rounds):
            for transport in transports:
                print(f"round {r + 1}: {transport}", file=sys.stderr, flush=True)
                run_once(transport, spec_path, args.np)
                raw = json.loads((work / "out.json").read_text())
                rep = side_report(raw, args.batch)
                figures[transport].append({
                    "step": rep["step_ms"]["median"], "embedding": rep["embedding_ms"]["median"],
                    "communication": rep["phases_ms"]["communication"],
                    "transport": raw.get("comm", {}).get("transport", "?"),
                    "others_pct": rep.get("cpu_others_pct")})
    out["load_after"] = list(os.getloadavg())
    base = figures.get("shared_memory")
    for transport, rounds in figures.items():
        summary: dict[str, Any] = {"rounds": rounds}
        for key in ("step", "embedding", "communication"):
            summary[f"{key}_median_ms"] = statistics.median(f[key] for f in rounds)
        if base is not None:
            by_round = [f["step"] / b["step"] for f, b in zip(rounds, base, strict=True)]
            summary["step_over_shared_memory"] = by_round
            summary["step_over_shared_memory_median"] = statistics.median(by_round)
        out[transport] = summary
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
