"""Judging an `embtrain bench` run: the ratios between its sides and the pass/fail targets
(thresholds in :mod:`embtrain.bench.results`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from embtrain.bench.peer_fbgemm import peer_summary
from embtrain.bench.precision import (
    FLOAT32_SIDE,
    half_alone,
)
from embtrain.bench.precision import summary as precision_summary
from embtrain.bench.results import (
    TARGET_DYNAMIC_VS_STATIC,
    TARGET_EMBEDDING,
    TARGET_PLAN_BYTES,
    TARGET_RANKS_VS_ONE,
    TARGET_STEP,
    disturbed_sides,
    hash_table_rates,
    ratios,
    tier_targets,
)
from embtrain.bench.synthetic import SyntheticModel

if TYPE_CHECKING:
    from embtrain.bench.runner import BenchOptions


def judge(doc: dict[str, Any], reports: dict[str, dict[str, Any]],
          rounds: dict[str, list[dict[str, float]]], options: BenchOptions,
          model: SyntheticModel) -> None:
    """Fill ``doc`` from the sides' ``reports``: results, ratios and pass/fail targets (judged
    only when no side was disturbed)."""
    doc["ran"] = True
    doc["environment"]["load_average_after"] = (
        list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    )
    doc["results"] = reports
    emb = reports["embtrain"]
    doc["identical_batches"] = all(
        r["batch_digest"] == doc["batches"]["digest"] for r in reports.values()
    )
    doc["disturbed"] = disturbed_sides(reports)
    if options.baseline == "fbgemm":
        doc["peers"] = peer_summary(reports, rounds)
    if "comm" in emb:
        comm = emb["comm"]
        plan_bytes = comm["plan_exchange_bytes_per_step"]
        comm["measured_over_plan"] = (comm["exchange_bytes_per_step"] / plan_bytes
                                      if plan_bytes else None)
        doc["comm"] = comm
    if options.precision != "none":
        doc["half_precision"] = (precision_summary(options.precision, reports, rounds)
                                 if FLOAT32_SIDE in reports
                                 else half_alone(options.precision, emb,
                                                 doc["float32_side_not_run"]))
    if options.dynamic:
        doc["hash_table"] = hash_table_rates(model, options.scale)
    if "tiers" in doc and "tiers" in emb:
        doc["tiers"]["judged"] = tier_targets(doc["tiers"], emb, reports.get("static"))
        if "static" in reports:  # all in memory, same batches: what the tiers cost
            doc["ratios"] = ratios(emb, reports["static"])
    if options.dynamic:
        doc["ratios_static"] = ratios(emb, reports["static"])
        doc["targets"] = {
            "dynamic_embedding_at_least_0_8x_static":
                doc["ratios_static"]["embedding"] >= TARGET_DYNAMIC_VS_STATIC,
        }
        if options.baseline == "tfra":
            doc["ratios"] = ratios(emb, reports["tfra"])
            doc["targets"]["embedding_at_least_3x_tfra"] = (
                doc["ratios"]["embedding"] >= TARGET_EMBEDDING)
        else:
            doc["ratios"] = doc["ratios_static"]
        doc["targets_judged"] = not doc["disturbed"]
    elif options.baseline == "one-process":
        base = reports["one-process"]
        doc["ratios"] = ratios(emb, base)
        over = doc["comm"]["measured_over_plan"] if "comm" in doc else None
        doc["targets"] = {
            "ranks_at_least_0_8x_one_process": doc["ratios"]["step"] >= TARGET_RANKS_VS_ONE,
            "bytes_within_10pct_of_plan": over is not None
            and abs(over - 1.0) <= TARGET_PLAN_BYTES,
        }
        doc["targets_judged"] = not doc["disturbed"]
    elif options.baseline != "none" and not ("tiers" in doc and options.baseline == "static"):
        base = reports[options.baseline]
        doc["ratios"] = ratios(emb, base)
        doc["targets"] = {
            "embedding_at_least_3x": doc["ratios"]["embedding"] >= TARGET_EMBEDDING,
            "step_at_least_1_3x": doc["ratios"]["step"] >= TARGET_STEP,
            "memory_not_higher": emb["peak_rss_bytes"] <= base["peak_rss_bytes"],
        }
        doc["targets_judged"] = not doc["disturbed"]
