"""The pipelined multi-rank step: the next batch's ids exchanged on a communication thread
while a step computes give the unpipelined result bit for bit, in three collectives a step."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from embtrain.comm.launch import LaunchSpec, launch
from embtrain.embedding.sharding.pipeline import Background

REPO = Path(__file__).resolve().parents[1]


def test_background_returns_and_reraises_in_the_joining_thread() -> None:
    names: list[str] = []

    def work() -> int:
        names.append(threading.current_thread().name)
        return 7

    job = Background(work)
    assert job.result() == 7 and job.done()
    assert names == ["embtrain-comm"]

    def fail() -> int:
        raise KeyError("lost")

    with pytest.raises(KeyError, match="lost"):
        Background(fail).result()


@pytest.mark.distributed
def test_pipelined_two_ranks_equal_unpipelined_bit_for_bit(tmp_path: Path) -> None:
    code = launch([sys.executable, str(REPO / "tests" / "workers" / "dist_pipeline_worker.py"),
                   str(tmp_path)], LaunchSpec(2))
    assert code == 0
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    # the communication thread's all-to-alls beside the training thread's: each its own
    assert reports[0]["concurrent_wrong"] == reports[1]["concurrent_wrong"] == []
    assert reports[0]["modes"] == {"whole": "table", "rows": "row", "cols": "column",
                                   "rep": "data_parallel"}
    for rep in reports:
        on, off = rep["on"], rep["off"]
        assert on["losses"] == off["losses"]  # exact floats
        assert on["dense"] == off["dense"]
        assert on["tables"] == off["tables"]
        # ids, pooled vectors, and one backward exchange carrying the embedding and the
        # dense gradients, the replicas' row sums, the loss and the stop vote
        assert on["collectives_per_step"] == off["collectives_per_step"] == 3
        # every step after the first got its ids from the communication thread
        assert on["ahead_exchanges"] == 5 and off["ahead_exchanges"] == 0
    assert reports[0]["on"]["losses"] == reports[1]["on"]["losses"]
    assert set(reports[0]["on"]["tables"]) == {"whole", "rows", "cols", "rep"}


@pytest.mark.distributed
def test_three_ranks_with_a_wide_network_all_reduce_it_and_stay_exact(tmp_path: Path) -> None:
    """With more than two ranks a dense network over 64 KiB goes through Horovod's grouped
    all-reduce (not the backward exchange): four collectives a step, still bit for bit."""
    code = launch([sys.executable, str(REPO / "tests" / "workers" / "dist_pipeline_worker.py"),
                   str(tmp_path), "wide"], LaunchSpec(3))
    assert code == 0
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(3)]
    for rep in reports:
        assert rep["concurrent_wrong"] == []
        on, off = rep["on"], rep["off"]
        assert on["losses"] == off["losses"] and on["dense"] == off["dense"]
        assert on["tables"] == off["tables"]
        assert on["collectives_per_step"] == off["collectives_per_step"] == 4
        assert on["ahead_exchanges"] == 5
    assert len({json.dumps(rep["on"]["losses"]) for rep in reports}) == 1
