"""The vector half-row operations of the CPU kernels (kernels/_llvm.py, used through
kernels/halves.py) against the NumPy oracle (embedding/reference_halves.py), bit for bit:
widening every 16-bit pattern (NaN payloads included), pooling's ``w * widen`` and
``+= w * widen``, and narrowing to nearest and stochastically with the counter-based bits of
the row's stream, on the rounding edges and random floats, for row widths that exercise every
lane count (16, 8, 4, 1); and the update's deferred rows (kernels/halves.py: ``widen_row``,
``ld_widened``, ``st_deferred``, ``flush_row``) of an optimizer slot, equal to the scalar
``ld`` / ``st`` per element with the slot's stream and to the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from embtrain.embedding.reference_halves import (
    narrow_nearest_ref,
    narrow_stochastic_ref,
    round_bits_ref,
    slot_column_ref,
    widen_ref,
)
from embtrain.kernels._llvm import half_axpy, half_narrow, half_scale_copy, half_widen
from embtrain.kernels.codes import ROUND_NEAREST, ROUND_STOCHASTIC, VAL_BF16, VAL_F16
from embtrain.kernels.halves import flush_row, ld, ld_widened, st, st_deferred, widen_row
from embtrain.kernels.rules.halves import round_base, round_row, slot_column
from tests.support.halfs import ALL16, random_floats, rounding_edges

KINDS = [pytest.param(VAL_BF16, id="bf16"), pytest.param(VAL_F16, id="f16")]
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
    (test_half_rules' points, shared)."""
    return np.concatenate([rounding_edges(kind), random_floats(50_000, kind)])


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


@njit
def _slot_rows_scalar(arr, x, seen, code, rmode, base, keys, c0, slot):
    """Row ``j`` of ``arr`` (key ``keys[j]``) read into ``seen[j]`` and set to ``x[j]``
    element by element: ``ld``, then ``st`` with the slot's column
    ``slot_column(c0 + d, slot)``."""
    for j in range(arr.shape[0]):
        rh = round_row(base, keys[j])
        for d in range(arr.shape[1]):
            seen[j, d] = ld(arr, j, d, code)
            st(arr, j, d, x[j, d], code, rmode, rh, slot_column(c0 + d, slot))


@njit
def _slot_rows_vector(arr, x, seen, buf, code, rmode, base, keys, c0, slot):
    """The same, deferred: the row widened into ``buf[1]``, read and written there, narrowed
    once from the slot's first column ``slot_column(c0, slot)``."""
    for j in range(arr.shape[0]):
        rh = round_row(base, keys[j])
        widen_row(arr, j, buf, 1, code)
        for d in range(arr.shape[1]):
            seen[j, d] = ld_widened(arr, j, d, buf, 1)
            st_deferred(arr, j, d, x[j, d], buf, 1)
        flush_row(arr, j, buf, 1, code, rmode, rh, slot_column(c0, slot))


@njit
def _read_widened(arr, out, buf, code):
    for j in range(arr.shape[0]):
        widen_row(arr, j, buf, 0, code)
        for d in range(arr.shape[1]):
            out[j, d] = ld_widened(arr, j, d, buf, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_widened_row_reads_every_pattern_as_ld(kind: int) -> None:
    for width in (16, 29):
        arr = np.resize(ALL16, (-(-ALL16.size // width), width))
        out = np.full(arr.shape, np.nan, np.float32)
        _read_widened(arr, out, np.full((3, width), np.nan, np.float32), kind)
        np.testing.assert_array_equal(_bits(out), _bits(widen_ref(arr, kind)),
                                      err_msg=f"width {width}")


@pytest.mark.parametrize("rmode", [pytest.param(ROUND_NEAREST, id="nearest"),
                                   pytest.param(ROUND_STOCHASTIC, id="stochastic")])
@pytest.mark.parametrize("kind", KINDS)
def test_deferred_slot_rows_equal_the_scalar_stores_and_the_oracle(kind: int, rmode: int) -> None:
    """A slot row stored in the table's dtype: widened once, updated in float32, narrowed once
    in vector lanes, bit for bit the per-element ``st`` of today's rule (slot 0 and slot 1
    streams, row widths of every lane count) and the oracle with ``slot_column_ref``."""
    pts = _floats(kind)
    with np.errstate(over="ignore"):
        base = round_base(np.uint64(SEED), np.uint64(STEP), np.uint64(TABLE))
    rng = np.random.default_rng(kind * 10 + rmode)
    for width, c0, slot in ((16, 0, 0), (29, 5, 1), (64, 1 << 20, 0)):
        rows = -(-pts.size // width)
        x = np.resize(pts, (rows, width))
        keys = rng.integers(-(1 << 40), 1 << 40, rows, dtype=np.int64)
        start = rng.integers(0, 1 << 16, (rows, width)).astype(np.uint16)
        scalar, vector = start.copy(), start.copy()
        seen_s, seen_v = np.empty((2, rows, width), np.float32)
        _slot_rows_scalar(scalar, x, seen_s, kind, rmode, base, keys, np.int64(c0), slot)
        _slot_rows_vector(vector, x, seen_v, np.full((3, width), np.nan, np.float32), kind,
                          rmode, base, keys, np.int64(c0), slot)
        np.testing.assert_array_equal(_bits(seen_v), _bits(widen_ref(start, kind)))
        np.testing.assert_array_equal(_bits(seen_s), _bits(seen_v))
        if rmode == ROUND_NEAREST:
            want = narrow_nearest_ref(x, kind)
        else:
            cols = slot_column_ref(c0 + np.arange(width), slot)
            want = narrow_stochastic_ref(x, kind, round_bits_ref(SEED, STEP, TABLE, keys[:, None],
                                                                 cols[None, :]))
        np.testing.assert_array_equal(scalar, want, err_msg=f"scalar, width {width}")
        np.testing.assert_array_equal(vector, want, err_msg=f"vector, width {width}")


def test_float16_stochastic_rounding_far_below_its_subnormals() -> None:
    """Below 2^-96 the compiled scalar rule once shifted an int64 by 64 or more (undefined;
    x86 shifts by the count mod 64) and rounded such a value up to 2^-24 when its random bits
    were within its mantissa of 2^32: the scalar store and the vector rows now narrow every
    such value as the oracle does, to ±0."""
    mant = np.random.default_rng(5).integers(0, 1 << 23, 1000).astype(np.uint32)
    a = (np.arange(31, dtype=np.uint32)[None, :] << np.uint32(23)) | mant[:, None]  # e 0 … 30
    x = np.ascontiguousarray(np.concatenate([a, a | np.uint32(1 << 31)]).view(np.float32))
    rows, width = x.shape
    keys = np.arange(rows, dtype=np.int64)
    with np.errstate(over="ignore"):
        base = round_base(np.uint64(SEED), np.uint64(STEP), np.uint64(TABLE))
    r = round_bits_ref(SEED, STEP, TABLE, keys[:, None], slot_column_ref(np.arange(width), 0))
    assert (r >= 0xFF000000).sum() > 100  # the bits that rounded up before
    want = narrow_stochastic_ref(x, VAL_F16, r)
    np.testing.assert_array_equal(want & 0x7FFF, 0)
    scalar, vector = np.ones((2, rows, width), np.uint16)
    seen = np.empty((rows, width), np.float32)
    _slot_rows_scalar(scalar, x, seen, VAL_F16, ROUND_STOCHASTIC, base, keys, np.int64(0), 0)
    _slot_rows_vector(vector, x, seen, np.empty((3, width), np.float32), VAL_F16,
                      ROUND_STOCHASTIC, base, keys, np.int64(0), 0)
    np.testing.assert_array_equal(scalar, want)
    np.testing.assert_array_equal(vector, want)
