"""Reader throughput: Criteo's raw TSV layout against the same rows in Parquet.

    python benchmarks/bench_text_reader.py [--rows 500000] [--batch 65536] [--repeats 3]

Writes ``--rows`` rows for ``recipes/criteo_tsv.yaml`` (label, 13 integer columns with 5 %
empty fields, 26 string id columns) with gen-data into a temporary folder, once as TSV and
once as Parquet (snappy, row groups of 131,072 rows), then reads one unshuffled epoch of
each through ``BatchReader`` (prefetch 2), alternating formats, ``--repeats`` times.
Prints the median rows/s (wall clock) and rows per process CPU-second per format, as JSON.
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
from embtrain.data.textwrite import as_text
from embtrain.recipe.loader import parse_recipe_text

REPO = Path(__file__).resolve().parents[1]


def recipe_for(root: Path, fmt: str, batch: int):  # type: ignore[no-untyped-def]
    text = (REPO / "recipes" / "criteo_tsv.yaml").read_text()
    text = text.replace("data/criteo_tsv", str(root / fmt)).replace(
        "batch_size: 4096", f"batch_size: {batch}\n  shuffle: {{enabled: false}}")
    if fmt == "parquet":
        text = text.replace("*.tsv", "*.parquet").replace("format: tsv", "format: parquet")
    return parse_recipe_text(text, f"{fmt}.yaml")


def one_epoch(recipe) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    rows = sum(b.size for b in BatchReader(recipe, "train"))
    return time.perf_counter() - wall, time.process_time() - cpu, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        recipes = {fmt: recipe_for(root, fmt, args.batch) for fmt in ("tsv", "parquet")}
        config = GenConfig(rows=args.rows, eval_rows=0, files=4, seed=0)
        for fmt, r in recipes.items():
            result = generate(r, root / fmt, config)
            if fmt == "tsv":
                as_text(result, r, "tsv")
        sizes = {fmt: sum(p.stat().st_size for p in (root / fmt / "train").iterdir())
                 for fmt in recipes}
        runs: dict[str, list[tuple[float, float, int]]] = {fmt: [] for fmt in recipes}
        one_epoch(recipes["parquet"])  # warm the kernels
        for _ in range(args.repeats):
            for fmt, r in recipes.items():
                runs[fmt].append(one_epoch(r))
        out = {"rows": args.rows, "batch": args.batch, "repeats": args.repeats,
               "load_average": os.getloadavg()[0]}
        for fmt, rs in runs.items():
            assert all(n == args.rows // args.batch * args.batch for _, _, n in rs)
            n = rs[0][2]
            out[fmt] = {"rows_per_s": round(n / statistics.median(w for w, _, _ in rs)),
                        "rows_per_cpu_s": round(n / statistics.median(c for _, c, _ in rs)),
                        "bytes": sizes[fmt]}
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
