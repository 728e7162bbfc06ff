"""The next step's keys looked up ahead (issue 31's pipeline stage on one rank): the rows,
values, bookkeeping, counters and outputs are the same bits as without it, whether the
look-ahead is used or has to be dropped (an index changed, other keys, a restore)."""

from __future__ import annotations

import numpy as np
import pytest

from embtrain.embedding.config import (
    DynamicConfig,
    FeatureConfig,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.engine import EmbeddingEngine
from tests.support.dynamic import dynamic_batches, dynamic_state, same_dynamic_state

DIM = 4
PLAIN = [TableConfig("plain", 4000, DIM, dynamic=DynamicConfig()),
         TableConfig("wide", 3000, 2 * DIM, dynamic=DynamicConfig(missing="initial"))]
POLICIES = [  # evicting, admitting, expiring (an index changes at the step boundary)
    TableConfig("small_lru", 150, DIM, dynamic=DynamicConfig(eviction="lru")),
    TableConfig("counted", 500, DIM, dynamic=DynamicConfig(admission="count", min_count=2)),
    TableConfig("ttl", 4000, DIM, dynamic=DynamicConfig(ttl_steps=2)),
]


def _features(tables: list[TableConfig]) -> list[FeatureConfig]:
    feats = []
    for t in tables:
        feats.append(FeatureConfig(f"{t.name}_a", t.name))
        feats.append(FeatureConfig(f"{t.name}_m", t.name, "mean"))
    return feats


def _run(tables: list[TableConfig], ahead: str, steps: int = 9):
    """Train (every third step an evaluation, which reads the step after's batch when
    ``ahead == "other"``); ``ahead``: ``none`` (no look-ahead), ``next`` (the next training
    batch handed to ``look_ahead`` after each forward, as the step pipeline does) or
    ``other`` (the batch looked up ahead is not the one the next forward reads). Returns every table's state,
    the hash tables' row bookkeeping, the counters, the outputs and the engine."""
    features = _features(tables)
    eng = EmbeddingEngine(tables, features, SparseOptimizerConfig("adagrad", 0.05), seed=3)
    batches = dynamic_batches(features, steps + 1)
    rng = np.random.default_rng(5)
    outs_all = []
    for step in range(steps):
        training = step % 3 != 2
        outs = eng.forward(batches[step], training=training, step=step)
        outs_all.append([o.copy() for o in outs])
        if ahead == "next":
            eng.look_ahead(batches[step + 1])
        elif ahead == "other":
            eng.look_ahead(batches[(step + 5) % len(batches)])
        if training:
            eng.backward_update([rng.standard_normal(o.shape).astype(np.float32)
                                 for o in outs], step)
    return (*dynamic_state(eng, tables, outs_all), eng)


def _same(a, b) -> None:
    same_dynamic_state(a[:4], b[:4])


def _used(run) -> int:
    return sum(k.ahead_used for k in run[4]._keyed.values())


def test_a_used_look_ahead_gives_the_bits_of_the_lookup_in_the_forward():
    base = _run(PLAIN, "none")
    ahead = _run(PLAIN, "next")
    _same(base, ahead)
    # every training forward after another training step used its look-ahead (an
    # evaluation's forward inserts nothing, so the one after it still may)
    assert _used(ahead) >= 5
    done, parts = ahead[4].lookahead_items
    assert parts > 0 and done <= parts
    assert base[2]["plain"]["inserts"] > 0


def test_look_aheads_dropped_when_an_index_changed_or_keys_differ():
    tables = PLAIN + POLICIES
    base = _run(tables, "none")
    metrics = base[2]
    assert metrics["small_lru"]["evictions"] > 0 and metrics["ttl"]["expired"] > 0
    assert metrics["counted"]["admissions_pending"] > 0
    _same(base, _run(tables, "next"))
    other = _run(tables, "other")
    _same(base, other)
    assert _used(other) == 0


def test_a_restore_between_the_look_ahead_and_the_forward_drops_it():
    features = _features(PLAIN)
    batches = dynamic_batches(features, 3)
    opt = SparseOptimizerConfig("adagrad", 0.05)
    results = []
    for ahead in (False, True):
        eng = EmbeddingEngine(PLAIN, features, opt, seed=3)
        saved = EmbeddingEngine(PLAIN, features, opt, seed=3)
        for step in range(2):  # a checkpoint's tables: two steps of another engine
            outs = saved.forward(batches[step], step=step)
            saved.backward_update([np.full(o.shape, 0.1, np.float32) for o in outs], step)
        outs = eng.forward(batches[0], step=0)
        if ahead:
            eng.look_ahead(batches[2])
        eng.backward_update([np.full(o.shape, 0.3, np.float32) for o in outs], 0)
        for t in PLAIN:  # restore: keys the look-ahead did not find now have rows
            eng.import_table(t.name, saved.export_table(t.name))
        results.append([o.copy() for o in eng.forward(batches[2], step=1)])
        assert sum(k.ahead_used for k in eng._keyed.values()) == 0
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_look_ahead_that_failed_leaves_the_lookup_to_the_forward(
        monkeypatch: pytest.MonkeyPatch):
    import embtrain.embedding.lookahead as la

    def broken() -> None:  # on the look-ahead's thread only
        raise MemoryError("no thread for you")

    features = _features(PLAIN)
    batches = dynamic_batches(features, 2)
    results = []
    for ahead in (False, True):
        eng = EmbeddingEngine(PLAIN, features, SparseOptimizerConfig("sgd", 0.1), seed=3)
        outs = eng.forward(batches[0], step=0)
        with monkeypatch.context() as m:
            m.setattr(la, "_idle_priority", broken)
            if ahead:
                eng.look_ahead(batches[1])
            eng.backward_update([np.full(o.shape, 0.2, np.float32) for o in outs], 0)
            results.append([o.copy() for o in eng.forward(batches[1], step=1)])
        assert sum(k.ahead_used for k in eng._keyed.values()) == 0
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


def test_keys_the_thread_did_not_reach_are_looked_up_by_the_forward(
        monkeypatch: pytest.MonkeyPatch):
    import time

    import embtrain.embedding.lookahead as la

    slow = la._idle_priority

    def late_start() -> None:  # the step ends before the thread looks anything up
        time.sleep(0.2)
        slow()

    monkeypatch.setattr(la, "_idle_priority", late_start)
    base = _run(PLAIN, "none")
    late = _run(PLAIN, "next")
    _same(base, late)
    keyed = list(late[4]._keyed.values())
    assert sum(k.ahead_used for k in keyed) >= 5
    # (a later group's thread may have looked its keys up while an earlier group's forward
    # ran: the forward takes the groups one after the other)
    assert sum(k.ahead_items[0] for k in keyed) < sum(k.ahead_items[1] for k in keyed)


def test_the_resumable_lookup_skips_done_chunks_and_stops_when_asked():
    from numba.typed import List

    from embtrain.embedding.dynamic import new_index
    from embtrain.kernels import dynamic as kd

    rng = np.random.default_rng(9)
    index = new_index(900)
    known = np.unique(rng.integers(-(2**63), 2**63 - 1, 900, dtype=np.int64))
    for r, k in enumerate(known.tolist()):
        kd.index_insert(index, np.int64(k), np.int64(r))
    sizes = (0, 1000, 37, 333)
    keys = [np.where(rng.random(n) < 0.7, known[rng.integers(0, known.size, n)],
                     rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)) for n in sizes]
    feat_table = np.zeros(len(sizes), dtype=np.int64)
    chunk = 64
    want = [np.empty(n, np.int64) for n in sizes]
    want_misses = np.empty(len(sizes), np.int64)
    kd.lookup_group(List(keys), feat_table, List([index]), List(want), chunk, want_misses)
    items = sum(-(-n // chunk) for n in sizes)
    outs = [np.full(n, -7, np.int64) for n in sizes]
    item_miss = np.zeros(items, np.int64)
    done = np.zeros(items, np.uint8)
    stopped = np.ones(1, np.uint8)
    args = (List(keys), feat_table, List([index]), List(outs), chunk, item_miss, done)
    assert kd.lookup_items(*args, stopped) == 0  # asked to stop before the first chunk
    assert all((o == -7).all() for o in outs)
    skip = rng.random(items) < 0.3  # chunks already done: left as they are
    done[skip] = 1
    assert kd.lookup_items(*args, np.zeros(1, np.uint8)) == items
    first = 0  # chunk by chunk, feature after feature
    for n, o, w in zip(sizes, outs, want, strict=True):
        for c in range(-(-n // chunk)):
            part = slice(c * chunk, min(n, (c + 1) * chunk))
            if skip[first + c]:
                assert (o[part] == -7).all()
            else:
                np.testing.assert_array_equal(o[part], w[part])
        first += -(-n // chunk)
    done[:] = 0  # all of it, again: the misses per chunk sum to the features' misses
    kd.lookup_items(*args, np.zeros(1, np.uint8))
    bounds = np.concatenate(([0], np.cumsum([-(-n // chunk) for n in sizes])))
    sums = np.concatenate(([0], np.cumsum(item_miss)))
    np.testing.assert_array_equal(sums[bounds[1:]] - sums[bounds[:-1]], want_misses)
    for o, w in zip(outs, want, strict=True):
        np.testing.assert_array_equal(o, w)
