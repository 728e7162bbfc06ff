"""Rich rendering of a bench result (the JSON document of :mod:`embtrain.bench.runner`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from embtrain.bench.results import (
    DISTURBED_PCT,
    TARGET_DYNAMIC_VS_STATIC,
    TARGET_EMBEDDING,
    TARGET_PLAN_BYTES,
    TARGET_RANKS_VS_ONE,
    TARGET_STEP,
    TF_FUSED_RUNS,
)
from embtrain.bench.runner import Outcome
from embtrain.recipe.units import format_bytes

PHASE_LABELS = {
    "input": "input",
    "embedding_forward": "embedding forward",
    "dense": "dense forward + backward",
    "embedding_update": "embedding backward + update",
    "communication": "communication",
}


def _head(doc: dict[str, Any]) -> str:
    info = doc["model_info"]
    scale = "" if doc["scale"] == 1 else f" ×{doc['scale']:g} rows"
    return (
        f"embtrain bench: {doc['model']} ({info['tables']} tables, {info['inputs']} inputs, "
        f"{format_bytes(info['table_bytes'])} fp32{scale}), batch {doc['batch']}, "
        f"{doc['optimizer']}, alpha {doc['alpha']:g}"
    )


def _ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}×"


def _peer_notes(doc: dict[str, Any]) -> list[str]:
    """--baseline fbgemm: the peers' check and each peer ÷ embtrain round by round."""
    notes = []
    if "peer_check" in doc:
        notes.append("peers checked against embtrain's step on a small case (largest "
                     "differences: " + "; ".join(
                         f"{k} pooled {v['pooled']:.1e}, updated rows {v['updated']:.1e}"
                         for k, v in doc["peer_check"].items()) + ")")
    for side, summary in doc.get("peers", {}).items():
        parts = []
        for part, label in (("embedding", "embedding part"), ("step", "whole step")):
            s = summary[part]
            parts.append(f"{label} {side} " + ", ".join(f"{m:.0f}" for m in s[f"{side}_ms"])
                         + " ms against embtrain " + ", ".join(f"{m:.0f}" for m in s["embtrain_ms"])
                         + f": median ratio {s['ratio_median']:.2f}×")
        notes.append(f"{side} ÷ embtrain by round: " + "; ".join(parts))
    return notes


def render(outcome: Outcome, console: Console | None = None) -> None:
    """Print a bench outcome for people."""
    console = console or Console()
    doc = outcome.doc
    console.print(Text(_head(doc), style="bold"))
    if not doc["ran"]:
        _render_not_run(outcome, console)
        return
    results = doc["results"]
    emb = results["embtrain"]
    base_name = doc["baseline"] if doc["baseline"] != "none" else None
    base = results.get(base_name) if base_name else None
    ratios = doc.get("ratios", {})
    table = Table(
        title=f"{doc['steps']} timed steps after {doc['warmup']} warm-up, median ms",
        title_justify="left",
    )
    table.add_column("")
    table.add_column("embtrain", justify="right")
    if base is not None:
        table.add_column(str(base_name), justify="right")
        table.add_column(f"{base_name} ÷ embtrain", justify="right")

    def row(label: str, e: str, b: str = "", r: str = "", style: str | None = None) -> None:
        cells = [label, e] + ([b, r] if base is not None else [])
        table.add_row(*cells, style=style)

    for phase, label in PHASE_LABELS.items():
        e = emb["phases_ms"][phase]
        b = base["phases_ms"][phase] if base else 0.0
        r = _ratio(b / e) if base and e > 0 and b > 0 and phase != "communication" else ""
        row(label, f"{e:.1f}", f"{b:.1f}", r)
    if emb.get("hidden_communication_ms"):
        row("communication hidden behind compute (pipeline thread)",
            f"{emb['hidden_communication_ms']:.1f}")
    if "lookup_ahead_share" in emb:
        row("dynamic tables' lookup done ahead, in the step before (share)",
            f"{emb['lookup_ahead_share']:.0%}")
    row(
        "embedding part (fwd + bwd + update)",
        f"{emb['embedding_ms']['median']:.1f}",
        f"{base['embedding_ms']['median']:.1f}" if base else "",
        _ratio(ratios.get("embedding")),
        style="bold",
    )
    row(
        "whole step",
        f"{emb['step_ms']['median']:.1f}",
        f"{base['step_ms']['median']:.1f}" if base else "",
        _ratio(ratios.get("step")),
        style="bold",
    )
    row(
        "step p10 – p90",
        f"{emb['step_ms']['p10']:.1f} – {emb['step_ms']['p90']:.1f}",
        f"{base['step_ms']['p10']:.1f} – {base['step_ms']['p90']:.1f}" if base else "",
    )
    row(
        "samples/s", f"{emb['samples_per_s']:,.0f}", f"{base['samples_per_s']:,.0f}" if base else ""
    )
    row(
        "peak memory (RSS)",
        format_bytes(emb["peak_rss_bytes"]),
        format_bytes(base["peak_rss_bytes"]) if base else "",
        f"{ratios['peak_memory']:.2f} (embtrain ÷ {base_name})" if base else "",
    )
    console.print(table)
    if "half_precision" in doc:
        _render_half(doc["half_precision"], results, console)
    notes = [
        f"batches: {doc['batches']['count']} distinct, pre-generated, "
        f"{'identical on both sides' if doc['identical_batches'] else 'DIFFERENT between sides'} "
        f"(digest {doc['batches']['digest'][:12]})",
        "each side ran in its own child process, one after the other; peak memory is its VmHWM",
    ]
    shares = [
        f"{side} steal {r['cpu_steal_pct']:.0f}%, other processes {r['cpu_others_pct']:.0f}%"
        for side, r in results.items()
        if r.get("cpu_steal_pct") is not None
    ]
    if shares:
        notes.append(
            "CPU taken from the timed steps (of all cores): "
            + "; ".join(shares)
            + " — above a few percent, times are inflated"
        )
    if doc.get("repeat", 1) > 1:
        rounds = "; ".join(
            f"{side} " + ", ".join(f"{m:.0f}" for m in r["round_step_medians_ms"])
            for side, r in results.items()
        )
        notes.append(
            f"best of {doc['repeat']} alternating rounds per side (median step ms: {rounds})"
        )
    notes.extend(_peer_notes(doc))
    comm = doc.get("comm")
    if comm is not None:
        over = comm.get("measured_over_plan")
        notes.append(
            f"embtrain on {doc.get('processes', 1)} ranks (transport "
            f"{comm.get('transport', 'horovod').replace('_', ' ')}), exchange "
            f"{comm['quantize']}: {format_bytes(int(comm['exchange_bytes_per_step']))} per step "
            f"measured (ids, pooled vectors, gradients, data-parallel row sums; all ranks), "
            f"plan's estimate "
            f"{format_bytes(int(comm['plan_exchange_bytes_per_step']))}"
            + (f" (measured ÷ plan {over:.2f})" if over is not None else "")
            + f"; dense all-reduce {format_bytes(int(comm['dense_allreduce_bytes_per_step']))}; "
            f"{comm['seconds_per_step'] * 1000:.1f} ms per step in collectives (rank 0)"
        )
    if base is not None and base_name == "one-process":
        t = doc["targets"]
        disturbed = doc.get("disturbed") or {}
        notes.append(
            ("(not judged) " if disturbed else "")
            + f"targets: {doc.get('processes')} ranks ≥ {TARGET_RANKS_VS_ONE:g}× the samples/s "
            f"of one process {'met' if t['ranks_at_least_0_8x_one_process'] else 'MISSED'}, "
            f"bytes within {TARGET_PLAN_BYTES:.0%} of the plan "
            f"{'met' if t['bytes_within_10pct_of_plan'] else 'MISSED'}"
        )
    elif base is not None and doc.get("ratios_static"):
        t = doc["targets"]
        disturbed = doc.get("disturbed") or {}
        static = results["static"]
        notes.append(
            "embtrain: every table dynamic (a hash table of capacity = its rows, keys looked up "
            "and inserted each step); static: the same tables static, on the same ids "
            f"(embedding part {static['embedding_ms']['median']:.1f} ms, step "
            f"{static['step_ms']['median']:.1f} ms)"
        )
        line = (("(not judged) " if disturbed else "")
                + f"targets: embedding part ≥ {TARGET_DYNAMIC_VS_STATIC:g}× the static engine's "
                f"speed {'met' if t['dynamic_embedding_at_least_0_8x_static'] else 'MISSED'} "
                f"({doc['ratios_static']['embedding']:.2f}×)")
        if "embedding_at_least_3x_tfra" in t:
            line += (f"; embedding part ≥ {TARGET_EMBEDDING:g}× TFRA's "
                     f"{'met' if t['embedding_at_least_3x_tfra'] else 'MISSED'} "
                     f"({ratios['embedding']:.2f}×)")
        notes.append(line)
    elif base is not None and base_name == "static" and doc.get("tiers"):
        notes.append(
            f"static: the same tables all in memory, on the same batches (step "
            f"{base['step_ms']['median']:.1f} ms, peak {format_bytes(base['peak_rss_bytes'])})"
        )
    elif base is not None:
        fused = base.get("fused_runs", TF_FUSED_RUNS)
        notes.append(
            f"{base_name}: the whole step is {fused}; its phases come from a "
            f"phased run of the same ops (sum {base['phased_step_ms']['median']:.1f} ms)"
        )
        notes.append(
            f"{base_name} embedding part: phased {base['phased_embedding_ms']['median']:.1f} ms, "
            f"alone as {fused} {base['embedding_only_ms']['median']:.1f} ms "
            f"(the faster is used); inside the fused step, overlapped with the dense work, it "
            f"adds {base['embedding_marginal_ms']:.1f} ms"
        )
        if emb["peak_rss_bytes"] and base.get("timed_peak_rss_bytes"):
            notes.append(
                f"peak memory during the timed steps only: embtrain "
                f"{format_bytes(emb.get('timed_peak_rss_bytes') or 0)}, {base_name} "
                f"{format_bytes(base['timed_peak_rss_bytes'])}"
            )
        t = doc["targets"]
        disturbed = doc.get("disturbed") or {}
        if disturbed:
            lost = ", ".join(f"{side} {pct:.0f}%" for side, pct in disturbed.items())
            notes.append(
                f"[bold red]NOT a fair comparison[/]: CPU taken from the timed steps by steal "
                f"and other processes ({lost}, above {DISTURBED_PCT:g}%); the targets below are "
                f"not judged — rerun on a quiet machine"
            )
        notes.append(
            ("(not judged) " if disturbed else "") + f"targets: embedding ≥ {TARGET_EMBEDDING:g}× {'met' if t['embedding_at_least_3x'] else 'MISSED'}, "
            f"step ≥ {TARGET_STEP:g}× {'met' if t['step_at_least_1_3x'] else 'MISSED'}, "
            f"memory not higher {'met' if t['memory_not_higher'] else 'MISSED'}"
        )
    tiers = doc.get("tiers")
    measured = (doc.get("results") or {}).get("embtrain", {}).get("tiers")
    if tiers and measured:
        raw = tiers.get("disk_rates") or {}
        reads = raw.get("random_4k_reads_per_s") or {}
        notes.append(
            f"tiers: hit rate {100 * measured['hit_rate']:.1f} % of lookups (expected "
            f"{100 * tiers['expected_hit_rate']:.1f} %), "
            f"{measured['rows_read_per_step']:,.0f} rows read and "
            f"{measured['rows_written_per_step']:,.0f} written per step, I/O wait "
            f"{1000 * measured['wait_seconds_per_step']:.1f} ms per step; "
            f"{tiers['tiered_tables']} tables on disk under {tiers['disk']}, "
            f"{tiers['host_memory_bytes'] / 2**30:.2f} GiB for the caches"
            + (f"; that disk: {' / '.join(f'{float(v):,.0f}' for v in reads.values())} random "
               f"4 KiB reads/s at {' / '.join(reads)} in flight, sequential writes "
               f"{raw['sequential_write_bytes_per_s'] / 1e9:.2f} GB/s" if reads else "")
        )
        oracle = measured.get("oracle")
        if oracle:
            t, a = oracle["timed"], oracle["all_steps"]
            notes.append(
                f"tiers vs the offline oracle ({oracle['eviction']}; distinct rows per step, the "
                f"same batches and cache rows): timed steps {100 * t['cache_hit_rate']:.1f} % "
                f"against {100 * t['oracle_hit_rate']:.1f} % "
                f"({t['points_below_oracle']:+.1f} points below; {100 * t['first_touch_share']:.1f} "
                f"% of the lookups were rows never read before, the oracle starting empty "
                f"{100 * t['oracle_cold_hit_rate']:.1f} %, the most likely rows starting empty "
                f"{100 * t['likely_rows_cold_hit_rate']:.1f} %); all steps "
                f"{100 * a['cache_hit_rate']:.1f} % against {100 * a['oracle_hit_rate']:.1f} % "
                f"(empty at first: {100 * a['oracle_cold_hit_rate']:.1f} %)"
            )
        judged = tiers.get("judged")
        if judged:
            def verdict(v: bool | None) -> str:
                return "not measured" if v is None else ("met" if v else "MISSED")

            share, ratio = judged["tier_read_share_of_raw"], judged["step_over_bound"]
            notes.append(
                "tier targets: hit rate within 3 points of the oracle "
                f"{verdict(judged['hit_rate_within_3_points_of_oracle'])}; reads ≥ 0.8× the raw "
                f"rate at 16 in flight {verdict(judged['tier_reads_at_least_0_8x_raw'])}"
                + (f" ({share:.2f}×: {judged['tier_reads_per_s']:,.0f} blocks/s while reading)"
                   if share is not None else "")
                + f"; step within 15 % of max(in-memory step, reads ÷ raw rate) "
                f"{verdict(judged['overlap_within_15pct'])}"
                + (f" ({ratio:.2f}× of {judged['overlap_bound_ms']:.0f} ms)"
                   if ratio is not None else " (needs --baseline static)")
            )
    rates = doc.get("hash_table")
    if rates:
        notes.append(
            f"hash table alone (capacity {rates['capacity']:,}, random 63-bit keys, batches of "
            f"{rates['batch']:,}): " + "; ".join(
                f"load {r['load_factor']:.2f}: {r['inserts_per_s'] / 1e6:.1f} M inserts/s, "
                f"{r['lookups_per_s'] / 1e6:.1f} M lookups/s" for r in rates["by_load_factor"])
        )
    env = doc.get("environment", {})
    if env:
        versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
        load = env.get("load_average") or [0.0]
        after = env.get("load_average_after") or [0.0]
        notes.append(
            f"{env.get('cpu_isa') or env.get('cpu')}, {env.get('cores')} cores, "
            f"{format_bytes(env.get('memory_bytes', 0))}; {versions}; {env.get('date')}; "
            f"load average {load[0]:.2f} before, {after[0]:.2f} after"
        )
    for note in notes:
        console.print(f"  • {note}")


def _render_half(half: dict[str, Any], results: dict[str, Any], console: Console) -> None:
    """The half side (``embtrain``) against float32 embtrain on the same batches."""
    if "float32_side_not_run" in half:
        _render_half_alone(half, console)
        return
    h, f = results["embtrain"], results["float32"]
    table = Table(title=f"--precision {half['precision']}: tables {half['tables_dtype']}, "
                  f"mixed_precision {half['mixed_precision']} vs float32 (ms, median; speed-up "
                  "= median over rounds of float32 ÷ half)", title_justify="left")
    for col in ("", "half", "float32", "speed-up", "rounds min – max"):
        table.add_column(col, justify="left" if not col else "right")
    parts = {"step": ("whole step", "step_ms"), "embedding": ("embedding part", "embedding_ms"),
             "dense": ("dense forward + backward", None)}
    for part, (label, key) in parts.items():
        hv = h[key]["median"] if key else h["phases_ms"]["dense"]
        fv = f[key]["median"] if key else f["phases_ms"]["dense"]
        lo, hi = half["speedup_spread"][part]
        table.add_row(label, f"{hv:.1f}", f"{fv:.1f}", _ratio(half["speedup"][part]),
                      f"{lo:.2f} – {hi:.2f}")
    hb, fb = half["engine_bytes"]["half"], half["engine_bytes"]["float32"]
    for key, label in (("values", "tables' values"), ("optimizer_state", "optimizer state")):
        if key in hb and key in fb:
            table.add_row(label, format_bytes(hb[key]), format_bytes(fb[key]),
                          f"{hb[key] / fb[key]:.2f} (half ÷ float32)" if fb[key] else "")
    table.add_row("peak memory (RSS)", format_bytes(h["peak_rss_bytes"]),
                  format_bytes(f["peak_rss_bytes"]), f"{half['peak_rss_ratio']:.2f}")
    loss = half["loss_last"]
    table.add_row("loss after the same steps", f"{loss['half']:.5f}", f"{loss['float32']:.5f}")
    console.print(table)
    t = half["targets"]
    console.print(
        "targets: whole step ≥ 1.6× "
        f"{'met' if t['step_at_least_1_6x'] else 'MISSED'}, embedding part ≥ 1.3× "
        f"{'met' if t['embedding_at_least_1_3x'] else 'MISSED'}, values half of float32's "
        f"{'met' if t['values_half_of_float32'] else 'MISSED'}", highlight=False)


def _render_half_alone(half: dict[str, Any], console: Console) -> None:
    """The half side ran alone: its memory, and why float32 did not run."""
    held = half["engine_bytes"]["half"]
    console.print(
        f"--precision {half['precision']}: tables {half['tables_dtype']}, mixed_precision "
        f"{half['mixed_precision']} ran alone ({half['float32_side_not_run']}); tables' values "
        f"{format_bytes(held.get('values', 0))}, optimizer state "
        f"{format_bytes(held.get('optimizer_state', 0))}, peak memory (RSS) "
        f"{format_bytes(half['peak_rss_bytes'])}; loss {half['loss_first']:.5f} → "
        f"{half['loss_last']:.5f}", highlight=False)


def _render_not_run(outcome: Outcome, console: Console) -> None:
    doc = outcome.doc
    if outcome.plan is not None:
        from embtrain.plan.render import render_plan

        if outcome.plan.topology.to_dict() != doc.get("topology"):
            console.print("the plan on the smallest one-rank topology that holds the tables:")
        render_plan(outcome.plan, console, max_tables=8, max_ranks=4)
    console.print(Text("not run: ", style="bold red") + Text(doc["reason"]))
    console.print(f"needs: {format_bytes(doc['needed_bytes'])}")
    smallest = doc["smallest_topology"].get("description")
    if smallest:
        console.print(f"smallest topology that would run it: {smallest}")
