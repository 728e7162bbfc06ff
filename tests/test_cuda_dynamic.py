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


def test_device_delete_leaves_tombstones_that_lookups_pass_and_compaction_clears():
    from embtrain.kernels import dynamic as kd
    from embtrain.kernels import get_backend
    from embtrain.kernels.cuda_dynamic import DeviceHashIndex

    be = get_backend("cuda")
    rng = np.random.default_rng(3)
    keys = _keys(rng, 100)  # collisions included: deletions sit inside probe runs
    rows = np.arange(100, dtype=np.int64)
    cpu = np.full((SLOTS, 2), -1, np.int64)
    dev = DeviceHashIndex(SLOTS)
    for k, r in zip(keys, rows, strict=True):
        kd.index_insert(cpu, k, r)
    dev.insert(keys, rows)
    gone = keys[::3]
    for k in gone:
        kd.index_delete(cpu, k)
    dev.delete(gone)
    assert (dev.count, dev.used) == (100 - gone.size, 100)
    probe = rng.permutation(keys)
    want = np.empty(probe.size, np.int64)
    kd.find_many(cpu, probe, want)
    assert (want[np.isin(probe, gone)] == -1).all()
    np.testing.assert_array_equal(be.to_host(dev.lookup(probe)), want)
    # inserting past half the used slots compacts first: tombstones gone, answers unchanged
    more = np.setdiff1d(_keys(np.random.default_rng(11), 200), keys)[:60]
    dev.insert(more, np.arange(200, 260, dtype=np.int64))
    for k, r in zip(more, range(200, 260), strict=True):
        kd.index_insert(cpu, k, r)
    assert dev.used == dev.count == 100 - gone.size + 60
    probe = np.concatenate([probe, more])
    kd.find_many(cpu, probe, want := np.empty(probe.size, np.int64))
    np.testing.assert_array_equal(be.to_host(dev.lookup(probe)), want)
    dev.delete(more[:5])
    host = dev.to_host()  # compacted: a valid CPU index
    assert int(np.count_nonzero(host[:, 1] == -2)) == 0
    kd.find_many(host, probe, back := np.empty(probe.size, np.int64))
    want[np.isin(probe, more[:5])] = -1
    np.testing.assert_array_equal(back, want)


def test_device_probability_admission_is_the_cpus():
    from embtrain.kernels import dynamic as kd
    from embtrain.kernels import get_backend
    from embtrain.kernels.cuda_dynamic import probability_admit

    keys = _keys(np.random.default_rng(2), 150)
    want = np.empty(keys.size, np.bool_)
    base = np.uint64(0x1234_5678_9ABC_DEF1)
    kd.probability_admit(base, 0.4, keys, want)
    got = get_backend("cuda").to_host(probability_admit(base, 0.4, keys))
    np.testing.assert_array_equal(got, want)
    assert 0 < want.sum() < keys.size


# --- the engine's dynamic tables on the cuda backend: the device row space against the CPU's

def _engines(dyn: dict, capacity: int = 14, two_features: bool = True, placement=None,
             half: dict | None = None):
    from embtrain.embedding.config import (
        DynamicConfig,
        FeatureConfig,
        SparseOptimizerConfig,
        TableConfig,
    )
    from embtrain.embedding.engine import EmbeddingEngine

    half = half or {}
    tables = [TableConfig("d", capacity, 3, dynamic=DynamicConfig(**dyn), placement=placement,
                          **half),
              TableConfig("e", 16, 3, dynamic=DynamicConfig(), **half)]
    feats = [FeatureConfig("f", "d", combiner="mean"), FeatureConfig("h", "e")]
    if two_features:
        feats.insert(1, FeatureConfig("g", "d"))
    opt = SparseOptimizerConfig(kind="adagrad", lr=0.1)
    return [EmbeddingEngine(tables, feats, opt, seed=7, backend=b) for b in ("cpu", "cuda")]


def _batch(rng: np.random.Generator, names, batch: int, pool: int):
    from embtrain.data.batch import SparseInput

    out = {}
    for name in names:
        sizes = rng.integers(0, 4, batch)
        offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        keys = (rng.integers(0, pool, int(offs[-1])) * 7919 - 3 * pool).astype(np.int64)
        out[name] = SparseInput(keys, offs)
    return out


def _same_tables(cpu, dev, names=("d", "e")) -> None:
    from embtrain.embedding.dynamic_device import DeviceHashRows

    for name in names:
        assert type(dev._space(name)) is DeviceHashRows  # the device index, not the host's
        a, b = cpu.export_table(name), dev.export_table(name)
        np.testing.assert_array_equal(b.keys, a.keys)
        np.testing.assert_allclose(b.values, a.values, rtol=1e-6, atol=1e-7)
        for s in a.slots:
            np.testing.assert_allclose(b.slots[s], a.slots[s], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(b.update_count, a.update_count)
        np.testing.assert_array_equal(b.last_step, a.last_step)
        for k in a.extra:
            np.testing.assert_array_equal(b.extra[k], a.extra[k])
        # the same rows for the same keys, the same free stack
        hc, hd = cpu.dynamic_table(name), dev.dynamic_table(name)
        np.testing.assert_array_equal(hd.row_live, hc.row_live)
        live = hc.row_live != 0
        np.testing.assert_array_equal(hd.row_key[live], hc.row_key[live])
        assert hd.n_free == hc.n_free
        np.testing.assert_array_equal(hd.free[: hd.n_free], hc.free[: hc.n_free])
        assert dev.dynamic_metrics()[name] == cpu.dynamic_metrics()[name]


@pytest.mark.parametrize("dyn", [
    {"eviction": "lru", "ttl_steps": 1},
    {"eviction": "lfu", "admission": "probability", "p": 0.9, "missing": "initial"},
    {"eviction": "lru", "admission": "count", "min_count": 2},
    {"eviction": "lfu", "admission": "bloom", "min_count": 2, "bloom_capacity": 500},
])
def test_device_dynamic_tables_train_as_the_cpu_ones(dyn):
    """Inserts, admission, eviction (a small table) and TTL over a few steps, an evaluation,
    and a checkpoint restored into a fresh engine: the cuda engine's device row space gives
    every key the CPU's row and the same outputs and tables."""
    cpu, dev = _engines(dyn)
    be = dev.backend
    rng = np.random.default_rng(1)
    for step in range(1, 5):
        inputs = _batch(rng, ("f", "g", "h"), 4, 20)
        want = cpu.forward(inputs, step=step)
        got = dev.forward(inputs, step=step)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_allclose(be.to_host(b), a, rtol=1e-6, atol=1e-7)
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in want]
        cpu.backward_update(grads, step)
        dev.backward_update(grads, step)
    seen = cpu.dynamic_metrics()["d"]
    assert seen["evictions"] > 0 and seen["inserts"] > 0
    assert seen["expired"] > 0 or not dyn.get("ttl_steps")
    inputs = _batch(rng, ("f", "g", "h"), 4, 20)
    for a, b in zip(cpu.forward(inputs, training=False), dev.forward(inputs, training=False),
                    strict=True):
        np.testing.assert_allclose(be.to_host(b), a, rtol=1e-6, atol=1e-7)
    _same_tables(cpu, dev)
    # a checkpoint into a fresh device engine, one more step on both
    _, again = _engines(dyn)
    for name in ("d", "e"):
        again.import_table(name, dev.export_table(name))
    inputs = _batch(rng, ("f", "g", "h"), 4, 20)
    cpu_fresh, _ = _engines(dyn)
    for name in ("d", "e"):
        cpu_fresh.import_table(name, cpu.export_table(name))
    for a, b in zip(cpu_fresh.forward(inputs, step=5), again.forward(inputs, step=5),
                    strict=True):
        np.testing.assert_allclose(be.to_host(b), a, rtol=1e-6, atol=1e-7)
    _same_tables(cpu_fresh, again)


def test_a_full_device_table_without_eviction_refuses_as_the_cpu_one():
    from embtrain.embedding.dynamic import TableFullError

    cpu, dev = _engines({"eviction": "none"}, capacity=4, two_features=False)
    inputs = _batch(np.random.default_rng(4), ("f", "h"), 6, 12)
    with pytest.raises(TableFullError) as want:
        cpu.forward(inputs, step=3)
    with pytest.raises(TableFullError) as got:
        dev.forward(inputs, step=3)
    assert str(got.value) == str(want.value)


def test_a_column_shard_of_a_device_dynamic_table_starts_at_its_columns_of_the_full_rows():
    """A column-sharded dynamic table (columns 2..4 of 5): new rows take those columns of the
    full table's initial values, on the device as on the CPU."""
    from embtrain.embedding.config import ShardPlacement

    cpu, dev = _engines({}, capacity=32, placement=ShardPlacement(col_start=2, full_dim=5))
    rng = np.random.default_rng(8)
    inputs = _batch(rng, ("f", "g", "h"), 4, 20)
    for a, b in zip(cpu.forward(inputs, step=1), dev.forward(inputs, step=1), strict=True):
        np.testing.assert_allclose(dev.backend.to_host(b), a, rtol=1e-6, atol=1e-7)
    _same_tables(cpu, dev)
    assert cpu.export_table("d").keys.size > 0


def test_indexes_sharing_one_buffer_are_looked_up_in_one_launch():
    """share_storage makes several indexes views of one buffer; inserts, deletes and
    compaction keep working in place, and lookup_tables answers each key from its table."""
    from embtrain.kernels import get_backend
    from embtrain.kernels.cuda_dynamic import DeviceHashIndex, lookup_tables, share_storage

    be = get_backend("cuda")
    rng = np.random.default_rng(6)
    keys = _keys(rng, 90)
    small, big = DeviceHashIndex(16), DeviceHashIndex(SLOTS)
    small.insert(keys[:5], np.arange(5))
    storage = share_storage([small, big])
    big.insert(keys[5:90], np.arange(100, 185))  # after sharing: written into the buffer
    small.delete(keys[:2])
    small.insert(keys[40:44], np.arange(10, 14))  # the same keys as big's, other rows
    small.compact()
    probe = np.concatenate([keys[:8], keys[40:44]])
    tables = np.array([0] * 8 + [1] * 4, np.int64)
    got = be.to_host(lookup_tables(storage, probe, tables))
    want = [be.to_host(small.lookup(probe[:8])), be.to_host(big.lookup(probe[8:]))]
    np.testing.assert_array_equal(got, np.concatenate(want))
    np.testing.assert_array_equal(got, [-1, -1, 2, 3, 4, -1, -1, -1, 135, 136, 137, 138])
    np.testing.assert_array_equal(be.to_host(small.lookup(keys[40:44])), [10, 11, 12, 13])


@pytest.mark.parametrize("half", [
    pytest.param({"dtype": "bfloat16"}, id="bfloat16"),
    pytest.param({"dtype": "float16", "optimizer_state": "table"}, id="float16-state_half"),
    pytest.param({"dtype": "bfloat16", "rounding": "nearest"}, id="bfloat16-nearest"),
])
def test_half_device_dynamic_tables_round_by_key_as_the_cpu_ones(half):
    """Half dynamic tables on the device row space: fresh rows narrowed as on the CPU, and each
    update rounded (stochastically: by the row's key, not its row) as the CPU engine's, with
    eviction moving keys between rows. The float32 arithmetic of the two backends may differ
    in the last bit, so a stored pattern may differ by one half step; nearly all are equal
    (rounding by row instead of by key would make about half of the stochastic ones differ)."""
    from embtrain.embedding.dynamic_device import DeviceHashRows

    cpu, dev = _engines({"eviction": "lru"}, half=half)
    assert all(type(dev._space(n)) is DeviceHashRows for n in ("d", "e"))
    be = dev.backend
    rng = np.random.default_rng(3)
    for step in range(1, 6):
        inputs = _batch(rng, ("f", "g", "h"), 6, 24)
        want = cpu.forward(inputs, step=step)
        got = dev.forward(inputs, step=step)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_allclose(be.to_host(b), a, rtol=1e-2, atol=1e-3)
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in want]
        cpu.backward_update(grads, step)
        dev.backward_update(grads, step)
    assert cpu.dynamic_metrics()["d"]["evictions"] > 0
    for name in ("d", "e"):
        a, b = cpu.export_table(name), dev.export_table(name)
        np.testing.assert_array_equal(b.keys, a.keys)
        assert b.values.dtype == np.uint16 and b.dtype == half["dtype"]
        arrays = [(a.values, b.values), *((a.slots[s], b.slots[s]) for s in a.slots
                                          if a.slots[s].dtype == np.uint16)]
        for x, y in arrays:
            step_apart = np.abs(x.astype(np.int64) - y.astype(np.int64))
            assert step_apart.max() <= 1, name
            assert (step_apart == 0).mean() >= 0.97, (name, (step_apart == 0).mean())
        np.testing.assert_array_equal(b.update_count, a.update_count)

