"""`embtrain bench --precision bf16 | fp16`: half precision against float32, same batches.

The half side (``embtrain``) trains the synthetic model with its tables in the half dtype
(``bfloat16`` / ``float16``) and ``train.mixed_precision`` set to match; the ``float32`` side
is the same embtrain with float32 tables and network. Both read the same pre-generated
batches, one after the other in child processes, in interleaved rounds (``--repeat``); the
baseline (native TensorFlow, float32) runs in each round too. The result says, per round and
as the median of the rounds, how much faster the half side's whole step, embedding part and
dense part are, the bytes of the tables' values and optimizer state as the engine allocated
them, each side's peak RSS, and the loss each side reached after the same steps.

Where this engine has no half tables yet (:data:`embtrain.embedding.config.SUPPORTED_DTYPES`)
the half side keeps float32 tables and the result says so (``tables_dtype``).
"""

from __future__ import annotations

from statistics import median
from typing import Any

PRECISIONS: dict[str, tuple[str, str]] = {  # --precision: (table dtype, mixed_precision)
    "bf16": ("bfloat16", "bf16"),
    "fp16": ("float16", "fp16"),
}
FLOAT32_SIDE = "float32"
TARGET_STEP = 1.6  # issue 30: whole step, half vs float32 (DE tiny, batch 65536, Adagrad)
TARGET_EMBEDDING = 1.3  # the embedding part
TARGET_VALUE_BYTES = 0.5  # the tables' values: half of float32's


def half_tables_supported(dtype: str) -> bool:
    """Whether this engine stores tables in ``dtype``."""
    from embtrain.embedding.config import SUPPORTED_DTYPES

    return dtype in SUPPORTED_DTYPES


def side_precision(precision: str) -> tuple[str, str]:
    """``(table dtype, mixed_precision)`` of the half side for ``--precision``."""
    table_dtype, mixed = PRECISIONS[precision]
    return (table_dtype if half_tables_supported(table_dtype) else "float32"), mixed


def precision_recipe(recipe: Any, table_dtype: str, mixed_precision: str,
                     optimizer_state: str | None = None) -> Any:
    """``recipe`` with every table in ``table_dtype`` (its optimizer state in
    ``optimizer_state``: ``float32`` or ``table``, for half tables) and the dense network in
    ``mixed_precision``."""
    if table_dtype == "float32" and mixed_precision == "none":
        return recipe
    half = table_dtype != "float32" and optimizer_state is not None
    tables = [t.model_copy(update={"dtype": table_dtype,
                                   **({"optimizer_state": optimizer_state} if half else {})})
              for t in recipe.tables]
    train = recipe.train.model_copy(update={"mixed_precision": mixed_precision})
    return recipe.model_copy(update={"tables": tables, "train": train})


def engine_bytes(embedding: Any) -> dict[str, int]:
    """Bytes of the tables' values and optimizer state as this rank's engine allocated them
    (read from the arrays, so a half table counts what it really holds)."""
    engines = [getattr(embedding, "engine", None)]
    dp = getattr(embedding, "dp", None)
    if dp is not None:
        engines.append(getattr(dp, "engine", None))
    values = slots = 0
    for engine in engines:
        for group in getattr(engine, "_groups", []):  # the fused groups' arrays
            values += int(getattr(group.values, "nbytes", 0))
            slots += sum(int(getattr(s, "nbytes", 0)) for s in (group.slots or []))
    return {"values": values, "optimizer_state": slots}


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summary(precision: str, reports: dict[str, dict[str, Any]],
            rounds: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """The half side (``embtrain``) against ``float32``: per-round and median speed-ups
    (float32 ms ÷ half ms), memory and losses."""
    half, full = reports["embtrain"], reports[FLOAT32_SIDE]
    per_round = [
        {part: _div(f[part], h[part]) for part in ("step", "embedding", "dense")}
        for h, f in zip(rounds["embtrain"], rounds[FLOAT32_SIDE], strict=True)
    ]

    def med(part: str) -> float | None:
        vals = [r[part] for r in per_round if r[part] is not None]
        return float(median(vals)) if vals else None

    speedup = {part: med(part) for part in ("step", "embedding", "dense")}
    spread = {part: [min(r[part] or 0.0 for r in per_round), max(r[part] or 0.0 for r in per_round)]
              for part in ("step", "embedding", "dense")}
    hb, fb = half.get("engine_bytes") or {}, full.get("engine_bytes") or {}
    value_ratio = _div(hb.get("values"), fb.get("values"))
    return {
        "precision": precision,
        "tables_dtype": half.get("table_dtype", "float32"),
        "mixed_precision": half.get("mixed_precision", "none"),
        "speedup": speedup,  # median over rounds of float32 ms ÷ half ms
        "speedup_spread": spread,  # [min, max] over the rounds
        "rounds": per_round,
        "engine_bytes": {"half": hb, "float32": fb},
        "value_bytes_ratio": value_ratio,
        "peak_rss_ratio": _div(half["peak_rss_bytes"], full["peak_rss_bytes"]),
        "loss_last": {"half": half.get("loss_last"), "float32": full.get("loss_last")},
        "targets": {
            "step_at_least_1_6x": speedup["step"] is not None and speedup["step"] >= TARGET_STEP,
            "embedding_at_least_1_3x": speedup["embedding"] is not None
            and speedup["embedding"] >= TARGET_EMBEDDING,
            "values_half_of_float32": value_ratio is not None
            and value_ratio <= TARGET_VALUE_BYTES + 1e-9,
        },
    }


def half_alone(precision: str, half: dict[str, Any], why: str) -> dict[str, Any]:
    """The half side's figures when the float32 side could not run (``why``): no speed-up,
    the memory it took."""
    return {
        "precision": precision,
        "tables_dtype": half.get("table_dtype", "float32"),
        "mixed_precision": half.get("mixed_precision", "none"),
        "float32_side_not_run": why,
        "engine_bytes": {"half": half.get("engine_bytes") or {}},
        "peak_rss_bytes": half["peak_rss_bytes"],
        "loss_first": half.get("loss_first"),
        "loss_last": half.get("loss_last"),
    }


def round_figures(report: dict[str, Any]) -> dict[str, float]:
    """One round's medians of a side: whole step, embedding part, dense part (ms)."""
    return {"step": report["step_ms"]["median"], "embedding": report["embedding_ms"]["median"],
            "dense": report["phases_ms"]["dense"]}
