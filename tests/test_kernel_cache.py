"""Compiled kernels: cached by content, warmed at set-up, compilation announced, never repeated."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numba
import pytest

from embtrain.kernels import numba_cache
from embtrain.kernels.watch import CompileWatch

REPO = Path(__file__).resolve().parents[1]

TINY = """
version: 1
name: tiny
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 128}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: tags, column: tags, table: tag, hotness: variable, combiner: mean}}
tables:
  - {{name: user, dim: 8, rows: 500}}
  - {{name: tag, dim: 8, rows: 200}}
optimizer: {{sparse: {{type: adagrad, lr: 0.2}}, dense: {{type: adam, lr: 0.003}}}}
model: {{type: dlrm, bottom: [16, 8], top: [16, 1]}}
train: {{steps: 30, eval_every: 10, eval_max_batches: 2, log_every: 10, seed: 1}}
"""


def test_kernels_use_the_content_keyed_cache() -> None:
    from embtrain.data import kernels as data_kernels
    from embtrain.kernels import _llvm, cpu

    for dispatcher in (cpu.pool_forward, cpu.backward_update, _llvm.axpy, data_kernels.copy_ids):
        locator = dispatcher._cache._impl._locator
        assert isinstance(locator, numba_cache.KernelCacheLocator), dispatcher
        assert Path(locator.get_cache_path()) == numba_cache.cache_dir()


def test_typed_lists_are_built_with_the_cached_helpers() -> None:
    from numba.typed import typedlist

    from embtrain.kernels import cpu, typed_lists  # noqa: F401  (cpu installs them)

    for name, helper in typed_lists.CACHED.items():
        assert getattr(typedlist, name) is helper, name
        locator = helper._cache._impl._locator
        assert isinstance(locator, numba_cache.KernelCacheLocator), name


TYPED_LISTS = """
import numpy as np
from numba.typed import List
from embtrain.kernels import cpu
rng = np.random.default_rng()
frozen = [rng.integers(-2**62, 2**62, n) for n in (17, 4)]
for a in frozen:
    a.flags.writeable = False  # the engine's read-only keys: an item type of its own
for arrays in ([rng.integers(0, 9, n) for n in (0, 3, 5)], frozen,
               [rng.random((4, 3), dtype=np.float32), rng.random((2, 3), dtype=np.float32)],
               [rng.integers(0, 2**16, (5, 2)).astype(np.uint16)]):
    packed = cpu.CpuBackend().array_list(arrays)
    assert isinstance(packed, List) and len(packed) == len(arrays)
    for got, want in zip(packed, arrays, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.flags.writeable == want.flags.writeable
        assert np.array_equal(got, want)
    packed[0] = arrays[-1]
    assert np.array_equal(packed[0], arrays[-1])
print("ok")
"""


def test_typed_lists_from_the_cached_helpers_hold_the_arrays(tmp_path: Path) -> None:
    # in a process of its own, caching into a directory of its own: the item types compiled
    # here must not land in the shared cache that other tests check for new entries
    env = {**os.environ, numba_cache.ENV: str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-c", TYPED_LISTS], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
    assert list((tmp_path / "cache").rglob("typed_lists._append-*.nbc"))


def test_cache_key_is_the_same_for_a_second_checkout_and_changes_with_the_code(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "checkout" / "embtrain"
    for rel in numba_cache.KERNEL_SOURCES:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(numba_cache.PACKAGE / rel, copy / rel)
    assert numba_cache.source_key(copy) == numba_cache.source_key()
    llvm = copy / "kernels" / "_llvm.py"  # inlined into cpu.py's kernels: it must count
    llvm.write_text(llvm.read_text() + "\n# changed\n")
    numba_cache.source_key.cache_clear()
    assert numba_cache.source_key(copy) != numba_cache.source_key()


def test_compile_watch_reports_embtrain_kernels_with_their_duration() -> None:
    def probe(x):
        return x * 3 + 1

    probe.__module__ = "embtrain.probe"  # announced: an embtrain kernel
    kernel = numba.njit(probe)
    other = numba.njit(lambda x: x - 1)  # not embtrain's: numba's own helpers are not shown
    started: list[str] = []
    ended: list[tuple[str, float]] = []
    with CompileWatch(started.append, lambda n, s: ended.append((n, s))) as watch:
        assert kernel(2) == 7
        assert other(2) == 1
        assert kernel(5) == 16  # compiled already: nothing new
    assert started == ["probe"]
    assert [n for n, _ in ended] == ["probe"] and ended[0][1] > 0
    assert watch.compiled == ended and watch.seconds == ended[0][1]


@pytest.mark.slow
def test_after_the_bootstrap_warm_up_a_run_in_a_fresh_process_compiles_nothing(
    cli, tmp_path: Path
) -> None:
    # What scripts/bootstrap.sh runs (a no-op when this code was warmed already).
    warm = subprocess.run([sys.executable, "-m", "embtrain.cli.warm", "--if-needed"],
                          capture_output=True, text=True, timeout=900)
    assert warm.returncode == 0, warm.stderr[-2000:]
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY.format(data=tmp_path / "data"))
    res = cli("gen-data", "--recipe", str(recipe), "--out", str(tmp_path / "data"), "--rows",
              "3000", "--eval-rows", "500", "--files", "1")
    assert res.returncode == 0, res.stderr
    for name in ("a", "b"):
        # numba's cache log of this process (stdout): what it loaded and what it saved
        res = cli("run", str(recipe), "--run-dir", str(tmp_path / name),
                  env={"NUMBA_DEBUG_CACHE": "1"})
        assert res.returncode == 0, res.stderr[-2000:]
        assert "compiling kernels" not in res.stdout + res.stderr, res.stdout
        # it loaded the warm-up's kernels and wrote nothing: no new specialisation, no index
        # rewritten (read from the process's own log, not from the shared directory, where a
        # test on another worker may be writing at the same time)
        assert f"data loaded from '{numba_cache.cache_dir()}" in res.stdout
        saved = [ln for ln in res.stdout.splitlines() if ln.startswith("[cache]")
                 and " saved to " in ln]
        assert not saved, saved


def test_compilation_is_announced_on_the_progress_stream(capsys: pytest.CaptureFixture) -> None:
    from embtrain.train.progress import compile_notices

    def probe2(x):
        return x * 5

    probe2.__module__ = "embtrain.probe"
    kernel = numba.njit(probe2)
    with compile_notices(to_stderr=True):
        assert kernel(2) == 10
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines[0].endswith("compiling kernels, first run only: probe2 ...")
    assert "compiled probe2 in " in lines[1] and lines[1].endswith(" s")
