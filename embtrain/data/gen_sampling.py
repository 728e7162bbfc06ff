"""Sampling the rows of ``embtrain gen-data``: power-law logical ids per column, their universe
growing by stage, the dense features, and each row's latent effects (:mod:`embtrain.data.gen`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embtrain.data.gen_ids import encode_ids, hashed_normal, name_key
from embtrain.data.gen_plan import (
    EFFECT_DECAY,
    EXACT_HEAD,
    LATENT_DIM,
    NULL_RATE,
    VARIABLE_MAX_LEN,
    GenPlan,
    IdColumn,
)
from embtrain.kernels.array_hashing import finalize64


@lru_cache(maxsize=64)
def _head_cdf(n: int, alpha: float) -> tuple[np.ndarray, float]:
    head = min(n, EXACT_HEAD)
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


def dense_params(plan: GenPlan, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng((seed, 1_000_001))
    m = len(plan.dense)
    mu = rng.uniform(0.0, 3.0, m)
    sigma = rng.uniform(0.8, 1.8, m)
    weight = rng.normal(0.0, 1.0, m)
    return mu, sigma, weight


def transform(x: np.ndarray, how: str) -> np.ndarray:
    if how == "log1p":
        return np.log1p(np.maximum(x, 0))
    if how == "signed_log1p":
        return np.sign(x) * np.log1p(np.abs(x))
    return x


@dataclass(frozen=True)
class Rows:
    columns: dict[str, pa.Array]
    dense: np.ndarray  # [n, n_dense] transformed values as the reader sees them
    effects: np.ndarray  # [n, n_ids] pooled latent effects
    latent: dict[int, np.ndarray]  # id column index -> [n, LATENT_DIM] pooled vectors


def stage_universe(space: int, stages: int, stage: int) -> int:
    """Logical ids drawn in ``stage`` of a growing universe (the eval split: ``stage = stages``)."""
    return max(1, space * min(stage + 1, stages) // stages)


def draw_ids(rng: np.random.Generator, c: IdColumn, rows: np.ndarray, alpha: float,
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


def gen_rows(plan: GenPlan, n: int, rng: np.random.Generator, seed: int, alpha: float,
              position: tuple[int, int] | None = None) -> Rows:
    columns: dict[str, pa.Array] = {}
    mu, sigma, _ = dense_params(plan, seed)
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
        dense[:, j] = transform(seen.astype(np.float32).astype(np.float64), col.transform)
    seed_key = finalize64(np.array([seed % 2**64], dtype=np.uint64))[0]
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
        k = draw_ids(rng, c, row, alpha, position)
        table_key = name_key(c.table)
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
        key = finalize64(k.astype(np.uint64) ^ finalize64(np.array([seed_key ^ table_key]))[0])
        w = weights.astype(np.float64) if weights is not None else np.ones(nnz)
        norm = np.bincount(row, w, minlength=n)
        effect = hashed_normal(key, 0) * (1.0 + k) ** -EFFECT_DECAY
        effects[:, i] = np.bincount(row, w * effect, minlength=n) / norm
        if i in wanted:
            vec = np.empty((n, LATENT_DIM))
            for d in range(LATENT_DIM):
                vec[:, d] = np.bincount(row, w * hashed_normal(key, 1 + d), minlength=n) / norm
            latent[i] = vec
    return Rows(columns, dense, effects, latent)


