"""The exchange's byte messages: packing, quantization, and the fp16 kernels against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from embtrain.comm.halves import from_half, to_half
from embtrain.comm.wire import Cursor, MessageBuffer, decode_vectors, encode_vectors, pack
from embtrain.recipe.kinds import TABLE_DTYPES


def _edge_floats() -> np.ndarray:
    f16 = np.finfo(np.float16)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 1e9, -1e9,
                float(f16.tiny), float(f16.tiny) / 2, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001,
                2.0**-26, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1e-30, -3.0000001e-5]
    return np.array(specials, dtype=np.float32)


@pytest.fixture(params=["vector", "software"])
def half_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both conversions: eight lanes through LLVM's half type, and the bit-exact software one."""
    from embtrain.comm import halves

    monkeypatch.setattr(halves, "_vector", request.param == "vector")
    return request.param


def test_fp16_kernels_equal_numpy_bit_for_bit(half_path: str) -> None:
    rng = np.random.default_rng(7)
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.concatenate([
            (rng.standard_normal(5000) * 10.0 ** rng.integers(-9, 6, 5000)).astype(np.float32),
            rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            _edge_floats(),
        ])
        x = np.resize(x, (x.size // 10, 10))
        want = x.astype(np.float16)
    mine = np.empty(x.shape, np.float16)
    to_half(x, mine)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(mine), nan)
    np.testing.assert_array_equal(mine.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    halves = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(256, 256)
    back = from_half(halves)
    ref = halves.astype(np.float32)
    assert np.array_equal(np.isnan(back), np.isnan(ref))
    np.testing.assert_array_equal(back[~np.isnan(ref)], ref[~np.isnan(ref)])
    from embtrain.comm import halves

    assert halves._vector == (half_path == "vector")  # the path asked for is the path taken


def test_fp16_kernels_read_column_slices(half_path: str) -> None:
    x = np.random.default_rng(1).standard_normal((40, 30)).astype(np.float32)
    dest = np.empty((40, 7), np.float16)
    to_half(x[:, 5:12], dest)
    np.testing.assert_array_equal(dest, x[:, 5:12].astype(np.float16))


@pytest.mark.parametrize("quantize", ["none", "fp16", "int8", "bf16"])
def test_messages_round_trip(quantize: str) -> None:
    rng = np.random.default_rng(3)
    blocks = [rng.standard_normal((13, 24)).astype(np.float32)[:, 3:11],
              rng.standard_normal((5, 3)).astype(np.float32)]
    ids = rng.integers(-5, 10**12, 17)
    per_dest = [[ids, *encode_vectors(blocks[0], quantize)], encode_vectors(blocks[1], quantize)]
    buf, counts = MessageBuffer().pack(per_dest)
    assert buf.ctypes.data % 64 == 0 and sum(counts) == buf.shape[0]
    cur = Cursor(buf)
    np.testing.assert_array_equal(cur.take(np.int64, 17), ids)
    tol = {"none": 0.0, "fp16": 1e-3, "int8": 2e-2, "bf16": 4e-3}[quantize]
    for block in blocks:
        got = decode_vectors(cur, *block.shape, quantize)
        assert got.dtype == np.float32 and got.shape == block.shape
        np.testing.assert_allclose(got, block, rtol=tol, atol=tol * np.abs(block).max())
    assert cur.at == buf.shape[0]
    assert pack([ids[:3].astype(np.int32)]).shape[0] == 16  # 12 bytes padded to 8


def test_bfloat16_kernels_equal_ml_dtypes_bit_for_bit() -> None:
    import ml_dtypes

    from embtrain.comm.halves import from_bfloat16, to_bfloat16

    rng = np.random.default_rng(11)
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.concatenate([
            (rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000)).astype(np.float32),
            rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            _edge_floats(),
            np.array([3.4028235e38, -3.4028235e38, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8,
                      1.0 + 2.0**-8 + 2.0**-20, 1e-45, -1e-40], np.float32),
        ])
    x = np.resize(x, (x.size // 8, 8))
    want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    bits = np.empty(x.shape, np.uint16)
    to_bfloat16(x[:, :], bits)
    nan = np.isnan(x)
    np.testing.assert_array_equal(bits[~nan], want[~nan])
    assert np.isnan(from_bfloat16(bits)[nan]).all()
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    back = from_bfloat16(every)
    ref = every.view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(np.isnan(back), np.isnan(ref))
    np.testing.assert_array_equal(back[~np.isnan(ref)], ref[~np.isnan(ref)])
    cols = np.empty((x.shape[0], 3), np.uint16)
    to_bfloat16(x[:, 2:5], cols)  # a column slice, read in place
    np.testing.assert_array_equal(cols[~nan[:, 2:5]], want[:, 2:5][~nan[:, 2:5]])


def test_exchange_codec_follows_the_table_dtype() -> None:
    from embtrain.comm.wire import exchange_codec, vector_bytes

    def codec(dtype: str, mixed: str, gradient: bool, partial: bool = False,
              quantize: str = "none") -> str:
        return exchange_codec(dtype, quantize, gradient, partial, mixed)  # type: ignore[arg-type]

    # a half table travels in its dtype when the network computes in it (lossless then)
    assert codec("bfloat16", "bf16", False) == codec("bfloat16", "bf16", True) == "bf16"
    assert codec("float16", "fp16", False) == "fp16"
    assert codec("float16", "fp16", True) == "none"  # unscaled gradients would underflow
    # float32 otherwise: a float32 table, a float32 network or another half type
    for dtype, mixed in (("float32", "bf16"), ("bfloat16", "none"), ("bfloat16", "fp16"),
                         ("float16", "bf16"), ("float32", "none")):
        assert codec(dtype, mixed, False) == codec(dtype, mixed, True) == "none"
    # partial sums (row sharding) are not values of the dtype
    assert codec("bfloat16", "bf16", False, partial=True) == "none"
    assert codec("bfloat16", "bf16", True, partial=True) == "none"
    # the recipe's quantize option still applies to every table
    for dtype in TABLE_DTYPES:
        assert codec(dtype, "none", True, quantize="int8") == "int8"
        assert codec(dtype, "bf16", False, partial=True, quantize="fp16") == "fp16"
    assert vector_bytes(3, 8, "bf16") == vector_bytes(3, 8, "fp16") == 48
    x = np.array([[1.0, 1.0 + 2.0**-7, -2.5, 2.0**127]], np.float32)  # bfloat16 values: exact
    buf, _ = MessageBuffer().pack([encode_vectors(x, "bf16")])
    assert buf.shape[0] == 8
    np.testing.assert_array_equal(decode_vectors(Cursor(buf), 1, 4, "bf16"), x)
