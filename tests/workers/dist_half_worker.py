"""One rank of the half-table equality test (started by tests/half/test_half_distributed.py).

bfloat16 tables (stochastic rounding) in every sharding mode, and a dynamic one sharded by
the hash of its keys (rounded by key, whichever rank and row holds it), trained through a
:class:`ShardedEmbedding` over the ranks and by a one-process engine on the same global
batches and gradients: every table's values (16-bit patterns) and metadata must be equal bit
for bit, and so must the optimizer slots of table- and column-sharded tables; the slots of
row-sharded and data-parallel tables sum their float32 gradients in another order (as
float32 tables do, to 1e-5) and may differ in the last bits (one half ulp for half slots). Writes ``OUT/rank-R.json`` with the checks made and the failures.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
from dist_sharded_worker import local_slice, make_batch, make_features, placement

from embtrain.comm import make_comm
from embtrain.embedding import EmbeddingEngine, SparseOptimizerConfig, TableConfig
from embtrain.embedding.config import DynamicConfig
from embtrain.embedding.sharded import ShardedEmbedding


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Optimizer slots of row-sharded and data-parallel tables: their float32 gradient sums
    run in another order on several ranks (as for float32 tables, to 1e-5), so a slot may
    differ in its last bits, or by one unit of a half slot's last place."""
    if a.dtype == np.uint16:
        a = (a.astype(np.uint32) << 16).view(np.float32)
        b = (b.astype(np.uint32) << 16).view(np.float32)
        return bool(np.all(np.abs(a - b) <= 2.0**-7 * np.maximum(np.abs(a), np.abs(b))))
    return bool(np.allclose(a, b, rtol=1e-5, atol=1e-6))


def run_case(comm, optimizer: str, state: str, steps: int, size: int) -> list[str]:
    world, rank = comm.size, comm.rank
    specs = [("h_row", 37, 8, "row"), ("h_col", 23, 7, "column"), ("h_tab", 19, 8, "table"),
             ("h_dp", 11, 4, "data_parallel"), ("h_dyn", 64, 8, "row")]
    tables = [TableConfig(n, rows, dim, dtype="bfloat16", optimizer_state=state,
                          dynamic=DynamicConfig() if n == "h_dyn" else None)
              for n, rows, dim, _ in specs]
    places = {n: placement(mode, rows, dim, world, owner=world - 1)
              for n, rows, dim, mode in specs}
    by_name = {t.name: t for t in tables}
    # the dynamic table (row-sharded by a hash of the key) reads keys 0..23: they fit each
    # rank's share of its capacity however the hash splits them
    by_name["h_dyn"] = replace(by_name["h_dyn"], rows=24, dynamic=None)
    features = make_features(tables)
    opt = SparseOptimizerConfig(kind=optimizer, lr=0.05)
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
            if not np.allclose(a, b[lo:hi], rtol=1e-5, atol=1e-6):
                problems.append(f"{optimizer}/{state} step {step}: group {g} forward differs")
        grads = [rng.standard_normal(w.shape).astype(np.float32) for w in want]
        ref.backward_update(grads, step)
        emb.backward_update([g[lo:hi] for g in grads], step)
    for name in emb.table_names:
        got_state = emb.export_table(name)
        if rank != 0:
            continue
        want_state = ref.export_table(name)
        assert got_state is not None
        pairs = [("keys", got_state.keys, want_state.keys),
                 ("values", got_state.values, want_state.values),
                 ("update_count", got_state.update_count, want_state.update_count),
                 ("last_step", got_state.last_step, want_state.last_step)]
        pairs += [(s, got_state.slots[s], want_state.slots[s]) for s in want_state.slots]
        exact = places[name].mode in ("table", "column")
        for what, a, b in pairs:
            if a.dtype != b.dtype or a.shape != b.shape:
                problems.append(f"{optimizer}/{state}: table {name} {what}: {a.dtype}{a.shape} "
                                f"vs {b.dtype}{b.shape}")
            elif what in ("keys", "values", "update_count", "last_step") or exact:
                if not np.array_equal(a, b):  # bit for bit
                    problems.append(f"{optimizer}/{state}: table {name} {what} differs in "
                                    f"{int((a != b).sum())} elements")
            elif not _close(a, b):
                problems.append(f"{optimizer}/{state}: table {name} {what} differs beyond "
                                "float32 summation order")
        if want_state.values.dtype != np.uint16:
            problems.append(f"table {name}: exported as {want_state.values.dtype}, not uint16")
    return problems


def main() -> int:
    out = Path(sys.argv[1])
    comm = make_comm()
    checks: list[str] = []
    problems: list[str] = []
    try:
        for optimizer, state in (("adagrad", "float32"), ("adam", "table")):
            problems += run_case(comm, optimizer, state, steps=3, size=25)
            checks.append(f"{optimizer}/{state}")
    except Exception:
        problems.append(traceback.format_exc())
        (out / f"rank-{comm.rank}.json").write_text(json.dumps(
            {"rank": comm.rank, "checks": checks, "problems": problems}))
        return 1
    (out / f"rank-{comm.rank}.json").write_text(json.dumps(
        {"rank": comm.rank, "checks": checks, "problems": problems}))
    comm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
