"""Slow, obvious NumPy reference of the engine, for tests (CPU and, later, CUDA kernels).

Nothing here is fast or used on a hot path; every function is written for readability and
follows the documented semantics of :mod:`embtrain.embedding.engine`,
:mod:`embtrain.embedding.initializers` and :mod:`embtrain.embedding.optimizers`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from embtrain.embedding.config import (
    FeatureConfig,
    InitializerConfig,
    SparseInput,
    SparseOptimizerConfig,
)
from embtrain.embedding.reference_halves import (
    narrow_nearest_ref,
    narrow_stochastic_ref,
    round_bits_ref,
    slot_column_ref,
)
from embtrain.kernels.array_hashing import mix64_array

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def init_reference(
    init: InitializerConfig, seed: int, name: str, rows: np.ndarray, dim: int
) -> np.ndarray:
    """Initial values ``[len(rows), dim]`` following the recipe in ``initializers``."""
    rows = np.asarray(rows, dtype=np.int64)
    if init.kind == "zeros":
        return np.zeros((rows.size, dim), np.float32)
    if init.kind == "constant":
        return np.full((rows.size, dim), init.value, np.float32)
    nh = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    seed_mix = mix64_array(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    base = mix64_array(seed_mix ^ np.uint64(nh))[0]
    rh = mix64_array(base ^ mix64_array(rows.astype(np.uint64)))[:, None]
    cols = np.arange(dim, dtype=np.uint64)[None, :] << np.uint64(8)

    def bits(j: int) -> np.ndarray:
        return mix64_array(rh ^ mix64_array(cols | np.uint64(j)))

    def unit(x: np.ndarray) -> np.ndarray:
        return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53

    if init.kind == "uniform":
        return (init.scale * (2.0 * unit(bits(0)) - 1.0)).astype(np.float32)
    z = np.zeros((rows.size, dim))
    todo = np.ones((rows.size, dim), dtype=bool)
    for attempt in range(127):
        u1 = ((bits(2 * attempt) >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53
        u2 = unit(bits(2 * attempt + 1))
        cand = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
        z = np.where(todo, cand, z)
        if init.kind == "normal":
            break
        todo &= np.abs(z) > 2.0
        if not todo.any():
            break
    return (init.std * z).astype(np.float32)


def _bag_scale(combiner: str, w: np.ndarray) -> np.float32:
    if combiner == "mean":
        s = np.float32(w.sum(dtype=np.float32)) if w.size else np.float32(0)
        return np.float32(1) / s if s != 0 else np.float32(0)
    if combiner == "sqrtn":
        s = np.sqrt(np.float32((w * w).sum(dtype=np.float32))) if w.size else np.float32(0)
        return np.float32(1) / s if s != 0 else np.float32(0)
    return np.float32(1)


def _weights(inp: SparseInput) -> np.ndarray:
    n = len(inp.keys)
    return np.ones(n, np.float32) if inp.weights is None else np.asarray(inp.weights, np.float32)


def pool_reference(
    table_values: np.ndarray, feature: FeatureConfig, inp: SparseInput
) -> np.ndarray:
    """One feature's pooled output ``[batch, width]`` (embedding_lookup_sparse semantics)."""
    dim = table_values.shape[1]
    batch = len(inp.offsets) - 1
    w = _weights(inp)
    if feature.combiner == "concat":
        hot = int(feature.hotness or 0)
        out = np.zeros((batch, hot * dim), np.float32)
        for b in range(batch):
            s, e = int(inp.offsets[b]), int(inp.offsets[b + 1])
            for j, p in enumerate(range(s, e)):
                out[b, j * dim : (j + 1) * dim] = w[p] * table_values[inp.keys[p]]
        return out
    out = np.zeros((batch, dim), np.float32)
    for b in range(batch):
        s, e = int(inp.offsets[b]), int(inp.offsets[b + 1])
        if s == e:
            continue
        acc = np.zeros(dim, np.float32)
        for p in range(s, e):
            acc += w[p] * table_values[inp.keys[p]]
        if feature.combiner == "mean":
            sw = w[s:e].sum(dtype=np.float32)
            acc = acc / sw if sw != 0 else np.zeros(dim, np.float32)
        elif feature.combiner == "sqrtn":
            sw = np.sqrt((w[s:e] * w[s:e]).sum(dtype=np.float32))
            acc = acc / sw if sw != 0 else np.zeros(dim, np.float32)
        out[b] = acc
    return out


def key_grads_reference(
    feature: FeatureConfig, inp: SparseInput, grad: np.ndarray, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-key gradients ``(keys, [nnz, dim])`` of one feature from d(loss)/d(its output)."""
    w = _weights(inp)
    keys = np.asarray(inp.keys, np.int64)
    out = np.zeros((keys.size, dim), np.float32)
    for b in range(len(inp.offsets) - 1):
        s, e = int(inp.offsets[b]), int(inp.offsets[b + 1])
        scale = _bag_scale(feature.combiner, w[s:e])
        for j, p in enumerate(range(s, e)):
            if feature.combiner == "concat":
                out[p] = (w[p] * scale) * grad[b, j * dim : (j + 1) * dim]
            else:
                out[p] = (w[p] * scale) * grad[b]
    return keys, out


def sum_duplicates(keys: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys in first-occurrence order and their summed gradients (like tf.unique)."""
    uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    summed = np.zeros((uniq.size, grads.shape[1]), np.float32)
    for p in range(keys.size):
        summed[rank[inv[p]]] += grads[p]
    return uniq[order], summed


def table_key_grads(
    features: Sequence[FeatureConfig],
    inputs: Mapping[str, SparseInput],
    grads: Mapping[str, np.ndarray],
    table: str,
    dim: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Keys and per-key gradients of every feature reading ``table`` (feature order)."""
    ks, gs = [np.zeros(0, np.int64)], [np.zeros((0, dim), np.float32)]
    for f in features:
        if f.table == table:
            k, g = key_grads_reference(f, inputs[f.name], grads[f.name], dim)
            ks.append(k)
            gs.append(g)
    return np.concatenate(ks), np.concatenate(gs)


def init_slots(cfg: SparseOptimizerConfig, rows: int, dim: int) -> dict[str, np.ndarray]:
    """Fresh slot arrays of the optimizer for a table."""
    a0 = np.float32(cfg.initial_accumulator_value)
    if cfg.kind == "sgd":
        return {}
    if cfg.kind == "adagrad":
        return {"accumulator": np.full((rows, dim), a0, np.float32)}
    if cfg.kind == "rowwise_adagrad":
        return {"accumulator": np.full(rows, a0, np.float32)}
    if cfg.kind in ("adam", "lazy_adam"):
        return {"m": np.zeros((rows, dim), np.float32), "v": np.zeros((rows, dim), np.float32)}
    if cfg.kind == "sgd_momentum":
        return {"momentum": np.zeros((rows, dim), np.float32)}
    return {
        "accumulator": np.full((rows, dim), a0, np.float32),
        "linear": np.zeros((rows, dim), np.float32),
    }


def apply_reference(
    cfg: SparseOptimizerConfig,
    values: np.ndarray,
    slots: dict[str, np.ndarray],
    keys: np.ndarray,
    g: np.ndarray,
    step: int,
) -> None:
    """Apply one sparse update in place: rows ``keys`` (unique) with summed gradients ``g``.

    ``adam`` here is *dense* Adam's moments: every row's m and v decay each step (touched or
    not); the parameters of touched rows only are updated (embtrain's documented ``adam``).
    """
    f32 = np.float32
    lr, eps = f32(cfg.lr), f32(cfg.epsilon)
    if cfg.kind == "sgd":
        values[keys] -= lr * g
    elif cfg.kind == "adagrad":
        a = slots["accumulator"][keys] + g * g
        slots["accumulator"][keys] = a
        values[keys] -= g * lr / (np.sqrt(a) + eps)
    elif cfg.kind == "rowwise_adagrad":
        a = slots["accumulator"][keys] + (g * g).sum(axis=1, dtype=f32) / f32(g.shape[1])
        slots["accumulator"][keys] = a
        values[keys] -= g * lr / (np.sqrt(a) + eps)[:, None]
    elif cfg.kind in ("adam", "lazy_adam"):
        b1, b2 = f32(cfg.beta1), f32(cfg.beta2)
        t = f32(step + 1)
        lr_t = lr * np.sqrt(f32(1) - b2**t) / (f32(1) - b1**t)
        m, v = slots["m"], slots["v"]
        if cfg.kind == "adam":
            untouched = np.ones(m.shape[0], bool)
            untouched[keys] = False
            m[untouched] *= b1
            v[untouched] *= b2
        mk = b1 * m[keys] + (f32(1) - b1) * g
        vk = b2 * v[keys] + (f32(1) - b2) * (g * g)
        m[keys], v[keys] = mk, vk
        values[keys] -= lr_t * mk / (np.sqrt(vk) + eps)
    elif cfg.kind == "ftrl":
        lr_power = f32(cfg.learning_rate_power)
        l1 = f32(cfg.l1_regularization_strength)
        l2 = f32(cfg.l2_regularization_strength) + f32(cfg.beta) / (f32(2) * lr)
        shrink = f32(cfg.l2_shrinkage_regularization_strength)
        var = values[keys]
        acc = slots["accumulator"][keys]
        gs = g + f32(2) * shrink * var
        new_acc = acc + g * g
        pn = new_acc ** (-lr_power)
        po = acc ** (-lr_power)
        lin = slots["linear"][keys] + (gs - (pn - po) / lr * var)
        x = np.clip(lin, -l1, l1) - lin
        y = pn / lr + f32(2) * l2
        values[keys] = x / y
        slots["linear"][keys] = lin
        slots["accumulator"][keys] = new_acc
    elif cfg.kind == "sgd_momentum":
        mu = f32(dict(cfg.options).get("momentum", 0.9))
        v = mu * slots["momentum"][keys] + g
        slots["momentum"][keys] = v
        values[keys] -= lr * v
    else:  # pragma: no cover
        raise ValueError(cfg.kind)


def narrow_update_reference(
    plan: object,
    new_values: np.ndarray,
    new_slots: Sequence[np.ndarray],
    old_values: np.ndarray,
    old_slots: Sequence[np.ndarray],
    touched: np.ndarray,
    step: int,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """A half group's arrays after an update whose float32 results are ``new_*`` (computed
    from the widened state ``old_*``): the ``touched`` group rows narrowed with the group's
    rounding (``plan``: a :class:`~embtrain.kernels.contract.GroupPlan`), the others as they
    were. Stochastic bits: ``round_bits(seed, step, table id, global row, global column)``,
    a slot's column through ``slot_column`` (a per-row slot: column 0); a keyed group's
    row takes its key from ``plan.row_round``."""
    seed = int(plan.round_seed) & 0xFFFFFFFFFFFFFFFF
    rows = np.asarray(touched, np.int64)
    table = np.searchsorted(plan.table_offset, rows, side="right") - 1
    tr = plan.table_round[table]
    keys = plan.row_round[rows] if plan.row_round.size else rows - plan.table_offset[table]
    grow = tr[:, 1] + tr[:, 2] * keys

    def narrow(new: np.ndarray, old: np.ndarray, code: int, slot: int) -> np.ndarray:
        if code == 0:
            out = old.copy()
            out[rows] = new[rows]
            return out
        out = narrow_nearest_ref(old, code)
        width = new.shape[1]
        cols = (tr[:, 3:4] + np.arange(width)[None, :]) if width > 1 else np.zeros((rows.size, 1),
                                                                                np.int64)
        if slot >= 0:
            cols = slot_column_ref(cols, slot)
        if plan.rounding == 0:
            out[rows] = narrow_nearest_ref(new[rows], code)
            return out
        bits = np.stack([round_bits_ref(seed, step, int(tr[i, 0]), grow[i], cols[i])
                         for i in range(rows.size)]) if rows.size else cols.astype(np.uint32)
        out[rows] = narrow_stochastic_ref(new[rows], code, bits)
        return out

    values = narrow(new_values, old_values, int(plan.value_code), -1)
    slots = [narrow(n, o, int(plan.slot_code), i)
             for i, (n, o) in enumerate(zip(new_slots, old_slots, strict=True))]
    return values, slots
