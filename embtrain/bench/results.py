"""What a bench run measured, summarised and judged against the issue's targets.

Pure functions of the sides' raw figures (:mod:`embtrain.bench.worker`'s output): step-time
statistics, the ratios of the two sides, the tier targets, and whether a side was disturbed
by other work on the machine. :mod:`embtrain.bench.runner` calls them; the renderer
(:mod:`embtrain.bench.report`) reads the targets.
"""

from __future__ import annotations

import contextlib
import os
import platform
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.bench.measure import PHASES
from embtrain.bench.synthetic import SyntheticModel
from embtrain.machine import this_cpu

TARGET_RANKS_VS_ONE = 0.8  # samples/s of N ranks ÷ one process with all cores
TARGET_PLAN_BYTES = 0.10  # measured exchange bytes within 10 % of the plan's estimate
# Targets of the issue (embtrain ÷ baseline).
TARGET_EMBEDDING = 3.0
TARGET_STEP = 1.3
# --dynamic: the embedding part through hash tables ÷ static tables on the same ids
TARGET_DYNAMIC_VS_STATIC = 0.8  # issue 31 (issue 17 asked 0.7)
# A side that lost more than this share of the machine's CPU (hypervisor steal plus other
# processes, percent of all cores × wall time) during its timed steps was slowed by
# something else: the comparison is reported but its targets are not judged.
DISTURBED_PCT = 5.0
#: what the whole step of embtrain's side and the TensorFlow baselines runs
TF_FUSED_RUNS = "one tf.function"


def summarize(values: list[float]) -> dict[str, float]:
    """Median, p10, p90, min and max in milliseconds."""
    a = np.asarray(values, dtype=np.float64) * 1000.0
    if a.size == 0:
        return {"median": 0.0, "p10": 0.0, "p90": 0.0, "min": 0.0, "max": 0.0}
    return {
        "median": float(np.median(a)),
        "p10": float(np.percentile(a, 10)),
        "p90": float(np.percentile(a, 90)),
        "min": float(a.min()),
        "max": float(a.max()),
    }


def side_report(raw: dict[str, Any], batch: int) -> dict[str, Any]:
    """Step-time statistics, phase medians and memory of one side."""
    timed = raw["timed"]
    phases = timed["phases"]
    emb = [
        f + u for f, u in zip(phases["embedding_forward"], phases["embedding_update"], strict=True)
    ]
    step_source = raw.get("fused", timed)["step"]
    step = summarize(step_source)
    out = {
        "step_ms": step,
        "samples_per_s": batch / (step["median"] / 1000.0) if step["median"] else 0.0,
        "phases_ms": {p: summarize(phases[p])["median"] for p in PHASES},
        "embedding_ms": summarize(emb),
        "peak_rss_bytes": raw["peak_rss_bytes"],
        "timed_peak_rss_bytes": raw.get("timed_peak_rss_bytes"),
        "end_rss_bytes": raw.get("end_rss_bytes"),
        "built_rss_bytes": raw.get("built_rss_bytes"),
        "built_peak_rss_bytes": raw.get("built_peak_rss_bytes"),
        "warmup_peak_rss_bytes": raw.get("warmup_peak_rss_bytes"),
        "build_seconds": raw["build_seconds"],
        "cpu_steal_pct": raw.get("steal_pct"),
        "cpu_others_pct": raw.get("others_pct"),
        "batch_digest": raw["batch_digest"],
        "loss_first": raw["losses"][0] if raw["losses"] else None,
        "loss_last": raw["losses"][-1] if raw["losses"] else None,
    }
    if "hidden_communication" in timed:  # the pipeline's thread, overlapping the step
        out["hidden_communication_ms"] = summarize(timed["hidden_communication"])["median"]
    if timed.get("lookup_ahead_share"):  # the look-ahead's thread, in the step before
        out["lookup_ahead_share"] = float(np.median(timed["lookup_ahead_share"]))
    for key in ("engine_bytes", "table_dtype", "mixed_precision",  # embtrain's sides
                "dynamic_tables", "tiered_tables"):
        if key in raw:
            out[key] = raw[key]
    if "tiers" in raw:
        out["tiers"] = raw["tiers"]
    for key in ("live_keys", "versions"):  # the tfra child: keys per hash table, its versions
        if key in raw:
            out[key] = raw[key]
    if "comm" in raw:
        out["comm"] = raw["comm"]
        out["processes"] = raw.get("processes", 1)
    if "fused" in raw:
        # what the side's whole step runs: a baseline of another framework says so itself
        runs = out["fused_runs"] = raw.get("fused_runs", TF_FUSED_RUNS)
        out["step_source"] = f"{runs} per step (fused); phases from a phased run"
        out["phased_step_ms"] = summarize(timed["step"])
        out["phased_embedding_ms"] = out["embedding_ms"]
        out["embedding_only_ms"] = summarize(raw["embedding_only"])
        # Embedding time of the baseline: the faster of the phased split and the embedding
        # part run alone as one fused step (never handicap the baseline).
        if out["embedding_only_ms"]["median"] < out["phased_embedding_ms"]["median"]:
            out["embedding_ms"] = out["embedding_only_ms"]
            out["embedding_source"] = f"embedding part alone, {runs}"
        else:
            out["embedding_source"] = "phased run: forward + backward and update"
        # What the embedding part adds to the fused step once TF overlaps it with the dense
        # work: fused step minus the phased dense and input medians (shown, not a target).
        out["embedding_marginal_ms"] = (
            step["median"] - out["phases_ms"]["dense"] - out["phases_ms"]["input"]
        )
    else:
        out["step_source"] = "sum of the timed phases"
    return out


def environment() -> dict[str, Any]:
    """Machine and versions, for the record."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"python": platform.python_version()}
    for dist in ("embtrain", "numpy", "numba", "tensorflow-cpu", "tensorflow", "keras"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    total = 0
    with contextlib.suppress(ValueError, OSError, AttributeError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpu": cpu,
        "cpu_isa": this_cpu().summary(),
        "cores": os.cpu_count(),
        "memory_bytes": total,
        "load_average": list(load),
        "platform": platform.platform(),
        "versions": versions,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# Tier targets of the issue: the tier's reads ≥ this share of the raw random-read rate at the
# same requests in flight, and the tiered step within this share above
# max(in-memory step, the step's reads ÷ that raw rate).
TARGET_TIER_READ_SHARE = 0.8
TARGET_TIER_OVERLAP = 0.15
TIER_DEPTH = 16  # requests a disk tier keeps in flight (embtrain.storage.store.DiskStore)


def tier_targets(tiers: dict[str, Any], emb: dict[str, Any],
                 memory: dict[str, Any] | None) -> dict[str, Any]:
    """The issue's performance targets of a tiered run, from this invocation's figures (None:
    not measurable here, e.g. without the in-memory side or without reads)."""
    m = emb["tiers"]
    raw = (tiers.get("disk_rates") or {}).get("random_4k_reads_per_s") or {}
    raw_rate = float(raw.get(str(TIER_DEPTH), 0.0)) or None
    blocks = m.get("read_blocks_per_step", 0.0)
    # wall time any tier file was reading (tables read at once share the 16 requests)
    seconds = m.get("read_busy_seconds_per_step", m.get("read_seconds_per_step", 0.0))
    tier_rate = blocks / seconds if seconds > 0 and blocks > 0 else None
    share = tier_rate / raw_rate if tier_rate and raw_rate else None
    oracle = m.get("oracle")
    step = emb["step_ms"]["median"] / 1000
    bound = None
    if memory is not None and raw_rate:
        bound = max(memory["step_ms"]["median"] / 1000, blocks / raw_rate)
    return {
        "hit_rate_points_below_oracle": oracle["timed"]["points_below_oracle"] if oracle else None,
        "hit_rate_within_3_points_of_oracle": oracle["within_target"] if oracle else None,
        "raw_reads_per_s": raw_rate, "tier_reads_per_s": tier_rate,
        "tier_read_share_of_raw": share,
        "tier_reads_at_least_0_8x_raw": None if share is None
        else share >= TARGET_TIER_READ_SHARE,
        "overlap_bound_ms": None if bound is None else 1000 * bound,
        "step_over_bound": None if bound is None else step / bound,
        "overlap_within_15pct": None if bound is None
        else step <= (1 + TARGET_TIER_OVERLAP) * bound,
    }


def hash_table_rates(model: SyntheticModel, scale: float) -> dict[str, Any]:
    """Inserts and lookups per second of one dynamic table alone (the model's largest, its
    keys random 63-bit values), at the load factors the table passes while it fills."""
    from embtrain.embedding.dynamic import hash_table_rates as rates

    rows = max(t.rows for t in model.tables(scale))
    return rates(max(rows, 1024))


def disturbed_sides(reports: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Sides whose timed steps lost more than ``DISTURBED_PCT`` % of the CPU to hypervisor
    steal and other processes, with that share (sides without /proc/stat figures: never)."""
    out = {}
    for side, r in reports.items():
        steal, others = r.get("cpu_steal_pct"), r.get("cpu_others_pct")
        if steal is None and others is None:
            continue
        share = float(steal or 0.0) + float(others or 0.0)
        if share > DISTURBED_PCT:
            out[side] = round(share, 1)
    return out


def ratios(emb: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """Baseline ÷ embtrain (above 1: embtrain faster) for the step and the embedding part."""

    def div(a: float, b: float) -> float:
        return a / b if b else float("inf")

    return {
        "step": div(base["step_ms"]["median"], emb["step_ms"]["median"]),
        "embedding": div(base["embedding_ms"]["median"], emb["embedding_ms"]["median"]),
        "embedding_forward": div(
            base["phases_ms"]["embedding_forward"], emb["phases_ms"]["embedding_forward"]
        ),
        "embedding_update": div(
            base["phases_ms"]["embedding_update"], emb["phases_ms"]["embedding_update"]
        ),
        "dense": div(base["phases_ms"]["dense"], emb["phases_ms"]["dense"]),
        "peak_memory": div(emb["peak_rss_bytes"], base["peak_rss_bytes"]),
    }
