"""Errors that the CLI turns into one line on stderr and an exit code."""

from __future__ import annotations


class EmbtrainError(Exception):
    """A known failure: the CLI prints ``str(error)`` as one line and exits with ``exit_code``."""

    exit_code = 1


class UserInputError(EmbtrainError):
    """Bad input from the user (recipe, arguments, data): exit code 2."""

    exit_code = 2


class RecipeError(UserInputError):
    """A recipe failed to load or validate; holds every problem found, one line each."""

    def __init__(self, lines: list[str]):
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


class DataError(UserInputError):
    """A data file does not match the recipe (missing column, wrong type, null id, bad value)."""


class TrainingDiverged(EmbtrainError):
    """The training loss stopped being finite (learning rates too high): exit 1, one line."""


class Interrupted(EmbtrainError):
    """Ctrl-C (SIGINT): exit 130, one line saying what was kept."""

    exit_code = 130


class JobFailed(EmbtrainError):
    """A rank of a multi-process job failed: one line naming the rank and how, with the job's
    exit code (2 when that rank's failure was bad input, else 1)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class StorageError(EmbtrainError):
    """A file could not be written or read (disk full, read-only, not a directory): exit 1."""


def os_error_cause(exc: OSError) -> str:
    """The cause of a file-system error in words, with a hint where one helps."""
    hint = {
        28: "; free some space (or choose another directory) and retry",
        30: "; the file system is read-only: choose a writable directory",
        13: "; no permission: choose a directory you may write to",
        20: "; a part of the path is a file, not a directory",
        21: "; it is a directory",
        17: "; it already exists",
    }.get(exc.errno or 0, "")
    return f"{exc.strerror or exc.__class__.__name__}{hint}"


def _exists_cause(path: object) -> str | None:
    """What is in the way when creating ``path`` failed with "File exists", or None."""
    import os

    try:
        name = os.fspath(path)  # type: ignore[call-overload]
        if os.path.islink(name) and not os.path.exists(name):
            return (f"it is a symbolic link to {os.readlink(name)!r}, which does not exist; "
                    "remove the link or create its target")
        if os.path.exists(name) and not os.path.isdir(name):
            return "it is a file, not a directory; choose another path"
    except (OSError, TypeError, ValueError):
        return None
    return None


def os_error_line(exc: OSError, what: str = "") -> str:
    """One line for a file-system error: the path(s), then the cause."""
    path = exc.filename if exc.filename is not None else what
    cause = os_error_cause(exc)
    if exc.errno == 17 and exc.filename is not None:
        found = _exists_cause(exc.filename)
        if found is not None:
            cause = f"{exc.strerror or 'File exists'}: {found}"
    if exc.filename2 is not None:
        path = f"{path} -> {exc.filename2}"
    return f"{path or 'file system'}: {cause}"
