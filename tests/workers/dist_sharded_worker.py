"""One rank of the sharded-embedding equality test (started by tests/test_distributed.py).

Every rank builds the same random global batches and gradients, runs its slice through a
:class:`ShardedEmbedding` over the ranks, and compares with a one-process engine that it
runs on the whole global batch: pooled outputs every step, and every table (values, slots,
update_count, last_step) at the end, for every sharding mode, combiner, input kind and
sparse optimizer. Writes ``OUT/rank-R.json`` with the checks made and the failures.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np

from embtrain.comm import make_comm
from embtrain.embedding import (
    EmbeddingEngine,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.sharded import ShardedEmbedding, TablePlacement
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES, spec_of

OPTIMIZERS = OPTIMIZER_NAMES  # every registered sparse optimizer


def placement(mode: str, rows: int, dim: int, world: int, owner: int = 0) -> TablePlacement:
    """The planner's layout rules for one table (row: keys ≡ r; column: first ranks one more)."""
    if mode == "table":
        return TablePlacement(mode, (owner,), {owner: rows}, {owner: (0, dim)})
    ranks = tuple(range(world))
    if mode == "data_parallel":
        return TablePlacement(mode, ranks, dict.fromkeys(ranks, rows),
                              dict.fromkeys(ranks, (0, dim)))
    if mode == "row":
        counts = {r: len(range(r, rows, world)) for r in ranks}
        owners = tuple(r for r in ranks if counts[r])
        return TablePlacement(mode, owners, {r: counts[r] for r in owners},
                              dict.fromkeys(owners, (0, dim)))
    n, k = divmod(dim, world)
    cols, at = {}, 0
    for r in ranks:
        width = n + (1 if r < k else 0)
        cols[r] = (at, at + width)
        at += width
    return TablePlacement(mode, ranks, dict.fromkeys(ranks, rows), cols)


def make_tables(optimizer: str, world: int) -> tuple[list[TableConfig], dict[str, TablePlacement]]:
    column_mode = "table" if spec_of(optimizer).row_wise else "column"
    specs = [("t_row", 37, 8, "row"), ("t_col", 23, 7, column_mode), ("t_tab", 19, 8, "table"),
             ("t_dp", 11, 4, "data_parallel")]
    tables = [TableConfig(n, rows, dim) for n, rows, dim, _ in specs]
    places = {n: placement(mode, rows, dim, world, owner=world - 1)
              for n, rows, dim, mode in specs}
    return tables, places


def make_features(tables: list[TableConfig]) -> list[FeatureConfig]:
    out = []
    for t in tables:
        out += [
            FeatureConfig(f"{t.name}_onehot", t.name, "sum", 1),
            FeatureConfig(f"{t.name}_mean", t.name, "mean", None),
            FeatureConfig(f"{t.name}_sqrtn", t.name, "sqrtn", 3),
            FeatureConfig(f"{t.name}_concat", t.name, "concat", 2),
        ]
    return out


def make_batch(rng: np.random.Generator, features: list[FeatureConfig],
               tables: dict[str, TableConfig], size: int) -> dict[str, SparseInput]:
    batch = {}
    for f in features:
        rows = tables[f.table].rows
        if f.hotness == 1:
            keys = rng.integers(0, rows, size)
            batch[f.name] = SparseInput.one_hot(keys)
            continue
        if f.combiner == "concat":
            lengths = rng.integers(0, f.hotness + 1, size)  # short bags pad with zeros
        elif f.hotness:
            lengths = np.full(size, f.hotness)
        else:
            lengths = rng.integers(0, 5, size)  # empty bags included
        nnz = int(lengths.sum())
        keys = rng.integers(0, rows, nnz) ** 2 % rows  # duplicates
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        weights = rng.uniform(0.2, 2.0, nnz).astype(np.float32) if f.combiner != "sqrtn" else None
        batch[f.name] = SparseInput(keys.astype(np.int64), offsets, weights)
    return batch


def local_slice(inp: SparseInput, lo: int, hi: int) -> SparseInput:
    offs = np.asarray(inp.offsets)
    a, b = int(offs[lo]), int(offs[hi])
    w = None if inp.weights is None else inp.weights[a:b]
    bag = inp.bag_size if inp.bag_size else 0
    return SparseInput(inp.keys[a:b], offs[lo:hi + 1] - a, w, bag_size=bag)


def run_case(comm, optimizer: str, quantize: str, steps: int, size: int) -> list[str]:
    world, rank = comm.size, comm.rank
    tables, places = make_tables(optimizer, world)
    by_name = {t.name: t for t in tables}
    features = make_features(tables)
    opt = SparseOptimizerConfig(kind=optimizer, lr=0.05)
    ref = EmbeddingEngine(tables, features, opt, seed=5)
    emb = ShardedEmbedding(tables, features, opt, seed=5, placements=places, comm=comm,
                           quantize=quantize)
    rng = np.random.default_rng(11)
    lo, hi = rank * size // world, (rank + 1) * size // world
    problems = []
    tol = {"none": 1e-5, "fp16": 2e-3, "int8": 2e-2}[quantize]
    for step in range(steps):
        batch = make_batch(rng, features, by_name, size)
        want = ref.forward(batch)
        got = emb.forward({k: local_slice(v, lo, hi) for k, v in batch.items()}, size)
        for g, (a, b) in enumerate(zip(got, want, strict=True)):
            if not np.allclose(a, b[lo:hi], rtol=tol, atol=tol):
                err = float(np.abs(a - b[lo:hi]).max())
                problems.append(f"{optimizer}/{quantize} step {step}: group {g} forward off by {err}")
        grads = [rng.standard_normal(w.shape).astype(np.float32) for w in want]
        ref.backward_update(grads, step)
        emb.backward_update([g[lo:hi] for g in grads], step)
    if quantize != "none":
        return problems
    for name in emb.table_names:
        got_state = emb.export_table(name)
        if rank != 0:
            continue
        want_state = ref.export_table(name)
        assert got_state is not None
        np.testing.assert_array_equal(got_state.keys, want_state.keys)
        pairs = [("values", got_state.values, want_state.values),
                 ("update_count", got_state.update_count, want_state.update_count),
                 ("last_step", got_state.last_step, want_state.last_step)]
        pairs += [(s, got_state.slots[s], want_state.slots[s]) for s in want_state.slots]
        for what, a, b in pairs:
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-6):
                problems.append(f"{optimizer}: table {name} {what} differs "
                                f"({a.shape} vs {b.shape})")
    # import: the reference's tables into a fresh sharded embedding, then out again
    fresh = ShardedEmbedding(tables, features, opt, seed=99, placements=places, comm=comm)
    for name in fresh.table_names:
        fresh.import_table(name, ref.export_table(name))
    for name in fresh.table_names:
        state = fresh.export_table(name)
        if rank == 0 and state is not None:
            want_state = ref.export_table(name)
            if not np.array_equal(state.values, want_state.values):
                problems.append(f"{optimizer}: import/export of table {name} changed its values")
    return problems


def main() -> int:
    out = Path(sys.argv[1])
    comm = make_comm()
    checks: list[str] = []
    problems: list[str] = []
    try:
        for optimizer in OPTIMIZERS:
            problems += run_case(comm, optimizer, "none", steps=3, size=25)
            checks.append(optimizer)
        for quantize in ("fp16", "int8"):
            problems += run_case(comm, "adagrad", quantize, steps=2, size=25)
            checks.append(quantize)
    except Exception:
        problems.append(traceback.format_exc())
        (out / f"rank-{comm.rank}.json").write_text(json.dumps(
            {"rank": comm.rank, "size": comm.size, "checks": checks, "problems": problems}))
        return 1  # the launcher stops the other ranks
    (out / f"rank-{comm.rank}.json").write_text(json.dumps(
        {"rank": comm.rank, "size": comm.size, "checks": checks, "problems": problems,
         "bytes_sent": comm.traffic.total()}))
    comm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
