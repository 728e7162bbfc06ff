"""Dynamic tables under power-law keys: the batches, and the whole state of a run to compare
two runs bit for bit."""

from __future__ import annotations

import numpy as np

from embtrain.embedding.config import FeatureConfig, SparseInput, TableConfig
from embtrain.embedding.engine import EmbeddingEngine


def dynamic_batches(features: list[FeatureConfig], steps: int, batch: int = 64
                    ) -> list[dict[str, SparseInput]]:
    """``steps`` batches of power-law keys (1.2) from 3,000 random 64-bit ids, 0-4 per bag."""
    rng = np.random.default_rng(11)
    universe = rng.integers(-(2**63), 2**63 - 1, 3000, dtype=np.int64)
    out = []
    for _ in range(steps):
        inputs = {}
        for f in features:
            lens = rng.integers(0, 5, batch)
            keys = universe[rng.zipf(1.2, int(lens.sum())) % universe.size]
            offs = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
            inputs[f.name] = SparseInput(keys, offs)
        out.append(inputs)
    return out


def dynamic_state(eng: EmbeddingEngine, tables: list[TableConfig], outs_all: list) -> tuple:
    """Every table's state, the hash tables' row bookkeeping, the counters and the outputs
    ``outs_all`` of a run of ``eng``, for :func:`same_dynamic_state`."""
    states = {t.name: eng.export_table(t.name) for t in tables}
    books = {}
    for keyed in eng._keyed.values():
        for space in keyed._group().spaces:
            d = space.d
            books[d.name] = (d.row_key.copy(), d.row_live.copy(), d.free[: d.n_free].copy(),
                             d.stats)
    return states, books, eng.dynamic_metrics(), outs_all


def same_dynamic_state(a: tuple, b: tuple) -> None:
    """Two :func:`dynamic_state` are the same bits: values, slots, counts, which key has which
    row, every counter and every output."""
    sa, ba, ma, oa = a
    sb, bb, mb, ob = b
    assert ma == mb
    for name in sa:
        x, y = sa[name], sb[name]
        for u, v in zip([x.keys, x.values, *x.slots.values(), x.update_count, x.last_step],
                        [y.keys, y.values, *y.slots.values(), y.update_count, y.last_step],
                        strict=True):
            np.testing.assert_array_equal(u, v)
        for u, v in zip(ba[name][:3], bb[name][:3], strict=True):  # which key has which row
            np.testing.assert_array_equal(u, v)
        assert ba[name][3] == bb[name][3]  # every counter
    for u, v in zip(oa, ob, strict=True):
        for p, q in zip(u, v, strict=True):
            np.testing.assert_array_equal(p, q)

