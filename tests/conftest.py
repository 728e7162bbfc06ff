"""Shared test helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import embtrain.storage  # noqa: F401  (registers the tier kinds, e.g. disk, for test engines)

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python -m embtrain ARGS`` in a subprocess and capture its output."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return subprocess.run([sys.executable, "-m", "embtrain", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    """The ``run_cli`` helper as a fixture."""
    return run_cli
