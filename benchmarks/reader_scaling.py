"""Reader work per rank at 1 and 2 ranks (and more): does it fall as 1/N with ``data.shards``?

    python benchmarks/reader_scaling.py [--data DIR] [--rows 1000000] [--shards 8]
                                        [--worlds 1 2] [--repeats 3]

Without ``--data`` it writes ``gen-data --preset criteo`` data (4 files, row groups of 131,072
rows) into a temporary folder first. For each world size ``w`` and each rank ``r < w`` it reads
rank ``r``'s batches of one shuffled training epoch (batch 65536, windows of 16 batches, no
prefetch thread: the rank's whole reader work runs in the measured call) and records the wall
time, the process CPU time (all threads: pyarrow decodes with its own) and the rows decoded.
Rounds interleave the world sizes and the two layouts, ``data.shards: --shards`` (each rank
decodes only its shards) and ``data.shards: 1`` (every rank decodes whole batches, the reader
before shards); medians over rounds, and per world size the slowest rank's median. The ranks
are read one after another in this process, so each figure is one rank's own work, not slowed
by its neighbours on a small machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embtrain.data import BatchReader
from embtrain.data.gen import GenConfig, generate
from embtrain.data.presets import preset_recipe
from embtrain.recipe.models import Recipe


def configured(recipe: Recipe, batch: int, shards: int) -> Recipe:
    data = recipe.data.model_copy(update={"batch_size": batch, "prefetch": 0, "shards": shards})
    return recipe.model_copy(update={"data": data})


def read_rank(recipe: Recipe, rank: int, world: int) -> dict[str, float]:
    """One epoch of rank ``rank``'s batches: wall and CPU seconds, rows kept and decoded."""
    reader = BatchReader(recipe, "train", rank=rank, world_size=world)
    start, cpu = time.perf_counter(), time.process_time()
    rows = sum(b.size for b in reader)
    return {"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu,
            "rows": rows, "decoded_rows": reader.decoded_rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="gen-data --preset criteo output (default: make one)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to generate without --data")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data
        if data_dir is None:
            data_dir = Path(tmp) / "criteo"
            start = time.perf_counter()
            generate(preset_recipe("criteo", str(data_dir)), data_dir,
                     GenConfig(rows=args.rows, eval_rows=1000, files=args.files), {"preset": "criteo"})
            print(f"generated {args.rows} rows in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        base = preset_recipe("criteo", str(data_dir.resolve()))
        layouts = {f"shards {args.shards}": configured(base, args.batch, args.shards),
                   "shards 1": configured(base, args.batch, 1)}
        read_rank(layouts[f"shards {args.shards}"], 0, 1)  # compile kernels, warm the page cache
        load_before = os.getloadavg()[0]
        runs: dict[tuple[str, int, int], list[dict[str, float]]] = {}
        for _ in range(args.repeats):
            for world in args.worlds:
                for name, recipe in layouts.items():
                    for rank in range(world):
                        runs.setdefault((name, world, rank), []).append(
                            read_rank(recipe, rank, world))
        results = []
        for name in layouts:
            for world in args.worlds:
                ranks = [{k: statistics.median(r[k] for r in runs[(name, world, rank)])
                          for k in ("wall_s", "cpu_s", "rows", "decoded_rows")}
                         for rank in range(world)]
                slowest = max(ranks, key=lambda r: r["wall_s"])
                results.append({"layout": name, "world": world, "ranks": ranks,
                                "wall_s": slowest["wall_s"],
                                "cpu_s": max(r["cpu_s"] for r in ranks),
                                "decoded_rows": max(r["decoded_rows"] for r in ranks)})
        for r in results:
            one = next(x for x in results if x["layout"] == r["layout"] and x["world"] == 1)
            r["wall_vs_1"] = r["wall_s"] / one["wall_s"]
            r["cpu_vs_1"] = r["cpu_s"] / one["cpu_s"]
        load_after = os.getloadavg()[0]
        if args.json:
            print(json.dumps({"results": results, "load": [load_before, load_after],
                              "cpus": os.cpu_count()}))
            return
        print(f"# {os.cpu_count()} CPUs, load average {load_before:.1f} -> {load_after:.1f}; "
              f"batch {args.batch}, medians of {args.repeats} interleaved rounds; per world "
              "size the slowest rank")
        print(f"{'layout':10} {'ranks':>5} {'wall s/rank':>12} {'vs 1 rank':>9} "
              f"{'CPU s/rank':>11} {'vs 1 rank':>9} {'rows decoded/rank':>18}")
        for r in results:
            print(f"{r['layout']:10} {r['world']:5d} {r['wall_s']:12.3f} {r['wall_vs_1']:9.2f} "
                  f"{r['cpu_s']:11.3f} {r['cpu_vs_1']:9.2f} {int(r['decoded_rows']):18,d}")


if __name__ == "__main__":
    main()
