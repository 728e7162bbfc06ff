"""The sparse optimizers' update rules: scalar functions of one element (or one row's
scalars), compiled into the CPU and the CUDA kernels alike.

A kernel reduces a row's gradients to ``g`` (duplicates summed), then for an element-wise
optimizer calls :func:`row_factors` once per row and :func:`update_elem` per column; for a
row-wise one (:func:`is_row_wise`) it sums ``g²`` over the row, calls
:func:`row_wise_begin` once and :func:`row_wise_apply` per column. Slots a kind does not have
are passed as zeros and their results ignored (:func:`slot_count`). Arithmetic is float32 in
the order written (docs/OPTIMIZERS.md); the NumPy oracle is
:mod:`embtrain.embedding.reference`. Names, codes, slots and the ``hp`` layout:
:mod:`embtrain.kernels.optimizer_spec`.
"""

from __future__ import annotations

import math

import numpy as np
from numba.extending import register_jitable

from embtrain.kernels.optimizer_spec import (
    HP_BETA1,
    HP_BETA2,
    HP_EPS,
    HP_L1,
    HP_L2,
    HP_L2_SHRINKAGE,
    HP_LR,
    HP_LR_POWER,
    HP_LR_T,
    HP_ONE_MINUS_BETA1,
    HP_ONE_MINUS_BETA2,
    HP_OPTIONS,
    OPT_ADAGRAD,
    OPT_ADAM,
    OPT_FTRL,
    OPT_LAZY_ADAM,
    OPT_ROWWISE_ADAGRAD,
    OPT_SGD,
    OPT_SGD_MOMENTUM,
    row_wise_table,
    slot_count_table,
)

_SLOTS = slot_count_table()
_ROW_WISE = row_wise_table()


@register_jitable(inline="always")
def slot_count(kind):
    """Slots (0, 1 or 2) of optimizer ``kind``."""
    return _SLOTS[kind]


@register_jitable(inline="always")
def is_row_wise(kind):
    """True when ``kind`` updates whole rows (:func:`row_wise_begin`)."""
    return _ROW_WISE[kind]


@register_jitable(inline="always")
def _sqrt(x):
    """float32 square root (``math.sqrt`` of a float32 is float32 when compiled)."""
    return np.float32(math.sqrt(x))


# ------------------------------------------------------------------ element-wise rules


@register_jitable(inline="always")
def sgd(hp, w, g):
    """``w - lr·g``."""
    return w - hp[HP_LR] * g


@register_jitable(inline="always")
def adagrad(hp, w, acc, g):
    """``acc += g²; w -= g·lr / (sqrt(acc) + eps)``; returns ``(w, acc)``."""
    a = acc + g * g
    return w - g * hp[HP_LR] / (_sqrt(a) + hp[HP_EPS]), a


@register_jitable(inline="always")
def adam(hp, w, m, v, g, f1, f2):
    """(Lazy) Adam with moments first scaled by ``f1``, ``f2`` (:func:`row_factors`);
    returns ``(w, m, v)``."""
    m = hp[HP_BETA1] * (m * f1) + hp[HP_ONE_MINUS_BETA1] * g
    v = hp[HP_BETA2] * (v * f2) + hp[HP_ONE_MINUS_BETA2] * (g * g)
    return w - hp[HP_LR_T] * m / (_sqrt(v) + hp[HP_EPS]), m, v


@register_jitable  # (not inlined in numba's IR, whose inliner warns on its branches; LLVM inlines it)
def ftrl(hp, w, accum, linear, g):
    """TensorFlow's ``ResourceSparseApplyFtrlV2``; returns ``(w, accum, linear)``."""
    lr = hp[HP_LR]
    lr_power = hp[HP_LR_POWER]
    l1 = hp[HP_L1]
    two = np.float32(2.0)
    shrink = hp[HP_L2_SHRINKAGE]
    gs = g + two * shrink * w if shrink > 0 else g
    new_accum = accum + g * g
    if lr_power == np.float32(-0.5):
        pn = _sqrt(new_accum)
        po = _sqrt(accum)
    else:  # float32 pow when compiled, as TensorFlow's kernel
        pn = np.float32(math.pow(new_accum, -lr_power))
        po = np.float32(math.pow(accum, -lr_power))
    lin = linear + (gs - (pn - po) / lr * w)
    # min(max(lin, -l1), l1) as numba's (and Python's) builtins compute it, NaN and signed zeros
    # alike; written out because builtin min/max of floats do not compile for the CUDA target
    hi = -l1 if -l1 > lin else lin
    clipped = l1 if l1 < hi else hi
    x = clipped - lin
    y = pn / lr + two * hp[HP_L2]
    return x / y, new_accum, lin


@register_jitable(inline="always")
def sgd_momentum(hp, w, v, g):
    """``v = momentum·v + g; w -= lr·v`` (TensorFlow's ``ResourceSparseApplyMomentum``);
    returns ``(w, v)``."""
    v = hp[HP_OPTIONS] * v + g
    return w - hp[HP_LR] * v, v


@register_jitable(inline="always")
def row_factors(kind, hp, step, last):
    """Per-row factors of :func:`update_elem`: ``adam``'s moment decay for the steps the row
    was skipped (``β^(step - last - 1)``, float64 power then float32), else ``(1, 1)``."""
    one = np.float32(1.0)
    if kind == OPT_ADAM:
        skipped = step - last - 1
        if skipped > 0:
            f1 = np.float32(np.float64(hp[HP_BETA1]) ** skipped)
            f2 = np.float32(np.float64(hp[HP_BETA2]) ** skipped)
            return f1, f2
    return one, one


@register_jitable(inline="always")
def update_elem(kind, hp, w, s1, s2, g, f1, f2):
    """One element of an element-wise optimizer: value ``w``, slots ``s1``, ``s2`` (zeros
    for slots the kind lacks), summed gradient ``g``; returns the new ``(w, s1, s2)``."""
    if kind == OPT_SGD:
        return sgd(hp, w, g), s1, s2
    if kind == OPT_ADAGRAD:
        w, s1 = adagrad(hp, w, s1, g)
        return w, s1, s2
    if kind == OPT_ADAM or kind == OPT_LAZY_ADAM:  # noqa: SIM109 (numba: `in` on a tuple is a call)
        return adam(hp, w, s1, s2, g, f1, f2)
    if kind == OPT_FTRL:
        return ftrl(hp, w, s1, s2, g)
    if kind == OPT_SGD_MOMENTUM:
        w, s1 = sgd_momentum(hp, w, s1, g)
        return w, s1, s2
    return w, s1, s2


# ---------------------------------------------------------------------- row-wise rules


@register_jitable(inline="always")
def row_wise_begin(kind, hp, acc, sumsq, dim):
    """A row-wise optimizer's per-row step from the row's slot ``acc`` and ``Σ g²``: returns
    the new slot and the row's factor for :func:`row_wise_apply` (row-wise adagrad:
    ``acc += Σg²/dim``, factor ``sqrt(acc) + eps``)."""
    if kind == OPT_ROWWISE_ADAGRAD:
        a = acc + sumsq / np.float32(dim)
        return a, _sqrt(a) + hp[HP_EPS]
    return acc, np.float32(1.0)


@register_jitable(inline="always")
def row_wise_apply(kind, hp, w, g, factor):
    """One element of a row-wise optimizer (row-wise adagrad: ``w - g·lr / factor``)."""
    if kind == OPT_ROWWISE_ADAGRAD:
        return w - g * hp[HP_LR] / factor
    return w
