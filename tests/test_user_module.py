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


def _generate(root: Path) -> None:
    from embtrain.data.gen import GenConfig, generate
    from embtrain.recipe import load_recipe

    generate(load_recipe(REPO / "recipes" / "quickstart.yaml"), root / "data",
             GenConfig(rows=2048, eval_rows=512, files=1, seed=1))


def test_an_edited_module_is_refused_by_predict_export_and_resume(tmp_path: Path, cli) -> None:
    _generate(tmp_path)
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

    copy = run / "model" / "two_tower_model.py"  # the run's own module: what predict imports
    copy.write_text(copy.read_text().replace('activation="relu"', 'activation="tanh"'))
    for args in (predict, ("export", str(run), str(tmp_path / "out")),
                 ("run", "--resume", str(run))):
        res = cli(*args)
        assert res.returncode == 2, (args, res.stderr)
        line = res.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert line.startswith(f"{copy}: the model module changed since "), line
        assert "restore the module as it was when the run trained" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "scores.parquet").exists()


SIBLING_BUILDER = '''
from tower_parts import build  # a sibling file beside this module
'''


def test_a_run_directory_imports_its_own_copy_of_the_module(tmp_path: Path, cli) -> None:
    """run copies the module and the sibling it imports into RUN/model/ and recipe.yaml
    names the copy; predict, export and --resume use it once the user's files are edited
    or gone; a recipe.yaml pointing outside the run is refused (one line, exit 2, nothing
    written) unless --allow-outside-module is given."""
    import json

    import pyarrow.parquet as pq
    import yaml

    _generate(tmp_path)
    user = tmp_path / "user"
    user.mkdir()
    shutil.copy(REPO / "recipes" / "two_tower_model.py", user / "tower_parts.py")
    (user / "tt.py").write_text(SIBLING_BUILDER)
    recipe = _two_tower(user, tmp_path / "data", build="tt:build")
    run = tmp_path / "run"
    res = cli("run", str(recipe), "--run-dir", str(run), "--max-steps", "3")
    assert res.returncode == 0, res.stderr
    assert (run / "model" / "tt.py").read_text() == SIBLING_BUILDER
    assert (run / "model" / "tower_parts.py").read_bytes() == \
        (REPO / "recipes" / "two_tower_model.py").read_bytes()
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    assert saved["model"]["path"] == "model"

    eval_glob = str(tmp_path / "data" / "eval" / "*.parquet")
    first = tmp_path / "first.parquet"
    assert cli("predict", str(run), "--data", eval_glob, "--out", str(first)).returncode == 0

    # the user's files edited, then deleted: the run's copy scores the same
    (user / "tower_parts.py").write_text((user / "tower_parts.py").read_text().replace(
        'activation="relu"', 'activation="tanh"'))
    again = tmp_path / "again.parquet"
    res = cli("predict", str(run), "--data", eval_glob, "--out", str(again))
    assert res.returncode == 0, res.stderr
    assert pq.read_table(again).equals(pq.read_table(first))
    shutil.rmtree(user)
    res = cli("export", str(run), str(tmp_path / "exported"))
    assert res.returncode == 0, res.stderr
    res = cli("run", "--resume", str(run), "--json")  # steps 4..6 from the copy
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["steps"] == 6

    # recipe.yaml pointed outside the run: refused, nothing written, unless allowed
    outside = tmp_path / "outside"
    shutil.copytree(run / "model", outside)
    text = (run / "recipe.yaml").read_text()
    (run / "recipe.yaml").write_text(text.replace("path: model", f"path: {outside}"))
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    scores = tmp_path / "scores.parquet"
    for args in (("predict", str(run), "--data", eval_glob, "--out", str(scores)),
                 ("export", str(run), str(tmp_path / "out")),
                 ("run", "--resume", str(run), "--from-step", "3")):
        res = cli(*args)
        assert res.returncode == 2, (args, res.stderr)
        line = res.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert line.startswith(f"{run / 'recipe.yaml'}: model.path: {outside} is outside the "
                               "run directory"), line
        assert "--allow-outside-module" in line and "runs made before" in line, line
    assert not scores.exists() and not (tmp_path / "out").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    res = cli("predict", str(run), "--data", eval_glob, "--out", str(scores),
              "--allow-outside-module")
    assert res.returncode == 0, res.stderr
    res = cli("export", str(run), str(tmp_path / "out"), "--allow-outside-module")
    assert res.returncode == 0, res.stderr


def test_a_checkpoint_fingerprint_with_the_module_path_still_matches(tmp_path: Path) -> None:
    """Checkpoints of Keras runs made before model.path left the fingerprint recorded it:
    they are still the recipe's; the path no longer changes the fingerprint."""
    import hashlib
    import json

    from embtrain.recipe import fingerprint_matches, load_recipe, recipe_fingerprint

    recipe = load_recipe(_two_tower(tmp_path, tmp_path / "data"))
    dumped = recipe.model_dump(mode="json")  # the fingerprint as it was computed before
    for key in ("device", "dense_backend"):
        dumped["train"].pop(key, None)
    dumped["distributed"]["comm"].pop("transport", None)
    older = hashlib.sha256(json.dumps(dumped, sort_keys=True, separators=(",", ":"))
                           .encode()).hexdigest()[:16]
    assert fingerprint_matches(older, recipe)
    moved = recipe.model_copy(update={"model": recipe.model.model_copy(
        update={"path": str(tmp_path / "elsewhere")})})
    assert recipe_fingerprint(moved) == recipe_fingerprint(recipe)
    assert not fingerprint_matches(older, moved)
    other = recipe.model_copy(update={"model": recipe.model.model_copy(
        update={"options": {"hidden": [8]}})})
    assert not fingerprint_matches(recipe_fingerprint(recipe), other)


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


def test_checking_a_run_module_imports_no_keras() -> None:
    """`run --resume`, predict and export check where a run's module lies before the dense
    backend is chosen: importing Keras then would fix it to TensorFlow (a `dense_backend: jax`
    run could not resume)."""
    import subprocess
    import sys

    code = ("import sys, embtrain.cli.run, embtrain.train.predict, embtrain.models.run_module; "
            "print(sorted(m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
