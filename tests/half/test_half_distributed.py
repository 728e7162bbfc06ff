"""bfloat16 tables on 2 real Horovod ranks (Gloo) equal one process: values bit for bit in
every sharding mode (the worker, tests/workers/dist_half_worker.py, says what holds for slots)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from embtrain.comm.launch import LaunchSpec, launch
from tests.support.cli import REPO

pytestmark = pytest.mark.distributed


def test_bf16_tables_on_two_ranks_equal_one_process_bit_for_bit(tmp_path: Path) -> None:
    code = launch([sys.executable, str(REPO / "tests" / "workers" / "dist_half_worker.py"), str(tmp_path)],
                  LaunchSpec(2))
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text())
               for r in range(2) if (tmp_path / f"rank-{r}.json").exists()]
    problems = [p for rep in reports for p in rep["problems"]]
    assert not problems, "\n".join(problems[:10])
    assert code == 0 and len(reports) == 2
    assert all(rep["checks"] == ["adagrad/float32", "adam/table"] for rep in reports)
