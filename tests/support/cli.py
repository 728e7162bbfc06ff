"""Running the `embtrain` command line in a subprocess, as a user does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout's root


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python -m embtrain ARGS`` in a subprocess and capture its output."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return subprocess.run([sys.executable, "-m", "embtrain", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
