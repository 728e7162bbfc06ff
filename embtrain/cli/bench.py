"""``embtrain bench``: DE's synthetic models, embtrain side by side with plain TensorFlow."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from embtrain.errors import UserInputError


def bench(
    model: Annotated[
        str,
        typer.Option(
            "--model", help="synthetic model: criteo, tiny, small, medium, large, jumbo, colossal"
        ),
    ] = "tiny",
    batch: Annotated[int, typer.Option("--batch", min=1, help="global batch size")] = 65536,
    steps: Annotated[int, typer.Option("--steps", min=1, help="timed steps per side")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="untimed steps first")] = 3,
    alpha: Annotated[
        float, typer.Option("--alpha", min=0.0, help="power-law exponent of the ids (0: uniform)")
    ] = 1.05,
    optimizer: Annotated[str, typer.Option("--optimizer", help="sgd, adagrad or adam")] = "adagrad",
    baseline: Annotated[str, typer.Option(
        "--baseline", help="native-tf, tfra (TensorFlow Recommenders-Addons dynamic_embedding, "
        "every table dynamic; needs `bash scripts/bootstrap.sh --tfra`), fbgemm (FBGEMM's CPU "
        "table-batched embedding and torch.nn.EmbeddingBag on the same ids, Adagrad; needs "
        "`bash scripts/bootstrap.sh --fbgemm`), static (with "
        "--dynamic: the same tables static; with --host-memory: the same tables all in "
        "memory) or none")] = "native-tf",
    scale: Annotated[
        float, typer.Option("--scale", help="multiply every table's rows (at least 1 row)")
    ] = 1.0,
    batches: Annotated[
        int | None,
        typer.Option(
            "--batches",
            min=1,
            help="distinct pre-generated batches, reused in a ring "
            "(default: min(steps + warmup, 8))",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of the data and the weights")] = 0,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            help="run each side this many times, alternating; report each side's best run "
            "(lowest median step) to filter out other jobs on a shared machine",
        ),
    ] = 1,
    np_: Annotated[
        int,
        typer.Option("--np", min=1, help="ranks (shared memory on one machine); with N > 1 the "
                     "comparison is one process with all cores (--baseline one-process)"),
    ] = 1,
    quantize: Annotated[
        str, typer.Option("--quantize", help="embedding exchange on the wire: none, fp16, int8")
    ] = "none",
    device: Annotated[
        str, typer.Option("--device", help="where embtrain's side trains (train.device): cpu, "
                          "gpu or auto")
    ] = "cpu",
    dynamic: Annotated[
        bool, typer.Option("--dynamic", help="every table a dynamic (hash) table of capacity = "
                           "its rows, against the static tables on the same ids "
                           "(--baseline static)")
    ] = False,
    host_memory: Annotated[
        str | None,
        typer.Option("--host-memory", help="train through storage tiers: memory for the tables "
                     "(values, optimizer state, metadata), a size such as 4GiB or a fraction "
                     "such as 0.1 of their bytes, split between tables by expected use; the "
                     "rest lives under --disk"),
    ] = None,
    disk: Annotated[
        str | None,
        typer.Option("--disk", help="directory of the disk tier (with --host-memory)"),
    ] = None,
    eviction: Annotated[
        str | None,
        typer.Option("--eviction", help="the tier caches' replacement: lru (default) or lfu "
                     "(with --host-memory and --disk)"),
    ] = None,
    precision: Annotated[
        str, typer.Option("--precision", help="none, bf16 or fp16: the half side (tables in "
                          "bfloat16/float16, train.mixed_precision bf16/fp16) against float32 "
                          "embtrain on the same batches, interleaved with --repeat; with "
                          "--dynamic or tiers the float32 side has the same dynamic or tiered "
                          "tables, and the static side is in the half dtype")
    ] = "none",
    optimizer_state: Annotated[
        str, typer.Option("--optimizer-state", help="with --precision: the half tables' "
                          "optimizer state in float32 (default) or in the table's dtype "
                          "(table)")
    ] = "float32",
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="also write the JSON result here")
    ] = None,
) -> None:
    """Benchmark a synthetic model: plan it, run embtrain and the baseline on the same batches."""
    from rich.console import Console

    from embtrain.bench.runner import BASELINES, BenchOptions, run_bench
    from embtrain.bench.synthetic import OPTIMIZERS, model_names

    if model not in model_names():
        raise UserInputError(f"--model: unknown model {model!r}; one of {', '.join(model_names())}")
    if optimizer not in OPTIMIZERS:
        raise UserInputError(f"--optimizer: {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    if baseline not in BASELINES:
        raise UserInputError(f"--baseline: {baseline!r} is not one of {', '.join(BASELINES)}")
    if quantize not in ("none", "fp16", "int8"):
        raise UserInputError(f"--quantize: {quantize!r} is not one of none, fp16, int8")
    if device not in ("cpu", "gpu", "auto"):
        raise UserInputError(f"--device: {device!r} is not one of cpu, gpu, auto")
    if device == "gpu":
        from embtrain.train.device import gpu_problem

        problem = gpu_problem()
        if problem is not None:
            raise UserInputError(f"--device gpu: {problem}; use --device cpu or auto")
    if dynamic and baseline == "native-tf":
        baseline = "static"  # (with --baseline tfra the static side runs too)
    tiered = host_memory is not None or disk is not None
    if baseline == "static" and not dynamic and not tiered:
        raise UserInputError("--baseline static compares dynamic tables with static ones "
                             "(give --dynamic) or tiered tables with all in memory (give "
                             "--host-memory and --disk)")
    if dynamic and np_ > 1:
        raise UserInputError("--dynamic compares one process with one process: drop --np")
    if np_ > 1 and baseline == "native-tf":
        baseline = "one-process"
    if np_ == 1 and baseline == "one-process":
        raise UserInputError("--baseline one-process compares N ranks with one: give --np N > 1")
    if np_ == 1 and quantize != "none":
        raise UserInputError("--quantize compresses the exchange between ranks: give --np N > 1")
    if precision not in ("none", "bf16", "fp16"):
        raise UserInputError(f"--precision: {precision!r} is not one of none, bf16, fp16")
    if optimizer_state not in ("float32", "table"):
        raise UserInputError(f"--optimizer-state: {optimizer_state!r} is not one of float32, "
                             "table")
    if optimizer_state != "float32" and precision == "none":
        raise UserInputError("--optimizer-state chooses the half tables' optimizer state: it "
                             "needs --precision bf16 or fp16")
    if not (math.isfinite(scale) and scale > 0):
        raise UserInputError(f"--scale: must be a positive number, got {scale}")
    options = BenchOptions(
        model=model,
        batch=batch,
        steps=steps,
        warmup=warmup,
        alpha=alpha,
        optimizer=optimizer,
        baseline=baseline,
        scale=scale,
        batches=batches,
        seed=seed,
        repeat=repeat,
        processes=np_,
        quantize=quantize,
        device=device,
        dynamic=dynamic,
        host_memory=host_memory,
        disk=disk,
        eviction=eviction,
        precision=precision,
        optimizer_state=optimizer_state,
    )
    err = Console(stderr=True, highlight=False)
    outcome = run_bench(options, progress=lambda msg: err.print(f"[dim]{msg}[/dim]"))
    text = json.dumps(outcome.doc, indent=2, sort_keys=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    if json_output:
        sys.stdout.write(text + "\n")
        return
    from embtrain.bench.report import render

    render(outcome, Console(highlight=False))
