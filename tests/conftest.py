"""Fixtures shared by the test modules (helpers they import are in tests/support/)."""

from __future__ import annotations

from pathlib import Path

import pytest

import embtrain.storage  # noqa: F401  (registers the tier kinds, e.g. disk, for test engines)
from tests.support.cli import REPO, run_cli  # noqa: F401  (REPO: for the modules' old imports)
from tests.support.tiny import TINY


@pytest.fixture
def cli():
    """The ``run_cli`` helper as a fixture."""
    return run_cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(root, recipe)``: a tiny recipe and its generated data (2 files per split)."""
    root = tmp_path_factory.mktemp("tiny")
    recipe = root / "tiny.yaml"
    recipe.write_text(TINY.format(data=root / "data"))
    result = run_cli("gen-data", "--recipe", str(recipe), "--out", str(root / "data"),
                     "--rows", "1024", "--eval-rows", "512", "--files", "2")
    assert result.returncode == 0, result.stderr
    return root, recipe


@pytest.fixture(scope="module")
def tiny_run(tiny) -> Path:
    """A finished run of TINY (6 steps, checkpoints at 2, 4, 6 keeping 2); copy before changing."""
    root, recipe = tiny
    run = root / "run-finished"
    result = run_cli("run", str(recipe), "--run-dir", str(run))
    assert result.returncode == 0, result.stderr
    return run
