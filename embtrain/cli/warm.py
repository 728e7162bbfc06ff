"""Compile the kernel specialisations runs ask for into the on-disk cache.

``python -m embtrain.cli.warm`` (a step of ``scripts/bootstrap.sh``; tooling above every layer,
since it drives the reader, the engine and the exchange kernels): the Parquet reader
reads a small generated data set holding every column type it accepts (each numeric dense
dtype with and without nulls, integer and string ids, one-hot, fixed and variable lists,
large lists, weights of two float widths) as a shuffled training split and as an evaluation
split, and the embedding engine trains on it, then exports its tables. ``--set default`` (the
set-up's) trains float32 tables (static, dynamic, cached over disk stores) with the shipped
recipes' sparse optimizers; ``--set full`` also bfloat16 and float16 tables (a dynamic
bfloat16 one, one with float16 optimizer state) with every sparse optimizer (what the test
suite meets; ``scripts/test.sh`` warms it). A specialisation the cache lacks compiles on first
use, announced with its name and about how long it takes (:mod:`embtrain.train.progress`).
The work is cut into :data:`UNITS` shared out to two processes by measured compile time.
numba compiles what its cache (:mod:`embtrain.kernels.numba_cache`) does not hold yet; a
second call compiles nothing and takes seconds. ``--if-needed`` returns at once when the
cache was already warmed with the set for this kernel code and these callers (a marker file
named after the set and a hash of :data:`CALL_SITES`: which specialisations exist depends on
them).
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embtrain.kernels import numba_cache
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
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
  - {{name: tstatic, dim: 8, rows: 200, storage: [{{tier: host, budget: 12KiB}}, {{tier: disk, path: {root}/store-s-{tag}}}]}}
  - {{name: tdyn, dim: 8, dynamic: {{capacity: 400, eviction: lfu, admission: {{type: count, min_count: 2}}}}, storage: [{{tier: host, budget: 40KiB}}, {{tier: disk, path: {root}/store-d-{tag}}}]}}
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


#: The sparse optimizers of the shipped recipes (``recipes/*.yaml``; a test holds this
#: current): the set-up's warm-up (the ``default`` set) trains with these.
DEFAULT_OPTIMIZERS = ("adagrad",)

#: What :func:`warm` can compile: ``default`` (the set-up's: what the shipped recipes need,
#: float32 tables of every kind, static, dynamic and tiered, every column type the reader
#: takes, the exchange's codecs) and ``full`` (also the half tables, bfloat16 and float16, and
#: every sparse optimizer: what the test suite meets). Anything not compiled ahead compiles on
#: first use, announced with its name and about how long it takes.
SETS = ("default", "full")

#: The tables of :data:`_RECIPE` by kind: float32 ones, static (``small``, ``wide``),
#: dynamic (three admission rules) and cached over disk stores; half ones, ``hb`` bfloat16 and
#: ``hd`` (dynamic) bfloat16 with float32 optimizer state, ``hf`` float16 with its state in
#: float16 too.
STATIC_TABLES = ("small", "wide")
FLOAT32_TABLES = (*STATIC_TABLES, "dcount", "dbloom", "dprob", "tstatic", "tdyn")
HALF_TABLES = ("hb", "hd", "hf")

#: The two kernels that take most of the compiling (each specialisation one to three CPU
#: minutes): pooling and the backward with its optimizer update, by :class:`Unit` ``big``.
BIG_KERNELS = {"forward": "pool_forward", "backward": "backward_update"}


@dataclass(frozen=True)
class Unit:
    """One share of the warm-up, run in one process: train ``tables`` (of :data:`_RECIPE`,
    with the features that read them and the dense ones; ``None``: only the kernels outside
    the engine's step, :func:`_exercise_helpers`) with ``optimizers`` (``None``: every sparse
    optimizer), compiling of :data:`BIG_KERNELS` only ``big`` (the other one is not called:
    another unit compiles it) and the small kernels it meets. ``cpu_s``: the CPU seconds the
    unit took with an empty cache, to balance the processes by."""

    name: str
    tables: tuple[str, ...] | None
    big: str | None
    optimizers: tuple[str, ...] | None
    cpu_s: float


#: The units of each set. Which specialisations exist: the kernels specialise on their
#: arguments' numba types, never on the optimizer (a runtime code), the combiner or the
#: table kind (static, dynamic and tiered groups pass the same types); the types that differ
#: are the table values' dtype (float32, or the 16-bit patterns of a half table), the
#: optimizer slots' (float32, or half with ``optimizer_state: table``; an optimizer without
#: slots pads with float32 ones) and the dense and list column types the reader meets; the
#: dimension (8/16/32/64) is a literal inside one specialisation. So: one pooling and one
#: backward for float32 tables, one pooling for half values, one backward for half values
#: with float32 state (also SGD on a half-state table) and one for half values with half
#: state. The float32 backward trains the static tables only (the same specialisation) so
#: that the dynamic and tiered tables' small kernels are compiled by the other process,
#: beside the pooling. ``cpu_s``: each unit's process CPU seconds in ``python -m
#: embtrain.cli.warm`` with an empty cache (Intel Xeon with AVX-512, 2 cores; CPU time does not grow with
#: the load of a shared machine), 2026-11-27; the marker file records them for every warm-up.
#: The default set from an empty cache: 208 s wall, 254 CPU s at load ~2.8 (702 s wall, 343 CPU
#: s at load ~9.6, when six agents shared the 2 cores).
UNITS: dict[str, tuple[Unit, ...]] = {
    "default": (
        Unit("helpers", None, None, DEFAULT_OPTIMIZERS, 11.0),
        Unit("float32-forward", FLOAT32_TABLES, "forward", DEFAULT_OPTIMIZERS, 140.0),
        Unit("float32-backward", STATIC_TABLES, "backward", DEFAULT_OPTIMIZERS, 187.0),
    ),
}
UNITS["full"] = (  # the half units measured after the default set (--set full: 702 CPU s)
    *(u for u in UNITS["default"] if u.name != "float32-backward"),
    Unit("float32-backward", FLOAT32_TABLES, "backward", None, 187.0),
    Unit("half-forward", HALF_TABLES, "forward", DEFAULT_OPTIMIZERS, 91.0),
    Unit("half-backward", ("hb", "hd"), "backward", None, 213.0),
    Unit("half-state-backward", ("hf",), "backward",
         tuple(o for o in OPTIMIZER_NAMES if o != "sgd"), 389.0),
)


def balance(units: tuple[Unit, ...], jobs: int) -> list[list[Unit]]:
    """``units`` in ``jobs`` lists of about equal measured compile time (longest first, each
    to the least loaded list); empty lists dropped."""
    shares: list[list[Unit]] = [[] for _ in range(max(jobs, 1))]
    for unit in sorted(units, key=lambda u: -u.cpu_s):
        min(shares, key=lambda share: sum(u.cpu_s for u in share)).append(unit)
    return [share for share in shares if share]


_TABLES = (*FLOAT32_TABLES, *HALF_TABLES)


def _part_text(text: str, tables: tuple[str, ...]) -> str:
    """``text`` (the recipe) with only ``tables`` and the features that read them; dense
    features stay."""
    out = []
    for line in text.splitlines():
        table = next((t for t in _TABLES if re.search(rf"(table|{{name): {t}\b", line)), None)
        if table is None or table in tables:
            out.append(line)
    return "\n".join(out) + "\n"


def _recipe(root: Path, optimizer: str, tables: tuple[str, ...], tag: str):  # -> Recipe
    """:data:`_RECIPE` for ``tables`` and ``optimizer``; ``tag`` names its files (and its
    tiered tables' store directories, one per engine)."""
    from embtrain.recipe.loader import load_recipe

    path = root / f"warm-{tag}-{optimizer}.yaml"
    path.write_text(_part_text(_RECIPE, tables).format(
        root=root, batch=BATCH, optimizer=optimizer, tag=f"{tag}-{optimizer}",
        plain=", ".join(f"d_{t}" for t in DENSE_TYPES),
        nullable=", ".join(f"n_{t}" for t in DENSE_TYPES),
    ))
    return load_recipe(path)


@contextmanager
def _only_big(big: str | None) -> Iterator[None]:
    """Within: the :data:`BIG_KERNELS` other than ``big`` do nothing when called (they are
    neither compiled nor run here; another unit compiles them). Their callers only read the
    error flags they would have set (zeros: no error), so the step goes on."""
    from embtrain.kernels import cpu

    def skipped(*args: object) -> None:
        return None

    saved = {name: getattr(cpu, name) for kind, name in BIG_KERNELS.items() if kind != big}
    try:
        for name in saved:
            setattr(cpu, name, skipped)
        yield
    finally:
        for name, kernel in saved.items():
            setattr(cpu, name, kernel)


def exercise(root: Path, unit: Unit) -> None:
    """Run ``unit``: read ``root``'s data (train, shuffled, and eval) and train an engine on
    it with the unit's sparse optimizers; then export, read and re-initialise rows as
    checkpoints do."""
    if unit.tables is None:
        _exercise_helpers()
        return
    optimizers = unit.optimizers if unit.optimizers is not None else OPTIMIZER_NAMES
    with _only_big(unit.big):
        _exercise_tables(root, unit.tables, optimizers, unit.name)


def _exercise_tables(root: Path, tables: tuple[str, ...], optimizers: tuple[str, ...],
                     tag: str) -> None:
    """:func:`exercise` for ``tables`` (``tag``: the unit's name)."""
    from embtrain.data import BatchReader
    from embtrain.embedding import EmbeddingEngine
    from embtrain.embedding.from_recipe import (
        feature_configs,
        sparse_optimizer_config,
        table_configs,
    )
    from embtrain.embedding.initializers import initial_rows
    from embtrain.storage import open_store

    for k, optimizer in enumerate(optimizers):
        recipe = _recipe(root, optimizer, tables, tag)
        configs = table_configs(recipe)
        for t in configs:  # the tiered tables' store directories (the job's run makes them)
            if t.tier is not None and t.tier.path:
                Path(t.tier.path).mkdir(parents=True, exist_ok=True)
        engine = EmbeddingEngine(configs, feature_configs(recipe),
                                 sparse_optimizer_config(recipe.optimizer.sparse), seed=0,
                                 stores=open_store)  # the tiered tables' disk stores
        splits = ("train", "eval") if k == 0 else ("train",)
        step = 0
        for split in splits:
            for batch in BatchReader(recipe, split, seed=0):
                if split == "eval":  # dynamic tables: lookup only
                    engine.forward(batch.sparse, training=False)
                outs = engine.forward(batch.sparse)
                engine.look_ahead(batch.sparse)  # the dynamic tables' resumable lookup ahead
                engine.read_ahead(batch.sparse)  # the tiered tables' reads ahead
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
    from embtrain.comm.halves import from_bfloat16, from_half, to_bfloat16, to_half

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


def marker(kernel_set: str = "default") -> Path:
    """The file that says the cache holds ``kernel_set`` (:data:`SETS`) for the current
    kernels and :data:`CALL_SITES`."""
    h = hashlib.sha256()
    for entry in CALL_SITES:
        files = (sorted((numba_cache.PACKAGE / entry).rglob("*.py")) if entry.endswith("/")
                 else [numba_cache.PACKAGE / entry])
        for path in files:
            rel = path.relative_to(numba_cache.PACKAGE).as_posix()
            h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return numba_cache.cache_dir() / f"warm-{kernel_set}-{h.hexdigest()[:16]}.json"


def is_warm(kernel_set: str) -> bool:
    """Whether the cache holds ``kernel_set`` (or a set that contains it)."""
    return any(marker(s).is_file() for s in SETS[SETS.index(kernel_set):])


def run_units(names: list[str], kernel_set: str, verbose: bool = True) -> list[dict]:
    """Run the units called ``names`` (of ``kernel_set``) in this process, in order; for each,
    what compiled (``(name, seconds)``) and the CPU seconds of its compiling."""
    units = {u.name: u for u in UNITS[kernel_set]}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_data(root)
        for name in names:
            def started(kernel: str, name: str = name) -> None:
                if verbose:
                    print(f"warm[{name}]: compiling {kernel} ...", file=sys.stderr, flush=True)

            c0, t0 = time.process_time(), time.perf_counter()
            with CompileWatch(on_start=started) as watch:
                exercise(root, units[name])
            results.append({"unit": name, "compiled": watch.compiled,
                            "cpu_s": round(watch.cpu_seconds, 1),
                            "process_cpu_s": round(time.process_time() - c0, 1),
                            "wall_s": round(time.perf_counter() - t0, 1)})
    return results


def warm(kernel_set: str = "default", verbose: bool = True, jobs: int = 2) -> list[dict]:
    """Compile (or load from the cache) ``kernel_set``'s specialisations; returns, per unit,
    what compiled (see :func:`run_units`). The units are shared out to ``jobs`` processes by
    their measured compile time (:func:`balance`), all but the first share in child processes
    (numba compiles one function at a time per process, and a function's cache entry is
    written whole, so processes share the cache safely).

    Writes :func:`marker` when every share is done.
    """
    first, *others = [[u.name for u in share] for share in balance(UNITS[kernel_set], jobs)]
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        reports = [Path(tmp) / f"share-{i}.json" for i in range(len(others))]
        children = [subprocess.Popen(
            [sys.executable, "-m", "embtrain.cli.warm", "--set", kernel_set,
             "--units", ",".join(share), "--report", str(report)]
            + ([] if verbose else ["--quiet"]))
            for share, report in zip(others, reports, strict=True)]
        try:
            results += run_units(first, kernel_set, verbose)
        finally:
            codes = [child.wait() for child in children]
        for share, report, code in zip(others, reports, codes, strict=True):
            if code != 0:
                raise RuntimeError(f"warm: the share {','.join(share)} failed (exit {code})")
            results += json.loads(report.read_text())
    seconds = sum(t for r in results for _, t in r["compiled"])
    record = {"set": kernel_set, "jobs": jobs, "units": results, "seconds": round(seconds, 1)}
    marker(kernel_set).write_text(json.dumps(record, indent=2) + "\n")
    if verbose:
        count = sum(len(r["compiled"]) for r in results)
        cpu = ", ".join(f"{r['unit']} {r['cpu_s']:.0f} s" for r in results)
        print(f"warm: {count} kernel(s) compiled into {numba_cache.cache_dir()} (CPU seconds "
              f"of compiling: {cpu})", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m embtrain.cli.warm [--set default|full] [--quiet] [--if-needed] [--jobs N]``."""
    parser = argparse.ArgumentParser(prog="python -m embtrain.cli.warm", description=__doc__)
    parser.add_argument("--set", dest="kernel_set", choices=SETS, default="default",
                        help="default: what the shipped recipes need (float32 tables; the "
                             "set-up's); full: also half tables and every sparse optimizer")
    parser.add_argument("--quiet", action="store_true", help="print nothing")
    parser.add_argument("--if-needed", action="store_true",
                        help="do nothing when this kernel code's cache already holds the set")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes compiling side by side (default: 2 where 2 cores are)")
    parser.add_argument("--units", help=argparse.SUPPRESS)  # a child's share, comma-separated
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)  # where it says so
    args = parser.parse_args(argv)
    if args.units is not None:
        results = run_units(args.units.split(","), args.kernel_set, verbose=not args.quiet)
        if args.report is not None:
            args.report.write_text(json.dumps(results))
        return 0
    if args.if_needed and is_warm(args.kernel_set):
        return 0
    if not args.quiet:
        about = sum(u.cpu_s for u in UNITS[args.kernel_set]) / max(1, min(args.jobs, 2))
        print(f"warm: compiling the {args.kernel_set} kernel set into {numba_cache.cache_dir()} "
              f"(once for this kernel code; about {about / 60:.0f} min on 2 free cores)",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    warm(args.kernel_set, verbose=not args.quiet, jobs=args.jobs)
    if not args.quiet:
        print(f"warm: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
