"""The set-up's kernel warm-up: compiles without a warning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from embtrain.kernels import numba_cache

REPO = Path(__file__).resolve().parents[1]

# The pooling of cpu.pool_forward for a float32 and a bfloat16 table, every combiner: the
# nesting that made numba warn (an inlined function calling an inlined overload,
# halfrows.row_scale_copy / row_axpy, that inlines _llvm's row loops), compiled with a
# fresh cache, against a NumPy reference on random inputs.
POOLING = """
import warnings
import numpy as np
from numba import njit
from embtrain.kernels import cpu
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
