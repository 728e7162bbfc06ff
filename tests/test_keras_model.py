"""Your own Keras model: the recipes/ examples train through `run` at 1 and 2 ranks and resume."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embtrain.errors import RecipeError

REPO = Path(__file__).resolve().parents[1]
TRAIN = "train:\n  steps: 20\n  eval_every: 10\n  log_every: 5\n  checkpoint: {every: 10}\n  seed: 0\n"


def _recipe(name: str, data: Path, out: Path) -> Path:
    text = (REPO / "recipes" / f"{name}.yaml").read_text()
    text = text.replace("data/quickstart", str(data)).replace("data/shop", str(data))
    text = text.replace("batch_size: 2048", "batch_size: 256")
    text = text[:text.index("train:\n")] + TRAIN
    out.write_text(text)
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Quickstart-shaped rows with a second label, and the two-tower module beside its recipe."""
    from embtrain.data.gen import GenConfig, generate
    from embtrain.recipe import load_recipe

    root = tmp_path_factory.mktemp("keras")
    generate(load_recipe(REPO / "recipes" / "quickstart.yaml"), root / "data",
             GenConfig(rows=5120, eval_rows=1000, files=2, seed=1))
    rng = np.random.default_rng(0)
    for path in sorted((root / "data").glob("*/*.parquet")):
        t = pq.read_table(path)
        y = t.column("label").to_numpy()
        buy = (y == 1) & (rng.random(len(y)) < 0.5)
        pq.write_table(t.append_column("purchase", pa.array(buy.astype(np.int8))), path)
    _recipe("two_tower", root / "data", root / "two_tower.yaml")
    shutil.copy(REPO / "recipes" / "two_tower_model.py", root / "two_tower_model.py")
    _recipe("keras_mmoe", root / "data", root / "keras_mmoe.yaml")
    return root


def _records(run_dir: Path) -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] in ("train", "eval"):
            out.append({k: v for k, v in r.items() if k not in ("samples_per_s", "seconds",
                                                                 "comm_bytes_per_step")})
    return out


def _dense(run_dir: Path, step: int) -> list[np.ndarray]:
    folder = run_dir / "checkpoints" / f"step-{step:08d}" / "dense"
    return [np.load(p) for p in sorted(folder.rglob("*.npy"))]


@pytest.fixture(scope="module")
def straight(root: Path) -> Path:
    from tests.support.cli import run_cli

    res = run_cli("run", str(root / "two_tower.yaml"), "--run-dir", str(root / "one"))
    assert res.returncode == 0, res.stderr
    return root / "one"


def test_two_tower_learns_and_checkpoints_its_keras_weights(straight: Path) -> None:
    records = _records(straight)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [10, 20] and evals[-1]["auc"] > 0.55
    weights = _dense(straight, 20)
    assert len(weights) >= 10 and any(w.shape == (16, 64) or w.ndim == 2 for w in weights)
    # the run's own copy of the module, named relative to the run directory
    assert "path: model\n" in (straight / "recipe.yaml").read_text()
    assert (straight / "model" / "two_tower_model.py").read_bytes() == \
        (straight.parent / "two_tower_model.py").read_bytes()


def test_two_ranks_equal_one(cli, root: Path, straight: Path) -> None:
    res = cli("run", str(root / "two_tower.yaml"), "--run-dir", str(root / "two"), "--np", "2")
    assert res.returncode == 0, res.stderr
    a, b = _records(straight), _records(root / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        for key in ("loss", "auc", "logloss"):
            if key in x:
                assert y[key] == pytest.approx(x[key], rel=1e-5, abs=1e-6), (x, y)
    for wa, wb in zip(_dense(straight, 20), _dense(root / "two", 20), strict=True):
        np.testing.assert_allclose(wb, wa, rtol=1e-5, atol=1e-6)


def test_resume_is_bit_exact(cli, root: Path, straight: Path) -> None:
    run_dir = root / "resumed"
    res = cli("run", str(root / "two_tower.yaml"), "--run-dir", str(run_dir), "--max-steps", "10")
    assert res.returncode == 0, res.stderr
    # the module is the run directory's own copy (its recipe.yaml names it)
    res = cli("run", "--resume", str(run_dir), cwd=Path("/"))
    assert res.returncode == 0, res.stderr
    assert _records(run_dir) == _records(straight)
    for wa, wb in zip(_dense(straight, 20), _dense(run_dir, 20), strict=True):
        assert np.array_equal(wa, wb)


def test_keras_mmoe_from_the_python_path_reports_each_label(cli, root: Path) -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "recipes")])}
    res = cli("run", str(root / "keras_mmoe.yaml"), "--run-dir", str(root / "mmoe"), "--np", "2",
              env=env)  # two ranks: the per-label evaluation gathers [rows, labels]
    assert res.returncode == 0, res.stderr
    last = [r for r in _records(root / "mmoe") if r["kind"] == "eval"][-1]
    assert set(last["labels"]) == {"click", "purchase"}
    assert all(0.5 < m["auc"] <= 1 and m["logloss"] > 0 for m in last["labels"].values())


# ---------------------------------------------------------------------------- validate

BAD_MODULE = '''
import keras

def wrong_output(inputs, options):
    xs = [keras.Input((f.width,), name=f.name) for f in inputs.features]
    xs.append(keras.Input((inputs.dense_width,), name="dense"))
    return keras.Model(xs, keras.layers.Dense(3, name="out")(keras.layers.Concatenate()(xs)))

def wrong_inputs(inputs, options):
    x = keras.Input((4,), name="dense")
    return keras.Model([x], keras.layers.Dense(1, name="out")(x))

def not_a_model(inputs, options):
    return [1, 2]
'''


@pytest.mark.parametrize("build,message", [
    ("nowhere_module:build", "model.build: cannot import module 'nowhere_module' (No module named "
                             "'nowhere_module'; searched {dir} and the Python path)"),
    ("bad_models:missing", "model.build: module 'bad_models' ({dir}/bad_models.py) has no "
                           "function 'missing'"),
    ("bad_models:not_a_model", "model.build: bad_models:not_a_model returned list, not a "
                               "keras.Model"),
    ("bad_models:wrong_output", "model.build: output 'label' has shape [2, 3]; expected [batch] "
                                "or [batch, 1] (one logit per row)"),
    ("bad_models:wrong_inputs", "model.build: the model's inputs are ['dense']; expected one per "
                                "feature plus 'dense': ['user', 'item', 'category', 'history', "
                                "'dense'] (missing ['user', 'item', 'category', 'history'])"),
])
def test_validate_builds_the_model_and_reports_one_located_line(tmp_path: Path, build: str,
                                                               message: str) -> None:
    from embtrain.cli.validate import validate

    (tmp_path / "bad_models.py").write_text(BAD_MODULE)
    text = (REPO / "recipes" / "two_tower.yaml").read_text().replace(
        "build: two_tower_model:build", f"build: {build}")
    path = tmp_path / "r.yaml"
    path.write_text(text)
    line = text.splitlines().index(f"  build: {build}") + 1
    with pytest.raises(RecipeError) as info:
        validate([path], quiet=True)
    assert info.value.lines == [f"{path}:{line}:10: " + message.format(dir=tmp_path)]
