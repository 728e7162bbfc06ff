"""The user's Python module behind ``model: {type: keras}``: its content belongs to the run,
and whatever it does wrong (exits, raises, lacks a dependency) is one line naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from embtrain.errors import RecipeError

REPO = Path(__file__).resolve().parents[1]


def _two_tower(root: Path, data: Path, build: str = "two_tower_model:build") -> Path:
    text = (REPO / "recipes" / "two_tower.yaml").read_text()
    text = text.replace("data/quickstart", str(data)).replace("batch_size: 2048",
                                                              "batch_size: 256")
    text = text.replace("build: two_tower_model:build", f"build: {build}")
    text = text[:text.index("train:\n")] + (
        "train:\n  steps: 6\n  eval_every: 6\n  log_every: 3\n  checkpoint: {every: 3}\n"
        "  seed: 0\n")
    path = root / "r.yaml"
    path.write_text(text)
    return path


def test_an_edited_module_is_refused_by_predict_export_and_resume(tmp_path: Path, cli) -> None:
    from embtrain.data.gen import GenConfig, generate
    from embtrain.recipe import load_recipe

    generate(load_recipe(REPO / "recipes" / "quickstart.yaml"), tmp_path / "data",
             GenConfig(rows=2048, eval_rows=512, files=1, seed=1))
    module = tmp_path / "two_tower_model.py"
    shutil.copy(REPO / "recipes" / "two_tower_model.py", module)
    recipe = _two_tower(tmp_path, tmp_path / "data")
    run = tmp_path / "run"
    res = cli("run", str(recipe), "--run-dir", str(run), "--max-steps", "3")
    assert res.returncode == 0, res.stderr
    predict = ("predict", str(run), "--data", str(tmp_path / "data" / "eval" / "*.parquet"),
               "--out", str(tmp_path / "scores.parquet"))
    assert cli(*predict).returncode == 0  # unchanged: scores
    (tmp_path / "scores.parquet").unlink()

    module.write_text(module.read_text().replace('activation="relu"', 'activation="tanh"'))
    for args in (predict, ("export", str(run), str(tmp_path / "out")),
                 ("run", "--resume", str(run))):
        res = cli(*args)
        assert res.returncode == 2, (args, res.stderr)
        line = res.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert line.startswith(f"{module}: the model module changed since "), line
        assert "restore the module as it was when the run trained" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "scores.parquet").exists()


BUILDERS = '''
import keras

def exits(inputs, options):
    import sys
    sys.exit(0)

def raises(inputs, options):
    width = options["missing"]
    return width
'''


@pytest.mark.parametrize("name,text,build,message", [
    ("exits_mod", BUILDERS, "exits", "model.build: {build}(inputs, options) raised SystemExit(0) "
     "(at {file}:6): the module exited the process; a builder must return a keras.Model (raise "
     "an exception to refuse)"),
    ("raises_mod", BUILDERS, "raises", "model.build: {build}(inputs, options) raised KeyError: "
     "'missing' (at {file}:9)"),
    ("exits_on_import", "import sys\nsys.exit(3)\n", "build", "model.build: importing "
     "'exits_on_import' raised SystemExit(3) (at {file}:2): the module exited the process; a "
     "builder must return a keras.Model (raise an exception to refuse)"),
    ("needs_a_package", "import keras\nimport not_installed_pkg_xyz\n", "build", "model.build: "
     "{file}:2: the module imports 'not_installed_pkg_xyz', which is not installed (No module "
     "named 'not_installed_pkg_xyz'); install it in this Python environment"),
])
def test_a_builder_that_exits_raises_or_lacks_a_dependency_is_one_located_line(
        tmp_path: Path, name: str, text: str, build: str, message: str) -> None:
    from embtrain.cli.validate import validate

    module = tmp_path / f"{name}.py"
    module.write_text(text)
    spec = f"{name}:{build}"
    recipe = _two_tower(tmp_path, tmp_path / "data", spec)
    line = recipe.read_text().splitlines().index(f"  build: {spec}") + 1
    with pytest.raises(RecipeError) as info:
        validate([recipe], quiet=True)
    assert info.value.lines == [f"{recipe}:{line}:10: "
                                + message.format(build=spec, file=module)]


def test_run_with_a_builder_that_exits_is_an_error(tmp_path: Path, cli) -> None:
    (tmp_path / "exiting.py").write_text(BUILDERS)
    recipe = _two_tower(tmp_path, tmp_path / "data", "exiting:exits")
    from embtrain.data.gen import GenConfig, generate
    from embtrain.recipe import load_recipe

    generate(load_recipe(REPO / "recipes" / "quickstart.yaml"), tmp_path / "data",
             GenConfig(rows=512, eval_rows=256, files=1, seed=1))
    res = cli("run", str(recipe), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "raised SystemExit(0)" in res.stderr and str(tmp_path / "exiting.py") in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


FIXED_BATCH = '''
import keras

def build(inputs, options):
    xs = [keras.Input((f.width,), name=f.name) for f in inputs.features]
    xs.append(keras.Input((inputs.dense_width,), name=inputs.dense_name))
    x = keras.layers.Dense(1)(keras.layers.Concatenate()(xs))
    out = keras.layers.Lambda(lambda t: keras.ops.reshape(t, (2, -1))[:, :1])(x)
    return keras.Model(xs, out)
'''


def test_a_model_whose_output_depends_on_the_batch_is_one_line(tmp_path: Path, cli) -> None:
    """It passed validate's batch of 2 rows, then training printed a TensorFlow traceback."""
    from embtrain.cli.validate import validate
    from embtrain.data.gen import GenConfig, generate
    from embtrain.recipe import load_recipe

    (tmp_path / "fixed_batch.py").write_text(FIXED_BATCH)
    recipe = _two_tower(tmp_path, tmp_path / "data", "fixed_batch:build")
    with pytest.raises(RecipeError) as info:
        validate([recipe], quiet=True)
    (line,) = info.value.lines
    assert "model.build: calling the model on a batch of 3 rows raised " in line, line
    assert "(it worked on 2: the output depends on the batch size)" in line, line
    generate(load_recipe(REPO / "recipes" / "quickstart.yaml"), tmp_path / "data",
             GenConfig(rows=512, eval_rows=256, files=1, seed=1))
    res = cli("run", str(recipe), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr and "batch of 3 rows" in res.stderr
