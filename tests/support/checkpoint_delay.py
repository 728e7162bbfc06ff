"""Slow checkpoint writes for the kill-during-write tests, kept out of production code.

:func:`install` makes the bundle writer (:mod:`embtrain.checkpoint.bundle_write`) sleep
``$EMBTRAIN_TEST_CHECKPOINT_FILE_DELAY`` seconds after each file it writes (read at every file,
so a process may set it between two checkpoints). A subprocess started with
:func:`delayed_env` installs it at start-up through ``checkpoint_delay_site/sitecustomize.py``.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

DELAY_ENV = "EMBTRAIN_TEST_CHECKPOINT_FILE_DELAY"
#: the directory whose ``sitecustomize`` calls :func:`install` in a subprocess
SITE_DIR = Path(__file__).resolve().parent / "checkpoint_delay_site"


def _sleep_after(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def slowed(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        delay = os.environ.get(DELAY_ENV)
        if delay:
            time.sleep(float(delay))
        return result

    slowed.slowed_down = True  # type: ignore[attr-defined]
    return slowed


def install() -> None:
    """Make every file the bundle writer finishes (array, literal, produced, copied or
    streamed) take ``$EMBTRAIN_TEST_CHECKPOINT_FILE_DELAY`` seconds longer; idempotent."""
    from embtrain.checkpoint import bundle_write

    for cls, name in ((bundle_write._Writer, "_write"), (bundle_write._Writer, "_produce"),
                      (bundle_write._Writer, "_copy"), (bundle_write._StreamFile, "finish")):
        method = getattr(cls, name)
        if not getattr(method, "slowed_down", False):
            setattr(cls, name, _sleep_after(method))


def delayed_env(seconds: float, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) for a subprocess whose checkpoint writes sleep
    ``seconds`` after each file."""
    out = dict(os.environ if env is None else env)
    out[DELAY_ENV] = str(seconds)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), out.get("PYTHONPATH")) if p)
    return out
