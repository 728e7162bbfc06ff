"""What a tier cache faces on a synthetic model: distinct rows per step, the offline oracle's
hit rate and misses per step at a cache of a fraction of each table's rows, next to the
planner's analytic estimate (:func:`embtrain.plan.hitrate.top_mass`).

    python benchmarks/tier_hitrate.py --model tiny --batch 65536 --steps 8 --fractions 0.1,0.5

Batches are ``bench``'s (:func:`embtrain.bench.inputs.generate`, same seed and alpha). Tables
whose rows all fit the cache are counted as hits. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from embtrain.bench.inputs import power_law_ids
from embtrain.bench.synthetic import load_model
from embtrain.plan.hitrate import top_mass
from embtrain.storage.oracle import oracle_hits


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--fractions", default="0.1,0.5")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    model = load_model(args.model)
    fractions = [float(f) for f in args.fractions.split(",")]
    inputs = model.inputs()
    by_table: dict[str, list[int]] = {}
    for n, spec in enumerate(inputs):
        by_table.setdefault(spec.table, []).append(n)
    rows_of = {s.table: s.rows for s in inputs}
    dim_of = {s.table: s.dim for s in inputs}
    result: dict[str, object] = {
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "model": args.model,
        "batch": args.batch, "steps": args.steps, "alpha": args.alpha}
    totals = {f: {"lookups": 0, "oracle_hits": 0, "analytic_hits": 0.0} for f in fractions}
    big = []
    for table, members in by_table.items():
        steps = []
        for t in range(args.steps):
            ids = [power_law_ids(np.random.default_rng([args.seed, 1, n, t]), rows_of[table],
                                 args.alpha, args.batch * inputs[n].hotness) for n in members]
            steps.append(np.concatenate(ids))
        for f in fractions:
            cached = int(f * rows_of[table])
            o = oracle_hits(steps, cached)
            totals[f]["lookups"] += o.lookups
            totals[f]["oracle_hits"] += o.hits
            # analytic: each distinct row of a step hits when it is among the `cached` most
            # likely; weight the rows by how often they appear in a step (not by lookups)
            totals[f]["analytic_hits"] += o.lookups * _distinct_top_share(
                rows_of[table], args.alpha, cached, args.batch * sum(
                    inputs[n].hotness for n in members))
        if rows_of[table] >= 1_000_000:
            big.append({"table": table, "rows": rows_of[table], "dim": dim_of[table],
                        "distinct_rows_per_step": int(np.mean([np.unique(s).shape[0]
                                                               for s in steps]))})
    result["large_tables"] = big
    result["by_fraction"] = {
        str(f): {"distinct_rows_per_step": v["lookups"] / args.steps,
                 "oracle_hit_rate": v["oracle_hits"] / v["lookups"],
                 "oracle_misses_per_step": (v["lookups"] - v["oracle_hits"]) / args.steps,
                 "analytic_hit_rate": v["analytic_hits"] / v["lookups"]}
        for f, v in totals.items()}
    print(json.dumps(result, indent=2))


def _distinct_top_share(rows: int, alpha: float, cached: int, draws: int) -> float:
    """Expected share of a step's distinct rows that are among the ``cached`` most likely,
    when a step draws ``draws`` ids: row k appears with probability 1 - (1 - p_k)^draws.
    Summed exactly over the first 2^20 rows and in strides beyond."""
    from embtrain.plan.hitrate import harmonic

    total = harmonic(rows, alpha)
    head = min(rows, 1 << 20)
    k = np.arange(1, head + 1, dtype=np.float64)
    appear = -np.expm1(draws * np.log1p(-(k ** -alpha) / total))
    inside = float(appear[:min(cached, head)].sum())
    outside = float(appear[min(cached, head):].sum())
    if rows > head:  # the tail in 4096 strata, midpoint per stratum
        edges = np.unique(np.geomspace(head, rows, 4097).astype(np.int64))
        mids = (edges[:-1] + edges[1:]) / 2.0
        widths = np.diff(edges).astype(np.float64)
        a = -np.expm1(draws * np.log1p(-(mids ** -alpha) / total)) * widths
        inside += float(a[edges[1:] <= cached].sum())
        outside += float(a[edges[1:] > cached].sum())
    _ = top_mass  # the lookup-weighted estimate the plan prints
    return inside / (inside + outside)


if __name__ == "__main__":
    main()
