"""The promises of docs/RELIABILITY.md, one test (or a few) per promise.

Each test reproduces a way a user could lose work or get a traceback (issue 21) and checks
the refusal: one line on stderr naming the file, field or column, exit code 2, nothing
written earlier lost.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from embtrain.checkpoint import CheckpointManager
from tests.test_checkpoint import FakeModel, make_engine, train

SHM = Path("/dev/shm")


def one_line_error(result, *needles: str, code: int = 2) -> str:
    """The single stderr line of a failed CLI run, checked for exit code and contents."""
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ------------------------------------------------------------ 1. exports across file systems


@pytest.fixture
def other_fs(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on another file system than ``tmp_path`` (tmpfs /dev/shm)."""
    if not SHM.is_dir() or os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the temporary directory")
    path = SHM / f"embtrain-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_dump_increments_and_apply_across_file_systems(cli, tmp_path: Path, other_fs: Path):
    run = tmp_path / "run"
    engine, model = make_engine(), FakeModel()
    manager = CheckpointManager(run, keep=5, recipe_fingerprint="fp-xfs")
    for step in (3, 6):
        train(engine, model, step - 3, 3)
        manager.save(step, engine, model, (0, step))
    result = cli("dump", str(run), str(other_fs / "d3"), "--step", "3")
    assert result.returncode == 0, result.stderr
    result = cli("dump", str(run), str(other_fs / "d6"))
    assert result.returncode == 0, result.stderr
    result = cli("incremental-export", str(run), str(other_fs / "i6"), "--since", "3")
    assert result.returncode == 0, result.stderr
    # and back: base and increment on tmpfs, the result on the disk
    result = cli("apply-increments", str(other_fs / "d3"), str(other_fs / "i6"),
                 "--out", str(tmp_path / "a6"))
    assert result.returncode == 0, result.stderr
    for p in (other_fs / "d6").rglob("*.npy"):
        assert (tmp_path / "a6" / p.relative_to(other_fs / "d6")).read_bytes() == p.read_bytes()
    # the exports are complete and verified: a second dump of the tmpfs export reads them back
    from embtrain.checkpoint import open_bundle, verify_bundle

    verify_bundle(open_bundle(other_fs / "d6"))


def test_copy_fd_streams_when_the_kernel_cannot(tmp_path: Path, other_fs: Path):
    from embtrain.checkpoint.bundle import copy_fd

    data = os.urandom(3 * (1 << 20) + 17)
    (tmp_path / "src").write_bytes(data)
    src = os.open(tmp_path / "src", os.O_RDONLY)
    dst = os.open(other_fs / "dst", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        assert copy_fd(src, dst, len(data)) == len(data)
    finally:
        os.close(src)
        os.close(dst)
    assert (other_fs / "dst").read_bytes() == data
