"""What a tier cache faces on a synthetic model: distinct rows per step, the offline oracle's
hit rate and misses per step at a cache of a fraction of each table's rows, next to the
planner's analytic estimate (:func:`embtrain.plan.hitrate.top_mass`).

    python benchmarks/tier_hitrate.py --model tiny --batch 65536 --steps 8 --fractions 0.1,0.5

Batches are ``bench``'s (:func:`embtrain.bench.inputs.generate`, same seed and alpha). Tables
whose rows all fit the cache are counted as hits.

``by_budget`` compares, for one memory budget shared by all tables (a fraction of all tables'
bytes: values, Adagrad state and metadata), the global oracle (the most used rows of any table,
greedily by steps seen per byte) with each table's own oracle under two splits of the budget:
the same fraction of every table, and :func:`embtrain.plan.hitrate.split_cache` (one cutoff on
the expected draws per row across tables). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from embtrain.bench.inputs import power_law_ids
from embtrain.bench.synthetic import load_model
from embtrain.plan.hitrate import split_cache, top_mass
from embtrain.storage.oracle import oracle_hits, step_rows


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
    freq: dict[str, np.ndarray] = {}  # steps seen per distinct row, descending
    for table, members in by_table.items():
        steps = []
        for t in range(args.steps):
            ids = [power_law_ids(np.random.default_rng([args.seed, 1, n, t]), rows_of[table],
                                 args.alpha, args.batch * inputs[n].hotness) for n in members]
            steps.append(np.concatenate(ids))
        _, seen = np.unique(np.concatenate(step_rows(steps)), return_counts=True)
        freq[table] = np.sort(seen)[::-1]
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
    result["by_budget"] = _by_budget(freq, rows_of, dim_of, {
        t: args.batch * sum(inputs[n].hotness for n in m) for t, m in by_table.items()},
        fractions, args.alpha)
    print(json.dumps(result, indent=2))


def _by_budget(freq: dict[str, np.ndarray], rows_of: dict[str, int], dim_of: dict[str, int],
               draws: dict[str, int], fractions: list[float], alpha: float) -> dict[str, object]:
    names = list(freq)
    row_bytes = {t: 8 * dim_of[t] + 12 for t in names}  # values, adagrad, metadata
    total_bytes = sum(rows_of[t] * row_bytes[t] for t in names)
    lookups = sum(int(freq[t].sum()) for t in names)
    ratio = np.concatenate([freq[t] / row_bytes[t] for t in names])
    nbytes = np.concatenate([np.full(freq[t].shape[0], row_bytes[t]) for t in names])
    hits = np.concatenate([freq[t] for t in names])
    order = np.argsort(-ratio, kind="stable")
    cum_bytes = np.cumsum(nbytes[order])
    cum_hits = np.cumsum(hits[order])
    out: dict[str, object] = {}
    for f in fractions:
        budget = int(f * total_bytes)
        taken = int(np.searchsorted(cum_bytes, budget, side="right"))
        oracle = int(cum_hits[taken - 1]) if taken else 0
        same = sum(int(freq[t][: int(f * rows_of[t])].sum()) for t in names)
        split = split_cache([rows_of[t] for t in names], [row_bytes[t] for t in names],
                            [float(draws[t]) for t in names], budget, alpha)
        cut = sum(int(freq[t][:c].sum()) for t, c in zip(names, split, strict=True))
        out[str(f)] = {"budget_bytes": budget, "global_oracle_hit_rate": oracle / lookups,
                       "same_fraction_split_hit_rate": same / lookups,
                       "split_cache_hit_rate": cut / lookups,
                       "split_cache_bytes": sum(c * row_bytes[t]
                                                for t, c in zip(names, split, strict=True))}
    return out


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
