"""``embtrain run``: train a recipe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table


def run(
    recipe_path: Path | None = typer.Argument(
        None, metavar="RECIPE", help="recipe YAML file (default with --resume: the run's own)"
    ),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help="default: runs/<recipe name>/<timestamp>"
    ),
    max_steps: int | None = typer.Option(
        None, "--max-steps", min=1, help="stop after this many steps"
    ),
    seed: int | None = typer.Option(None, "--seed", help="override train.seed"),
    resume: Path | None = typer.Option(
        None, "--resume", metavar="RUN_DIR", help="continue RUN_DIR from its latest checkpoint"
    ),
    from_step: int | None = typer.Option(
        None, "--from-step", min=0, help="with --resume: the checkpoint at this step"
    ),
    allow: str | None = typer.Option(
        None, "--allow", metavar="CHANGES",
        help="with --resume: 'data' continues although the data changed since the checkpoint",
    ),
    json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Train the recipe's model; evaluate, log metrics and write a run directory."""
    from embtrain.errors import UserInputError
    from embtrain.recipe import load_recipe
    from embtrain.recipe.overrides import check_seed
    from embtrain.train import RunOptions, TrainJob

    check_seed(seed)
    if resume is None and (recipe_path is None or from_step is not None):
        raise UserInputError("give a RECIPE, or --resume RUN_DIR [--from-step N]")
    if resume is not None and (run_dir is not None or seed is not None):
        raise UserInputError("--resume continues RUN_DIR as it was: no --run-dir or --seed")
    allowed = frozenset(a.strip() for a in (allow or "").split(",") if a.strip())
    if allowed - {"data"}:
        raise UserInputError(f"--allow: {', '.join(sorted(allowed - {'data'}))}: "
                             "with --resume only 'data' may be allowed")
    if allowed and resume is None:
        raise UserInputError("--allow data goes with --resume RUN_DIR")
    if recipe_path is None:
        assert resume is not None
        recipe_path = resume / "recipe.yaml"
    recipe = load_recipe(recipe_path)
    options = RunOptions(
        run_dir=run_dir, max_steps=max_steps, seed=seed, resume=resume, from_step=from_step,
        progress_to_stderr=json_out, allow=allowed,
    )
    job = TrainJob(recipe, str(recipe_path), options)
    summary = run_job(job, resume is None, run_dir)
    if json_out:
        typer.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
        return
    console = Console(highlight=False)
    table = Table(title=f"embtrain run: {recipe.name}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("run directory", summary.run_dir)
    table.add_row("steps", f"{summary.steps} ({summary.epochs:.2f} epochs)")
    table.add_row("time", f"{summary.seconds:.1f} s, {summary.samples_per_s:,.0f} samples/s")
    table.add_row("final train loss", f"{summary.final_loss:.4f}")
    last = summary.last_eval
    if last is not None:
        table.add_row("eval AUC", f"{last.auc:.4f}")
        table.add_row("eval logloss", f"{last.logloss:.4f}")
        table.add_row("eval rows", f"{last.rows:,}")
    if summary.best_auc is not None:
        table.add_row("best achievable AUC", f"{summary.best_auc:.4f} (from the data generator)")
    console.print(table)
    if last is not None:
        console.print(f"eval AUC {last.auc:.4f}")


def run_job(job: Any, new_run: bool, run_dir: Path | None) -> Any:
    """``job.run()``; a new run that stops before its first checkpoint leaves nothing behind.

    Ctrl-C is one line saying what was kept and how to continue (exit 130).
    """
    from embtrain.errors import Interrupted
    from embtrain.train.rundir import remove_unresumable, resume_hint

    existed = run_dir is not None and run_dir.exists()
    try:
        return job.run()
    except BaseException as exc:
        where = getattr(job, "run_dir", None)
        removed = new_run and where is not None and remove_unresumable(where, existed)
        if isinstance(exc, KeyboardInterrupt):
            if where is None:
                raise Interrupted("interrupted (Ctrl-C) before training started") from None
            if removed:
                raise Interrupted(
                    f"interrupted (Ctrl-C) before the first checkpoint; {where} was removed"
                ) from None
            raise Interrupted(f"interrupted (Ctrl-C); {resume_hint(where)}") from None
        raise
