"""Interleaved A/B timing of CPU-kernel variants on the DE "tiny" tables, in one process.

This VM's absolute times drift by up to ~50 % within an hour, so comparing two processes run
minutes apart says little. Here every variant is a copy of the CPU kernels (``embtrain/kernels/cpu_bags.py``,
``cpu_pool.py`` and ``cpu_update.py``, joined into one module) with textual edits (see ``VARIANTS``), compiled side by side; one engine runs the steps and the
variants take turns step by step, so drift hits them alike. Variants that change results
(e.g. redirecting reads to cached rows) are for timing only: they corrupt the tables.

    .venv/bin/python benchmarks/kernel_ab.py as_shipped grads_cached no_scatter [--steps 8]
        [--tables all|small|1m|shared] [--batch 65536]

(threads: numba's default, or ``NUMBA_NUM_THREADS``)

Prints, per variant, median ms of forward, backward + update and their sum.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np

import embtrain.kernels.cpu as cpu
import embtrain.kernels.cpu_bags as cpu_bags
import embtrain.kernels.cpu_pool as cpu_pool
import embtrain.kernels.cpu_update as cpu_update
from embtrain.embedding import bench_engine
from embtrain.embedding.config import SparseOptimizerConfig
from embtrain.embedding.engine import EmbeddingEngine

_GRAD_CACHED = [
    ("b * width + col, c, dim", "(b & 7) * width + col, c, dim"),
    ("gb = b * width + col", "gb = (b & 7) * width + col"),
]
_ACC_CACHED = [
    ("(us + v) * dim", "(us + (v & 16383)) * dim"),
    ("(us - v - 2) * dim", "(us + ((-v - 2) & 16383)) * dim"),
]
#: _add_row returns at once: no gradient is summed into the rows (timing only)
_NO_SCATTER = [(
    '(not ``[0, 0]``)."""\n    if grads16.shape[1] > 0:\n',
    '(not ``[0, 0]``)."""\n    return\n    if grads16.shape[1] > 0:\n',
)]
_NO_UPDATE = [
    (
        "                _update_row(kind, hp, values, slot1, slot2, r, acc, us + rk, step, last, n_slots,\n"
        "                            h, sb)\n",
        "",
    ),
    ("                meta[r, 0] += 1\n                meta[r, 1] = step + 1\n", ""),
    ("                    prefetch(meta, rr * 2)\n", ""),
]

_BLOCK_LOOP = """        for blk in range(nblk):
            b0 = blk * block
            b1 = min(batch, b0 + block)
"""
_BAND_SETUP = """        c_lo = grads.shape[1]
        c_hi = 0
        for wi in range(i0, i1):
            tt = item_table[wi]
            for j in range(tf_ptr[tt], tf_ptr[tt + 1]):
                c_lo = min(c_lo, feat_col[tf_idx[j]])
                c_hi = max(c_hi, feat_col[tf_idx[j]] + dim)
        gw = grads.shape[1]
""" + _BLOCK_LOOP


def _ahead(dist: int, fn: str) -> list[tuple[str, str]]:
    """Edits that prefetch each key's gradient slice ``dist`` samples ahead with ``fn``
    (``prefetch``: into L1; ``prefetch_l2``: prefetcht1, into L2)."""
    return [
        (
            "from embtrain.kernels._llvm import (\n    axpy,\n",
            "from numba.extending import intrinsic\n"
            "from embtrain.kernels._llvm import _make_prefetch\n"
            "prefetch_l2 = intrinsic(_make_prefetch(0, 2))  # prefetcht1: into L2, not L1\n"
            "from embtrain.kernels._llvm import (\n    axpy,\n",
        ),
        (
            "    for b in range(b0, b1):\n        c = w[b] if has_w else np.float32(1.0)\n",
            f"    for b in range(b0, b1):\n        if b + {dist} < grads.shape[0]:\n"
            f"            {fn}(grads, (b + {dist}) * width + col)\n"
            "        c = w[b] if has_w else np.float32(1.0)\n",
        ),
        (
            "        gb = b * width + col\n",
            f"        gb = b * width + col\n        if b + {dist} < grads.shape[0]:\n"
            f"            {fn}(grads, (b + {dist}) * width + col)\n",
        ),
    ]


#: the kernel modules a variant copies, joined in this order (each imports the ones before)
KERNEL_MODULES = (cpu_bags, cpu_pool, cpu_update)

#: name -> list of (old, new) replacements applied to the kernel source.
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "as_shipped": [],
    "grads_cached": _GRAD_CACHED,
    "grads_acc_cached": _GRAD_CACHED + _ACC_CACHED,
    "no_scatter": _NO_SCATTER,
    # before a block's sums, prefetch the worker's column band of the block's gradient rows
    # (row by row: contiguous runs instead of the sums' column-by-column walk)
    "band_touch": [
        (_BLOCK_LOOP, _BAND_SETUP + """            for b in range(b0, b1):
                for c in range(c_lo - c_lo % 16, c_hi, 16):
                    prefetch(grads, b * gw + c)
"""),
    ],
    # the same for the next block, while this one is summed
    "band_next": [
        (_BLOCK_LOOP, _BAND_SETUP + """            for b in range(b1, min(batch, b1 + block)):
                for c in range(c_lo - c_lo % 16, c_hi, 16):
                    prefetch(grads, b * gw + c)
"""),
    ],
    # the row map's entries folded into 4 Mi entries (16 MB) by the row's low 22 bits (timing
    # only: colliding rows share an id, so results are wrong and slightly fewer rows update)
    "map_compact": [
        ("prefetch(row_map, off + keys[p + PREFETCH])", "prefetch(row_map, (off + keys[p + PREFETCH]) & 4194303)"),
        ("u = row_map[r] - stamp", "u = row_map[r & 4194303] - stamp"),
        ("row_map[r] = stamp + n", "row_map[r & 4194303] = stamp + n"),
    ],
    # gradients read as if laid out feature-major, [features, batch, dim] (timing only)
    "feature_major": [
        ("b * width + col, c, dim", "col * grads.shape[0] + b * dim, c, dim"),
        ("gb = b * width + col", "gb = col * grads.shape[0] + b * dim"),
    ],
    # each key's gradient slice prefetched N samples ahead in its feature's column (into L2
    # or L1): lines of the next block arrive while this block is summed
    "ahead_l2_64": _ahead(64, "prefetch_l2"),
    "ahead_l2_256": _ahead(256, "prefetch_l2"),
    "ahead_l1_64": _ahead(64, "prefetch"),
    # prefetch distance of the forward, the id pass and the optimizer pass (shipped: 32)
    "pf_64": [("PREFETCH = 32", "PREFETCH = 64")],
    "pf_128": [("PREFETCH = 32", "PREFETCH = 128")],
    "prefetch_only": _NO_SCATTER + _NO_UPDATE,
    "no_meta": [
        ("                meta[r, 0] += 1\n                meta[r, 1] = step + 1\n", ""),
        ("                    prefetch(meta, rr * 2)\n", ""),
    ],
    "one_hot_inlined": [
        ("@njit(cache=True)\ndef _scatter_one_hot", '@njit(cache=True, inline="always")\ndef _scatter_one_hot'),
        ("@njit(cache=True)\ndef _pool_one_hot", '@njit(cache=True, inline="always")\ndef _pool_one_hot'),
    ],
    "table_major": [
        (
            "        for blk in range(nblk):\n            b0 = blk * block\n"
            "            b1 = min(batch, b0 + block)\n            for wi in range(i0, i1):\n",
            "        for wi in range(i0, i1):\n            for blk in range(nblk):\n"
            "                b0 = blk * block\n                b1 = min(batch, b0 + block)\n",
        )
    ],
}

#: subsets of the tiny model's table kinds (see bench_engine.TINY_MODEL)
TABLE_SETS = {
    "all": bench_engine.TINY_MODEL,
    "small": tuple(t for t in bench_engine.TINY_MODEL if t[2] <= 10_000 and not t[4]),
    "1m": tuple(t for t in bench_engine.TINY_MODEL if t[2] == 1_000_000 and not t[4]),
    "shared": tuple(t for t in bench_engine.TINY_MODEL if t[4]),
}


def compile_variant(name: str, workdir: Path) -> ModuleType:
    """Import a copy of the CPU kernels with variant ``name``'s edits applied."""
    src = "\n".join(Path(m.__file__).read_text() for m in KERNEL_MODULES)
    for own in ("from __future__ import annotations\n",
                "from embtrain.kernels.cpu_bags import PREFETCH, bag_start, is_one_hot\n"):
        src = src.replace(own, "")
    src = "from __future__ import annotations\n" + src
    for old, new in VARIANTS[name]:
        if old not in src:
            raise SystemExit(f"variant {name!r}: the kernel source no longer contains {old[:60]!r}")
        src = src.replace(old, new)
    path = workdir / f"cpu_variant_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"cpu_variant_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use_variant(kernels: ModuleType) -> None:
    """Make the CPU backend run ``kernels``' ``pool_forward`` and ``backward_update``: its
    ``forward_group``/``backward_group`` call the names :mod:`embtrain.kernels.cpu` imported."""
    cpu.pool_forward = kernels.pool_forward  # type: ignore[attr-defined]
    cpu.backward_update = kernels.backward_update  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", choices=sorted(VARIANTS))
    ap.add_argument("--steps", type=int, default=8, help="timed steps per variant")
    ap.add_argument("--tables", choices=sorted(TABLE_SETS), default="all")
    ap.add_argument("--batch", type=int, default=65536)
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="kernel_ab_"))
    sys.path.insert(0, str(workdir))
    modules = {v: compile_variant(v, workdir) for v in args.variants}
    bench_engine.TINY_MODEL = TABLE_SETS[args.tables]
    tables, feats = bench_engine.tiny_model(1.0)
    data = bench_engine.make_batches(tables, feats, args.batch, 3, 1.05, 0)
    engine = EmbeddingEngine(
        tables, [f for f, _ in feats], SparseOptimizerConfig(kind="adagrad", lr=0.01), seed=0
    )
    out = engine.new_outputs(args.batch)
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(o.shape, dtype=np.float32) * 1e-3 for o in out]
    times: dict[str, dict[str, list[float]]] = {v: {"fwd": [], "bwd": []} for v in args.variants}
    warmup = 2 * len(args.variants)  # compiles every variant, then two rounds untimed
    for s in range(warmup + args.steps * len(args.variants)):
        v = args.variants[s % len(args.variants)]
        use_variant(modules[v])
        t0 = time.perf_counter()
        engine.forward(data[s % 3], out=out)
        t1 = time.perf_counter()
        engine.backward_update(grads, s)
        t2 = time.perf_counter()
        if s >= warmup:
            times[v]["fwd"].append(t1 - t0)
            times[v]["bwd"].append(t2 - t1)
    for v in args.variants:
        fwd, bwd = times[v]["fwd"], times[v]["bwd"]
        tot = [a + b for a, b in zip(fwd, bwd, strict=True)]
        print(
            f"{v:>18}: forward {1e3 * statistics.median(fwd):7.1f} ms   backward+update "
            f"{1e3 * statistics.median(bwd):7.1f} ms   total {1e3 * statistics.median(tot):7.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
