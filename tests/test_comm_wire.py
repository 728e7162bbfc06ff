"""The exchange's byte messages: packing, quantization, and the fp16 kernels against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from embtrain.comm.halfs import from_half, to_half
from embtrain.comm.wire import Cursor, MessageBuffer, decode_vectors, encode_vectors, pack


def _edge_floats() -> np.ndarray:
    f16 = np.finfo(np.float16)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 1e9, -1e9,
                float(f16.tiny), float(f16.tiny) / 2, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001,
                2.0**-26, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1e-30, -3.0000001e-5]
    return np.array(specials, dtype=np.float32)


@pytest.fixture(params=["vector", "software"])
def half_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both conversions: eight lanes through LLVM's half type, and the bit-exact software one."""
    from embtrain.comm import halfs

    monkeypatch.setattr(halfs, "_vector", request.param == "vector")
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
    from embtrain.comm import halfs

    assert halfs._vector == (half_path == "vector")  # the path asked for is the path taken


def test_fp16_kernels_read_column_slices(half_path: str) -> None:
    x = np.random.default_rng(1).standard_normal((40, 30)).astype(np.float32)
    dest = np.empty((40, 7), np.float16)
    to_half(x[:, 5:12], dest)
    np.testing.assert_array_equal(dest, x[:, 5:12].astype(np.float16))


@pytest.mark.parametrize("quantize", ["none", "fp16", "int8"])
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
    tol = {"none": 0.0, "fp16": 1e-3, "int8": 2e-2}[quantize]
    for block in blocks:
        got = decode_vectors(cur, *block.shape, quantize)
        assert got.dtype == np.float32 and got.shape == block.shape
        np.testing.assert_allclose(got, block, rtol=tol, atol=tol * np.abs(block).max())
    assert cur.at == buf.shape[0]
    assert pack([ids[:3].astype(np.int32)]).shape[0] == 16  # 12 bytes padded to 8
