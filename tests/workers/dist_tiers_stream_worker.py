"""One rank of the streamed-checkpoint test on several ranks (started by
tests/tiers/test_tiers_stream.py).

Every rank trains tiered tables (row, column and table sharding, static, and a dynamic
row-sharded one) on the same global batches as a one-process engine
that it runs too (a data-parallel table is left out: its all-reduced row sums equal one
process's to 1e-5, not bit for bit), then:

* writes a checkpoint the way ``TrainJob._checkpoint`` does (rank 0 writes from a
  :class:`CollectiveExport`, every rank drains it): it must equal, byte for byte, the
  one-process engine's checkpoint;
* writes one whose file writes fail on rank 0 in the middle of a tiered table: every rank
  must get past it (no rank waits forever) and the earlier checkpoint stays intact;
* restores the checkpoint into fresh tiered sharded tables (every rank reads its shard, chunk
  by chunk) and compares them with the one-process engine;
* compares :meth:`ShardedEmbedding.table_stream` of every table with its whole export.

Writes ``OUT/rank-R.json`` with the checks made and the problems found.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
from dist_sharded_worker import local_slice, placement

from embtrain.checkpoint import CheckpointManager
from embtrain.checkpoint import bundle_write as bundle_mod
from embtrain.checkpoint.collective import CollectiveExport
from embtrain.comm import make_comm
from embtrain.embedding import (
    EmbeddingEngine,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.config import DynamicConfig, TierConfig
from embtrain.embedding.sharded import ShardedEmbedding
from embtrain.errors import EmbtrainError

CHUNK = 13
STEPS = 4
BATCH = 24


def tables(tiered: bool) -> tuple[list[TableConfig], dict[str, str]]:
    tier = TierConfig(60) if tiered else None
    specs = [("t_row", 97, 8, "row", tier), ("t_col", 53, 7, "column", tier),
             ("t_tab", 41, 8, "table", tier)]
    out = [TableConfig(n, r, d, tier=t) for n, r, d, _, t in specs]
    # room for every key: with evictions each shard would choose its own victims
    out.append(TableConfig("t_dyn", 400, 8, tier=TierConfig(150) if tiered else None,
                           dynamic=DynamicConfig(admission="count", min_count=2)))
    return out, {n: m for n, _, _, m, _ in specs} | {"t_dyn": "row"}


def features(ts: list[TableConfig]) -> list[FeatureConfig]:
    return [FeatureConfig(f"f_{t.name}", t.name, "sum", None) for t in ts]


def batch(rng: np.random.Generator, ts: list[TableConfig]) -> dict[str, SparseInput]:
    out = {}
    for t in ts:
        lens = rng.integers(0, 3, BATCH)
        n = int(lens.sum())
        keys = (rng.integers(0, 300, n) * 7919 - 10**6 if t.dynamic is not None
                else (rng.zipf(1.3, n) - 1) % t.rows)
        offs = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        out[f"f_{t.name}"] = SparseInput(keys.astype(np.int64), offs,
                                         rng.uniform(0.5, 1.5, n).astype(np.float32))
    return out


def sharded(comm, ts: list[TableConfig], modes: dict[str, str], seed: int) -> ShardedEmbedding:
    places = {t.name: placement(modes[t.name], t.rows, t.dim, comm.size, owner=comm.size - 1)
              for t in ts}
    return ShardedEmbedding(ts, features(ts), SparseOptimizerConfig("adagrad", lr=0.05), seed,
                            placements=places, comm=comm)


def save(comm, emb: ShardedEmbedding, run: Path, step: int) -> str:
    """What TrainJob._checkpoint does with several ranks; the error rank 0 broadcast."""
    export = CollectiveExport(emb, CHUNK)
    error = ""
    try:
        if comm.rank == 0:
            CheckpointManager(run, fsync=False).save(step, export, None, (0, step))
    except (OSError, EmbtrainError) as exc:
        error = str(exc)
    finally:
        export.drain()
    return comm.broadcast_bytes(error.encode() if comm.rank == 0 else None).decode()


def manifest(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step-{step:08d}" / "manifest.json").read_text())


def files(m: dict) -> dict:
    return {f["path"]: f for f in m["files"] if f["path"] != "state.json"}


def run(comm, out: Path) -> tuple[list[str], list[str]]:
    checks: list[str] = []
    problems: list[str] = []
    ts, modes = tables(tiered=True)
    plain, _ = tables(tiered=False)
    ref = EmbeddingEngine(plain, features(plain), SparseOptimizerConfig("adagrad", lr=0.05), 5)
    emb = sharded(comm, ts, modes, 5)
    rng = np.random.default_rng(3)
    lo, hi = comm.rank * BATCH // comm.size, (comm.rank + 1) * BATCH // comm.size
    for step in range(STEPS):
        inputs = batch(rng, ts)
        want = ref.forward(inputs)
        emb.forward({k: local_slice(v, lo, hi) for k, v in inputs.items()}, BATCH)
        grads = [rng.standard_normal(w.shape).astype(np.float32) for w in want]
        ref.backward_update(grads, step)
        emb.backward_update([g[lo:hi] for g in grads], step)
    # the sharded chunks of every table are its whole export
    for t in ts:
        total, chunks = emb.table_stream(t.name, CHUNK)
        parts = [c for c in chunks]
        whole = emb.export_table(t.name)
        if comm.rank == 0:
            assert whole is not None
            keys = np.concatenate([c.keys for c in parts])
            if total != whole.keys.size or not np.array_equal(keys, whole.keys):
                problems.append(f"{t.name}: table_stream keys differ from export_table")
            values = np.concatenate([c.values for c in parts])
            if not np.array_equal(values, whole.values):
                problems.append(f"{t.name}: table_stream values differ from export_table")
            if t.dynamic is not None and (
                    parts[0].extra.keys() != whole.extra.keys() or not all(
                        np.array_equal(parts[0].extra[k], whole.extra[k]) for k in whole.extra)):
                problems.append(f"{t.name}: admission state of the first chunk differs")
            if len(parts) < 2:
                problems.append(f"{t.name}: one chunk only; the test needs several")
    checks.append("table_stream")
    run_dir = out / "ranks"
    error = save(comm, emb, run_dir, STEPS)
    if error:
        problems.append(f"save failed: {error}")
    if comm.rank == 0:
        CheckpointManager(out / "one", fsync=False).save(STEPS, ref, None, (0, STEPS))
        a, b = manifest(run_dir, STEPS), manifest(out / "one", STEPS)
        if a["content_fingerprint"] != b["content_fingerprint"] or files(a) != files(b):
            diff = sorted(p for p in files(b) if files(a).get(p) != files(b)[p])
            problems.append(f"2 ranks wrote another checkpoint than 1 rank: {diff[:5]}")
        if a["tables"] != b["tables"]:
            problems.append("manifest tables differ")
    checks.append("same checkpoint")
    # a write failing on rank 0 in the middle of a tiered table stops no rank forever
    real = bundle_mod._StreamFile.write_at
    calls = [0]

    def failing(self: bundle_mod._StreamFile, array: np.ndarray, at: int) -> None:
        calls[0] += 1
        if calls[0] > 3:
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        return real(self, array, at)

    if comm.rank == 0:
        bundle_mod._StreamFile.write_at = failing  # type: ignore[method-assign]
    try:
        error = save(comm, emb, run_dir, STEPS + 1)
    finally:
        bundle_mod._StreamFile.write_at = real  # type: ignore[method-assign]
    if "No space left on device" not in error:
        problems.append(f"a failed write reached rank {comm.rank} as {error!r}")
    if comm.rank == 0 and sorted(os.listdir(run_dir / "checkpoints")) != ["step-00000004"]:
        problems.append(f"after the failed write: {os.listdir(run_dir / 'checkpoints')}")
    checks.append("failed write")
    # restore on every rank, chunk by chunk, into fresh tiered shards
    fresh = sharded(comm, [replace(t) for t in ts], modes, 99)
    CheckpointManager(run_dir).restore(fresh, None, supersede_newer=comm.rank == 0)
    for t in ts:
        got = fresh.export_table(t.name)
        if comm.rank != 0:
            continue
        assert got is not None
        want = ref.export_table(t.name)
        same = (np.array_equal(got.keys, want.keys) and np.array_equal(got.values, want.values)
                and all(np.array_equal(got.slots[s], want.slots[s]) for s in want.slots)
                and np.array_equal(got.last_step, want.last_step))
        if not same:
            problems.append(f"restored table {t.name} differs from the one-process engine")
    checks.append("restore")
    return checks, problems


def main() -> int:
    out = Path(sys.argv[1])
    comm = make_comm()
    checks: list[str] = []
    problems: list[str] = []
    code = 0
    try:
        checks, problems = run(comm, out)
    except Exception:
        problems.append(traceback.format_exc())
        code = 1
    (out / f"rank-{comm.rank}.json").write_text(json.dumps(
        {"rank": comm.rank, "checks": checks, "problems": problems}))
    if code == 0:
        comm.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
