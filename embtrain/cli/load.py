"""``embtrain load``: start a new run warm-started from an export (or checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer


def make_warm_start_job(
    recipe: Any, source: str, options: Any, export: Path, allow: set[str], comm: Any = None
) -> Any:
    """A :class:`~embtrain.train.TrainJob` whose engine and dense model start from ``export``.

    Uses ``RunOptions.init_from`` when the training job has it, else a subclass whose
    ``_build`` loads the export right after building the engine and model.
    """
    import dataclasses

    from embtrain.checkpoint import warm_start
    from embtrain.train import TrainJob

    if "init_from" in {f.name for f in dataclasses.fields(options)}:
        options = dataclasses.replace(options, init_from=export, allow=frozenset(allow))
        return TrainJob(recipe, source, options, comm)

    class WarmStartJob(TrainJob):
        """TrainJob that loads the export right after building the engine and model."""

        def _build(self) -> None:
            super()._build()
            self.warm_start = warm_start(self.engine, self.model, export, self.recipe, allow)

    return WarmStartJob(recipe, source, options, comm)


ALLOW_HELP = (
    "comma-separated changes to accept: lr, optimizer, steps, eval, checkpoint, seed, "
    "data, features, model, train, dtype (a table's dtype, rounding or optimizer_state: "
    "converted as it loads)"
)


def load(
    export: Annotated[
        Path,
        typer.Argument(metavar="EXPORT", help="export (embtrain dump) or checkpoint directory"),
    ],
    recipe_path: Annotated[Path, typer.Option("--recipe", help="recipe of the new run")],
    allow: Annotated[
        str | None, typer.Option("--allow", metavar="CATEGORIES", help=ALLOW_HELP)
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="default: runs/<recipe name>/<timestamp>")
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="stop after this many steps")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="override train.seed")] = None,
    check_only: Annotated[
        bool, typer.Option("--check", help="only check the export against the recipe")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    np_: Annotated[
        int | None,
        typer.Option("--np", min=1, help="processes; overrides distributed.processes"),
    ] = None,
) -> None:
    """Train RECIPE starting from EXPORT's tables and dense model; refuse exports that do not fit.

    With several processes every rank reads its own shards of the export.
    """
    from embtrain.checkpoint import CheckpointError, open_bundle, parse_allow
    from embtrain.checkpoint.load_export import differences
    from embtrain.recipe import load_recipe
    from embtrain.recipe.overrides import check_seed

    check_seed(seed)
    allowed = parse_allow(allow)
    recipe = load_recipe(recipe_path)
    bundle = open_bundle(export, kinds=("export", "checkpoint"))
    refused, accepted = differences(bundle, recipe, allowed)
    if refused:
        lines = [f"{bundle.path}: does not fit {recipe_path}: {len(refused)} difference(s)"]
        raise CheckpointError("\n".join(lines + [f"{bundle.path}: {r}" for r in refused]))
    if any(t.dtype == "float16" or t.state_dtype == "float16" for t in recipe.tables):
        from embtrain.checkpoint.half_range import float16_overflows

        overflows = float16_overflows(bundle, recipe)  # a value beyond float16 loads as inf
        if overflows:
            raise CheckpointError("\n".join(f"{bundle.path}: {line}" for line in overflows))
    if check_only:
        from embtrain.checkpoint import verify_bundle
        from embtrain.checkpoint.keycheck import check_keys

        verify_bundle(bundle)  # every file, as the load verifies them
        check_keys(bundle, recipe)  # and the keys, as the load checks them
        result = {"export": str(export), "step": bundle.step, "fits": True, "allowed": accepted}
        typer.echo(
            json.dumps(result, indent=2)
            if json_out
            else f"{export} fits {recipe_path}" + "".join(f"\n  {a}" for a in accepted)
        )
        return
    from embtrain.cli.run import exit_if_stopped, run_job
    from embtrain.comm import launched_rank, make_comm
    from embtrain.train import RunOptions

    processes = np_ or recipe.distributed.processes
    if launched_rank() is None and processes > 1:
        from embtrain.cli.ranks import launch_ranks

        args = ["load", str(export), "--recipe", str(recipe_path)]
        for flag, value in (("--allow", allow), ("--run-dir", run_dir),
                            ("--max-steps", max_steps), ("--seed", seed)):
            if value is not None:
                args += [flag, str(value)]
        if json_out:
            args.append("--json")
        code = launch_ranks(recipe, str(recipe_path), processes, None, 1, 0, None, args)
        raise typer.Exit(code)
    comm = make_comm()
    job = make_warm_start_job(
        recipe,
        str(recipe_path),
        RunOptions(run_dir=run_dir, max_steps=max_steps, seed=seed, progress_to_stderr=json_out),
        export,
        allowed,
        comm,
    )
    try:
        summary, stop = run_job(job, True, run_dir, json_out)
    finally:
        comm.shutdown()
    if comm.rank != 0:
        if summary.stopped and stop.exit_code is not None:
            raise typer.Exit(stop.exit_code)
        return
    data = {
        **summary.to_dict(),
        "warm_start": {"export": str(export), "step": bundle.step, "allowed": accepted},
    }
    if json_out:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        exit_if_stopped(stop, summary.run_dir, summary.steps)
        return
    typer.echo(f"warm-started from {export} (step {bundle.step})")
    typer.echo(f"run directory      {summary.run_dir}")
    typer.echo(f"steps              {summary.steps}")
    typer.echo(f"final train loss   {summary.final_loss:.4f}")
    last = summary.last_eval
    if last is not None:
        from embtrain.train.summary import eval_headline

        typer.echo(f"eval {eval_headline(last)}")
    exit_if_stopped(stop, summary.run_dir, summary.steps)
