"""The disk tier's own read and write rates against the raw disk, on one path, in one process.

    python benchmarks/tier_io.py /work/tier-bench --rows 15000000 --batch 40000 --seconds 4

1. raw: random 4 KiB direct reads/s at 1, 4, 16 in flight and the sequential write rate
   (:func:`embtrain.storage.diskbench.measure_disk`);
2. tier write: every row of a dim-16 Adagrad table (144-byte records, 28 per 4 KiB block)
   written through ``RowFile.write`` in batches (packed, appended);
3. tier read: batches of ``--batch`` distinct random rows through ``RowFile.read`` at each
   depth: rows/s, blocks/s, and blocks/s as a share of the raw rate at the same depth;
4. overlap: the same batches through ``TierIO.prefetch`` while the main thread sleeps
   (a step that releases the GIL) as long as a read takes: wait per batch.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from embtrain.embedding.config import SparseOptimizerConfig, TableConfig
from embtrain.storage.aligned import BLOCK
from embtrain.storage.disk import RowFile, RowLayout
from embtrain.storage.diskbench import measure_disk
from embtrain.storage.tier_io import TierIO


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("directory", type=Path)
    p.add_argument("--rows", type=int, default=15_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=40_000)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--raw-size", default="2GiB")
    args = p.parse_args()
    from embtrain.recipe.units import parse_bytes

    d = args.directory
    d.mkdir(parents=True, exist_ok=True)
    out: dict[str, object] = {"date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                              "rows": args.rows, "dim": args.dim, "batch": args.batch}
    raw = measure_disk(d, parse_bytes(args.raw_size), (1, 4, 16), args.seconds)
    out["raw"] = raw.to_dict()
    lay = RowLayout.of(TableConfig("bench", args.rows, args.dim),
                       SparseOptimizerConfig(kind="adagrad", lr=0.1), 0)
    out["record_bytes"] = lay.record_bytes
    out["rows_per_block"] = lay.rows_per_unit
    rng = np.random.default_rng(0)
    depth_results = {}
    f = RowFile.create(d / "bench.tier", lay, "bench")
    t0 = time.perf_counter()
    chunk = 1 << 20
    for a in range(0, args.rows, chunk):
        f.write(f.read(np.arange(a, min(args.rows, a + chunk))))
    dt = time.perf_counter() - t0
    out["tier_write"] = {"rows_per_s": args.rows / dt,
                         "bytes_per_s": f.counters.bytes_written / dt,
                         "note": "includes computing the initial rows it writes"}
    f.close()
    for depth in (1, 4, 16):
        g = RowFile.open(d / "bench.tier", lay, "bench", depth=depth)
        rows = blocks = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            keys = rng.choice(args.rows, args.batch, replace=False)
            before = g.counters.bytes_read
            g.read(keys)
            rows += args.batch
            blocks += (g.counters.bytes_read - before) // BLOCK
        dt = time.perf_counter() - t0
        raw_rate = raw.random_reads_per_s[depth]
        depth_results[str(depth)] = {"rows_per_s": rows / dt, "blocks_per_s": blocks / dt,
                                     "share_of_raw": blocks / dt / raw_rate}
        g.close()
    out["tier_read"] = depth_results
    io = TierIO(RowFile.open(d / "bench.tier", lay, "bench", depth=16))
    t0 = time.perf_counter()
    io.read(rng.choice(args.rows, args.batch, replace=False))
    alone = time.perf_counter() - t0
    waits = []
    ticket = io.prefetch(rng.choice(args.rows, args.batch, replace=False))
    for _ in range(5):
        time.sleep(alone)  # the step
        t0 = time.perf_counter()
        io.wait(ticket)
        waits.append(time.perf_counter() - t0)
        ticket = io.prefetch(rng.choice(args.rows, args.batch, replace=False))
    io.wait(ticket)
    io.close()
    out["overlap"] = {"read_alone_s": alone, "wait_after_equal_step_s": waits}
    print(json.dumps(out, indent=2))
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
