"""A Keras model with unnamed layers and batch normalization: trains, checkpoints its moving
statistics, resumes bit-exactly at 1 and 2 ranks (the ranks' moving averages averaged: equal to
one rank's for statistics of the input), and exports them (scored without embtrain)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import REPO, run_cli
from tests.support.serving import score_without_embtrain

# Keras names the first unnamed Dense layer "dense": embtrain's dense input must not be.
MODULE = '''
import keras


def build(inputs, options):
    features = [keras.Input((f.width,), name=f.name) for f in inputs.features]
    dense = keras.Input((inputs.dense_width,), name=inputs.dense_name)
    normed = keras.layers.BatchNormalization(momentum=0.9)(dense)  # statistics of the input
    x = keras.layers.Concatenate()([*features, normed])
    x = keras.layers.Dense(16, activation="relu")(x)
    x = keras.layers.BatchNormalization(momentum=0.9)(x)
    return keras.Model([*features, dense], keras.layers.Dense(1)(x))
'''

TRAIN = "train:\n  steps: 20\n  eval_every: 10\n  log_every: 5\n  checkpoint: {every: 10}\n  seed: 0\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from embtrain.data.gen import GenConfig, generate
    from embtrain.recipe import load_recipe

    root = tmp_path_factory.mktemp("keras-state")
    generate(load_recipe(REPO / "recipes" / "quickstart.yaml"), root / "data",
             GenConfig(rows=5120, eval_rows=1000, files=2, seed=1))
    (root / "bn_model.py").write_text(MODULE)
    text = (REPO / "recipes" / "quickstart.yaml").read_text()
    text = text.replace("data/quickstart", str(root / "data"))
    text = text.replace("batch_size: 2048", "batch_size: 256")
    text = text[:text.index("model:\n")] + "model: {type: keras, build: 'bn_model:build'}\n" + TRAIN
    (root / "bn.yaml").write_text(text)
    return root


def _records(run_dir: Path) -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] in ("train", "eval"):
            out.append({k: v for k, v in r.items() if k not in ("samples_per_s", "seconds",
                                                                 "comm_bytes_per_step")})
    return out


def _state(run_dir: Path, step: int) -> dict[str, np.ndarray]:
    """The checkpoint's dense arrays by name."""
    folder = run_dir / "checkpoints" / f"step-{step:08d}"
    names = json.loads((folder / "manifest.json").read_text())["dense"]["weight_names"]
    return {name: np.load(folder / "dense" / f"weights-{i:03d}.npy")
            for i, name in enumerate(names)}


def _run(root: Path, name: str, *extra: str) -> Path:
    res = run_cli("run", str(root / "bn.yaml"), "--run-dir", str(root / name), *extra)
    assert res.returncode == 0, res.stderr
    return root / name


@pytest.mark.parametrize("ranks", [1, 2])
def test_batch_norm_trains_checkpoints_its_statistics_and_resumes_bit_exactly(root: Path,
                                                                           ranks: int):
    np_ = ("--np", "2") if ranks == 2 else ()
    straight = _run(root, f"straight-{ranks}", *np_)
    state = _state(straight, 20)
    # unnamed layers kept Keras' default names, "dense" among them
    assert "dense/kernel" in state and "batch_normalization/moving_mean" in state
    mean = state["batch_normalization/moving_mean"]
    variance = state["batch_normalization/moving_variance"]
    assert mean.shape == (4,) and not np.allclose(mean, 0) and not np.allclose(variance, 1)
    resumed = _run(root, f"resumed-{ranks}", *np_, "--max-steps", "10")
    res = run_cli("run", "--resume", str(resumed), *np_)
    assert res.returncode == 0, res.stderr
    assert _records(resumed) == _records(straight)
    for name, value in _state(straight, 20).items():
        assert np.array_equal(value, _state(resumed, 20)[name]), name


def test_two_ranks_average_their_moving_statistics(root: Path):
    """Each rank's moving mean of the input is an average of its slices' means: averaged over
    the ranks it is one rank's (over whole batches); the variance is the mean of the slices'
    variances (close to, not equal to, one rank's)."""
    for ranks in (1, 2):
        if not (root / f"straight-{ranks}").exists():
            _run(root, f"straight-{ranks}", *(("--np", "2") if ranks == 2 else ()))
    one, two = _state(root / "straight-1", 20), _state(root / "straight-2", 20)
    np.testing.assert_allclose(two["batch_normalization/moving_mean"],
                               one["batch_normalization/moving_mean"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two["batch_normalization/moving_variance"],
                               one["batch_normalization/moving_variance"], rtol=0.05)


def test_batch_norm_model_exports_its_statistics(root: Path):
    from embtrain.serving.export import export_saved_model
    from embtrain.train.predict import PredictOptions, predict

    run = root / "straight-1"
    if not run.exists():
        _run(root, "straight-1")
    data = str(root / "data" / "eval" / "*.parquet")
    predict(PredictOptions(run, data, root / "pred.parquet", progress=False))
    import pyarrow.parquet as pq

    want = pq.read_table(root / "pred.parquet")["probability"].to_numpy()
    summary = export_saved_model(run, root / "export")
    score_without_embtrain([(Path(summary.path), data, root / "tf.npy")])
    np.testing.assert_allclose(np.load(root / "tf.npy"), want, atol=1e-5)


def test_a_model_naming_its_dense_input_dense_still_builds(tmp_path: Path):
    """Modules written before the dense input was renamed keep working."""
    from embtrain.models.keras_model import check_recipe_model
    from embtrain.recipe.models import KerasModel

    (tmp_path / "old_model.py").write_text('''
import keras

def build(inputs, options):
    xs = [keras.Input((f.width,), name=f.name) for f in inputs.features]
    xs.append(keras.Input((inputs.dense_width,), name="dense"))
    h = keras.layers.Concatenate(name="cat")(xs)
    return keras.Model(xs, keras.layers.Dense(1, name="out")(h))
''')
    check_recipe_model(KerasModel(type="keras", build="old_model:build", path=str(tmp_path)),
                       [("user", 4)], 3, ["label"])
