"""The ``embtrain`` command: one thin module per sub-command, registered here.

Exit codes: 0 success, 1 runtime failure, 2 bad input (recipe, arguments, data), 130 Ctrl-C.
A known error is one line on stderr (a recipe error: one line per problem); a file-system
error is one line naming the path and the cause; anything else is one ``internal error`` line.
``EMBTRAIN_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import typer

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before anything imports TensorFlow

from embtrain.errors import EmbtrainError, Interrupted, os_error_line

app = typer.Typer(
    name="embtrain",
    help="Train recommendation models with huge embedding tables.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# (module under embtrain.cli, function, command name)
COMMANDS = [
    ("validate", "validate", "validate"),
    ("schema", "schema", "schema"),
    ("plan", "plan", "plan"),
    ("run", "run", "run"),
    ("gen_data", "gen_data", "gen-data"),
    ("bench", "bench", "bench"),
    ("dump", "dump", "dump"),
    ("load", "load", "load"),
    ("incremental_export", "incremental_export", "incremental-export"),
    ("apply_increments", "apply_increments", "apply-increments"),
    ("predict", "predict", "predict"),
    ("export", "export", "export"),
]



def _interruptible(function: Callable[..., Any]) -> Callable[..., Any]:
    """Turn Ctrl-C inside a command into :class:`Interrupted` (one line, exit 130).

    Typer would otherwise exit 130 without a word.
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except KeyboardInterrupt:
            raise Interrupted("interrupted (Ctrl-C)") from None

    return wrapper


for module_name, function_name, command_name in COMMANDS:
    module = importlib.import_module(f"embtrain.cli.{module_name}")
    app.command(command_name)(_interruptible(getattr(module, function_name)))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map known errors to one stderr line and their exit code."""
    try:
        result = app(args=argv, prog_name="embtrain", standalone_mode=False)
        return result if isinstance(result, int) else 0  # --help and the like: their code
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except EmbtrainError as exc:
        if os.environ.get("EMBTRAIN_DEBUG"):
            traceback.print_exc()
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a file-system error nothing more specific caught: one line
        if os.environ.get("EMBTRAIN_DEBUG"):
            traceback.print_exc()
        print(os_error_line(exc), file=sys.stderr)
        return 1
    except Exception as exc:
        usage = usage_error_line(exc)
        if usage is not None:  # a bad command line: one line, exit 2
            if type(exc).__name__ == "NoArgsIsHelpError":
                exc.show()  # type: ignore[attr-defined]  # the help, as before
            else:
                print(usage, file=sys.stderr)
            return int(getattr(exc, "exit_code", 2))
        # a bug: one line; EMBTRAIN_DEBUG=1 shows where
        if os.environ.get("EMBTRAIN_DEBUG"):
            traceback.print_exc()
        message = str(exc).splitlines()[0] if str(exc) else ""
        print(f"internal error: {type(exc).__name__}: {message} (run again with "
              "EMBTRAIN_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        return 1
    return 0


def usage_error_line(exc: BaseException) -> str | None:
    """One line for a command-line parsing error (Typer's click exceptions), else ``None``.

    ``embtrain run: Invalid value for '--max-steps': ...; see embtrain run --help``.
    """
    if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
        return None
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command_path", None) or "embtrain"
    message = " ".join(str(exc.format_message()).split()).rstrip(".")
    return f"{command}: {message}; see {command} --help"


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
