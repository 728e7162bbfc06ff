"""The vector half-row operations of the CPU kernels (kernels/_llvm.py, used through
kernels/halfrows.py) against the NumPy oracle (embedding/reference_halfs.py), bit for bit:
widening every 16-bit pattern (NaN payloads included), pooling's ``w * widen`` and
``+= w * widen``, and narrowing to nearest and stochastically with the counter-based bits of
the row's stream, on the rounding edges and random floats, for row widths that exercise every
lane count (16, 8, 4, 1)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit
from test_halfs import _random_floats, _rounding_edges

from embtrain.embedding.reference_halfs import (
    narrow_nearest_ref,
    narrow_stochastic_ref,
    round_bits_ref,
    widen_ref,
)
from embtrain.kernels._llvm import half_axpy, half_narrow, half_scale_copy, half_widen
from embtrain.kernels.codes import ROUND_NEAREST, ROUND_STOCHASTIC, VAL_BF16, VAL_F16
from embtrain.kernels.rules.halfs import round_base, round_row

KINDS = [pytest.param(VAL_BF16, id="bf16"), pytest.param(VAL_F16, id="f16")]
ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
WIDTHS = (16, 29, 64)  # 29 = 16 + 8 + 4 + 1: every lane count
SEED, STEP, TABLE = 99, 7, 0x1234_5678_9ABC_DEF0


@njit
def _widen_rows(dst, src, width, code):
    for i in range(0, src.shape[0], width):
        half_widen(dst, i, src, i, min(width, src.shape[0] - i), code)


@njit
def _pool_rows(dst, src, w, width, code):
    """Row ``i`` of ``dst`` = ``w[0] * src_i`` + ``w[1] * src_i`` (a set, then an axpy)."""
    for i in range(0, src.shape[0], width):
        n = min(width, src.shape[0] - i)
        half_scale_copy(dst, i, src, i, w[0], n, code)
        half_axpy(dst, i, src, i, w[1], n, code)


@njit
def _narrow_rows(dst, src, width, code, rmode, base, keys, c0):
    """Row ``j`` (elements ``j * width ...``) is row ``keys[j]`` of a table, first column
    ``c0``."""
    for j in range(keys.shape[0]):
        i = j * width
        n = min(width, src.shape[0] - i)
        half_narrow(dst, i, src, i, n, code, rmode, round_row(base, keys[j]), c0)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def _floats(kind: int) -> np.ndarray:
    """Every half value, the midpoints, a float32 ulp either side, specials (NaN payloads,
    ±inf, float32 subnormals, past the largest half), and random floats of every exponent
    (test_halfs' points, shared)."""
    return np.concatenate([_rounding_edges(kind), _random_floats(50_000, kind)])


@pytest.mark.parametrize("kind", KINDS)
def test_vector_widen_every_pattern(kind: int) -> None:
    want = _bits(widen_ref(ALL16, kind))
    for width in WIDTHS:
        out = np.full(ALL16.size, np.nan, np.float32)
        _widen_rows(out, ALL16, width, kind)
        np.testing.assert_array_equal(_bits(out), want, err_msg=f"width {width}")


@pytest.mark.parametrize("kind", KINDS)
def test_vector_pooling_of_half_rows(kind: int) -> None:
    h = ALL16[np.isfinite(widen_ref(ALL16, kind))]
    x = widen_ref(h, kind)
    w = np.float32([0.75, -1.3])
    with np.errstate(over="ignore"):
        want = w[0] * x
        want += w[1] * x
    for width in WIDTHS:
        out = np.empty(h.size, np.float32)
        _pool_rows(out, h, w, width, kind)
        np.testing.assert_array_equal(_bits(out), _bits(want), err_msg=f"width {width}")


@pytest.mark.parametrize("kind", KINDS)
def test_vector_narrow_to_nearest(kind: int) -> None:
    x = _floats(kind)
    want = narrow_nearest_ref(x, kind)
    for width in WIDTHS:
        out = np.zeros(x.size, np.uint16)
        keys = np.arange(-(-x.size // width), dtype=np.int64)
        _narrow_rows(out, x, width, kind, ROUND_NEAREST, np.uint64(0), keys, np.int64(0))
        np.testing.assert_array_equal(out, want, err_msg=f"width {width}")


@pytest.mark.parametrize("kind", KINDS)
def test_vector_narrow_stochastic_with_the_row_streams(kind: int) -> None:
    """Row ``j`` is key ``keys[j]`` (negative keys too) from column ``c0``: its element ``d``
    draws ``round_bits(seed, step, table, key, c0 + d)``, as the scalar store would."""
    x = _floats(kind)
    with np.errstate(over="ignore"):
        base = round_base(np.uint64(SEED), np.uint64(STEP), np.uint64(TABLE))
    for width, c0 in ((16, 0), (29, 5), (64, 1 << 33)):
        rows = -(-x.size // width)
        keys = np.random.default_rng(width).integers(-(1 << 40), 1 << 40, rows, dtype=np.int64)
        pos = np.arange(x.size)
        r = round_bits_ref(SEED, STEP, TABLE, keys[pos // width], c0 + pos % width)
        out = np.zeros(x.size, np.uint16)
        _narrow_rows(out, x, width, kind, ROUND_STOCHASTIC, base, keys, np.int64(c0))
        np.testing.assert_array_equal(out, narrow_stochastic_ref(x, kind, r),
                                      err_msg=f"width {width}")
