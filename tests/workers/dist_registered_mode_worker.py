"""One rank of the registered-sharding-mode test (started by tests/test_adding_kinds.py).

Registers a dummy sharding mode, ``last_owner`` (the whole table on the last rank), the way
docs/ARCHITECTURE.md says a mode is added: its name, a cost model in the planner's
``MODELS`` and a strategy in ``embedding/sharding``'s registry, nothing else. Then every rank
runs its slice of random global batches through a :class:`ShardedEmbedding` holding one
table in that mode and one row-sharded table, and compares with a one-process engine on the
whole batch: pooled outputs every step, every table's values and slots at the end. Writes
``OUT/rank-R.json`` with what it saw and the failures.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np
from dist_sharded_worker import local_slice, make_batch, make_features, placement

from embtrain.comm import make_comm
from embtrain.embedding import EmbeddingEngine, SparseOptimizerConfig, TableConfig
from embtrain.embedding.sharded import ShardedEmbedding, TablePlacement
from embtrain.embedding.sharding import STRATEGIES
from embtrain.embedding.sharding.table import TableSharding
from embtrain.plan.shardings import MODELS, Group, TableModel

MODE = "last_owner"


class LastOwnerModel(TableModel):
    """The dummy's cost model (``plan/shardings.py``): ``table``'s, on the last rank."""

    name = MODE
    one_owner = False  # the mode, not the placer, chooses the rank

    def layout(self, rows: int, dim: int, world: int, rank: int = 0) -> tuple[Group, ...]:
        return (Group(world - 1, 1, rows, dim, 0),)


class LastOwnerSharding(TableSharding):
    """The dummy's strategy (``embedding/sharding/<mode>.py``)."""

    name = MODE
    model = LastOwnerModel()


def register() -> None:
    """The dummy's entries in the registries (this process only)."""
    MODELS[MODE] = LastOwnerSharding.model
    STRATEGIES[MODE] = LastOwnerSharding()


def placed(rows: int, dim: int, world: int) -> TablePlacement:
    """Where the dummy's cost model puts a table: its layout's one group."""
    (g,) = MODELS[MODE].layout(rows, dim, world)
    return TablePlacement(MODE, (g.first,), {g.first: rows}, {g.first: (0, dim)})


def run(comm, steps: int = 3, size: int = 24) -> tuple[list[str], list[int], bool]:
    world, rank = comm.size, comm.rank
    tables = [TableConfig("t_last", 29, 8), TableConfig("t_row", 37, 8)]
    places = {"t_last": placed(29, 8, world), "t_row": placement("row", 37, 8, world)}
    by_name = {t.name: t for t in tables}
    features = make_features(tables)
    opt = SparseOptimizerConfig(kind="adagrad", lr=0.05)
    ref = EmbeddingEngine(tables, features, opt, seed=5)
    emb = ShardedEmbedding(tables, features, opt, seed=5, placements=places, comm=comm)
    rng = np.random.default_rng(11)
    lo, hi = rank * size // world, (rank + 1) * size // world
    problems = []
    for step in range(steps):
        batch = make_batch(rng, features, by_name, size)
        want = ref.forward(batch)
        got = emb.forward({k: local_slice(v, lo, hi) for k, v in batch.items()}, size)
        for g, (a, b) in enumerate(zip(got, want, strict=True)):
            if not np.allclose(a, b[lo:hi], rtol=1e-5, atol=1e-5):
                problems.append(f"step {step}: group {g} forward off by "
                                f"{float(np.abs(a - b[lo:hi]).max())}")
        grads = [rng.standard_normal(w.shape).astype(np.float32) for w in want]
        ref.backward_update(grads, step)
        emb.backward_update([g[lo:hi] for g in grads], step)
    for name in emb.table_names:
        got_state = emb.export_table(name)
        if rank != 0:
            continue
        want_state = ref.export_table(name)
        assert got_state is not None
        pairs = [("values", got_state.values, want_state.values)]
        pairs += [(s, got_state.slots[s], want_state.slots[s]) for s in want_state.slots]
        for what, a, b in pairs:
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-6):
                problems.append(f"table {name} {what} differs")
    return problems, list(places["t_last"].owners), "t_last" in emb.engine.table_names


def main() -> int:
    out = Path(sys.argv[1])
    register()
    comm = make_comm()
    report: dict = {"rank": comm.rank, "mode": MODE, "problems": []}
    try:
        problems, owners, holds = run(comm)
        report.update(problems=problems, owners=owners, holds_table=holds)
    except Exception:
        report["problems"] = [traceback.format_exc()]
    (out / f"rank-{comm.rank}.json").write_text(json.dumps(report))
    if report["problems"]:
        return 1
    comm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
