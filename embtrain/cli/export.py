"""``embtrain export``: a run's checkpoint as a TensorFlow SavedModel (TF Serving layout)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def export(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run directory of `embtrain run`"),
    out: Path = typer.Argument(..., metavar="OUT", help="model directory; the export goes to "
                               "OUT/<step>/"),
    checkpoint: int | None = typer.Option(
        None, "--checkpoint", min=0, metavar="STEP", help="the checkpoint at this step "
        "(default: the latest)"),
    format_: str = typer.Option("saved_model", "--format", help="saved_model"),
    max_size: str | None = typer.Option(
        None, "--max-size", metavar="SIZE", help="refuse a model larger than this (e.g. 8GiB; "
        "default: half the memory available)"),
    allow_outside_module: bool = typer.Option(
        False, "--allow-outside-module", help="import a `type: keras` model's module from "
        "where the run's recipe.yaml points outside RUN_DIR (runs made before the module was "
        "copied into RUN_DIR/model/); only for code you trust"),
    json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Write a TensorFlow SavedModel that maps raw columns to predict's outputs (the click
    probability; with data.labels one output per label).

    The run's recipe is checked against its checkpoint; a `type: keras` model's module (the
    run's recipe's model.build) is imported and run to build the network, from the run
    directory's own copy (RUN_DIR/model/); one pointing outside RUN_DIR is refused without
    --allow-outside-module."""
    from embtrain.errors import UserInputError
    from embtrain.models.backend import select_backend

    select_backend("tensorflow", "embtrain export")  # a SavedModel is TensorFlow's
    from embtrain.serving.export import export_saved_model

    if format_ != "saved_model":
        raise UserInputError(f"--format: '{format_}' is not supported (saved_model)")
    limit = None
    if max_size is not None:
        from pydantic import ByteSize, TypeAdapter, ValidationError

        try:
            limit = int(TypeAdapter(ByteSize).validate_python(max_size))
        except ValidationError:
            raise UserInputError(f"--max-size: '{max_size}' is not a size (e.g. 512MiB, 8GiB)"
                                 ) from None
    from embtrain.cli.dump import removing_on_sigterm

    with removing_on_sigterm(out, "export"):
        summary = export_saved_model(run_dir, out, checkpoint, limit, allow_outside_module)
    if json_out:
        typer.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
        return
    typer.echo(f"exported {summary.checkpoint} (step {summary.step}) to {summary.path}: "
               f"{summary.bytes / 2**20:.1f} MiB in {summary.seconds:.1f} s; signature "
               f"serving_default takes {', '.join(summary.inputs)} and returns "
               f"{', '.join(summary.outputs)}")
