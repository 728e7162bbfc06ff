"""The ``embtrain`` command: one thin module per sub-command, registered here.

Exit codes: 0 success, 1 runtime failure, 2 bad input (recipe, arguments, data), 130 Ctrl-C.
A known error is one line on stderr (a recipe error: one line per problem); a file-system
error is one line naming the path and the cause; anything else is one ``internal error`` line.
``EMBTRAIN_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import functools
import importlib
import json
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


#: Set by the launcher in each rank it starts: the rank writes its final error line there
#: (``CODE LINE``) instead of on stderr, and the launcher reports the job's one line.
RANK_ERROR_FILE = "EMBTRAIN_RANK_ERROR_FILE"


def _wants_json(argv: list[str] | None) -> bool:
    args = sys.argv[1:] if argv is None else argv
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def report_error(line: str, code: int, argv: list[str] | None = None) -> int:
    """Say a failure: one line on stderr (a recipe error: one per problem) and, with ``--json``,
    ``{"error": ..., "exit_code": N}`` on stdout; in a rank the launcher started, only to the
    launcher. Returns ``code``."""
    error_file = os.environ.get(RANK_ERROR_FILE)
    if error_file:
        try:
            with open(error_file, "w", encoding="utf-8") as out:
                out.write(f"{code} {line}")
            return code
        except OSError:
            pass  # say it on stderr then
    print(line, file=sys.stderr, flush=True)
    if _wants_json(argv):
        print(json.dumps({"error": line, "exit_code": code}), flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map known errors to one stderr line and their exit code."""
    debug = bool(os.environ.get("EMBTRAIN_DEBUG"))
    try:
        result = app(args=argv, prog_name="embtrain", standalone_mode=False)
        return result if isinstance(result, int) else 0  # --help and the like: their code
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except typer.Abort:
        return report_error("aborted", 1, argv)
    except EmbtrainError as exc:
        if debug:
            traceback.print_exc()
        return report_error(str(exc), exc.exit_code, argv)
    except KeyboardInterrupt:
        return report_error("interrupted", 130, argv)
    except OSError as exc:  # a file-system error nothing more specific caught: one line
        if debug:
            traceback.print_exc()
        return report_error(os_error_line(exc), 1, argv)
    except RecursionError as exc:  # input nested too deep for a recursive reader: bad input
        if debug:
            traceback.print_exc()
        return report_error(f"input nested too deep to read ({exc})", 2, argv)
    except Exception as exc:
        usage = usage_error_line(exc)
        if usage is not None:  # a bad command line: one line, exit 2
            if type(exc).__name__ == "NoArgsIsHelpError":
                exc.show()  # type: ignore[attr-defined]  # the help, as before
                return int(getattr(exc, "exit_code", 2))
            return report_error(usage, int(getattr(exc, "exit_code", 2)), argv)
        # a bug: one line; EMBTRAIN_DEBUG=1 shows where
        if debug:
            traceback.print_exc()
        from embtrain.comm.launch import lost_peer_line

        lost = lost_peer_line(exc)
        if lost is not None:  # another rank failed: this one's collective could not finish
            return report_error(lost, 1, argv)
        message = str(exc).splitlines()[0] if str(exc) else ""
        return report_error(f"internal error: {type(exc).__name__}: {message} (run again with "
                            "EMBTRAIN_DEBUG=1 for the traceback, and please report it)", 1, argv)


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
