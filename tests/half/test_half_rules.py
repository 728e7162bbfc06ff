"""Half-precision rules (kernels/rules/halves.py, compiled by numba for the CPU) against NumPy's
float16, ml_dtypes' bfloat16 and the NumPy reference (embedding/reference_halves.py):
widening exhaustively, round to nearest on every rounding decision, stochastic rounding bit
for bit with the same random bits and unbiased (exactly over all low bits, and statistically
over the counter-based source)."""

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
from embtrain.kernels.codes import VAL_BF16, VAL_F16
from embtrain.kernels.rules.halves import (
    narrow_nearest,
    narrow_stochastic,
    round_base,
    round_base_int,
    round_bits,
    round_col,
    round_row,
    round_table_id,
    slot_column,
    widen,
)
from tests.support.halfs import ALL16, numpy_widen, random_floats, rounding_edges

ml_dtypes = pytest.importorskip("ml_dtypes")
KINDS = [pytest.param(VAL_BF16, id="bf16"), pytest.param(VAL_F16, id="f16")]


@njit
def _widen_all(bits, kind):
    out = np.empty(bits.shape[0], np.float32)
    for i in range(bits.shape[0]):
        out[i] = widen(bits[i], kind)
    return out


@njit
def _nearest_all(x, kind):
    out = np.empty(x.shape[0], np.uint16)
    for i in range(x.shape[0]):
        out[i] = narrow_nearest(x[i], kind)
    return out


@njit
def _stochastic_all(x, kind, r):
    out = np.empty(x.shape[0], np.uint16)
    for i in range(x.shape[0]):
        out[i] = narrow_stochastic(x[i], kind, r[i])
    return out


@njit
def _round_bits_all(seed, step, table, keys, cols):
    out = np.empty(keys.shape[0], np.uint32)
    for i in range(keys.shape[0]):
        out[i] = round_bits(seed, step, table, keys[i], cols[i])
    return out


def _numpy_narrow(x: np.ndarray, kind: int) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        dt = np.float16 if kind == VAL_F16 else ml_dtypes.bfloat16
        return x.astype(dt).view(np.uint16)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("kind", KINDS)
def test_widen_every_pattern(kind: int) -> None:
    want = _bits(numpy_widen(ALL16, kind))
    np.testing.assert_array_equal(_bits(_widen_all(ALL16, kind)), want)
    np.testing.assert_array_equal(_bits(widen_ref(ALL16, kind)), want)


@pytest.mark.parametrize("kind", KINDS)
def test_narrow_nearest_matches_numpy(kind: int) -> None:
    x = np.concatenate([rounding_edges(kind), random_floats(200_000, 1)])
    want = _numpy_narrow(x, kind)
    np.testing.assert_array_equal(narrow_nearest_ref(x, kind), want)
    np.testing.assert_array_equal(_nearest_all(x, kind), want)
    # a round trip of every finite half is exact
    h = ALL16[np.isfinite(numpy_widen(ALL16, kind))]
    np.testing.assert_array_equal(_nearest_all(_widen_all(h, kind), kind), h)


@pytest.mark.parametrize("kind", KINDS)
def test_narrow_stochastic_equals_reference(kind: int) -> None:
    x = np.concatenate([rounding_edges(kind), random_floats(100_000, 2)])
    rng = np.random.default_rng(3)
    for r in (rng.integers(0, 1 << 32, x.size, dtype=np.uint64).astype(np.uint32),
              np.zeros(x.size, np.uint32), np.full(x.size, 0xFFFFFFFF, np.uint32)):
        got = _stochastic_all(x, kind, r)
        np.testing.assert_array_equal(got, narrow_stochastic_ref(x, kind, r))
    # it always lands on one of the two neighbours: the nearest half or the other one
    finite = np.isfinite(x)
    r = rng.integers(0, 1 << 32, x.size, dtype=np.uint64).astype(np.uint32)
    got = _stochastic_all(x, kind, r)[finite].astype(np.int64)
    near = _numpy_narrow(x[finite], kind).astype(np.int64)
    assert np.all(np.abs(got - near) <= 1)
    # values exactly representable never move; non-finite ones narrow as the nearest rule
    h = ALL16[np.isfinite(numpy_widen(ALL16, kind))]
    np.testing.assert_array_equal(_stochastic_all(_widen_all(h, kind), kind, r[: h.size]), h)
    nf = x[~finite]
    np.testing.assert_array_equal(_stochastic_all(nf, kind, r[: nf.size]), _numpy_narrow(nf, kind))


@pytest.mark.parametrize("kind", KINDS)
def test_narrow_stochastic_is_exactly_unbiased_over_all_low_bits(kind: int) -> None:
    """With every value of the low ``s`` random bits once, the mean of the results is ``x``
    exactly (normal values: s = 16 for bfloat16, 13 for float16; float16 subnormal results
    drop 14 … 22 bits here)."""
    rng = np.random.default_rng(4)
    xs = (rng.standard_normal(24) * 10.0 ** rng.uniform(-3, 3, 24)).astype(np.float32)
    if kind == VAL_F16:
        sub = (rng.uniform(-1, 1, 12) * 2.0 ** rng.integers(-20, -14, 12)).astype(np.float32)
        xs = np.concatenate([xs, sub, np.float32([65500.0, -65503.0, 6.1e-5])])
    else:
        xs = np.concatenate([xs, np.float32([1e-39, -3e38, 3.3e38])])
    for x in xs:
        a = abs(float(x))
        e = int(np.float32(a).view(np.uint32) >> 23)
        s = 16 if kind == VAL_BF16 else int(np.clip(126 - e, 13, 32))
        assert s <= 22
        r = np.arange(1 << s, dtype=np.uint32)
        got = _widen_all(_stochastic_all(np.full(r.size, x), kind, r), kind)
        assert np.all(np.isfinite(got))
        assert got.astype(np.float64).mean() == float(x), (x, s)


@pytest.mark.parametrize("kind", KINDS)
def test_narrow_stochastic_is_unbiased_with_the_counter_source(kind: int) -> None:
    """Draws from :func:`round_bits` (one element of many keys): the mean of the rounded
    values is within 6 standard errors of ``x`` (a Bernoulli between two neighbours)."""
    n = 40_000
    keys = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(5)
    xs = (rng.standard_normal(16) * 10.0 ** rng.uniform(-2, 2, 16)).astype(np.float32)
    for j, x in enumerate(xs):
        r = _round_bits_all(np.uint64(7), np.uint64(3), np.uint64(11), keys,
                            np.full(n, j, np.int64))
        got = _widen_all(_stochastic_all(np.full(n, x), kind, r), kind).astype(np.float64)
        lo, hi = got.min(), got.max()
        p = (float(x) - lo) / (hi - lo) if hi > lo else 0.0
        se = (hi - lo) * np.sqrt(max(p * (1 - p), 1.0 / n) / n)
        assert abs(got.mean() - float(x)) <= 6 * se, (x, got.mean(), se)
        # the nearest value is drawn more often than the other one
        near = float(numpy_widen(_numpy_narrow(np.float32([x]), kind), kind)[0])
        assert (got == near).mean() >= 0.5 - 6 * np.sqrt(0.25 / n)


def test_round_bits_kernel_equals_reference() -> None:
    rng = np.random.default_rng(6)
    keys = rng.integers(-(1 << 62), 1 << 62, 5000, dtype=np.int64)
    cols = rng.integers(0, 512, 5000, dtype=np.int64)
    seed, step, table = 12345, 77, round_table_id("user_id")
    want = round_bits_ref(seed, step, table, keys, cols)
    got = _round_bits_all(np.uint64(seed), np.uint64(step), np.uint64(table), keys, cols)
    np.testing.assert_array_equal(got, want)
    # the per-table base, row and column stages compose to round_bits
    with np.errstate(over="ignore"):
        base = round_base(np.uint64(seed), np.uint64(step), np.uint64(table))
        assert int(base) == round_base_int(seed, step, table)
        staged = [round_col(round_row(base, k), c) for k, c in zip(keys[:50], cols[:50], strict=True)]
    np.testing.assert_array_equal(np.array(staged, np.uint32), want[:50])
    # other steps, tables and slots draw other bits
    other = [round_bits_ref(seed, step + 1, table, keys, cols),
             round_bits_ref(seed, step, table + 1, keys, cols),
             round_bits_ref(seed, step, table, keys, slot_column_ref(cols, 0)),
             round_bits_ref(seed, step, table, keys, slot_column_ref(cols, 1))]
    for o in other:
        assert (o == want).mean() < 0.01
    assert int(slot_column(3, 1)) == int(slot_column_ref(np.int64(3), 1))


@pytest.mark.parametrize("kind", KINDS)
def test_rules_run_as_python(kind: int) -> None:
    """Under numba's CUDA simulator the rules run as plain Python on NumPy scalars."""
    x = np.concatenate([rounding_edges(kind)[::97], random_floats(500, 8)])
    r = np.random.default_rng(9).integers(0, 1 << 32, x.size, dtype=np.uint64).astype(np.uint32)
    near = np.array([narrow_nearest(v, kind) for v in x], np.uint16)
    np.testing.assert_array_equal(near, _numpy_narrow(x, kind))
    sto = np.array([narrow_stochastic(v, kind, b) for v, b in zip(x, r, strict=True)], np.uint16)
    np.testing.assert_array_equal(sto, narrow_stochastic_ref(x, kind, r))
    h = ALL16[::61]
    wide = np.array([widen(b, kind) for b in h], np.float32)
    np.testing.assert_array_equal(_bits(wide), _bits(numpy_widen(h, kind)))
