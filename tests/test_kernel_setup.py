"""The set-up's kernel warm-up: compiles without a warning, what it compiles is what the
shipped recipes need, and its processes share the work by compile time."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from embtrain.cli import warm
from embtrain.kernels import numba_cache
from embtrain.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]

# The pooling of cpu.pool_forward for a float32 and a bfloat16 table, every combiner: the
# nesting that made numba warn (an inlined function calling an inlined overload,
# halves.row_scale_copy / row_axpy, that inlines _llvm's row loops), compiled with a
# fresh cache, against a NumPy reference on random inputs.
POOLING = """
import warnings
import numpy as np
from numba import njit
from embtrain.kernels import cpu_pool as cpu
from embtrain.kernels.codes import COMB_MEAN, COMB_SQRTN, COMB_SUM, VAL_BF16

@njit
def pool(keys, offs, w, values, out, err, comb, vcode):
    dim = values.shape[1]
    if dim == 8:
        cpu._pool_rows(keys, offs, 0, w, 0, values.shape[0], 0, comb, 1, values, out, 0,
                       out.shape[0], 0, 8, err, 0, vcode)
    else:
        cpu._pool_rows(keys, offs, 0, w, 0, values.shape[0], 0, comb, 1, values, out, 0,
                       out.shape[0], 0, dim, err, 0, vcode)

rng = np.random.default_rng()
batch, rows = 40, 30
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for dim in (8, 13):
        table = rng.standard_normal((rows, dim)).astype(np.float32)
        bf16 = (table.view(np.uint32) >> 16).astype(np.uint16)  # truncated: exact to widen
        for values, vcode, exact in ((table, 0, table),
                                     (bf16, VAL_BF16, (bf16.astype(np.uint32) << 16).view(np.float32))):
            for comb in (COMB_SUM, COMB_MEAN, COMB_SQRTN):
                lengths = rng.integers(0, 4, batch)
                offs = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
                keys = rng.integers(0, rows, offs[-1]).astype(np.int64)
                w = rng.random(offs[-1]).astype(np.float32)
                out = np.full((batch, dim), np.nan, np.float32)
                err = np.zeros((1, 2), np.int64)
                pool(keys, offs, w, values, out, err, comb, vcode)
                for b in range(batch):
                    k, wb = keys[offs[b]:offs[b + 1]], w[offs[b]:offs[b + 1]].astype(np.float64)
                    want = (wb[:, None] * exact[k]).sum(0)
                    den = {COMB_SUM: 1.0, COMB_MEAN: wb.sum(), COMB_SQRTN: np.sqrt((wb * wb).sum())}[comb]
                    want = want / den if den else np.zeros(dim)
                    assert np.allclose(out[b], want, rtol=1e-5, atol=1e-6), (dim, vcode, comb, b)
                assert not err.any()
for w in caught:
    print(f"{w.category.__name__}: {w.message}")
print("compiled", len(caught))
"""


def test_compiling_the_pooling_of_float32_and_half_tables_emits_no_warning(tmp_path: Path) -> None:
    env = {**os.environ, numba_cache.ENV: str(tmp_path / "cache"),
           "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    res = subprocess.run([sys.executable, "-W", "always", "-c", POOLING], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "compiled 0", res.stdout[-3000:]
    assert "Warning" not in res.stderr, res.stderr[-3000:]


def test_the_default_set_covers_the_shipped_recipes() -> None:
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert recipes
    for path in recipes:
        recipe = load_recipe(path)
        assert recipe.optimizer.sparse.type in warm.DEFAULT_OPTIMIZERS, path.name
        assert all(t.dtype == "float32" for t in recipe.tables), path.name


def test_every_set_trains_each_table_kind_and_the_full_set_every_optimizer() -> None:
    default = {u.name: u for u in warm.UNITS["default"]}
    full = {u.name: u for u in warm.UNITS["full"]}
    assert set(default) <= set(full)
    for units, dtypes in ((default, warm.FLOAT32_TABLES),
                          (full, warm.FLOAT32_TABLES + warm.HALF_TABLES)):
        for table in dtypes:  # each table's pooling, with its small kernels
            assert any(u.big == "forward" for u in units.values()
                       if u.tables and table in u.tables), table
        for table in (warm.STATIC_TABLES[0], *(t for t in warm.HALF_TABLES if t in dtypes)):
            # the update of each argument-type pattern (one for every float32 table kind)
            assert any(u.big == "backward" for u in units.values()
                       if u.tables and table in u.tables), table
        assert not {t for u in units.values() if u.tables for t in u.tables} - set(dtypes)
        assert any(u.tables is None for u in units.values())  # the helpers
    # every optimizer's update with float32 tables, with half values (float32 state: SGD on
    # a half-state table pads with float32 slots, the same types) and half state
    assert full["float32-backward"].optimizers is None
    assert full["half-backward"].optimizers is None
    assert "sgd" not in full["half-state-backward"].optimizers


def test_a_unit_trains_only_its_tables_and_the_features_reading_them(tmp_path: Path) -> None:
    recipe = warm._recipe(tmp_path, "adagrad", warm.STATIC_TABLES, "probe")
    assert {t.name for t in recipe.tables} == set(warm.STATIC_TABLES)
    read = {f.table for f in recipe.features if getattr(f, "table", None)}
    assert read == set(warm.STATIC_TABLES)
    assert any(f.kind == "dense" for f in recipe.features)


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_balance_shares_units_by_compile_time_close_to_the_best_split(jobs: int) -> None:
    rng = random.Random()
    for _ in range(30):
        units = tuple(warm.Unit(f"u{i}", (), None, None, rng.uniform(1, 300))
                      for i in range(rng.randint(1, 7)))
        shares = warm.balance(units, jobs)
        assert sorted(u.name for share in shares for u in share) == sorted(u.name for u in units)
        assert len(shares) <= jobs
        longest = max(sum(u.cpu_s for u in share) for share in shares)
        best = min(max(sum(u.cpu_s for u, j in zip(units, assign, strict=True) if j == k)
                       for k in range(jobs))
                   for assign in itertools.product(range(jobs), repeat=len(units)))
        assert longest <= best * 4 / 3 + 1e-9  # the longest-first rule's bound


def test_the_set_up_shares_its_two_largest_compilations_out_to_two_processes() -> None:
    shares = warm.balance(warm.UNITS["default"], 2)
    assert len(shares) == 2
    bigs = [{u.big for u in share} - {None} for share in shares]
    assert sorted(map(sorted, bigs)) == [["backward"], ["forward"]]


def test_a_first_use_compilation_of_a_large_kernel_says_about_how_long(
    capsys: pytest.CaptureFixture,
) -> None:
    import numba

    from embtrain.kernels.watch import COMPILE_CPU_SECONDS
    from embtrain.train.progress import compile_notices

    def pool_forward(x):  # named as the large kernel: announced with its expected duration
        return x + 1

    pool_forward.__module__ = "embtrain.probe"
    with compile_notices(to_stderr=True):
        assert numba.njit(pool_forward)(2) == 3
    first = capsys.readouterr().err.splitlines()[0]
    low, high = (round(s / 60) for s in COMPILE_CPU_SECONDS["pool_forward"])
    about = f"{low}" if low == high else f"{low}-{high}"
    assert first.endswith(f"compiling kernels, first run only: pool_forward (about {about} min) ...")
