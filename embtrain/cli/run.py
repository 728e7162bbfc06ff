"""``embtrain run``: train a recipe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from embtrain.train.signals import GracefulStop


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
    allow_outside_module: bool = typer.Option(
        False, "--allow-outside-module", help="with --resume: import a `type: keras` model's "
        "module from where the run's recipe.yaml points outside RUN_DIR (runs made before the "
        "module was copied into RUN_DIR/model/); only for code you trust"),
    json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    np_: int | None = typer.Option(
        None, "--np", min=1, help="processes (ranks) in all; overrides distributed.processes"
    ),
    hosts: str | None = typer.Option(
        None, "-H", "--hosts", help="host:slots,... as horovodrun takes them (remote: over ssh)"
    ),
    nodes: int = typer.Option(1, "--nodes", min=1, help="machines, each started by hand"),
    node_rank: int = typer.Option(0, "--node-rank", min=0, help="this machine's index"),
    rendezvous: str | None = typer.Option(
        None, "--rendezvous", metavar="ADDR:PORT", help="node 0's address for --nodes > 1"
    ),
) -> None:
    """Train the recipe's model; evaluate, log metrics and write a run directory.

    With several processes (``--np`` or ``distributed.processes``) this command starts the
    ranks itself (shared memory between them on one machine, Horovod over Gloo across
    machines); a process started by horovodrun or mpirun runs as its rank.
    """
    from embtrain.cli.ranks import launch_ranks
    from embtrain.comm import launched_rank, make_comm
    from embtrain.errors import UserInputError
    from embtrain.recipe import load_recipe
    from embtrain.recipe.overrides import check_seed
    from embtrain.train import RunOptions, TrainJob
    from embtrain.train.summary import format_auc, format_label_metrics, has_auc

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
    if allow_outside_module and resume is None:
        raise UserInputError("--allow-outside-module goes with --resume RUN_DIR (a new run "
                             "imports the module its recipe names)")
    own_recipe = recipe_path is None
    if own_recipe:
        from embtrain.train.predict import run_recipe

        assert resume is not None
        # the run's own module copy; one outside the run only with --allow-outside-module
        recipe, recipe_path = run_recipe(resume, allow_outside_module)
    else:
        recipe = load_recipe(recipe_path)
    if launched_rank() is None:
        processes = np_ or recipe.distributed.processes
        host_list = hosts or (",".join(recipe.distributed.hosts)
                              if recipe.distributed.hosts else None)
        if np_ is None and resume is not None and nodes == 1 and host_list is None:
            from embtrain.train.rundir import recorded_processes

            processes = recorded_processes(resume) or processes  # as the run was trained
        if processes > 1 or nodes > 1:
            argv = [] if own_recipe else [str(recipe_path)]
            if allow_outside_module:
                argv.append("--allow-outside-module")
            for flag, value in (("--run-dir", run_dir), ("--max-steps", max_steps),
                                ("--seed", seed), ("--resume", resume), ("--from-step", from_step)):
                if value is not None:
                    argv += [flag, str(value)]
            if json_out:
                argv.append("--json")
            code = launch_ranks(recipe, str(recipe_path), processes, host_list, nodes,
                                node_rank, rendezvous, ["run", *argv])
            raise typer.Exit(code)
    options = RunOptions(
        run_dir=run_dir, max_steps=max_steps, seed=seed, resume=resume, from_step=from_step,
        progress_to_stderr=json_out, allow=allowed,
    )
    comm = make_comm()
    job = TrainJob(recipe, str(recipe_path), options, comm)
    try:
        summary, stop = run_job(job, resume is None, run_dir, json_out)
    finally:
        comm.shutdown()
    if comm.rank != 0:  # rank 0 reports; the others only share its exit code
        if summary.stopped and stop.exit_code is not None:
            raise typer.Exit(stop.exit_code)
        return
    if json_out:
        typer.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
        exit_if_stopped(stop, summary.run_dir, summary.steps, summary.stopped,
                        summary.processes)
        return
    console = Console(highlight=False)
    table = Table(title=f"embtrain run: {recipe.name}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("run directory", summary.run_dir)
    table.add_row("steps", f"{summary.steps} ({summary.epochs:.2f} epochs)")
    if summary.processes > 1:
        table.add_row("ranks", f"{summary.processes}, exchanging through "
                      f"{summary.transport.replace('_', ' ')}")
    table.add_row("time", f"{summary.seconds:.1f} s, {summary.samples_per_s:,.0f} samples/s")
    table.add_row("final train loss", f"{summary.final_loss:.4f}")
    last = summary.last_eval
    if last is not None:
        if has_auc(last):  # none when every label is a regression (mse) label
            table.add_row("eval AUC", format_auc(last))
            table.add_row("eval logloss", f"{last.logloss:.4f}")
        for name, metrics in (last.labels or {}).items():
            table.add_row(f"eval {name}", format_label_metrics(metrics))
        table.add_row("eval rows", f"{last.rows:,}")
    if summary.best_auc is not None and (last is None or has_auc(last)):
        table.add_row("best achievable AUC", f"{summary.best_auc:.4f} (from the data generator)")
    if summary.stopped:
        table.add_row("stopped", f"by {stop.signal_name or 'a signal to another rank'}; "
                      "resumable from its checkpoint")
    console.print(table)
    if last is not None and not summary.stopped:
        if last.labels:  # every label's figures, one line each
            for name, metrics in last.labels.items():
                console.print(f"eval {name}: {format_label_metrics(metrics)}")
        else:
            console.print(f"eval AUC {format_auc(last)}")
    exit_if_stopped(stop, summary.run_dir, summary.steps, summary.stopped, summary.processes)


def exit_if_stopped(stop: GracefulStop, run_dir: str, steps: int, stopped: str | None = None,
                    processes: int = 1) -> None:
    """After a run stopped by a signal: say how to continue (stderr), exit ``128 + signal``
    (rank 0 of a job whose other rank got the signal says it too; the launcher exits 128 +
    that rank's signal)."""
    from embtrain.train.rundir import resume_command

    if stop.exit_code is None:
        if stopped:
            typer.echo(f"stopped by a signal to another rank after step {steps}; checkpoint "
                       f"written; continue with: {resume_command(run_dir, processes)}", err=True)
        return
    where = (
        f"checkpoint written; continue with: {resume_command(run_dir, processes)}"
        if steps
        else "no step was done, nothing to resume"
    )
    typer.echo(f"stopped by {stop.signal_name} after step {steps}; {where}", err=True)
    raise typer.Exit(stop.exit_code)


def run_job(job: Any, new_run: bool, run_dir: Path | None, json_out: bool = False
            ) -> tuple[Any, GracefulStop]:
    """``job.run()`` under a graceful stop (SIGTERM/SIGINT: checkpoint after this step, exit
    143/130) with compiling kernels announced; a new run that fails before its first
    checkpoint leaves nothing behind (rank 0 created it, rank 0 removes it).
    """
    from embtrain.errors import Interrupted
    from embtrain.train.progress import compile_notices
    from embtrain.train.rundir import remove_unresumable, resume_hint
    from embtrain.train.signals import GracefulStop

    existed = run_dir is not None and run_dir.exists()
    try:
        with GracefulStop() as stop, compile_notices(to_stderr=json_out):
            return job.run(stop), stop
    except BaseException as exc:
        where = getattr(job, "run_dir", None)
        removed = (new_run and where is not None and getattr(job, "is_root", True)
                   and remove_unresumable(where, existed))
        if isinstance(exc, KeyboardInterrupt):
            if where is None:
                raise Interrupted("interrupted (Ctrl-C) before training started") from None
            if removed:
                raise Interrupted(
                    f"interrupted (Ctrl-C) before the first checkpoint; {where} was removed"
                ) from None
            size = getattr(getattr(job, "comm", None), "size", 1)
            raise Interrupted(f"interrupted (Ctrl-C); {resume_hint(where, size)}") from None
        raise
