"""``embtrain plan RECIPE``: where every table would live, memory per rank, traffic per step."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from embtrain.errors import UserInputError


def _size(flag: str, value: str | None, allow_none: bool = False) -> int | None:
    """Parse a ``--flag 80GiB`` value; a bad one is a :class:`UserInputError` naming the flag."""
    from embtrain.recipe.units import parse_bytes

    if value is None:
        return None
    if allow_none and value.strip().lower() in ("none", "no", "cpu"):
        return None
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise UserInputError(f"{flag}: {exc}") from None


def data_alpha(train: str | list[str]) -> float | None:
    """The id exponent gen-data wrote in ``dataset.json`` beside the training files' folder
    (``OUT/train/*.parquet`` → ``OUT/dataset.json``), or None."""
    import json

    first = train if isinstance(train, str) else (train[0] if train else "")
    folder = Path(first).parent
    for candidate in (folder / "dataset.json", folder.parent / "dataset.json"):
        try:
            value = json.loads(candidate.read_text()).get("alpha")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
    return None


def plan(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML file")],
    world_size: Annotated[int | None, typer.Option(
        "--world-size", min=1, max=65536, help="number of ranks (default: the recipe's distributed.processes)")] = None,
    device_memory: Annotated[str | None, typer.Option(
        "--device-memory", help="GPU memory per rank, e.g. 80GiB, or 'none' for CPU-only ranks "
                                "(default: detected with nvidia-smi)")] = None,
    host_memory: Annotated[str | None, typer.Option(
        "--host-memory", help="host memory per rank, e.g. 512GiB (default: this machine's "
                              "available memory divided among its ranks)")] = None,
    disk: Annotated[str | None, typer.Option(
        "--disk", help="disk per rank, e.g. 2TiB (default: free space of the working directory "
                       "divided among this machine's ranks)")] = None,
    batch_size: Annotated[int | None, typer.Option(
        "--batch-size", min=1, max=2**31 - 1, help="global batch size for traffic (default: the recipe's)")] = None,
    alpha: Annotated[float | None, typer.Option(
        "--alpha", min=0.0, max=100.0, help="power-law exponent of the ids for the expected "
        "hit rates of tiered tables (default: the data's dataset.json from gen-data, else "
        "1.05)")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print only the plan as JSON")] = False,
) -> None:
    """Plan a recipe: sharding and tiers of every table, memory per rank, traffic per step."""
    from embtrain.plan import Topology, make_plan
    from embtrain.recipe import load_recipe

    device = _size("--device-memory", device_memory, allow_none=True)
    host = _size("--host-memory", host_memory)
    disk_bytes = _size("--disk", disk)
    loaded = load_recipe(recipe)
    ranks = world_size if world_size is not None else loaded.distributed.processes
    if device_memory is None or host is None or disk_bytes is None:
        detected = Topology.detect(ranks)
        if device_memory is None:  # the detected GPU's, unless the recipe trains on cpu
            device = None if loaded.train.device == "cpu" else detected.device_memory
        host = detected.host_memory if host is None else host
        disk_bytes = detected.disk if disk_bytes is None else disk_bytes
    assert host is not None and disk_bytes is not None
    topology = Topology(world_size=ranks, device_memory=device, host_memory=host, disk=disk_bytes)
    if alpha is None:
        alpha = data_alpha(loaded.data.train)
    kwargs = {} if alpha is None else {"id_alpha": alpha}
    result = make_plan(loaded, topology, batch_size=batch_size, **kwargs)
    from embtrain.plan.runtime import check_runtime, runtime_line

    check_runtime(result, str(recipe))  # every process's runtime besides what the plan holds
    if json_output:
        typer.echo(result.to_json())
        return
    from embtrain.plan.render import render_plan

    render_plan(result)
    from embtrain.comm.launch import process_runtime
    from embtrain.models.backend import backend_label

    runs = process_runtime(ranks, loaded.distributed.comm.transport,
                           loaded.distributed.hosts or (),
                           backend_label(loaded.train.dense_backend))
    typer.echo(runtime_line(result, runs))
    from embtrain.machine import cpu_summary, half_precision_note

    typer.echo(f"cpu: {cpu_summary()}")
    note = half_precision_note(loaded.train.mixed_precision) if loaded.train.device != "gpu" \
        else None
    if note:
        typer.echo(f"note: {note}")
