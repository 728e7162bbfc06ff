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
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from embtrain.data.kernels import hash_strings
from embtrain.errors import UserInputError
from embtrain.recipe.models import Recipe

LATENT_DIM = 4
LOGIT_STD = 1.45
TARGET_CTR = 0.25
NULL_RATE = 0.05
VARIABLE_MAX_LEN = 20
DYNAMIC_SPACE = 4
ROW_GROUP_ROWS = 131_072
SHARES = {"dense": 0.3, "categorical": 0.55, "interactions": 0.15}
MAX_INTERACTION_FEATURES = 4
EFFECT_DECAY = 0.15  # effect of logical id k is scaled by (1 + k) ** -EFFECT_DECAY
_EXACT_HEAD = 1 << 20
_CALIBRATION_ROWS = 100_000



# ------------------------------------------------------------------------------ hashing


_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK63 = np.uint64((1 << 63) - 1)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(_M1)
    x ^= x >> np.uint64(27)
    x *= np.uint64(_M2)
    x ^= x >> np.uint64(31)
    return x


def _unshift(x: np.ndarray, shift: int, mask: np.uint64) -> np.ndarray:
    """Inverse of ``x ^= x >> shift`` on values of ``mask``'s width (``mask``: all ones)."""
    y = x.copy()
    for _ in range(64 // shift + 1):
        y = (x ^ (y >> np.uint64(shift))) & mask
    return y


def _unmix64(x: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_mix64`."""
    ones = np.uint64(0xFFFFFFFFFFFFFFFF)
    x = _unshift(x.astype(np.uint64, copy=True), 31, ones)
    x = x * np.uint64(pow(_M2, -1, 1 << 64))
    x = _unshift(x, 27, ones)
    x = x * np.uint64(pow(_M1, -1, 1 << 64))
    return _unshift(x, 30, ones)


def _mix63(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer modulo 2**63: a bijection of ``[0, 2**63)``."""
    x = x.astype(np.uint64, copy=True) & _MASK63
    x ^= x >> np.uint64(30)
    x = (x * np.uint64(_M1)) & _MASK63
    x ^= x >> np.uint64(27)
    x = (x * np.uint64(_M2)) & _MASK63
    x ^= x >> np.uint64(31)
    return x


def _unmix63(x: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_mix63`."""
    x = _unshift(x.astype(np.uint64, copy=True) & _MASK63, 31, _MASK63)
    x = (x * np.uint64(pow(_M2, -1, 1 << 63))) & _MASK63
    x = _unshift(x, 27, _MASK63)
    x = (x * np.uint64(pow(_M1, -1, 1 << 63))) & _MASK63
    return _unshift(x, 30, _MASK63)


ENCODINGS: tuple[str, ...] = ("dense", "int64", "uint63")


def encode_ids(k: np.ndarray, table: str, encoding: str) -> np.ndarray:
    """The int64 ids written for logical ids ``k`` of ``table`` (see the module docstring)."""
    key = _name_key(table)
    if encoding == "int64":
        return _mix64(k.astype(np.uint64) ^ key).view(np.int64)
    if encoding == "uint63":
        return _mix63(k.astype(np.uint64) ^ (key & _MASK63)).view(np.int64)
    if encoding == "dense":
        return np.asarray(k, dtype=np.int64)
    raise ValueError(f"unknown id encoding {encoding!r}")


def logical_ids(ids: np.ndarray, table: str, encoding: str) -> np.ndarray:
    """Inverse of :func:`encode_ids`: the logical ids (``0..space-1``) behind written ids."""
    key = _name_key(table)
    raw = np.asarray(ids, dtype=np.int64).view(np.uint64)
    if encoding == "int64":
        return (_unmix64(raw) ^ key).view(np.int64)
    if encoding == "uint63":
        if (raw > _MASK63).any():
            raise ValueError("uint63 ids are never negative")
        return (_unmix63(raw) ^ (key & _MASK63)).view(np.int64)
    if encoding == "dense":
        return np.asarray(ids, dtype=np.int64).copy()
    raise ValueError(f"unknown id encoding {encoding!r}")


def _name_key(name: str) -> np.uint64:
    return np.uint64(hash_strings([name]).view(np.uint64)[0])


def _uniform(keys: np.ndarray, stream: int) -> np.ndarray:
    """A uniform (0, 1) float64 per uint64 key, independent across ``stream``."""
    salt = np.uint64((0x9E3779B97F4A7C15 * (stream + 1)) & 0xFFFFFFFFFFFFFFFF)
    h = _mix64(keys + salt)
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))


def _normal(keys: np.ndarray, stream: int) -> np.ndarray:
    """A standard normal per key (Box–Muller on two hashed uniforms)."""
    u1, u2 = _uniform(keys, 2 * stream), _uniform(keys, 2 * stream + 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


# -------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class DenseColumn:
    """One generated dense column."""

    name: str
    kind: str  # "count" | "signed" | "normal"
    integer: bool
    nulls: bool
    transform: str
    fill: float


@dataclass(frozen=True)
class IdColumn:
    """One generated id column (with its optional weight column)."""

    feature: str
    column: str
    table: str
    space: int  # logical ids drawn from [0, space)
    dynamic: bool
    hotness: int | None  # None: variable
    string_ids: bool
    weights: str | None
    exact: bool = False  # lists of exactly ``hotness`` ids (combiner: concat)
    encoding: str | None = None  # None: int64 for dynamic tables, dense otherwise
    stages: int = 1  # >1: the universe grows over the train split in this many stages

    @property
    def id_encoding(self) -> str:
        """How logical ids are written: ``dense``, ``int64`` or ``uint63``."""
        return self.encoding or ("int64" if self.dynamic else "dense")


@dataclass(frozen=True)
class GenPlan:
    """What to generate for a recipe."""

    dense: tuple[DenseColumn, ...]
    ids: tuple[IdColumn, ...]
    label: str
    label_float: bool
    interactions: tuple[tuple[int, int], ...]  # pairs of indices into ``ids``
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenConfig:
    """gen-data's arguments besides the recipe and the output folder."""

    rows: int = 200_000
    eval_rows: int = 50_000
    files: int = 4
    alpha: float = 1.05
    seed: int = 0


@dataclass(frozen=True)
class GenResult:
    """What gen-data wrote and the ground truth's quality on the eval split."""

    out: Path
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    rows: int
    eval_rows: int
    best_auc: float
    best_logloss: float
    ctr_train: float
    ctr_eval: float
    seconds: float
    columns: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def make_plan(recipe: Recipe) -> GenPlan:
    """Decide the columns to write for ``recipe``."""
    declared = recipe.data.columns or {}
    seen: set[str] = set()
    notes: list[str] = []
    dense: list[DenseColumn] = []
    for f in recipe.dense_features:
        kind = {"log1p": "count", "signed_log1p": "signed", "none": "normal"}[f.transform]
        for col in f.columns:
            if col in seen:
                continue
            seen.add(col)
            integer = declared.get(col, "int" if kind == "count" else "float") == "int"
            fill = 0.0 if f.fill_null is None else float(f.fill_null)
            dense.append(DenseColumn(col, kind, integer, f.fill_null is not None, f.transform, fill))
    ids: list[IdColumn] = []
    for f in recipe.categorical_features:
        if f.column in seen:
            continue
        seen.add(f.column)
        table = recipe.table(f.table)
        space = (int(table.dynamic.capacity) * DYNAMIC_SPACE if table.dynamic is not None
                 else int(table.rows or 1))
        if f.weights:
            seen.add(f.weights)
        if f.ids == "string" and table.dynamic is None and f.out_of_range == "error":
            notes.append(f"feature '{f.name}': string ids hash outside table '{table.name}' "
                         "rows; the reader needs out_of_range: modulo or a dynamic table")
        ids.append(IdColumn(f.name, f.column, table.name, space, table.dynamic is not None,
                            None if f.hotness == "variable" else int(f.hotness),
                            f.ids == "string", f.weights, f.combiner == "concat"))
    pairs = interaction_pairs(ids)
    label_float = declared.get(recipe.data.label) == "float"
    return GenPlan(tuple(dense), tuple(ids), recipe.data.label, label_float, pairs, tuple(notes))


def interaction_pairs(ids: tuple[IdColumn, ...] | list[IdColumn]) -> tuple[tuple[int, int], ...]:
    """Pairs of id columns whose latent vectors interact: those with the smallest universes
    of at least 100 ids (at most :data:`MAX_INTERACTION_FEATURES` columns)."""
    candidates = sorted(range(len(ids)), key=lambda i: (ids[i].space < 100, ids[i].space, i))
    chosen = sorted(candidates[:MAX_INTERACTION_FEATURES])
    return tuple((a, b) for i, a in enumerate(chosen) for b in chosen[i + 1:])


# ------------------------------------------------------------------------- sampling


@lru_cache(maxsize=64)
def _head_cdf(n: int, alpha: float) -> tuple[np.ndarray, float]:
    head = min(n, _EXACT_HEAD)
    w = np.cumsum(np.arange(1, head + 1, dtype=np.float64) ** -alpha)
    tail = 0.0
    if n > head:  # ∑_{k=head}^{n-1} (k+1)^-α ≈ ∫_{head+0.5}^{n+0.5} x^-α dx
        a, b = head + 0.5, n + 0.5
        tail = math.log(b / a) if alpha == 1 else (b ** (1 - alpha) - a ** (1 - alpha)) / (1 - alpha)
    total = w[-1] + tail
    return w / total, w[-1] / total


def power_law(rng: np.random.Generator, size: int, n: int, alpha: float) -> np.ndarray:
    """``size`` logical ids in ``[0, n)`` with P(k) ∝ (k+1)^-alpha."""
    cdf, head_mass = _head_cdf(n, alpha)
    u = rng.random(size)
    k = np.searchsorted(cdf, u, side="right").astype(np.int64)
    tail = u >= head_mass
    if tail.any():
        a, b = cdf.shape[0] + 0.5, n + 0.5
        v = (u[tail] - head_mass) / (1.0 - head_mass)
        if alpha == 1:
            x = a * (b / a) ** v
        else:
            x = (a ** (1 - alpha) + v * (b ** (1 - alpha) - a ** (1 - alpha))) ** (1 / (1 - alpha))
        k[tail] = np.clip(np.floor(x + 0.5).astype(np.int64) - 1, cdf.shape[0], n - 1)
    return np.minimum(k, n - 1)


def _dense_params(plan: GenPlan, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng((seed, 1_000_001))
    m = len(plan.dense)
    mu = rng.uniform(0.0, 3.0, m)
    sigma = rng.uniform(0.8, 1.8, m)
    weight = rng.normal(0.0, 1.0, m)
    return mu, sigma, weight


def _transform(x: np.ndarray, how: str) -> np.ndarray:
    if how == "log1p":
        return np.log1p(np.maximum(x, 0))
    if how == "signed_log1p":
        return np.sign(x) * np.log1p(np.abs(x))
    return x


@dataclass(frozen=True)
class _Rows:
    columns: dict[str, pa.Array]
    dense: np.ndarray  # [n, n_dense] transformed values as the reader sees them
    effects: np.ndarray  # [n, n_ids] pooled latent effects
    latent: dict[int, np.ndarray]  # id column index -> [n, LATENT_DIM] pooled vectors


def stage_universe(space: int, stages: int, stage: int) -> int:
    """Logical ids drawn in ``stage`` of a growing universe (the eval split: ``stage = stages``)."""
    return max(1, space * min(stage + 1, stages) // stages)


def _draw_ids(rng: np.random.Generator, c: IdColumn, rows: np.ndarray, alpha: float,
              position: tuple[int, int] | None) -> np.ndarray:
    """Logical ids of column ``c`` for the rows ``rows`` (one entry per id) of a file that
    starts at row ``position[0]`` of a split of ``position[1]`` train rows (None: eval or
    calibration, the whole universe)."""
    if c.stages <= 1 or position is None:
        return power_law(rng, rows.size, c.space, alpha)
    start, total = position
    stage = (rows + start) * c.stages // max(total, 1)
    k = np.empty(rows.size, dtype=np.int64)
    for s in np.unique(stage):
        at = stage == s
        k[at] = power_law(rng, int(at.sum()), stage_universe(c.space, c.stages, int(s)), alpha)
    return k


def _gen_rows(plan: GenPlan, n: int, rng: np.random.Generator, seed: int, alpha: float,
              position: tuple[int, int] | None = None) -> _Rows:
    columns: dict[str, pa.Array] = {}
    mu, sigma, _ = _dense_params(plan, seed)
    dense = np.zeros((n, len(plan.dense)), dtype=np.float64)
    for j, col in enumerate(plan.dense):
        if col.kind == "count":
            x = np.floor(rng.lognormal(mu[j], sigma[j], n)) - 1.0
            x = np.maximum(x, 0.0)
        elif col.kind == "signed":
            x = rng.choice(np.array([-1.0, 1.0]), n) * rng.lognormal(mu[j] - 1.0, sigma[j], n)
        else:
            x = rng.normal(mu[j] - 1.5, sigma[j], n)
        values = x.astype(np.int64) if col.integer else x.astype(np.float32)
        mask = rng.random(n) < NULL_RATE if col.nulls else None
        columns[col.name] = pa.array(values, mask=mask)
        seen = np.where(mask, col.fill, values) if mask is not None else values
        dense[:, j] = _transform(seen.astype(np.float32).astype(np.float64), col.transform)
    seed_key = _mix64(np.array([seed % 2**64], dtype=np.uint64))[0]
    effects = np.zeros((n, len(plan.ids)), dtype=np.float64)
    latent: dict[int, np.ndarray] = {}
    wanted = {i for pair in plan.interactions for i in pair}
    for i, c in enumerate(plan.ids):
        if c.hotness == 1:
            lengths = np.ones(n, dtype=np.int64)
        elif c.exact and c.hotness is not None:
            lengths = np.full(n, c.hotness, dtype=np.int64)
        else:
            top = c.hotness if c.hotness is not None else VARIABLE_MAX_LEN
            lengths = rng.integers(1, top + 1, n)
        nnz = int(lengths.sum())
        row = np.repeat(np.arange(n), lengths)
        k = _draw_ids(rng, c, row, alpha, position)
        table_key = _name_key(c.table)
        if c.string_ids:
            values: pa.Array = pc.binary_join_element_wise("v", pa.array(k).cast(pa.string()), "")
        else:
            values = pa.array(encode_ids(k, c.table, c.id_encoding))
        weights = rng.uniform(0.5, 1.5, nnz).astype(np.float32) if c.weights else None
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        if c.hotness == 1:
            columns[c.column] = values
            if c.weights:
                columns[c.weights] = pa.array(weights)
        else:
            columns[c.column] = pa.ListArray.from_arrays(pa.array(offsets), values)
            if c.weights:
                columns[c.weights] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(weights))
        key = _mix64(k.astype(np.uint64) ^ _mix64(np.array([seed_key ^ table_key]))[0])
        w = weights.astype(np.float64) if weights is not None else np.ones(nnz)
        norm = np.bincount(row, w, minlength=n)
        effect = _normal(key, 0) * (1.0 + k) ** -EFFECT_DECAY
        effects[:, i] = np.bincount(row, w * effect, minlength=n) / norm
        if i in wanted:
            vec = np.empty((n, LATENT_DIM))
            for d in range(LATENT_DIM):
                vec[:, d] = np.bincount(row, w * _normal(key, 1 + d), minlength=n) / norm
            latent[i] = vec
    return _Rows(columns, dense, effects, latent)


@dataclass(frozen=True)
class _Truth:
    dense_mean: np.ndarray
    dense_std: np.ndarray
    dense_weight: np.ndarray
    effect_std: np.ndarray
    scales: tuple[float, float, float]  # multipliers of the dense, categorical, interaction parts
    inter_std: np.ndarray
    bias: float


def _parts(plan: GenPlan, rows: _Rows, truth: _Truth | None, weight: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = rows.effects.shape[0]
    if truth is None:
        d_mean, d_std = rows.dense.mean(axis=0), rows.dense.std(axis=0) + 1e-12
        e_std = rows.effects.std(axis=0) + 1e-12
    else:
        d_mean, d_std, e_std = truth.dense_mean, truth.dense_std, truth.effect_std
    dense = ((rows.dense - d_mean) / d_std) @ weight if plan.dense else np.zeros(n)
    cat = (rows.effects / e_std).sum(axis=1) if plan.ids else np.zeros(n)
    inter = np.zeros((n, len(plan.interactions)))
    for p, (a, b) in enumerate(plan.interactions):
        inter[:, p] = (rows.latent[a] * rows.latent[b]).sum(axis=1)
    return dense, cat, inter


def _calibrate(plan: GenPlan, config: GenConfig) -> _Truth:
    n = min(max(config.rows, 10_000), _CALIBRATION_ROWS)
    rows = _gen_rows(plan, n, np.random.default_rng((config.seed, 99)), config.seed, config.alpha)
    weight = _dense_params(plan, config.seed)[2]
    dense, cat, inter = _parts(plan, rows, None, weight)
    inter_std = inter.std(axis=0) + 1e-12
    inter_sum = (inter / inter_std).sum(axis=1)
    present = {"dense": bool(plan.dense), "categorical": bool(plan.ids),
               "interactions": bool(plan.interactions)}
    total = sum(SHARES[k] for k, on in present.items() if on) or 1.0
    stds = (dense.std(), cat.std(), inter_sum.std())
    scales = tuple(
        (LOGIT_STD * math.sqrt(SHARES[k] / total) / (s + 1e-12)) if present[k] else 0.0
        for k, s in zip(("dense", "categorical", "interactions"), stds, strict=True))
    z = scales[0] * dense + scales[1] * cat + scales[2] * inter_sum
    lo, hi = -20.0, 20.0
    for _ in range(60):  # bisection: mean(sigmoid(z + b)) = TARGET_CTR
        mid = (lo + hi) / 2
        if _sigmoid(z + mid).mean() < TARGET_CTR:
            lo = mid
        else:
            hi = mid
    return _Truth(rows.dense.mean(axis=0), rows.dense.std(axis=0) + 1e-12, weight,
                  rows.effects.std(axis=0) + 1e-12, scales, inter_std, (lo + hi) / 2)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _probability(plan: GenPlan, rows: _Rows, truth: _Truth) -> np.ndarray:
    dense, cat, inter = _parts(plan, rows, truth, truth.dense_weight)
    inter_sum = (inter / truth.inter_std).sum(axis=1)
    s = truth.scales
    return _sigmoid(truth.bias + s[0] * dense + s[1] * cat + s[2] * inter_sum)


# ------------------------------------------------------------------------------ metrics


def exact_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC with tied scores counted one half (Mann–Whitney U on average ranks)."""
    labels = np.asarray(labels).astype(bool)
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = np.asarray(scores)[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    sizes = np.diff(np.r_[starts, s.size])
    ranks = np.repeat(starts + (sizes + 1) / 2.0, sizes)
    rank_sum = ranks[labels[order]].sum()
    return float((rank_sum - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(p: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities ``p``."""
    p = np.clip(p, 1e-12, 1 - 1e-12)
    y = np.asarray(labels, dtype=np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())


# -------------------------------------------------------------------------------- write


def _arrow_type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_arrow_type_name(t.value_type)}>"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    return "string" if pa.types.is_string(t) else str(t)


def _write_split(plan: GenPlan, truth: _Truth, config: GenConfig, out: Path, split: str,
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
        gen = _gen_rows(plan, n, rng, config.seed, config.alpha, position)
        p = _probability(plan, gen, truth)
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


def generate(recipe: Recipe, out: str | Path, config: GenConfig = GenConfig(),
             source: dict[str, str] | None = None, plan: GenPlan | None = None) -> GenResult:
    """Write train and eval Parquet files and ``dataset.json`` for ``recipe`` under ``out``
    (``plan``: what to write, by default :func:`make_plan` of the recipe)."""
    check_config(config)
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan or make_plan(recipe)
    truth = _calibrate(plan, config)
    train, p_train, y_train, columns = _write_split(plan, truth, config, out, "train", config.rows)
    evals, p_eval, y_eval, _ = _write_split(plan, truth, config, out, "eval", config.eval_rows)
    p_ref, y_ref = (p_eval, y_eval) if config.eval_rows else (p_train, y_train)
    auc, loss = exact_auc(p_ref, y_ref), log_loss(p_ref, y_ref)
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
        "best_auc": round(auc, 6),
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
    return GenResult(out, tuple(train), tuple(evals), config.rows, config.eval_rows, auc, loss,
                     float(y_train.mean()), ctr_eval, time.perf_counter() - start, columns,
                     plan.notes)
