"""Dynamic tables against a plain Python reference (a dict of rows with explicit scores).

The reference keeps, per live key, its values, slots, update_count and last_step; admission
counts in a dict; eviction picks the live keys the batch did not find with the smallest
(score, key); TTL removes keys with ``last_step <= step - ttl`` after each step. The engine
must hold the same live keys with the same values, slots and metadata after every step, and
pool the same outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embtrain.embedding.config import (
    DynamicConfig,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.dynamic import TableFullError, new_index, shard_of_keys
from embtrain.embedding.engine import EmbeddingEngine
from embtrain.embedding.initializers import mix64, table_base
from embtrain.embedding.reference import (
    apply_reference,
    init_reference,
    init_slots,
    pool_reference,
    sum_duplicates,
    table_key_grads,
)
from embtrain.kernels import dynamic as kd
from embtrain.kernels.array_hashing import mix64_array
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES

DIM = 4
SEED = 11


class RefTable:
    """One dynamic table as a dict: key → row state."""

    def __init__(self, name: str, cfg: TableConfig, opt: SparseOptimizerConfig):
        self.name, self.cfg, self.opt = name, cfg, opt
        self.dyn = cfg.dynamic
        self.rows: dict[int, dict] = {}
        self.counts: dict[int, int] = {}
        self.bloom: dict[int, int] = {}

    def initial(self, key: int) -> np.ndarray:
        return init_reference(self.cfg.initializer, SEED, self.name, np.array([key]), DIM)[0]

    def _admit(self, key: int, n: int) -> bool:
        d = self.dyn
        if d.admission == "count":
            c = self.counts.pop(key, 0) + n
            if c >= d.min_count:
                return True
            self.counts[key] = c
            return False
        if d.admission == "bloom":  # a filter so large it never collides
            self.bloom[key] = min(self.bloom.get(key, 0) + n, 255)
            return self.bloom[key] >= d.min_count
        if d.admission == "probability":
            base = np.uint64(mix64(int(table_base(SEED, self.name)) ^ 0x6A09E667F3BCC908))
            h = mix64_array(np.array([base]) ^ mix64_array(np.array([key]).astype(np.int64).view(np.uint64)))
            return float((h[0] >> np.uint64(11)).astype(np.float64) * 2.0**-53) < d.p
        return True

    def resolve(self, keys_in_order: list[int], training: bool, step: int) -> dict[int, np.ndarray]:
        """What each distinct key reads this step; inserts/evicts like the engine."""
        found = {k for k in keys_in_order if k in self.rows}
        missed: dict[int, int] = {}
        for k in keys_in_order:
            if k not in found:
                missed[k] = missed.get(k, 0) + 1
        reads = {k: self.rows[k]["v"].copy() for k in found}
        if not training:
            for k in missed:
                reads[k] = self.initial(k) if self.dyn.missing == "initial" else np.zeros(DIM,
                                                                                        np.float32)
            return reads
        new = [k for k, n in missed.items() if self._admit(k, n)]
        need = len(new) - (self.cfg.rows - len(self.rows))
        if need > 0:
            if self.dyn.eviction == "none":
                raise TableFullError(self.name, step, self.cfg.rows, len(self.rows), len(new))
            col = "last" if self.dyn.eviction == "lru" else "count"
            cand = sorted((r[col] + (1 if col == "last" else 0), k)
                          for k, r in self.rows.items() if k not in found)
            for _, k in cand[:need]:
                del self.rows[k]
        for k in new:
            slots = {s: a[0] for s, a in init_slots(self.opt, 1, DIM).items()}
            self.rows[k] = {"v": self.initial(k), "s": slots, "count": 0, "last": -1}
        for k in missed:
            reads[k] = self.rows[k]["v"].copy() if k in self.rows else self.initial(k)
        return reads

    def update(self, keys: np.ndarray, grads: np.ndarray, step: int) -> None:
        live = [i for i, k in enumerate(keys.tolist()) if k in self.rows]
        all_keys = sorted(self.rows)
        pos = {k: i for i, k in enumerate(all_keys)}
        values = np.array([self.rows[k]["v"] for k in all_keys], np.float32).reshape(-1, DIM)
        slots = {s: np.array([self.rows[k]["s"][s] for k in all_keys], np.float32)
                 for s in init_slots(self.opt, 1, DIM)}
        idx = np.array([pos[int(keys[i])] for i in live], np.int64)
        opt = self.opt
        if opt.kind == "adam":  # moments kept as of a row's last update, decayed when it is next
            for i in live:
                skipped = step - self.rows[int(keys[i])]["last"] - 1
                if skipped > 0:
                    j = pos[int(keys[i])]
                    slots["m"][j] *= np.float32(np.float64(np.float32(opt.beta1)) ** skipped)
                    slots["v"][j] *= np.float32(np.float64(np.float32(opt.beta2)) ** skipped)
            from dataclasses import replace
            opt = replace(opt, kind="lazy_adam")
        apply_reference(opt, values, slots, idx, grads[live], step)
        for k in all_keys:
            r = self.rows[k]
            r["v"] = values[pos[k]]
            r["s"] = {s: slots[s][pos[k]] for s in slots}
        for i in live:
            r = self.rows[int(keys[i])]
            r["count"] += 1
            r["last"] = step
        if self.dyn.ttl_steps is not None:
            for k in [k for k, r in self.rows.items() if r["last"] <= step - self.dyn.ttl_steps]:
                del self.rows[k]


def _engine(cfg: TableConfig, opt: SparseOptimizerConfig, features: list[FeatureConfig]):
    return EmbeddingEngine([cfg], features, opt, SEED)


def _inputs(rng, universe: np.ndarray, features, batch: int) -> dict[str, SparseInput]:
    out = {}
    for f in features:
        p = rng.zipf(1.3, size=batch * 3) % universe.size
        lens = rng.integers(0, 4, batch) if f.hotness is None else np.full(batch, f.hotness)
        keys = universe[p[: int(lens.sum())]] if lens.sum() <= p.size else universe[
            rng.integers(0, universe.size, int(lens.sum()))]
        offs = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        w = rng.uniform(0.5, 1.5, keys.size).astype(np.float32)
        out[f.name] = SparseInput(keys.astype(np.int64), offs, w)
    return out


def _run_both(dyn: DynamicConfig, opt_kind: str, steps: int = 12, capacity: int = 40,
              combiners=("sum", "mean"), eval_every: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    universe = rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64)
    universe[:3] = [-1, 2**40 + 7, 0]
    cfg = TableConfig("t", capacity, DIM, dynamic=dyn)
    opt = SparseOptimizerConfig(opt_kind, lr=0.05)
    feats = [FeatureConfig(f"f{i}", "t", c, None) for i, c in enumerate(combiners)]
    eng = _engine(cfg, opt, feats)
    ref = RefTable("t", cfg, opt)
    for step in range(steps):
        inputs = _inputs(rng, universe, feats, 16)
        order = [int(k) for f in feats for k in inputs[f.name].keys]
        training = not (eval_every and step % eval_every == eval_every - 1)
        reads = ref.resolve(order, training, step)
        outs = eng.forward(inputs, training=training, step=step)
        for f in feats:
            g, c, w = eng.layout[f.name]
            vals = {k: reads[k] for k in reads}
            keys = inputs[f.name].keys
            uniq = np.unique(keys)
            table = np.array([vals[int(k)] for k in uniq], np.float32).reshape(-1, DIM)
            remapped = SparseInput(np.searchsorted(uniq, keys), inputs[f.name].offsets,
                                   inputs[f.name].weights)
            want = pool_reference(table, f, remapped)
            np.testing.assert_allclose(outs[g][:, c:c + w], want, rtol=1e-5, atol=1e-6)
        if not training:
            continue
        grads = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
        eng.backward_update(grads, step)
        fg = {f.name: grads[eng.layout[f.name].group][:, eng.layout[f.name].column_start:
                                                       eng.layout[f.name].column_start + DIM]
              for f in feats}
        keys, kg = table_key_grads(feats, inputs, fg, "t", DIM)
        uk, ug = sum_duplicates(keys, kg)
        ref.update(uk, ug, step)
        _compare(eng, ref)
    return eng, ref


def _compare(eng: EmbeddingEngine, ref: RefTable) -> None:
    state = eng.export_table("t")
    want = sorted(ref.rows)
    assert state.keys.tolist() == want
    if not want:
        return
    np.testing.assert_allclose(state.values, [ref.rows[k]["v"] for k in want], rtol=1e-5,
                               atol=1e-6)
    for s, arr in state.slots.items():
        np.testing.assert_allclose(arr, [ref.rows[k]["s"][s] for k in want], rtol=1e-5,
                                   atol=1e-6)
    assert state.update_count.tolist() == [ref.rows[k]["count"] for k in want]
    assert state.last_step.tolist() == [ref.rows[k]["last"] for k in want]
    assert len(want) <= ref.cfg.rows


@pytest.mark.parametrize("opt", OPTIMIZER_NAMES)
def test_lru_every_optimizer_matches_reference(opt):
    eng, _ = _run_both(DynamicConfig(eviction="lru"), opt)
    assert eng.dynamic_metrics()["t"]["evictions"] > 0


@pytest.mark.parametrize("dyn", [
    DynamicConfig(eviction="lfu"),
    DynamicConfig(eviction="lru", admission="count", min_count=2),
    DynamicConfig(eviction="lfu", admission="count", min_count=3, missing="initial"),
    DynamicConfig(eviction="lru", admission="bloom", min_count=2, bloom_capacity=1_000_000,
                  false_positive_rate=1e-6),
    DynamicConfig(eviction="lru", admission="probability", p=0.4),
    DynamicConfig(eviction="lru", ttl_steps=2),
    DynamicConfig(eviction="lfu", ttl_steps=1, admission="count", min_count=2),
], ids=lambda d: f"{d.eviction}-{d.admission}-ttl{d.ttl_steps}-{d.missing}")
def test_policies_match_reference(dyn):
    eng, ref = _run_both(dyn, "adagrad", steps=14)
    m = eng.dynamic_metrics()["t"]
    assert m["rows"] == len(ref.rows)
    if dyn.admission == "count":
        assert m["admissions_pending"] == len(ref.counts)


def test_concat_and_fixed_hotness():
    _run_both(DynamicConfig(), "adagrad", combiners=("sum",), capacity=60)
    rng = np.random.default_rng(5)
    cfg = TableConfig("t", 64, DIM, dynamic=DynamicConfig())
    feats = [FeatureConfig("c", "t", "concat", 3)]
    eng = _engine(cfg, SparseOptimizerConfig("sgd", 0.1), feats)
    keys = rng.integers(-(2**62), 2**62, (8, 3))
    out = eng.forward({"c": SparseInput.fixed_hotness(keys)})[0]
    want = init_reference(cfg.initializer, SEED, "t", keys.reshape(-1), DIM).reshape(8, 3 * DIM)
    np.testing.assert_array_equal(out, want)


def test_eviction_none_raises_with_the_table_step_and_capacity():
    cfg = TableConfig("users", 4, DIM, dynamic=DynamicConfig(eviction="none"))
    eng = _engine(cfg, SparseOptimizerConfig("sgd", 0.1), [FeatureConfig("f", "users")])
    eng.forward({"f": SparseInput.one_hot(np.arange(4))}, step=0)
    eng.backward_update([np.zeros((4, DIM), np.float32)], 0)
    with pytest.raises(TableFullError, match=r"'users' is full at step 1: 4 of 4 rows.*capacity"):
        eng.forward({"f": SparseInput.one_hot(np.array([9]))}, step=1)


def test_batch_larger_than_capacity_is_one_clear_error():
    cfg = TableConfig("t", 4, DIM, dynamic=DynamicConfig())
    eng = _engine(cfg, SparseOptimizerConfig("sgd", 0.1), [FeatureConfig("f", "t")])
    with pytest.raises(TableFullError, match="one batch holds 6 new keys"):
        eng.forward({"f": SparseInput.one_hot(np.arange(6))})


def test_export_import_round_trip_and_capacity_check():
    eng, _ = _run_both(DynamicConfig(admission="count", min_count=2), "adam", steps=8)
    state = eng.export_table("t")
    other = _engine(eng.table_config("t"), SparseOptimizerConfig("adam", lr=0.05),
                    [FeatureConfig("f0", "t"), FeatureConfig("f1", "t", "mean")])
    other.import_table("t", state)
    again = other.export_table("t")
    for a, b in zip([state.keys, state.values, *state.slots.values(), state.update_count,
                     state.last_step], [again.keys, again.values, *again.slots.values(),
                                        again.update_count, again.last_step], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(state.extra["admission_keys"], again.extra["admission_keys"])
    small = _engine(TableConfig("t", 3, DIM, dynamic=DynamicConfig()),
                    SparseOptimizerConfig("adam", lr=0.05), [FeatureConfig("f0", "t")])
    with pytest.raises(ValueError, match="do not fit its capacity of 3 rows"):
        small.import_table("t", state)
    assert small.export_table("t").keys.size == 0


def test_results_do_not_depend_on_threads():
    import numba

    def run():
        return _run_both(DynamicConfig(admission="count"), "adagrad", steps=6)[0].export_table("t")

    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        a = run()
    finally:
        numba.set_num_threads(before)
    b = run()
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.values, b.values)


def test_dynamic_equals_static_on_the_same_ids():
    """Keys 0..n-1 in a dynamic table of capacity n train exactly like a static table."""
    rng = np.random.default_rng(3)
    opt = SparseOptimizerConfig("adagrad", 0.1)
    feats = [FeatureConfig("f", "t", "sum"), FeatureConfig("g", "t", "mean")]
    dyn = _engine(TableConfig("t", 300, 8, dynamic=DynamicConfig()), opt, feats)
    sta = _engine(TableConfig("t", 300, 8), opt, feats)
    for step in range(6):
        inputs = {f.name: SparseInput.fixed_hotness(rng.integers(0, 300, (32, 2)))
                  for f in feats}
        a, b = dyn.forward(inputs), sta.forward(inputs)
        np.testing.assert_array_equal(a[0], b[0])
        g = [rng.standard_normal(a[0].shape).astype(np.float32)]
        dyn.backward_update(g, step)
        sta.backward_update(g, step)
    d, s = dyn.export_table("t"), sta.export_table("t")
    np.testing.assert_array_equal(d.values, s.values[d.keys])
    np.testing.assert_array_equal(d.slots["accumulator"], s.slots["accumulator"][d.keys])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 30), min_size=1,
                         max_size=12), min_size=1, max_size=12),
       st.integers(12, 40), st.sampled_from(["lru", "lfu"]))
def test_index_invariants(batches, capacity, eviction):
    """Capacity never exceeded; every key inserted and not evicted or expired is still found
    at its row; the index and the row bookkeeping agree."""
    cfg = TableConfig("t", capacity, DIM, dynamic=DynamicConfig(eviction=eviction, ttl_steps=5))
    eng = _engine(cfg, SparseOptimizerConfig("sgd", 0.1), [FeatureConfig("f", "t")])
    table = eng.dynamic_table("t")
    live: set[int] = set()
    for step, keys in enumerate(batches):
        keys = np.array(keys, dtype=np.int64)
        before = table.metrics()
        eng.forward({"f": SparseInput.one_hot(keys)}, step=step)
        eng.backward_update([np.ones((keys.size, DIM), np.float32)], step)
        after = table.metrics()
        gone = (after["evictions"] - before["evictions"]) + (after["expired"] - before["expired"])
        live |= set(keys.tolist())
        held = set(table.row_key[table.row_live.astype(bool)].tolist())
        assert held <= live and len(live) - len(held) <= after["evictions"] + after["expired"]
        assert len(held) == after["rows"] <= capacity
        assert set(keys.tolist()) <= held  # a batch's keys are never evicted by itself
        assert gone >= 0
        for r in np.flatnonzero(table.row_live):
            assert kd.index_find(table.index, table.row_key[r]) == r
        live = held


def test_index_delete_keeps_probe_chains():
    rng = np.random.default_rng(0)
    index = new_index(64)
    keys = rng.integers(-(2**63), 2**63 - 1, 64, dtype=np.int64)
    for i, k in enumerate(keys):
        kd.index_insert(index, k, i)
    for i in rng.permutation(64)[:40]:
        assert kd.index_delete(index, keys[i]) == i
        keys[i] = 0  # deleted
    for i, k in enumerate(keys):
        if k != 0:
            assert kd.index_find(index, k) == i


def test_shard_of_keys_spreads_sparse_keys():
    keys = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, 100_000, dtype=np.int64)
    counts = np.bincount(shard_of_keys(keys, 3), minlength=3)
    assert counts.min() > 32_000
    np.testing.assert_array_equal(shard_of_keys(keys * 0 + 5, 3), shard_of_keys(keys * 0 + 5, 3))


def test_hash_table_rates_reports_every_load_factor():
    from embtrain.embedding.dynamic import hash_table_rates

    rates = hash_table_rates(5000, batch=1024)
    assert [r["load_factor"] for r in rates["by_load_factor"]] == [0.25, 0.5, 0.75, 0.9, 1.0]
    assert all(r["inserts_per_s"] > 0 and r["lookups_per_s"] > 0 for r in rates["by_load_factor"])


@pytest.mark.parametrize("k", [1, 7, 50, 199, 400])
def test_victims_are_the_smallest_score_then_key(k):
    rng = np.random.default_rng(k)
    cfg = TableConfig("t", 300, DIM, dynamic=DynamicConfig(eviction="lru"))
    from embtrain.embedding.dynamic import DynamicTable

    d = DynamicTable(cfg, SEED)
    keys = rng.choice(np.arange(-(10**6), 10**6), 250, replace=False).astype(np.int64)
    d.upsert(keys)
    meta = np.zeros((300, 2), np.int32)
    meta[:, 1] = rng.integers(0, 5, 300)  # many ties
    d.pin[rng.choice(300, 20, replace=False)] = 9
    got = d.victims(meta, k, 9)
    cand = [r for r in range(300) if d.row_live[r] and d.pin[r] != 9]
    want = sorted(sorted(cand, key=lambda r: (meta[r, 1], d.row_key[r]))[:k])
    assert got.tolist() == want
