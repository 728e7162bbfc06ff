"""`train.device` on a machine without a GPU: what is chosen, the one-line refusal of `gpu`,
the DLPack crossings between engine and network, and the launcher's one GPU per rank.

The GPU path itself runs under numba's CUDA simulator in tests/test_sim_e2e.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from embtrain.comm.launch import LaunchSpec, gpu_binding, launch
from embtrain.errors import UserInputError
from embtrain.kernels import cuda_simulated, default_backend
from embtrain.recipe import parse_recipe_text, recipe_fingerprint
from embtrain.train.device import Device, gpu_limits, resolve_device

NO_GPU = default_backend() == "cpu" and not cuda_simulated()

RECIPE = """
version: 1
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 16}}
features:
  - {{kind: dense, name: numeric, columns: [I1]}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
tables:
  - {{name: user, dim: 4, rows: 40{storage}}}
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: mlp, hidden: [4]}}
train: {{steps: 2, device: {device}}}
"""


def _recipe(device: str, storage: str = "", data: str = "d"):
    return parse_recipe_text(RECIPE.format(device=device, storage=storage, data=data))


@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU (and no simulator)")
def test_gpu_without_a_gpu_stops_before_training_with_one_line(tmp_path: Path) -> None:
    from tests.support.cli import run_cli

    recipe = tmp_path / "r.yaml"  # its data need not exist: the device is checked first
    recipe.write_text(RECIPE.format(device="gpu", storage="", data=tmp_path / "data"))
    res = run_cli("run", str(recipe), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines == [f"{recipe}: train.device: gpu, but no CUDA device (numba.cuda finds none); "
                     "use train.device: cpu or auto"]
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU (and no simulator)")
def test_auto_and_cpu_train_on_the_cpu_here() -> None:
    assert resolve_device(_recipe("auto")) == Device("cpu", "cpu")
    assert resolve_device(_recipe("cpu")) == Device("cpu", "cpu")
    with pytest.raises(UserInputError, match=r"train\.device: gpu, but no CUDA device"):
        resolve_device(_recipe("gpu"), "r.yaml")


@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU (and no simulator)")
def test_auto_says_which_device_and_why(tmp_path: Path) -> None:
    from embtrain.data.gen import GenConfig, generate
    from tests.support.cli import run_cli

    line = ("train.device: auto: training on the CPU: no CUDA device (numba.cuda finds none)")
    assert resolve_device(_recipe("auto")).reason == line
    assert resolve_device(_recipe("cpu")).reason == ""  # asked for: nothing to explain
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(device="auto", storage="", data=tmp_path / "data"))
    generate(_recipe("auto", data=str(tmp_path / "data")), tmp_path / "data",
             GenConfig(rows=64, eval_rows=32, files=1))
    res = run_cli("run", str(recipe), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    said = [ln for ln in res.stdout.splitlines() if "train.device" in ln]
    assert len(said) == 1 and said[0].endswith(f"Z {line}")


def test_what_a_real_gpu_cannot_run_yet_is_named() -> None:
    tiered = _recipe("gpu", ", storage: [{tier: device, budget: 1KiB}, {tier: host}]")
    assert gpu_limits(_recipe("gpu"), 1) == []
    assert gpu_limits(tiered, 1) == ["tables[0]: a tiered table (table 'user') does not run on "
                                     "a GPU yet; use train.device: cpu"]
    assert "2 ranks" in gpu_limits(_recipe("gpu"), 2)[0]
    # a dynamic table in memory runs its key -> row phase on the device; behind tiers it does not
    def dynamic(storage: str = ""):
        text = RECIPE.format(device="gpu", storage=storage, data="d")
        return parse_recipe_text(text.replace("rows: 40", "dynamic: {capacity: 40}"))

    assert gpu_limits(dynamic(), 1) == []
    dynamic_tiered = dynamic(", storage: [{tier: device, budget: 1KiB}, {tier: host}]")
    assert gpu_limits(dynamic_tiered, 1) == ["tables[0]: a tiered table (table 'user') does not "
                                             "run on a GPU yet; use train.device: cpu"]
    # a half dynamic table in memory too (its rows round by key on the device)
    half = dynamic().tables[0].model_copy(update={"dtype": "bfloat16"})
    assert gpu_limits(dynamic().model_copy(update={"tables": [half]}), 1) == []


def test_the_device_is_not_part_of_the_recipe_fingerprint() -> None:
    prints = {recipe_fingerprint(_recipe(d)) for d in ("auto", "cpu", "gpu")}
    assert len(prints) == 1  # a run resumes on the other device
    assert recipe_fingerprint(_recipe("cpu", data="e")) not in prints


def test_pooled_arrays_and_gradients_cross_through_dlpack() -> None:
    """The device's crossings (here NumPy <-> TensorFlow on the CPU, as under the simulator):
    the values arrive unchanged, unaligned and read-only arrays included."""
    import tensorflow as tf

    dev = Device("gpu", "cuda", simulated=True)
    rng = np.random.default_rng(0)
    raw = rng.standard_normal(5 * 3 + 1).astype(np.float32)
    unaligned = raw[1:].reshape(5, 3)
    frozen = rng.standard_normal((5, 2)).astype(np.float32)
    frozen.flags.writeable = False
    tensors = dev.to_network([unaligned, frozen])
    assert all(isinstance(t, tf.Tensor) for t in tensors)
    for t, a in zip(tensors, [unaligned, frozen], strict=True):
        np.testing.assert_array_equal(np.asarray(t), a)
    grads = [tf.constant(a * 2) for a in (unaligned, frozen)]
    back = dev.from_network(grads)
    for b, a in zip(back, [unaligned, frozen], strict=True):
        assert isinstance(b, np.ndarray) and b.flags.writeable
        np.testing.assert_array_equal(b, a * 2)
    cpu = Device("cpu", "cpu")  # the CPU device hands the model its arrays as they are
    assert cpu.to_network([unaligned])[0] is unaligned


def test_the_launcher_binds_one_gpu_per_local_rank(tmp_path: Path, monkeypatch) -> None:
    assert gpu_binding(1, ("4", "6")) == {"CUDA_VISIBLE_DEVICES": "6"}
    assert gpu_binding(2, ("4", "6")) == {"CUDA_VISIBLE_DEVICES": ""}  # beyond the last GPU
    assert gpu_binding(0, ()) == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    probe = ("import json, os, sys; open(os.path.join(sys.argv[1], os.environ['HOROVOD_RANK']),"
             " 'w').write(json.dumps([os.environ['HOROVOD_LOCAL_RANK'],"
             " os.environ['CUDA_VISIBLE_DEVICES']]))")
    assert launch([sys.executable, "-c", probe, str(tmp_path)], LaunchSpec(2)) == 0
    seen = {p.name: json.loads(p.read_text()) for p in tmp_path.iterdir()}
    assert seen == {"0": ["0", "3"], "1": ["1", "5"]}


@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU (and no simulator)")
def test_bench_on_a_gpu_without_one_is_one_line() -> None:
    from tests.support.cli import run_cli

    res = run_cli("bench", "--model", "tiny", "--device", "gpu")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "--device gpu: no CUDA device (numba.cuda finds none); use --device cpu or auto"]


@pytest.mark.distributed
def test_rows_of_an_array_cross_between_ranks_through_dlpack(tmp_path: Path) -> None:
    """The communicator's array exchange (NCCL for CuPy arrays where Horovod has it; here
    NumPy through the job's transport, shared memory on one machine): every rank gets its
    rows from every rank, in rank order."""
    worker = Path(__file__).parent / "workers" / "dist_device_worker.py"
    assert launch([sys.executable, str(worker), str(tmp_path)], LaunchSpec(2)) == 0
    for r in range(2):
        rep = json.loads((tmp_path / f"rank-{r}.json").read_text())
        want = [[src, r, i, 0.5] for src in range(2) for i in range(src + 1 + r)]
        assert rep["received"] == want and rep["module"] == "numpy"
        assert rep["sent"] == (r + 1 + (1 - r)) * 16  # rows to the other rank, 16 bytes each


@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU (and no simulator)")
def test_a_gpu_run_is_scored_on_the_cpu_where_there_is_no_gpu() -> None:
    from embtrain.train.device import scoring_device

    assert scoring_device(_recipe("gpu")) == Device("cpu", "cpu")


def test_plan_sizes_the_device_tier_from_the_detected_gpu_unless_on_cpu(tmp_path: Path) -> None:
    """A stand-in nvidia-smi reports one 40 GiB GPU: `plan` takes it for the device tier of a
    `gpu` recipe; a `cpu` recipe's device tier is host memory; --device-memory overrides."""
    import os

    from tests.support.cli import run_cli

    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nprintf '40960\\n'\n")
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:{os.environ['PATH']}"}
    memory = {}
    for device, extra in (("gpu", []), ("cpu", []), ("cpu", ["--device-memory", "8GiB"])):
        recipe = tmp_path / f"{device}.yaml"
        recipe.write_text(RECIPE.format(device=device, storage="", data=tmp_path))
        res = run_cli("plan", str(recipe), "--json", *extra, env=env)
        assert res.returncode == 0, res.stderr
        memory[(device, bool(extra))] = json.loads(res.stdout)["topology"]["device_memory"]
    assert memory == {("gpu", False): 40960 << 20, ("cpu", False): None,
                      ("cpu", True): 8 << 30}
