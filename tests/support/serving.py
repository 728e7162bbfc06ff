"""Runs to serve and score: recipes with every feature kind and every dense network, a run
trained in this process or through the CLI, and scoring a SavedModel in a process where
embtrain cannot be imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.cli import REPO, run_cli

#: every feature kind over static tables and a dynamic one; ``{data}``: the data directory
ALL_KINDS = """
version: 1
name: all-kinds
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 128}}
features:
  - {{kind: dense, name: numeric, columns: [I1, I2], transform: signed_log1p, fill_null: 0.5}}
  - {{kind: dense, name: counts, columns: [I3], transform: log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: city, column: city, table: city, ids: string, out_of_range: modulo}}
  - {{kind: categorical, name: tags, column: tags, table: tag, hotness: 3, combiner: concat}}
  - {{kind: categorical, name: hist, column: hist, table: item, hotness: variable, combiner: mean,
     weights: hist_w}}
  - {{kind: categorical, name: item, column: item_id, table: item, weights: item_w}}
  - {{kind: categorical, name: dyn, column: dyn_id, table: dyn, hotness: variable,
     combiner: sqrtn}}
tables:
  - {{name: user, dim: 4, rows: 50}}
  - {{name: city, dim: 4, rows: 40}}
  - {{name: tag, dim: 4, rows: 30}}
  - {{name: item, dim: 4, rows: 60}}
  - {{name: dyn, dim: 4, dynamic: {{capacity: 2000}}}}
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: dcn_v2, cross_layers: 2, deep: [8]}}
train: {{steps: 8, eval_every: 4, log_every: 4, seed: 1, checkpoint: {{every: 4, keep: 3}}}}
"""


#: a static table over a file on disk (``{store}``), with a cache of a few hundred rows in
#: memory; ``{data}``: the data directory
TIERED = """
version: 1
name: tiered-tiny
data: {{train: {data}/train/*.parquet, eval: {data}/eval/*.parquet, batch_size: 128}}
features:
  - {{kind: dense, name: numeric, columns: [I1], transform: signed_log1p}}
  - {{kind: categorical, name: user, column: user_id, table: user}}
  - {{kind: categorical, name: item, column: item_id, table: item}}
tables:
  - {{name: user, dim: 4, rows: 50}}
  - name: item
    dim: 8
    rows: 3000
    storage:
      - {{tier: host, budget: 24KiB}}
      - {{tier: disk, path: {store}}}
optimizer: {{sparse: {{type: adagrad, lr: 0.1}}, dense: {{type: adam, lr: 0.01}}}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: 8, eval_every: 4, log_every: 4, seed: 1}}
"""



#: every built-in dense network, small, as recipe text
MODELS = {
    "mlp": "{type: mlp, hidden: [8]}",
    "dlrm": "{type: dlrm, bottom: [8, 4], top: [8, 1]}",
    "dcn_v2": "{type: dcn_v2, cross_layers: 2, deep: [8]}",
    "deepfm": "{type: deepfm, deep: [8]}",
    "wide_deep": "{type: wide_deep, deep: [8]}",
}


def recipe_with_model(model: str, data: Path, **changes: str) -> str:
    """ALL_KINDS with the dense network ``model`` (a key of MODELS) and text replacements."""
    text = ALL_KINDS.format(data=data).replace(MODELS["dcn_v2"], MODELS[model])
    if model in ("dlrm", "deepfm"):  # interactions need equal widths: no concat feature
        text = text.replace("hotness: 3, combiner: concat", "hotness: 3, combiner: sum")
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def train_run(root: Path, name: str, text: str, *extra: str) -> Path:
    """A run of ``text``: in this process (one rank), or through the CLI with ``extra``."""
    recipe = root / f"{name}.yaml"
    recipe.write_text(text)
    run = root / f"run-{name}"
    if not extra:
        from embtrain.recipe import load_recipe
        from embtrain.train import RunOptions, TrainJob

        TrainJob(load_recipe(recipe), str(recipe),
                 RunOptions(run_dir=run, tensorboard=False, interactive=False,
                            progress_to_stderr=True)).run()
        return run
    result = run_cli("run", str(recipe), "--run-dir", str(run), *extra)
    assert result.returncode == 0, result.stderr
    return run


def score_without_embtrain(jobs: list[tuple[Path, str, Path]]) -> None:
    """Score every (export, data glob, out.npy) in one process where embtrain cannot be
    imported (``-I``: no PYTHONPATH, no current directory on the path, plus a blocker)."""
    args = [str(x) for job in jobs for x in job]
    result = subprocess.run([sys.executable, "-I", str(REPO / "tests" / "workers" / "serving_client.py"),
                             *args], capture_output=True, text=True, timeout=600,
                            cwd="/", env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]

def make_run_from(root: Path, name: str, text: str) -> Path:
    """Generate data for recipe ``text`` (formatted with ``data`` and ``store``) under ``root``
    and train it; the run directory."""
    data, store = root / f"data-{name}", root / f"store-{name}"
    store.mkdir()
    recipe = root / f"{name}.yaml"
    recipe.write_text(text.format(data=data, store=store))
    made = run_cli("gen-data", "--recipe", str(recipe), "--out", str(data), "--rows", "1024",
                   "--eval-rows", "300", "--files", "2")
    assert made.returncode == 0, made.stderr
    run = root / f"run-{name}"
    result = run_cli("run", str(recipe), "--run-dir", str(run))
    assert result.returncode == 0, result.stderr
    return run


def eval_glob(run: Path) -> str:
    """The eval glob of the run's saved recipe."""
    recipe = (run / "recipe.yaml").read_text()
    return next(line.split("eval:", 1)[1].strip() for line in recipe.splitlines()
                if line.strip().startswith("eval:"))
