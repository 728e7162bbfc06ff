"""``embtrain predict``: score Parquet rows with a run's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def predict(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run directory of `embtrain run`"),
    data: str = typer.Option(..., "--data", metavar="GLOB", help="Parquet file(s) to score"),
    out: Path = typer.Option(..., "--out", metavar="FILE.parquet", help="the predictions"),
    checkpoint: int | None = typer.Option(
        None, "--checkpoint", min=0, metavar="STEP", help="the checkpoint at this step "
        "(default: the latest)"),
    np_: int | None = typer.Option(None, "--np", min=1, help="processes (ranks) in all"),
    keep: str | None = typer.Option(
        None, "--keep", metavar="COL,...", help="input columns copied to the output"),
    allow_outside_module: bool = typer.Option(
        False, "--allow-outside-module", help="import a `type: keras` model's module from "
        "where the run's recipe.yaml points outside RUN_DIR (runs made before the module was "
        "copied into RUN_DIR/model/); only for code you trust"),
    json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Score Parquet rows with the run's latest (or chosen) checkpoint, as evaluation does;
    write one row per input row, in input order: the --keep columns, probability, logit.

    A `type: keras` model's module is imported and run from the run directory's own copy
    (RUN_DIR/model/); one pointing outside RUN_DIR is refused without --allow-outside-module."""
    from embtrain.cli.ranks import launch_ranks
    from embtrain.comm import launched_rank, make_comm
    from embtrain.train.predict import PredictOptions, run_recipe
    from embtrain.train.predict import predict as score

    columns = tuple(c.strip() for c in (keep or "").split(",") if c.strip())
    recipe, source = run_recipe(run_dir, allow_outside_module)
    if launched_rank() is None and (np_ or 1) > 1:
        argv = [str(run_dir), "--data", data, "--out", str(out)]
        if checkpoint is not None:
            argv += ["--checkpoint", str(checkpoint)]
        if columns:
            argv += ["--keep", ",".join(columns)]
        if json_out:
            argv.append("--json")
        if allow_outside_module:
            argv.append("--allow-outside-module")
        code = launch_ranks(recipe, str(source), int(np_ or 1), None, 1, 0, None,
                            ["predict", *argv])
        raise typer.Exit(code)
    from embtrain.cli.dump import removing_on_sigterm

    comm = make_comm()
    try:
        # SIGTERM stops like Ctrl-C: the tier scratch directory and a partial OUT are removed
        with removing_on_sigterm(out, "predict"):
            summary = score(PredictOptions(run_dir, data, out, checkpoint, columns,
                                         allow_outside_module=allow_outside_module), comm)
    finally:
        comm.shutdown()
    if comm.rank != 0:
        return
    if json_out:
        typer.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
        return
    line = (f"{summary.rows:,} rows scored with {summary.checkpoint} (step {summary.step}) in "
            f"{summary.seconds:.1f} s ({summary.rows_per_s:,.0f} rows/s) -> {summary.out}")
    if summary.labels:
        line += "; " + "; ".join(
            f"{name}: " + "  ".join(f"{k} {'undefined' if v is None else f'{v:.6f}'}"
                                    for k, v in m.items())
            for name, m in summary.labels.items())
    elif summary.auc is not None:
        line += f"; auc {summary.auc:.6f}  logloss {summary.logloss:.6f}"
    typer.echo(line)
