"""The dense step on JAX equals the dense step on TensorFlow (``train.dense_backend``).

Keras picks its backend once per process, so each backend runs in a fresh process
(tests/workers/dense_backend_worker.py) on the same fresh random inputs: every built-in network, a
user's Keras model (given the same initial weights: Keras draws them differently per
backend), two labels, a learning-rate schedule and each dense optimizer. Losses, group
gradients, dense gradients, weights and optimizer state after three steps, and predict,
agree to 1e-5 (float32 association error; Adam amplifies it in a near-zero gradient).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import REPO

SLOTS = [("c0", 0, 0, 4, 4), ("c1", 0, 4, 4, 4), ("c2", 0, 8, 4, 4), ("lst", 1, 0, 8, 4),
         ("c3", 1, 8, 4, 4)]
WIDTHS = [12, 12]
NUM_DENSE = 3
ADAM = {"type": "adam", "lr": 0.01}
SGD = {"type": "sgd", "lr": 0.05, "momentum": 0.9}
ADAGRAD = {"type": "adagrad", "lr": 0.05}
SCHEDULED = {"type": "adam", "lr": 0.02,
             "schedule": {"warmup_steps": 1, "decay": "cosine", "decay_steps": 3,
                          "min_ratio": 0.1}}
CASES = {
    "mlp": ({"type": "mlp", "hidden": [16, 8]}, ADAM),
    "dlrm": ({"type": "dlrm", "bottom": [8, 4], "top": [16, 1]}, SGD),
    "dlrm_cat": ({"type": "dlrm", "bottom": [4], "top": [8], "interaction": "cat"}, ADAGRAD),
    "dcn_v2": ({"type": "dcn_v2", "cross_layers": 2, "deep": [16], "structure": "parallel"},
               ADAM),
    "dcn_v2_low_rank": ({"type": "dcn_v2", "cross_layers": 2, "low_rank": 3, "deep": [16, 1]},
                        SCHEDULED),
    "deepfm": ({"type": "deepfm", "deep": [16, 8]}, ADAGRAD),
    "wide_deep": ({"type": "wide_deep", "deep": [16, 8], "wide_features": ["c0", "lst"]}, SGD),
    "mmoe": ({"type": "mmoe", "experts": 3, "expert": [8], "tower": [4]}, ADAM),
}
TWO_LABELS = [{"name": "click", "column": "click"},
              {"name": "stay", "column": "stay", "loss": "mse", "weight": 0.5}]
KERAS_MODULE = '''
import keras

def build(inputs, options):
    xs = [keras.Input((f.width,), name=f.name) for f in inputs.features]
    xs.append(keras.Input((inputs.dense_width,), name="dense"))
    h = keras.layers.Dense(8, activation="relu", name="hidden")(keras.layers.Concatenate()(xs))
    return keras.Model(xs, keras.layers.Dense(1, name="out")(h))
'''


def _inputs(cases: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, case in cases.items():
        heads = len(case["labels"]) if case.get("labels") else 1
        for step in range(4):
            out[f"{name}/{step}/dense"] = rng.standard_normal((32, NUM_DENSE), np.float32)
            for g, w in enumerate(WIDTHS):
                out[f"{name}/{step}/g{g}"] = 0.5 * rng.standard_normal((32, w), np.float32)
            y = (rng.random((32, heads)) < 0.4).astype(np.float32)
            if heads > 1:
                y[:, 1] = rng.random(32).astype(np.float32)  # the mse label
            out[f"{name}/{step}/labels"] = y[:, 0] if heads == 1 else y
    # the Keras model's initial weights: Dense(8) on 24 + 3 columns, then Dense(1)
    for i, shape in enumerate([(27, 8), (8,), (8, 1), (1,)]):
        out[f"keras/w{i}"] = (0.3 * rng.standard_normal(shape)).astype(np.float32)
    return out


def _run(backend: str, cases: Path, inputs: Path, out: Path, module_dir: Path) -> dict:
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": f"{REPO}:{module_dir}",
           "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, str(REPO / "tests" / "workers" / "dense_backend_worker.py"),
                          backend, str(cases), str(inputs), str(out)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return dict(np.load(out))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    root = tmp_path_factory.mktemp("backends")
    (root / "tiny_keras.py").write_text(KERAS_MODULE)
    cases = {}
    for name, (config, optimizer) in CASES.items():
        cases[name] = {"config": config, "optimizer": optimizer, "slots": SLOTS,
                       "num_dense": NUM_DENSE, "groups": len(WIDTHS)}
    cases["mmoe"]["labels"] = TWO_LABELS
    cases["keras"] = {"config": {"type": "keras", "build": "tiny_keras:build",
                                 "path": str(root)},
                      "optimizer": ADAM, "slots": SLOTS, "num_dense": NUM_DENSE,
                      "groups": len(WIDTHS), "weights": "keras"}
    (root / "cases.json").write_text(json.dumps(cases))
    np.savez(root / "inputs.npz", **_inputs(cases, np.random.default_rng(11)))
    tf = _run("tensorflow", root / "cases.json", root / "inputs.npz", root / "tf.npz", root)
    jx = _run("jax", root / "cases.json", root / "inputs.npz", root / "jax.npz", root)
    return tf, jx


@pytest.mark.parametrize("case", [*CASES, "keras"])
def test_a_jax_step_equals_a_tensorflow_step(results: tuple[dict, dict], case: str) -> None:
    tf, jx = results
    keys = sorted(k for k in tf if k.startswith(f"{case}/"))
    assert keys == sorted(k for k in jx if k.startswith(f"{case}/"))
    assert any("/opt" in k for k in keys) and any("/2/grad" in k for k in keys)
    assert any(k.endswith("/2/lr") for k in keys)
    if case == "mmoe":  # two labels: each label's loss is reported on both
        assert any(k.endswith("/2/label_losses") for k in keys)
    for key in keys:
        want, got = tf[key], jx[key]
        if key.endswith("/names"):  # checkpoints name the same arrays on both
            assert list(got) == list(want)
            continue
        assert got.dtype == want.dtype and got.shape == want.shape, key
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=key)


# ------------------------------------------------------------- runs across the two backends

RUN_RECIPE = """
version: 1
name: backends
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 32}}
features:
  - {{kind: dense, name: numeric, columns: [I1], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
  - {{kind: categorical, name: tags, column: tags, table: tag, hotness: variable, combiner: mean}}
tables:
  - {{name: user, dim: 4, rows: 40}}
  - {{name: item, dim: 4, rows: 60}}
  - {{name: tag, dim: 4, rows: 30}}
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adagrad, lr: 0.05}}}}
model: {{type: dcn_v2, cross_layers: 1, deep: [8]}}
train: {{steps: 6, eval_every: 3, log_every: 1, seed: 1, checkpoint: {{every: 3, keep: 3}},
         dense_backend: {backend}}}
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    from tests.support.cli import run_cli

    res = run_cli(*args, env={"PYTHONWARNINGS": "ignore"})
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _records(run_dir: Path, steps: range) -> dict[tuple[str, int], list[float]]:
    from embtrain.train.metrics_log import read_metrics

    return {(r["kind"], r["step"]): [r.get("loss") or 0.0, r.get("auc") or 0.0,
                                     r.get("logloss") or 0.0]
            for r in read_metrics(run_dir) if r["kind"] in ("train", "eval")
            and r["step"] in steps}


def _assert_same_run(got: Path, want: Path, steps: range = range(1, 7)) -> None:
    a, b = _records(want, steps), _records(got, steps)
    assert sorted(a) == sorted(b) and len(a) == len(steps) + len([s for s in steps if s % 3 == 0])
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=str(key))


@pytest.fixture(scope="module")
def backend_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("backend-runs")
    for backend in ("tensorflow", "jax"):
        (root / f"{backend}.yaml").write_text(RUN_RECIPE.format(data=root / "data",
                                                                 backend=backend))
    _cli("gen-data", "--recipe", str(root / "jax.yaml"), "--out", str(root / "data"),
         "--rows", "384", "--eval-rows", "96", "--files", "2")
    for backend in ("tensorflow", "jax"):
        _cli("run", str(root / f"{backend}.yaml"), "--run-dir", str(root / backend))
    return {"root": root, "tensorflow": root / "tensorflow", "jax": root / "jax"}


def test_a_jax_run_equals_the_tensorflow_run(backend_runs: dict[str, Path]) -> None:
    _assert_same_run(backend_runs["jax"], backend_runs["tensorflow"])
    recipe = (backend_runs["jax"] / "recipe.yaml").read_text()
    assert "dense_backend: jax" in recipe


@pytest.mark.parametrize("trained,resumed", [("jax", "tensorflow"), ("tensorflow", "jax")])
def test_a_run_resumes_on_the_other_backend(backend_runs: dict[str, Path], tmp_path: Path,
                                           trained: str, resumed: str) -> None:
    """A checkpoint is NumPy arrays with the same names on both: the run trained to step 3 on
    one backend continues on the other as it went on there."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(backend_runs[trained], copy)
    _cli("run", str(backend_runs["root"] / f"{resumed}.yaml"), "--resume", str(copy),
         "--from-step", "3")
    _assert_same_run(copy, backend_runs[trained], range(4, 7))
    manifest = json.loads(next((copy / "checkpoints").glob("step-00000006/manifest.json"))
                          .read_text())
    trained_manifest = json.loads(next((backend_runs[trained] / "checkpoints")
                                       .glob("step-00000006/manifest.json")).read_text())
    assert manifest["dense"] == trained_manifest["dense"]  # names, counts


def test_a_jax_run_exports_a_saved_model_that_scores_like_predict(
        backend_runs: dict[str, Path], tmp_path: Path) -> None:
    """`embtrain export` of a run trained on JAX (its recipe says jax; export is TensorFlow's):
    the SavedModel, in a process that cannot import embtrain, gives predict's probabilities."""
    import pyarrow.parquet as pq

    run, data = backend_runs["jax"], str(backend_runs["root"] / "data" / "eval" / "*.parquet")
    _cli("predict", str(run), "--data", data, "--out", str(tmp_path / "pred.parquet"))
    want = pq.read_table(tmp_path / "pred.parquet")["probability"].to_numpy()
    _cli("export", str(run), str(tmp_path / "export"))
    (served,) = (tmp_path / "export").iterdir()
    res = subprocess.run([sys.executable, "-I", str(REPO / "tests" / "workers" / "serving_client.py"),
                          str(served), data, str(tmp_path / "served.npy")],
                         capture_output=True, text=True, timeout=600, cwd="/",
                         env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert res.returncode == 0, res.stderr[-3000:]
    got = np.load(tmp_path / "served.npy")
    assert got.shape == want.shape and len(want) == 96
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_two_jax_ranks_equal_one_tensorflow_rank(backend_runs: dict[str, Path],
                                                 tmp_path: Path) -> None:
    """Several ranks on JAX: the dense gradients ride the embedding's backward exchange as
    host arrays (the shared-memory communicator), summed in rank order."""
    _cli("run", str(backend_runs["root"] / "jax.yaml"), "--run-dir", str(tmp_path / "two"),
         "--np", "2")
    _assert_same_run(tmp_path / "two", backend_runs["tensorflow"])
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["processes"] == 2


def test_mixed_precision_on_jax_is_one_line_exit_2(backend_runs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    from tests.support.cli import run_cli

    text = (backend_runs["root"] / "jax.yaml").read_text()
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text(text.replace("seed: 1,", "seed: 1, mixed_precision: bf16,"))
    res = run_cli("run", str(recipe), "--run-dir", str(tmp_path / "mixed"))
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].endswith(
        "train.mixed_precision: bf16 runs on the TensorFlow dense backend only; set "
        "train.dense_backend: tensorflow or train.mixed_precision: none"), res.stderr
    assert lines[0].startswith(f"{recipe}:16:57: ")  # where mixed_precision is


def test_without_tensorflow_auto_trains_on_jax(backend_runs: dict[str, Path],
                                               tmp_path: Path) -> None:
    """`train.dense_backend: auto` where TensorFlow cannot be imported (a GPU machine's
    software): the run trains on JAX (no TensorBoard events) as the TensorFlow run did."""
    text = (backend_runs["root"] / "jax.yaml").read_text()
    recipe = tmp_path / "auto.yaml"
    recipe.write_text(text.replace("dense_backend: jax", "dense_backend: auto"))
    res = subprocess.run([sys.executable, str(REPO / "tests" / "workers" / "cli_with_blocked_imports.py"),
                          "tensorflow,horovod", "run",
                          str(recipe), "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO),
                              "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"})
    assert res.returncode == 0, res.stderr[-3000:]
    _assert_same_run(tmp_path / "run", backend_runs["tensorflow"])
    assert not (tmp_path / "run" / "tensorboard").exists()
