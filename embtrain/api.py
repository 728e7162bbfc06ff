"""The Python API: what the CLI does, callable from a notebook, with errors as exceptions.

Every function takes a recipe as a path, a mapping (the YAML's structure) or a loaded
:class:`~embtrain.recipe.Recipe`, and raises what the CLI reports as one line:
:class:`~embtrain.errors.RecipeError` (``.lines``: every problem), :class:`~embtrain.errors.DataError`,
:class:`~embtrain.errors.UserInputError` (exit code 2 on the CLI) or another
:class:`~embtrain.errors.EmbtrainError` (exit 1).

    import embtrain.api as et

    recipe = et.load_recipe("recipes/quickstart.yaml")
    summary = et.run(recipe, run_dir="runs/notebook")
    print(summary.last_eval.auc)

``run`` trains in this process (one rank); with ``processes > 1`` it starts the ranks through
``embtrain run --np`` and returns the summary they wrote. Keras state (the seed, op
determinism) is set for this process by a run, as the CLI sets it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from embtrain.errors import EmbtrainError, RecipeError, UserInputError
from embtrain.recipe import Recipe

RecipeLike = str | os.PathLike[str] | Mapping[str, Any] | Recipe

__all__ = ["dump", "gen_data", "load", "load_recipe", "plan", "predict", "resume", "run",
           "validate"]


def load_recipe(source: RecipeLike, name: str | None = None) -> Recipe:
    """A validated recipe from a YAML file, a mapping or a recipe (returned as it is).

    A mapping is validated like a file (every problem at once, :class:`RecipeError`), its
    positions given as ``<dict>:line:col`` of its YAML form; ``name`` sets a missing name."""
    import yaml

    from embtrain.recipe.loader import load_recipe as load_file
    from embtrain.recipe.loader import parse_recipe_text

    if isinstance(source, Recipe):
        recipe = source
    elif isinstance(source, Mapping):
        text = yaml.safe_dump(json.loads(json.dumps(dict(source))), sort_keys=False)
        recipe = parse_recipe_text(text, "<dict>")
    elif isinstance(source, str | os.PathLike):
        recipe = load_file(Path(source))
    else:
        raise UserInputError(f"a recipe is a path, a mapping or a Recipe, not "
                             f"{type(source).__name__}")
    if recipe.name is None:
        recipe = recipe.model_copy(update={"name": name or "recipe"})
    return recipe


def validate(source: RecipeLike, data: bool = False) -> Recipe:
    """:func:`load_recipe`, plus what ``embtrain validate [--data]`` checks: a keras model is
    built on a dummy batch; with ``data`` the first file of each split is read. Every problem
    raises one :class:`RecipeError` listing them all."""
    recipe = load_recipe(source)
    problems: list[str] = []
    where = str(source) if isinstance(source, str | os.PathLike) else "<recipe>"
    if recipe.model.type == "keras":
        from embtrain.models.keras_model import KerasModelError, check_recipe_model

        dims = {t.name: t.dim for t in recipe.tables}
        features = [(f.name, dims[f.table] * (int(f.hotness) if f.combiner == "concat"
                                              and f.hotness != "variable" else 1))
                    for f in recipe.categorical_features]
        try:
            check_recipe_model(recipe.model, features,  # type: ignore[arg-type]
                               sum(len(f.columns) for f in recipe.dense_features),
                               [lab.name for lab in recipe.data.label_specs()])
        except KerasModelError as exc:
            problems.append(f"{where}: {exc}")
    if data:
        from embtrain.data.check import check_data

        problems += check_data(recipe)
    if problems:
        raise RecipeError(problems)
    return recipe


def plan(source: RecipeLike, world_size: int | None = None, device_memory: int | None = None,
         host_memory: int | None = None) -> Any:
    """The placement ``embtrain plan`` prints (a :class:`~embtrain.plan.Plan`; ``.to_dict()``)."""
    from embtrain.plan import Topology, make_plan

    recipe = load_recipe(source)
    world = world_size or recipe.distributed.processes
    topology = Topology.detect(world)
    changes = {k: v for k, v in (("device_memory", device_memory), ("host_memory", host_memory))
               if v is not None}
    if changes:
        topology = Topology(**{**topology.to_dict(), **changes})
    return make_plan(recipe, topology)


def gen_data(source: RecipeLike, out: str | os.PathLike[str], rows: int = 200_000,
             eval_rows: int = 50_000, files: int = 4, seed: int = 0,
             file_format: str = "parquet") -> Any:
    """``embtrain gen-data``: synthetic data for the recipe's columns (a ``GenResult``)."""
    from embtrain.data.gen import GenConfig, generate

    recipe = load_recipe(source)
    result = generate(recipe, Path(out), GenConfig(rows, eval_rows, files, seed=seed),
                      {"recipe": recipe.name or ""})
    if recipe.data.labels is not None:
        from embtrain.data.labels_gen import add_labels

        add_labels([str(Path(out) / p) for p in (*result.train_files, *result.eval_files)],
                   recipe, seed)
    if file_format != "parquet":
        from embtrain.data.textwrite import as_text

        result = as_text(result, recipe, file_format)
    return result


def _summary(data: dict[str, Any]) -> Any:
    from embtrain.train.summary import EvalResult, RunSummary

    fields = dict(data)
    fields["evals"] = [EvalResult(**e) for e in fields.get("evals", [])]
    return RunSummary(**fields)


def _in_process(job: Any, new_run: bool, run_dir: Path | None) -> Any:
    from embtrain.cli.run import run_job

    summary, _ = run_job(job, new_run, run_dir)
    return summary


def _launch(args: list[str]) -> Any:
    """``embtrain ARGS --json`` in a subprocess: its summary, or its one-line error raised."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")}
    res = subprocess.run([sys.executable, "-m", "embtrain", *args, "--json"], env=env,
                         capture_output=True, text=True)
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
        message = lines[-1] if lines else f"embtrain {args[0]} exited with {res.returncode}"
        message = message.removeprefix("error: ")
        raise (UserInputError if res.returncode == 2 else EmbtrainError)(message)
    return _summary(json.loads(res.stdout))


def run(source: RecipeLike, run_dir: str | os.PathLike[str] | None = None,
        max_steps: int | None = None, seed: int | None = None,
        processes: int | None = None) -> Any:
    """``embtrain run``: train, evaluate, checkpoint; the :class:`RunSummary`.

    One process trains here; ``processes`` (default ``distributed.processes``) above one are
    started as ranks by ``embtrain run --np`` (a mapping recipe is written to a file for them)."""
    recipe = load_recipe(source)
    where = Path(run_dir) if run_dir is not None else None
    processes = processes or recipe.distributed.processes
    if processes > 1:
        path, tmp = _recipe_file(source, recipe)
        try:
            args = ["run", str(path), "--np", str(processes)]
            for flag, value in (("--run-dir", where), ("--max-steps", max_steps),
                                ("--seed", seed)):
                if value is not None:
                    args += [flag, str(value)]
            return _launch(args)
        finally:
            if tmp is not None:
                os.unlink(tmp)
    from embtrain.comm import LocalComm
    from embtrain.train import RunOptions, TrainJob

    options = RunOptions(run_dir=where, max_steps=max_steps, seed=seed, interactive=False)
    source_name = str(source) if isinstance(source, str | os.PathLike) else f"<{recipe.name}>"
    return _in_process(TrainJob(recipe, source_name, options, LocalComm()), True, where)


def _recipe_file(source: RecipeLike, recipe: Recipe) -> tuple[Path, str | None]:
    if isinstance(source, str | os.PathLike):
        return Path(source), None
    from embtrain.recipe.loader import recipe_to_yaml

    fd, tmp = tempfile.mkstemp(suffix=".yaml", prefix=f"{recipe.name}-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(recipe_to_yaml(recipe))
    return Path(tmp), tmp


def resume(run_dir: str | os.PathLike[str], from_step: int | None = None,
           max_steps: int | None = None, processes: int | None = None,
           allow_outside_module: bool = False) -> Any:
    """``embtrain run --resume RUN_DIR``: continue a run from its latest (or ``from_step``)
    checkpoint; a finished run returns its stored summary. A Keras module outside the run
    directory is imported only with ``allow_outside_module`` (``--allow-outside-module``)."""
    from embtrain.train.predict import run_recipe

    run_dir = Path(run_dir)
    recipe, _ = run_recipe(run_dir, allow_outside_module)
    if (processes or 1) > 1:
        args = ["run", "--resume", str(run_dir), "--np", str(processes)]
        if allow_outside_module:
            args.append("--allow-outside-module")
        for flag, value in (("--from-step", from_step), ("--max-steps", max_steps)):
            if value is not None:
                args += [flag, str(value)]
        return _launch(args)
    from embtrain.comm import LocalComm
    from embtrain.train import RunOptions, TrainJob

    options = RunOptions(resume=run_dir, from_step=from_step, max_steps=max_steps,
                         interactive=False)
    job = TrainJob(recipe, str(run_dir / "recipe.yaml"), options, LocalComm())
    return _in_process(job, False, None)


def predict(run_dir: str | os.PathLike[str], data: str, out: str | os.PathLike[str],
            checkpoint: int | None = None, keep: Iterable[str] = (),
            progress: bool = False, allow_outside_module: bool = False) -> Any:
    """``embtrain predict`` in this process: score the Parquet files ``data`` (a glob) with the
    run's latest (or ``checkpoint``) checkpoint into one Parquet file ``out``; returns the
    :class:`~embtrain.train.predict.PredictSummary` (with AUC and logloss when the files hold
    the labels)."""
    from embtrain.train.predict import PredictOptions
    from embtrain.train.predict import predict as score

    return score(PredictOptions(Path(run_dir), str(data), Path(out), checkpoint,
                                tuple(keep), progress, allow_outside_module))


def dump(run_dir: str | os.PathLike[str], out: str | os.PathLike[str], step: int | None = None,
         array_format: str = "npy") -> dict[str, Any]:
    """``embtrain dump``: a checkpoint as a self-describing export; its manifest."""
    from embtrain.checkpoint import dump as dump_checkpoint

    if array_format not in ("npy", "parquet"):
        raise UserInputError(f"array_format: expected npy or parquet, got {array_format!r}")
    return dump_checkpoint(Path(run_dir), Path(out), step=step,
                           array_format=array_format)  # type: ignore[arg-type]


def load(export: str | os.PathLike[str], source: RecipeLike,
         run_dir: str | os.PathLike[str] | None = None, allow: Iterable[str] = (),
         max_steps: int | None = None, seed: int | None = None) -> Any:
    """``embtrain load``: a new run of ``source`` warm-started from an export (or checkpoint);
    an export that does not fit raises one error listing every difference."""
    from embtrain.checkpoint import CheckpointError, open_bundle, parse_allow
    from embtrain.checkpoint.load_export import differences
    from embtrain.cli.load import make_warm_start_job
    from embtrain.comm import LocalComm
    from embtrain.train import RunOptions

    recipe = load_recipe(source)
    allowed = parse_allow(list(allow) or None)
    bundle = open_bundle(Path(export), kinds=("export", "checkpoint"))
    refused, _ = differences(bundle, recipe, allowed)
    if refused:
        raise CheckpointError("\n".join(
            [f"{bundle.path}: does not fit the recipe: {len(refused)} difference(s)"]
            + [f"{bundle.path}: {r}" for r in refused]))
    where = Path(run_dir) if run_dir is not None else None
    options = RunOptions(run_dir=where, max_steps=max_steps, seed=seed, interactive=False)
    source_name = str(source) if isinstance(source, str | os.PathLike) else f"<{recipe.name}>"
    job = make_warm_start_job(recipe, source_name, options, Path(export), allowed, LocalComm())
    return _in_process(job, True, where)
