"""The device hash index (kernels/cuda_dynamic.py) against the CPU index (kernels/dynamic.py).

Runs the CUDA kernels on a GPU or under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``,
its own invocation in scripts/test.sh); skipped otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from embtrain.kernels import available_backends

pytestmark = [
    pytest.mark.skipif("cuda" not in available_backends(),
                       reason="needs a GPU or NUMBA_ENABLE_CUDASIM=1"),
    # the simulator runs the uint64 hash in NumPy scalars, which warn as they wrap (by design)
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

SLOTS = 256


def _keys(rng: np.random.Generator, n: int) -> np.ndarray:
    """Distinct int64 keys: small, negative, huge, and colliding in their home slots."""
    pool = np.concatenate([rng.integers(-50, 50, 40), rng.integers(-2**63, 2**63 - 1, 200),
                           np.array([0, -1, 2**63 - 1, -2**63]),
                           np.arange(1000, 1000 + 64 * SLOTS, SLOTS)])
    return rng.permutation(np.unique(pool))[:n].astype(np.int64)


def test_device_insert_and_lookup_answer_as_the_cpu_index():
    from embtrain.kernels import dynamic as kd
    from embtrain.kernels import get_backend
    from embtrain.kernels.cuda_dynamic import DeviceHashIndex

    be = get_backend("cuda")
    rng = np.random.default_rng(5)
    keys = _keys(rng, 120)
    rows = rng.permutation(400)[:120].astype(np.int64)
    cpu = np.full((SLOTS, 2), -1, np.int64)
    dev = DeviceHashIndex(SLOTS)
    # two rounds of inserts (the second probes past the first's entries), lookups after each
    for part in (slice(0, 70), slice(70, 120)):
        for k, r in zip(keys[part], rows[part], strict=True):
            kd.index_insert(cpu, k, r)
        dev.insert(keys[part], rows[part])
        absent = np.setdiff1d(_keys(np.random.default_rng(9), 200), keys)[:50]
        probe = rng.permutation(np.concatenate([keys, absent]))
        want = np.empty(probe.size, np.int64)
        kd.find_many(cpu, probe, want)
        np.testing.assert_array_equal(be.to_host(dev.lookup(probe)), want)
    assert dev.count == 120 and int(np.count_nonzero(want >= 0)) == 120
    # the device-built index is a valid CPU index, and a CPU-built one a valid device index
    back = np.empty(probe.size, np.int64)
    kd.find_many(np.ascontiguousarray(dev.to_host()), probe, back)
    np.testing.assert_array_equal(back, want)
    mirrored = DeviceHashIndex.from_host(cpu)
    assert mirrored.count == 120
    np.testing.assert_array_equal(be.to_host(mirrored.lookup(probe)), want)


def test_device_index_refuses_overfilling_and_bad_sizes():
    from embtrain.kernels.cuda_dynamic import DeviceHashIndex

    with pytest.raises(ValueError, match="power of two"):
        DeviceHashIndex(100)
    dev = DeviceHashIndex(8)
    dev.insert(np.arange(4), np.arange(4))
    with pytest.raises(ValueError, match="overfill"):
        dev.insert(np.array([9]), np.array([9]))
    with pytest.raises(ValueError, match="3 keys but 2 rows"):
        DeviceHashIndex(8).insert(np.arange(3), np.arange(2))
