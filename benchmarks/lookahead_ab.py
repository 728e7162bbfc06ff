"""Dynamic tables' look-ahead on and off against static tables, interleaved in one invocation.

`embtrain bench --model tiny --dynamic --baseline static` compares dynamic with static tables;
this script adds the same dynamic side with the pipeline stage off (no look-ahead: the
lookup runs in the forward), so one run gives both ratios on the same batches, in rounds
that alternate the three sides (each side a child process, as the bench runs them). It
prints the medians over the rounds of each side's median embedding part and whole step, and
the ratios per round.

    python benchmarks/lookahead_ab.py --rounds 3 --steps 6 --warmup 3

``--warmup 3`` with 8 distinct batches: the timed steps insert new keys (issue 31's target
is measured so).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from embtrain.bench.inputs import generate
from embtrain.bench.results import side_report
from embtrain.bench.sides import run_side
from embtrain.bench.synthetic import load_model
from embtrain.bench.worker import SideSpec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--batches", type=int, default=8, help="distinct batches in a ring")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    model = load_model(args.model)
    sides = {  # name: (dynamic, pipeline)
        "dynamic, look-ahead": (True, True),
        "dynamic, no look-ahead": (True, False),
        "static": (False, True),
    }
    got: dict[str, list[dict]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory(prefix="embtrain-lookahead-") as tmp:
        work = Path(tmp)
        generate(model.inputs(args.scale), model.numerical, args.batch, args.batches, 1.05,
                 seed=0).save(work / "batches")
        for r in range(args.rounds):
            for i, (name, (dynamic, pipeline)) in enumerate(sides.items()):
                spec = SideSpec(side="embtrain" if dynamic else "static", model=model.name, scale=args.scale,
                                batch=args.batch, optimizer="adagrad", steps=args.steps,
                                warmup=args.warmup, seed=0, batches_dir=str(work / "batches"),
                                out=str(work / f"side{i}.json"), dynamic=dynamic,
                                pipeline=pipeline)
                report = side_report(run_side(spec, work), args.batch)
                got[name].append(report)
                share = report.get("lookup_ahead_share")
                print(f"round {r + 1}: {name}: embedding part "
                      f"{report['embedding_ms']['median']:.1f} ms (forward "
                      f"{report['phases_ms']['embedding_forward']:.1f}), step "
                      f"{report['step_ms']['median']:.1f} ms"
                      + (f", lookup done ahead {share:.0%}" if share is not None else ""),
                      flush=True)

    def med(name: str, key: str) -> float:
        return statistics.median(x[key]["median"] for x in got[name])

    def ratios(name: str, key: str) -> list[float]:
        return [s[key]["median"] / d[key]["median"]
                for s, d in zip(got["static"], got[name], strict=True)]

    out = {name: {"embedding_ms": med(name, "embedding_ms"), "step_ms": med(name, "step_ms"),
                  "embedding_static_ratio_per_round": ratios(name, "embedding_ms"),
                  "step_static_ratio_per_round": ratios(name, "step_ms"),
                  "lookup_ahead_share": [x.get("lookup_ahead_share") for x in got[name]]}
           for name in sides}
    if args.json:
        print(json.dumps(out))
        return 0
    for name, o in out.items():
        er, sr = o["embedding_static_ratio_per_round"], o["step_static_ratio_per_round"]
        print(f"{name:24s} embedding part {o['embedding_ms']:7.1f} ms (static ÷ it: median "
              f"{statistics.median(er):.2f}, rounds {min(er):.2f}-{max(er):.2f}); step "
              f"{o['step_ms']:7.1f} ms (static ÷ it: {statistics.median(sr):.2f}, "
              f"{min(sr):.2f}-{max(sr):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
