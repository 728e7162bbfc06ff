"""Compile every kernel specialisation a run can ask for into the on-disk cache.

``python -m embtrain.cli.warm`` (a step of ``scripts/bootstrap.sh``; tooling above every layer,
since it drives the reader, the engine and the exchange kernels): the Parquet reader
reads a small generated data set holding every column type it accepts (each numeric dense
dtype with and without nulls, integer and string ids, one-hot, fixed and variable lists,
large lists, weights of two float widths; bfloat16 and float16 tables, a dynamic bfloat16 one,
a static and a dynamic table cached over disk stores) as a shuffled training split and as an
evaluation split, and the embedding engine trains on it with every sparse optimizer, then
exports its tables. numba compiles what its cache (:mod:`embtrain.kernels.numba_cache`)
does not hold yet; a second call compiles nothing and takes seconds. ``--if-needed`` returns
at once when the cache was already warmed for this kernel code and these callers (a marker
file named after a hash of :data:`CALL_SITES`: which specialisations exist depends on them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embtrain.kernels import numba_cache
from embtrain.kernels.watch import CompileWatch

#: Files (or, ending in ``/``, every ``.py`` under a directory) whose calls decide the kernels'
#: argument types (hence their specialisations), relative to the package.
CALL_SITES = ("embedding/", "data/columns.py", "data/reader.py", "cli/warm.py", "comm/wire.py")

#: Every numeric type a dense column may have (float16 is read as float32).
DENSE_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float16", "float32", "float64")
ROWS = 600
BATCH = 64

_RECIPE = """
version: 1
name: warm
data:
  train: {root}/train/*.parquet
  eval: {root}/eval/*.parquet
  batch_size: {batch}
  shuffle: {{window_batches: 2}}
features:
  - {{kind: dense, name: plain, columns: [{plain}], transform: signed_log1p}}
  - {{kind: dense, name: nullable, columns: [{nullable}], transform: log1p, fill_null: 0.0}}
  - {{kind: categorical, name: id64, column: id64, table: small}}
  - {{kind: categorical, name: id32, column: id32, table: small, weights: w32, combiner: sqrtn}}
  - {{kind: categorical, name: idu64, column: idu64, table: small, out_of_range: modulo}}
  - {{kind: categorical, name: ids, column: ids, table: wide, ids: string, out_of_range: modulo}}
  - {{kind: categorical, name: list64, column: list64, table: small, hotness: variable, combiner: mean, weights: wl32}}
  - {{kind: categorical, name: list32, column: list32, table: wide, hotness: variable, weights: wl64}}
  - {{kind: categorical, name: large, column: large, table: small, hotness: variable, combiner: sqrtn}}
  - {{kind: categorical, name: fixed, column: fixed, table: wide, hotness: 3, combiner: concat}}
  - {{kind: categorical, name: strs, column: strs, table: wide, ids: string, hotness: variable, out_of_range: modulo}}
  - {{kind: categorical, name: half_b, column: id32, table: hb}}
  - {{kind: categorical, name: half_f, column: list32, table: hf, hotness: variable, weights: wl64}}
  - {{kind: categorical, name: half_d, column: id64, table: hd}}
  - {{kind: categorical, name: dyn_count, column: id64, table: dcount}}
  - {{kind: categorical, name: dyn_bloom, column: ids, table: dbloom, ids: string}}
  - {{kind: categorical, name: dyn_prob, column: list64, table: dprob, hotness: variable, combiner: mean}}
  - {{kind: categorical, name: tier_s, column: list64, table: tstatic, hotness: variable}}
  - {{kind: categorical, name: tier_d, column: ids, table: tdyn, ids: string}}
tables:
  - {{name: small, dim: 8, rows: 50, initializer: {{type: normal, std: 0.01}}}}
  - {{name: wide, dim: 16, rows: 70}}
  - {{name: hb, dim: 8, rows: 50, dtype: bfloat16}}
  - {{name: hf, dim: 16, rows: 70, dtype: float16, rounding: nearest, optimizer_state: table}}
  - {{name: hd, dim: 8, dtype: bfloat16, dynamic: {{capacity: 40}}}}
  - {{name: dcount, dim: 8, dynamic: {{capacity: 64, admission: {{type: count}}, ttl_steps: 2, missing: initial}}}}
  - {{name: dbloom, dim: 8, dynamic: {{capacity: 70, eviction: lfu, admission: {{type: bloom, capacity: 1000}}}}}}
  - {{name: dprob, dim: 8, dynamic: {{capacity: 60, admission: {{type: probability, p: 0.5}}}}}}
  - {{name: tstatic, dim: 8, rows: 200, storage: [{{tier: host, budget: 12KiB}}, {{tier: disk, path: {root}/store-s-{optimizer}}}]}}
  - {{name: tdyn, dim: 8, dynamic: {{capacity: 400, eviction: lfu, admission: {{type: count, min_count: 2}}}}, storage: [{{tier: host, budget: 40KiB}}, {{tier: disk, path: {root}/store-d-{optimizer}}}]}}
optimizer: {{sparse: {{type: {optimizer}, lr: 0.05}}, dense: {{type: adam, lr: 0.001}}}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: 4, seed: 0}}
"""


def _ragged(rng: np.random.Generator, n: int, hi: int, max_len: int) -> list[list[int]]:
    return [rng.integers(0, hi, rng.integers(0, max_len + 1)).tolist() for _ in range(n)]


def write_data(root: Path, rows: int = ROWS, seed: int = 0) -> None:
    """Two train files and one eval file with every column type :data:`_RECIPE` names."""
    rng = np.random.default_rng(seed)
    for split, files in (("train", 2), ("eval", 1)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i in range(files):
            n = rows
            cols: dict[str, pa.Array] = {"label": pa.array(rng.random(n) < 0.3).cast(pa.float32())}
            for t in DENSE_TYPES:
                values = rng.integers(0, 100, n).astype(t)
                cols[f"d_{t}"] = pa.array(values)
                mask = np.zeros(n, dtype=bool)
                mask[:: 7] = True
                cols[f"n_{t}"] = pa.array(values, mask=mask)
            cols["id64"] = pa.array(rng.integers(0, 50, n), pa.int64())
            cols["id32"] = pa.array(rng.integers(0, 50, n), pa.int32())
            cols["w32"] = pa.array(rng.random(n), pa.float32())
            cols["idu64"] = pa.array(rng.integers(0, 1000, n), pa.uint64())
            cols["ids"] = pa.array([f"s{x}" for x in rng.integers(0, 90, n)], pa.string())
            list64 = _ragged(rng, n, 50, 4)
            cols["list64"] = pa.array(list64, pa.list_(pa.int64()))
            cols["wl32"] = pa.array([[1.0] * len(x) for x in list64], pa.list_(pa.float32()))
            list32 = _ragged(rng, n, 70, 3)
            cols["list32"] = pa.array(list32, pa.list_(pa.int32()))
            cols["wl64"] = pa.array([[0.5] * len(x) for x in list32], pa.list_(pa.float64()))
            cols["large"] = pa.array(_ragged(rng, n, 50, 5), pa.large_list(pa.int64()))
            cols["fixed"] = pa.array(rng.integers(0, 70, (n, 3)).tolist(), pa.list_(pa.int64(), 3))
            cols["strs"] = pa.array([[f"t{v}" for v in x] for x in _ragged(rng, n, 99, 3)],
                                    pa.list_(pa.large_string()))
            pq.write_table(pa.table(cols), root / split / f"part-{i}.parquet")


#: The parts :func:`warm` compiles side by side, each in its own process, as stages run in
#: order, each the half tables it trains (``()``: the float32 tables). The largest kernels to
#: compile are the pooling and the update of each argument-type pattern: float32 tables, half
#: values (the pooling of every half table; the update with float32 state) and half values
#: with half state (``hf``: the update only). The ``half`` part compiles the half pooling first;
#: the ``float32`` part reaches ``hf`` after its own kernels, when that pooling is in the cache
#: (numba loads what another process saved), and compiles only ``hf``'s update. Measured on 2
#: cores with a fresh cache: 368 s as now (2026-11-25 00:10 UTC); ``hf`` in the half part
#: after its pooling and update, as before: 483 s (2026-11-24).
PARTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "float32": ((), ("hf",)),
    "half": (("hb", "hd"),),
}
HALF_TABLES = tuple(t for stages in PARTS.values() for stage in stages for t in stage)


def _part_text(text: str, stage: tuple[str, ...] | None) -> str:
    """``text`` (the recipe) with only the stage's tables (its half tables; ``()``: the
    float32 tables) and the features that read them (``None``: every table); dense features
    stay in every stage."""
    if stage is None:
        return text
    out = []
    for line in text.splitlines():
        table = next((t for t in HALF_TABLES
                      if re.search(rf"(table|{{name): {t}\b", line)), None)
        names_table = "kind: categorical" in line or "{name:" in line
        mine = table in stage if table is not None else stage == ()
        if names_table and not mine:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def _recipe(root: Path, optimizer: str, stage: tuple[str, ...] | None = None):  # -> Recipe
    from embtrain.recipe.loader import load_recipe

    name = "all" if stage is None else "-".join(stage) or "float32"
    path = root / f"warm-{name}-{optimizer}.yaml"
    path.write_text(_part_text(_RECIPE, stage).format(
        root=root, batch=BATCH, optimizer=optimizer,
        plain=", ".join(f"d_{t}" for t in DENSE_TYPES),
        nullable=", ".join(f"n_{t}" for t in DENSE_TYPES),
    ))
    return load_recipe(path)


def exercise(root: Path, part: str = "all") -> None:
    """Read ``root``'s data (train, shuffled, and eval) and train an engine on it with every
    sparse optimizer; then export, read and re-initialise rows as checkpoints do. ``part``:
    ``all``, or one of :data:`PARTS` (its stages in order; the helpers' kernels with
    ``float32``)."""
    stages = (None,) if part == "all" else PARTS[part]
    if part in ("all", "float32"):
        _exercise_helpers()
    for stage in stages:
        _exercise_stage(root, stage)


def _exercise_stage(root: Path, stage: tuple[str, ...] | None) -> None:
    """:func:`exercise` for one stage's tables (``None``: all)."""
    from embtrain.data import BatchReader
    from embtrain.embedding import EmbeddingEngine
    from embtrain.embedding.config import OPTIMIZER_KINDS
    from embtrain.embedding.from_recipe import (
        feature_configs,
        sparse_optimizer_config,
        table_configs,
    )
    from embtrain.embedding.initializers import initial_rows
    from embtrain.storage import open_store

    # every sparse optimizer, SGD last: a stage of tables with half optimizer state then
    # finds SGD's update (that of float32 state) compiled by the other part meanwhile
    for k, optimizer in enumerate(sorted(OPTIMIZER_KINDS, key=lambda kind: kind == "sgd")):
        recipe = _recipe(root, optimizer, stage)
        tables = table_configs(recipe)
        for t in tables:  # the tiered tables' store directories (the job's run makes them)
            if t.tier is not None and t.tier.path:
                Path(t.tier.path).mkdir(parents=True, exist_ok=True)
        engine = EmbeddingEngine(tables, feature_configs(recipe),
                                 sparse_optimizer_config(recipe.optimizer.sparse), seed=0,
                                 stores=open_store)  # the tiered tables' disk stores
        splits = ("train", "eval") if k == 0 else ("train",)
        step = 0
        for split in splits:
            for batch in BatchReader(recipe, split, seed=0):
                if split == "eval":  # dynamic tables: lookup only
                    engine.forward(batch.sparse, training=False)
                outs = engine.forward(batch.sparse)
                engine.prefetch(batch.sparse)  # the dynamic tables' resumable lookup ahead
                engine.backward_update([np.full_like(o, 0.01) for o in outs], step)
                step += 1
        outs = engine.forward(batch.sparse, out=engine.new_outputs(batch.size))
        engine.backward_update([np.full_like(o, 0.01) for o in outs], step)
        for table in engine.table_names:
            state = engine.export_table(table)
            if engine.table_config(table).dynamic is not None:  # a restore's upsert path
                engine.import_table(table, state)
            engine.read_rows(table, np.arange(3))
            rows = np.arange(3)
            initial_rows(engine.table_config(table), 0, rows)
            rows.flags.writeable = False  # rows read from a checkpoint or export (memory-mapped)
            initial_rows(engine.table_config(table), 0, rows)


def _exercise_helpers() -> None:
    """The kernels outside the engine's step: string hashing, id transposes, the row-map reset,
    the dynamic index's rehash, the exchange's fp16 and bfloat16 conversions."""
    from embtrain.data.kernels import hash_strings, transpose_into
    from embtrain.kernels import get_backend

    hash_strings(["a", "bc"])
    hash_strings([""])
    # A chunk's one-hot ids are C-contiguous, or strided when the chunk is a slice of a file.
    src, dst = np.zeros((2, 8), np.int64), np.zeros((8, 2), np.int64)
    transpose_into(src, dst, 0)
    transpose_into(src[:, 2:6], dst, 0)
    get_backend("cpu").fill_i32(np.zeros(4, np.int32), 0)  # the engine's row-map reset
    from embtrain.embedding.dynamic import new_index
    from embtrain.kernels import dynamic as kd

    kd.rehash(new_index(4), new_index(8))  # count admission's counter grows
    # the exchange's codecs between ranks, fp16 (quantized) and bfloat16 (a bfloat16 table's bit
    # patterns): from column slices, whole arrays and read-only ones (TensorFlow's gradients,
    # received bytes) into contiguous halves, and back
    from embtrain.comm.halfs import from_bfloat16, from_half, to_bfloat16, to_half

    wide = np.zeros((2, 24), np.float32)
    frozen = wide.copy()
    frozen.flags.writeable = False
    for encode, decode, dtype in ((to_half, from_half, np.float16),
                                  (to_bfloat16, from_bfloat16, np.uint16)):
        half = np.zeros((2, 16), dtype)
        for src in (wide[:, 2:18], wide[:, :16].copy(), frozen[:, 2:18], frozen[:, :16]):
            encode(src, half)
        decode(half)
        half.flags.writeable = False
        decode(half)


def marker() -> Path:
    """The file that says the cache was warmed for the current kernels and :data:`CALL_SITES`."""
    h = hashlib.sha256()
    for entry in CALL_SITES:
        files = (sorted((numba_cache.PACKAGE / entry).rglob("*.py")) if entry.endswith("/")
                 else [numba_cache.PACKAGE / entry])
        for path in files:
            rel = path.relative_to(numba_cache.PACKAGE).as_posix()
            h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return numba_cache.cache_dir() / f"warm-{h.hexdigest()[:16]}.json"


def warm_part(part: str, verbose: bool = True) -> CompileWatch:
    """Compile (or load from the cache) ``part``'s kernel specialisations (``all``: every one);
    returns what compiled."""
    label = "" if part == "all" else f"[{part}]"

    def started(name: str) -> None:
        if verbose:
            print(f"warm{label}: compiling {name} ...", file=sys.stderr, flush=True)

    with CompileWatch(on_start=started) as watch, tempfile.TemporaryDirectory() as tmp:
        write_data(Path(tmp))
        exercise(Path(tmp), part)
    return watch


def warm(verbose: bool = True, jobs: int = 2) -> list[tuple[str, float]]:
    """Compile (or load from the cache) every kernel specialisation; returns what compiled
    (name, seconds). With ``jobs`` ≥ 2 the :data:`PARTS` compile side by side, each but the
    first in a child process (numba compiles one function at a time per process, and a
    function's cache entry is written whole, so two processes share the cache safely).

    Writes :func:`marker` when every part is done.
    """
    if jobs < 2:
        compiled = list(warm_part("all", verbose).compiled)
    else:
        first, *others = PARTS
        with tempfile.TemporaryDirectory() as tmp:
            reports = {part: Path(tmp) / f"{part}.json" for part in others}
            children = {part: subprocess.Popen(
                [sys.executable, "-m", "embtrain.cli.warm", "--part", part, "--report",
                 str(report)] + ([] if verbose else ["--quiet"]))
                for part, report in reports.items()}
            try:
                compiled = list(warm_part(first, verbose).compiled)
            finally:
                codes = {part: child.wait() for part, child in children.items()}
            for part, code in codes.items():
                if code != 0:
                    raise RuntimeError(f"warm: the {part} part failed (exit {code})")
                compiled += [tuple(c) for c in json.loads(reports[part].read_text())["compiled"]]
    seconds = sum(t for _, t in compiled)
    record = {"compiled": [name for name, _ in compiled], "seconds": seconds}
    marker().write_text(json.dumps(record, indent=2) + "\n")
    if verbose:
        print(f"warm: {len(compiled)} kernel(s) compiled ({seconds:.1f} s of compiling) into "
              f"{numba_cache.cache_dir()}", file=sys.stderr, flush=True)
    return compiled


def main(argv: list[str] | None = None) -> int:
    """``python -m embtrain.cli.warm [--quiet] [--if-needed] [--jobs N]``."""
    parser = argparse.ArgumentParser(prog="python -m embtrain.cli.warm", description=__doc__)
    parser.add_argument("--quiet", action="store_true", help="print nothing")
    parser.add_argument("--if-needed", action="store_true",
                        help="do nothing when this kernel code's cache was already warmed")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="1: one process; more: the parts side by side (default where 2 cores are)")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # a child's share
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)  # where it says so
    args = parser.parse_args(argv)
    if args.part is not None:
        watch = warm_part(args.part, verbose=not args.quiet)
        if args.report is not None:
            args.report.write_text(json.dumps({"compiled": watch.compiled}))
        return 0
    if args.if_needed and marker().is_file():
        return 0
    if not args.quiet:
        print(f"warm: compiling what {numba_cache.cache_dir()} lacks (everything, 3-7 minutes "
              "on 2 cores, the first time for this kernel code)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    warm(verbose=not args.quiet, jobs=args.jobs)
    if not args.quiet:
        print(f"warm: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
