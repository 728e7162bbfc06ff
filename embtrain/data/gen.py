"""Deterministic synthetic CTR data for a recipe or a preset (``embtrain gen-data``).

Layout: ``OUT/train/part-00000.parquet …``, ``OUT/eval/part-00000.parquet …`` and
``OUT/dataset.json``. The same arguments give byte-identical files.

Columns are exactly what the recipe reads: dense columns (``log1p`` features: non-negative
heavy-tailed int64 counts; ``signed_log1p``: signed heavy-tailed float32; ``none``: normal
float32; about 5 % nulls only where the feature has a ``fill_null``), id columns (int64, or
``"v<id>"`` strings for ``ids: string``), list<int64|string> columns for ``hotness: N``
(lengths 1..N; exactly N with ``combiner: concat``) or ``variable`` (lengths 1..20), float32
weight columns shaped like their ids, and an int8 label.

Ids: logical id ``k`` in ``[0, n)`` has probability ∝ ``(k+1)^-alpha`` (exact for
``k < 2**20``, a continuous approximation of the tail beyond). ``n`` is a static table's
``rows``; a dynamic table draws from ``4 × capacity`` logical ids, written as
``splitmix64(k ^ hash(table))`` reinterpreted as int64 (a fixed bijection, so ids spread over
int64).

A plan may override a column's ``encoding`` (``dense``: the logical id; ``int64``: the
scrambled id above; ``uint63``: ``mix63(k ^ hash(table))``, a bijection of ``[0, 2**63)``
like a database's 63-bit ids) and let its universe grow (``stages``): the train split is cut
into that many consecutive stages of rows, stage ``s`` draws from the first
``space × (s+1) / stages`` logical ids, and the eval split from all of them, so new ids keep
appearing in later rows and files. :func:`logical_ids` inverts an encoding: it maps the
written ids back to the logical ids ``0..space-1``, the same data with dense ids.

Labels come from a hidden ground-truth model: per (table, logical id) a latent scalar effect
and a latent vector of :data:`LATENT_DIM` values, drawn from a hash of (seed, table, id); the
logit sums dense weights × standardised transformed dense values, each feature's
(weighted-mean pooled) effect, and dot products of the pooled latent vectors of a few feature
pairs (the features with the smallest tables of at least 100 rows); the three parts are scaled to fixed shares of a logit standard deviation
:data:`LOGIT_STD`, and a bias sets the click rate to about :data:`TARGET_CTR`. The label is
Bernoulli(sigmoid(logit)). The best achievable AUC and log loss (those of the true
probabilities on the eval split) are printed and stored in ``dataset.json``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embtrain.data.gen_plan import (
    DEFAULT_CONFIG,
    LATENT_DIM,
    LOGIT_STD,
    ROW_GROUP_ROWS,
    SHARES,
    TARGET_CTR,
    GenConfig,
    GenPlan,
    GenResult,
    make_plan,
)
from embtrain.data.gen_sampling import gen_rows
from embtrain.data.gen_truth import Truth, calibrate, probability
from embtrain.errors import UserInputError
from embtrain.metrics import auc, logloss
from embtrain.recipe.models import Recipe

# -------------------------------------------------------------------------------- write


def _arrow_type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_arrow_type_name(t.value_type)}>"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    return "string" if pa.types.is_string(t) else str(t)


def _write_split(plan: GenPlan, truth: Truth, config: GenConfig, out: Path, split: str,
                 rows: int) -> tuple[list[str], np.ndarray, np.ndarray, dict[str, str]]:
    folder = out / split
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("part-*.parquet"):
        stale.unlink()
    files = max(1, min(config.files, rows)) if rows else 0
    names: list[str] = []
    probs: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    types: dict[str, str] = {}
    split_code = 0 if split == "train" else 1
    for f in range(files):
        n = (f + 1) * rows // files - f * rows // files
        rng = np.random.default_rng((config.seed, split_code, f))
        position = (f * rows // files, rows) if split == "train" else None
        gen = gen_rows(plan, n, rng, config.seed, config.alpha, position)
        p = probability(plan, gen, truth)
        y = (rng.random(n) < p).astype(np.int8)
        cols = dict(gen.columns)
        cols[plan.label] = pa.array(y.astype(np.float32) if plan.label_float else y)
        table = pa.table(cols)
        path = folder / f"part-{f:05d}.parquet"
        pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, compression="snappy")
        names.append(str(path.relative_to(out)))
        probs.append(p)
        labels.append(y)
        types = {name: _arrow_type_name(table.schema.field(name).type) for name in table.column_names}
    return names, np.concatenate(probs or [np.zeros(0)]), np.concatenate(labels or [np.zeros(0)]), types


MAX_ROWS = 2**40
MAX_FILES = 100_000


def check_config(config: GenConfig) -> None:
    """Refuse out-of-range arguments with one line naming the option."""
    from embtrain.recipe.models import MAX_SEED

    if not 1 <= config.rows <= MAX_ROWS:
        raise UserInputError(f"gen-data: --rows {config.rows}: give 1 to {MAX_ROWS}")
    if not 0 <= config.eval_rows <= MAX_ROWS:
        raise UserInputError(f"gen-data: --eval-rows {config.eval_rows}: give 0 to {MAX_ROWS}")
    if not 1 <= config.files <= MAX_FILES:
        raise UserInputError(f"gen-data: --files {config.files}: give 1 to {MAX_FILES}")
    if not (math.isfinite(config.alpha) and 0 < config.alpha <= 100):
        raise UserInputError(f"gen-data: --alpha {config.alpha}: give a number in (0, 100]")
    if not 0 <= config.seed <= MAX_SEED:
        raise UserInputError(f"gen-data: --seed {config.seed}: give an integer in [0, {MAX_SEED}]")


def generate(recipe: Recipe, out: str | Path, config: GenConfig = DEFAULT_CONFIG,
             source: dict[str, str] | None = None, plan: GenPlan | None = None) -> GenResult:
    """Write train and eval Parquet files and ``dataset.json`` for ``recipe`` under ``out``
    (``plan``: what to write, by default :func:`make_plan` of the recipe)."""
    check_config(config)
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan or make_plan(recipe)
    truth = calibrate(plan, config)
    train, p_train, y_train, columns = _write_split(plan, truth, config, out, "train", config.rows)
    evals, p_eval, y_eval, _ = _write_split(plan, truth, config, out, "eval", config.eval_rows)
    p_ref, y_ref = (p_eval, y_eval) if config.eval_rows else (p_train, y_train)
    auc_best, loss = auc(y_ref, p_ref), logloss(y_ref, p_ref)
    ctr_eval = float(y_eval.mean()) if y_eval.size else float("nan")
    info = {
        "generator": "embtrain gen-data",
        "source": source or {"recipe": recipe.name or ""},
        "seed": config.seed,
        "alpha": config.alpha,
        "rows": {"train": config.rows, "eval": config.eval_rows},
        "files": {"train": train, "eval": evals},
        "columns": columns,
        "label": plan.label,
        "ctr": {"train": round(float(y_train.mean()), 6),
                "eval": None if math.isnan(ctr_eval) else round(ctr_eval, 6)},
        "best_auc": round(auc_best, 6),
        "best_logloss": round(loss, 6),
        "best_metrics_split": "eval" if config.eval_rows else "train",
        "ids": {c.column: {"table": c.table, "encoding": c.id_encoding, "universe": c.space,
                           "stages": c.stages}
                for c in plan.ids if not c.string_ids},
        "ground_truth": {
            "logit_std": LOGIT_STD, "target_ctr": TARGET_CTR, "bias": round(truth.bias, 6),
            "latent_dim": LATENT_DIM, "shares": SHARES,
            "interactions": [[plan.ids[a].feature, plan.ids[b].feature]
                             for a, b in plan.interactions],
        },
    }
    (out / "dataset.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return GenResult(out, tuple(train), tuple(evals), config.rows, config.eval_rows, auc_best, loss,
                     float(y_train.mean()), ctr_eval, time.perf_counter() - start, columns,
                     plan.notes)
