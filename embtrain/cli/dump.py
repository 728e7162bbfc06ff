"""``embtrain dump``: a run's checkpoint as a self-describing export."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer


@contextlib.contextmanager
def removing_on_sigterm(out: Path, command: str = "dump") -> Iterator[None]:
    """SIGTERM stops the ``command`` (dump, export) like Ctrl-C does: the writer's temporary
    directory is removed on the way out (its ``finally``), one line says so, exit 143. (SIGKILL cannot be caught: the
    next write into the same parent sweeps what it left, see ``checkpoint/tmpdirs.py``.)"""

    def stop(signum: int, _frame: object) -> None:
        signal.signal(signum, signal.SIG_IGN)  # a second one must not cut the clean-up short
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except SystemExit as exc:
        if exc.code == 128 + signal.SIGTERM:
            typer.echo(f"{command} stopped by SIGTERM; {out} was not written (its temporary "
                       "files are removed)", err=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def dump(
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN_DIR", help="run directory (or one checkpoint directory)")
    ],
    out: Annotated[Path, typer.Argument(metavar="OUT", help="new export directory")],
    step: Annotated[
        int | None, typer.Option("--step", min=0, help="checkpoint step (default: the latest)")
    ] = None,
    array_format: Annotated[
        str, typer.Option("--format", help="npy, or parquet (one file per table)")
    ] = "npy",
    no_sync: Annotated[
        bool, typer.Option("--no-sync", help="skip fsync (checksums still cover every file)")
    ] = False,
    verify: Annotated[
        str,
        typer.Option("--verify", help="check each source file by crc32 (default) or by sha256"),
    ] = "crc32",
    json_out: Annotated[bool, typer.Option("--json", help="print a summary as JSON")] = False,
) -> None:
    """Export the latest (or --step) checkpoint: per table keys, values, optimizer slots, metadata."""
    from embtrain.checkpoint import dump as dump_checkpoint
    from embtrain.errors import UserInputError

    if array_format not in ("npy", "parquet"):
        raise UserInputError(f"--format: expected npy or parquet, got {array_format!r}")
    start = time.perf_counter()
    with removing_on_sigterm(out):
        manifest = dump_checkpoint(
            run_dir,
            out,
            step=step,
            array_format=array_format,  # type: ignore[arg-type]
            fsync=not no_sync,
            verify=verify,
        )
    seconds = time.perf_counter() - start
    total = sum(f["bytes"] for f in manifest["files"])
    summary = {
        "out": str(out),
        "step": manifest["step"],
        "format": array_format,
        "tables": len(manifest["tables"]),
        "files": len(manifest["files"]),
        "bytes": total,
        "seconds": round(seconds, 3),
        "mb_per_s": round(total / 1e6 / max(seconds, 1e-9), 1),
        "content_fingerprint": manifest["content_fingerprint"],
    }
    if json_out:
        typer.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        typer.echo(
            f"dumped step {summary['step']} to {out}: {summary['tables']} tables, "
            f"{total / 2**30:.2f} GiB in {seconds:.1f} s ({summary['mb_per_s']:.0f} MB/s)"
        )
