"""`embtrain run` with `train.device: gpu` under numba's CUDA simulator equals the CPU run.

The whole GPU path but the hardware: the ``cuda`` kernels (run thread by thread by the
simulator, NumPy arrays standing in for CuPy's), the same job, builder and sharding
strategies as on CPU, pooled embeddings and gradients crossing to TensorFlow (on the CPU)
through DLPack. A tiny recipe with a static table per sharding mode, a tiered table (a
device cache over host memory) and a bfloat16 dynamic table (its key -> row phase on the
device: embedding/dynamic_device.py, asserted below; its updates rounded by key there); 1 and
2 ranks and a resume, against one
CPU run: losses, evaluations and the last checkpoint's tables and dense state to 1e-5
(2 simulated GPUs from step 1; 1 simulated GPU resuming their checkpoint; 1 simulated GPU
with the JAX dense backend, crossing to JAX instead, and its resume).

Runs only in its own invocation (scripts/test.sh), the simulator switched on before numba's
CUDA module is imported: ``NUMBA_ENABLE_CUDASIM=1 pytest tests/test_sim_e2e.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embtrain.kernels import cuda_simulated
from embtrain.train.metrics_log import read_metrics

pytestmark = [pytest.mark.skipif(not cuda_simulated(), reason="needs NUMBA_ENABLE_CUDASIM=1"),
              pytest.mark.distributed]

RECIPE = """
version: 1
name: sim-tiny
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 16}}
features:
  - {{kind: dense, name: numeric, columns: [I1], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
  - {{kind: categorical, name: tags, column: tags, table: tag, hotness: variable, combiner: mean}}
  - {{kind: categorical, name: category, column: category, table: dyn}}
tables:
  - {{name: user, dim: 4, rows: 40, sharding: column}}
  - name: item
    dim: 4
    rows: 60
    sharding: table
    storage: [{{tier: device, budget: 4KiB}}, {{tier: host}}]
  - {{name: tag, dim: 4, rows: 30, sharding: row}}
  - {{name: dyn, dim: 4, dtype: bfloat16, dynamic: {{capacity: 100}}}}
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: 6, eval_every: 3, eval_max_batches: 2, log_every: 1, seed: 1,
         checkpoint: {{every: 3, keep: 3}}, device: {device}}}
"""

QUIET = {"PYTHONWARNINGS": "ignore"}  # the simulator's integer-overflow warnings (hashing)


def _run(*args: str, simulated: bool = True):
    from tests.support.cli import run_cli

    env = {**QUIET, "NUMBA_ENABLE_CUDASIM": "1" if simulated else "0"}
    res = run_cli("run", *args, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def _records(run_dir: Path) -> list[tuple]:
    return [(r["kind"], r["step"], r.get("loss"), r.get("auc"), r.get("logloss"))
            for r in read_metrics(run_dir) if r["kind"] in ("train", "eval")]


def _assert_same_run(got: Path, want: Path, steps: range = range(1, 7)) -> None:
    a = {(k, s): v for k, s, *v in _records(want) if s in steps}
    b = {(k, s): v for k, s, *v in _records(got) if s in steps}
    assert sorted(b) == sorted(a) and len(a) == len(steps) + len([s for s in steps if s % 3 == 0])
    for key in a:
        np.testing.assert_allclose(np.array(b[key], float), np.array(a[key], float),
                                   rtol=1e-5, atol=1e-6, err_msg=str(key))
    last = f"checkpoints/step-{steps[-1]:08d}"
    files = sorted(p.relative_to(want / last) for p in (want / last).rglob("*.npy"))
    assert files == sorted(p.relative_to(got / last) for p in (got / last).rglob("*.npy"))
    assert any(str(f).startswith("tables/item/") for f in files)  # the tiered table
    assert any(str(f).startswith("tables/dyn/") for f in files)  # the dynamic table
    for f in files:
        np.testing.assert_allclose(np.load(got / last / f), np.load(want / last / f),
                                   rtol=1e-5, atol=1e-6, err_msg=str(f))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.cli import run_cli

    root = tmp_path_factory.mktemp("sim")
    recipes = {}
    for device in ("cpu", "gpu"):
        recipes[device] = root / f"{device}.yaml"
        recipes[device].write_text(RECIPE.format(data=root / "data", device=device))
    made = run_cli("gen-data", "--recipe", str(recipes["cpu"]), "--out", str(root / "data"),
                   "--rows", "256", "--eval-rows", "64", "--files", "2")
    assert made.returncode == 0, made.stderr
    out = {"cpu": root / "cpu", "gpu-2": root / "gpu-2"}
    _run(str(recipes["cpu"]), "--run-dir", str(out["cpu"]), simulated=False)
    _run(str(recipes["gpu"]), "--run-dir", str(out["gpu-2"]), "--np", "2")
    return out


def test_two_gpu_ranks_in_the_simulator_equal_the_cpu_run(runs: dict[str, Path]) -> None:
    _assert_same_run(runs["gpu-2"], runs["cpu"])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # simulated hashing
def test_the_gpu_run_keys_its_dynamic_table_on_the_device(tmp_path: Path) -> None:
    """What `run` builds for the recipe above with train.device: gpu (the builder's engine):
    the dynamic table's key -> row phase is the device row space (the device hash index),
    the tiered table's the host one; on cpu both are the host's."""
    from embtrain.embedding.dynamic_device import DeviceHashRows, DeviceKeyedGroup
    from embtrain.embedding.keyed import KeyedGroup
    from embtrain.embedding.rows_cache import CachedRows
    from embtrain.embedding.rows_hash import HashRows
    from embtrain.plan import Topology, make_plan
    from embtrain.recipe import parse_recipe_text
    from embtrain.train.builder import build_trainer

    kinds = {}
    for device in ("gpu", "cpu"):
        recipe = parse_recipe_text(RECIPE.format(data=tmp_path, device=device))
        plan = make_plan(recipe, Topology(1, None, 64 * 2**30, 2**40))
        engine = build_trainer(recipe, plan).embedding.engine
        dyn, item = engine._locate("dyn"), engine._locate("item")
        kinds[device] = (type(engine._space("dyn")), type(engine._keyed[dyn[0].info.index]),
                         type(engine._space("item")), type(engine._keyed[item[0].info.index]))
    assert kinds["gpu"] == (DeviceHashRows, DeviceKeyedGroup, CachedRows, KeyedGroup)
    assert kinds["cpu"] == (HashRows, KeyedGroup, CachedRows, KeyedGroup)


def test_one_gpu_resumes_in_the_simulator_as_the_cpu_run_continues(runs: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    """The 2-rank GPU run's checkpoint at step 3, resumed on 1 simulated GPU (the 1-rank
    path: every table in one engine, no exchange) to step 6: as the CPU run went on."""
    copy = tmp_path / "run"
    shutil.copytree(runs["gpu-2"], copy)
    _run("--resume", str(copy), "--from-step", "3", "--np", "1")
    _assert_same_run(copy, runs["cpu"], range(4, 7))
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["processes"] == 1


def test_one_gpu_with_the_jax_dense_backend_equals_the_cpu_run_and_resumes(
        runs: dict[str, Path], tmp_path: Path) -> None:
    """`train.device: gpu` with `train.dense_backend: jax` (what a GPU machine without
    TensorFlow runs): pooled arrays and gradients cross between the cuda engine and JAX;
    one rank, the tiered and the bfloat16 dynamic table, equal to the TensorFlow CPU run; its
    step-3 checkpoint resumed on the JAX GPU path continues as the CPU run went on."""
    text = (runs["cpu"] / "recipe.yaml").read_text()
    recipe = tmp_path / "jax.yaml"
    lines = [line for line in text.splitlines()
             if not line.strip().startswith(("device:", "dense_backend:"))]
    at = next(i for i, line in enumerate(lines) if line.startswith("train:"))
    lines[at + 1:at + 1] = ["  device: gpu", "  dense_backend: jax"]
    recipe.write_text("\n".join(lines) + "\n")
    run = tmp_path / "gpu-jax"
    _run(str(recipe), "--run-dir", str(run), "--np", "1")
    _assert_same_run(run, runs["cpu"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["processes"] == 1
    copy = tmp_path / "resumed"
    shutil.copytree(run, copy)
    _run("--resume", str(copy), "--from-step", "3")
    _assert_same_run(copy, runs["cpu"], range(4, 7))
