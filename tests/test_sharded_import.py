"""Importing whole tables into sharded embeddings: every owner keeps its shard (keys,
columns, slots, metadata and a dynamic table's admission state), checked against a plain
one-process engine on fresh random states; the sharding strategies' import path runs on one
process through a communicator of size one with a row or column placement."""

from __future__ import annotations

import numpy as np
import pytest

from embtrain.comm.base import LocalComm
from embtrain.embedding import EmbeddingEngine, FeatureConfig, SparseOptimizerConfig, TableConfig
from embtrain.embedding.config import DynamicConfig
from embtrain.embedding.engine import TableState
from embtrain.embedding.sharded import ShardedEmbedding
from embtrain.embedding.sharding.base import TablePlacement

DIM = 6


def _config(dynamic: bool) -> tuple[TableConfig, FeatureConfig, SparseOptimizerConfig]:
    table = TableConfig("t", 64, DIM,
                        dynamic=DynamicConfig(admission="count", min_count=3) if dynamic else None)
    return table, FeatureConfig("f", "t"), SparseOptimizerConfig(kind="adagrad")


def _state(rng: np.random.Generator, table: TableConfig, dynamic: bool) -> TableState:
    n = 40
    keys = (np.sort(rng.choice(1 << 40, n, replace=False)) if dynamic
            else np.sort(rng.choice(table.rows, n, replace=False))).astype(np.int64)
    extra = {}
    if dynamic:
        counted = np.sort(rng.choice(1 << 40, 9, replace=False)).astype(np.int64)
        extra = {"admission_keys": counted,
                 "admission_counts": rng.integers(1, 3, counted.size).astype(np.int64)}
    return TableState(
        keys=keys,
        values=rng.standard_normal((n, DIM)).astype(np.float32),
        slots={"accumulator": rng.random((n, DIM)).astype(np.float32)},
        update_count=rng.integers(0, 9, n).astype(np.int64),
        last_step=rng.integers(0, 9, n).astype(np.int64),
        extra=extra,
    )


@pytest.mark.parametrize(("mode", "dynamic"), [("row", True), ("row", False),
                                                ("column", False), ("table", True)])
def test_imported_shard_equals_the_engines_table(mode: str, dynamic: bool) -> None:
    rng = np.random.default_rng(7)
    table, feature, opt = _config(dynamic)
    state = _state(rng, table, dynamic)
    placement = TablePlacement(mode, (0,), {0: table.rows}, {0: (0, DIM)})
    sharded = ShardedEmbedding([table], [feature], opt, seed=1, placements={"t": placement},
                               comm=LocalComm())
    sharded.import_table("t", state)
    reference = EmbeddingEngine([table], [feature], opt, 1)
    reference.import_table("t", state)
    got, want = sharded.export_table("t"), reference.export_table("t")
    assert got is not None
    np.testing.assert_array_equal(got.keys, want.keys)
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.slots["accumulator"], want.slots["accumulator"])
    np.testing.assert_array_equal(got.update_count, want.update_count)
    np.testing.assert_array_equal(got.last_step, want.last_step)
    assert sorted(got.extra) == sorted(want.extra)
    for name, array in want.extra.items():
        np.testing.assert_array_equal(got.extra[name], array)


@pytest.mark.parametrize("mode", ["row", "column", "table"])
def test_unknown_slot_is_refused_naming_it(mode: str) -> None:
    table, feature, opt = _config(mode == "row")
    state = _state(np.random.default_rng(3), table, mode == "row")
    state.slots["momentum"] = np.zeros(state.keys.size, np.float32)
    placement = TablePlacement(mode, (0,), {0: table.rows}, {0: (0, DIM)})
    sharded = ShardedEmbedding([table], [feature], opt, seed=1, placements={"t": placement},
                               comm=LocalComm())
    with pytest.raises(ValueError, match=r"table 't': unknown slots \['momentum'\]"):
        sharded.import_table("t", state)
