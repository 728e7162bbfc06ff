"""Dynamic tables' misses run in parallel across the tables of a group (issue 31): the rows,
values, counters and evictions do not depend on the thread count, and the one-pass insert
gives exactly what collecting, admitting and inserting one after the other gives."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from embtrain.embedding.config import (
    DynamicConfig,
    FeatureConfig,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.dynamic import _bins
from embtrain.embedding.engine import EmbeddingEngine
from embtrain.embedding.rows_hash import HashRows
from tests.support.dynamic import dynamic_batches, dynamic_state, same_dynamic_state

DIM = 4
TABLES = [  # name, capacity, dynamic policy: fused inserts, evicting, admitting, expiring
    TableConfig("plain", 4000, DIM, dynamic=DynamicConfig()),
    TableConfig("shared", 4000, DIM, dynamic=DynamicConfig(eviction="lfu")),
    TableConfig("small_lru", 150, DIM, dynamic=DynamicConfig(eviction="lru")),
    TableConfig("counted", 500, DIM, dynamic=DynamicConfig(admission="count", min_count=2)),
    TableConfig("ttl", 4000, DIM, dynamic=DynamicConfig(ttl_steps=2)),
    TableConfig("wide", 3000, 2 * DIM, dynamic=DynamicConfig(missing="initial")),
]
FEATURES = [FeatureConfig("a", "plain"), FeatureConfig("b1", "shared"),
            FeatureConfig("b2", "shared", "mean"), FeatureConfig("c", "small_lru"),
            FeatureConfig("d", "counted"), FeatureConfig("e", "ttl"),
            FeatureConfig("w", "wide")]


def _run(threads: int, fused: bool, monkeypatch: pytest.MonkeyPatch, steps: int = 8):
    """Train ``steps`` steps (every third an evaluation); return every table's state, the
    hash tables' row bookkeeping, the counters and the outputs."""
    before = numba.get_num_threads()
    with monkeypatch.context() as m:
        if not fused:  # the step by step path: collect, admit, insert, fill per table
            m.setattr(HashRows, "fused_inserts", lambda self, training: False)
        numba.set_num_threads(threads)
        try:
            eng = EmbeddingEngine(TABLES, FEATURES, SparseOptimizerConfig("adagrad", 0.05),
                                  seed=3)
            rng = np.random.default_rng(5)
            outs_all = []
            for step, inputs in enumerate(dynamic_batches(FEATURES, steps)):
                training = step % 3 != 2
                outs = eng.forward(inputs, training=training, step=step)
                outs_all.append([o.copy() for o in outs])
                if training:
                    eng.backward_update([rng.standard_normal(o.shape).astype(np.float32)
                                         for o in outs], step)
        finally:
            numba.set_num_threads(before)
    return dynamic_state(eng, TABLES, outs_all)


def test_one_thread_two_threads_and_the_step_by_step_path_agree_bit_for_bit(monkeypatch):
    base = _run(1, False, monkeypatch)
    metrics = base[2]
    assert metrics["small_lru"]["evictions"] > 0 and metrics["ttl"]["expired"] > 0
    assert metrics["counted"]["admissions_pending"] > 0 and metrics["plain"]["inserts"] > 0
    same_dynamic_state(base, _run(1, True, monkeypatch))
    same_dynamic_state(base, _run(2, True, monkeypatch))
    same_dynamic_state(base, _run(2, False, monkeypatch))


def test_bins_cover_every_busy_table_once_largest_first():
    work = [5, 0, 90, 7, 7, 40, 1]
    for bins in (1, 2, 3, 16):
        order, starts = _bins(work, bins)
        assert sorted(order.tolist()) == [0, 2, 3, 4, 5, 6]
        assert starts[0] == 0 and starts[-1] == order.size
        assert len(starts) - 1 == min(bins, 6)
        assert order[0] == 2  # the largest table opens the first bin


def test_the_lookup_counts_each_features_misses_as_a_separate_pass_does():
    from numba.typed import List

    from embtrain.embedding.dynamic import new_index
    from embtrain.kernels import dynamic as kd

    rng = np.random.default_rng(7)
    indexes, present = [], []
    for cap in (50, 700):
        index = new_index(cap)
        keys = np.unique(rng.integers(-(2**63), 2**63 - 1, cap, dtype=np.int64))
        for r, k in enumerate(keys.tolist()):
            kd.index_insert(index, np.int64(k), np.int64(r))
        indexes.append(index)
        present.append(keys)
    feat_table = np.array([0, 1, 1, 0], dtype=np.int64)
    keys_list, outs = List(), List()
    for f, n in enumerate((0, 1000, 37, 333)):  # spans several chunks of 64
        known = present[feat_table[f]]
        k = np.where(rng.random(n) < 0.6, known[rng.integers(0, known.size, n)],
                     rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64))
        keys_list.append(k)
        outs.append(np.empty(n, dtype=np.int64))
    misses = np.full(4, -5, dtype=np.int64)
    kd.lookup_group(keys_list, feat_table, List(indexes), outs, 64, misses)
    counted = np.zeros(4, dtype=np.int64)
    kd.count_misses(outs, counted)
    np.testing.assert_array_equal(misses, counted)
    assert misses[0] == 0 and misses[1:].min() > 0
    for f in range(4):  # and every row is the index's
        expect = np.array([kd.index_find(indexes[feat_table[f]], k) for k in keys_list[f]],
                          dtype=np.int64)
        np.testing.assert_array_equal(outs[f], expect)


def test_held_lists_pack_again_only_when_an_array_is_another_object():
    from numba.typed import List

    from embtrain.embedding.dynamic import HeldLists

    packed = []

    def pack(arrays):
        packed.append(len(arrays))
        out = List()
        for a in arrays:
            out.append(a)
        return out

    held = HeldLists(pack)
    a, b = np.zeros(3, np.int64), np.ones(2, np.int64)
    first = held("rows", [a, b])
    assert held("rows", [a, b]) is first and len(packed) == 1
    assert held("other", [a, b]) is not first  # kept by name
    c = b.copy()  # equal values, another array: packed again, and holds c
    again = held("rows", [a, c])
    assert again is not first and len(packed) == 3
    c[0] = 7
    assert again[1][0] == 7
    assert held("rows", [a]) is not again and len(packed) == 4
