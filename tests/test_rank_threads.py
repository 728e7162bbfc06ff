"""The launcher gives each rank its share of the machine's cores: numba's, OpenMP's and
TensorFlow's thread pools sized cores ÷ local ranks, unless the environment sets them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from embtrain.comm.launch import THREAD_VARIABLES, LaunchSpec, launch, thread_share, usable_cores


def test_each_local_rank_gets_its_share_of_the_cores() -> None:
    assert thread_share(2, cores=2, environ={}) == {v: "1" for v in THREAD_VARIABLES}
    assert thread_share(2, cores=16, environ={}) == {v: "8" for v in THREAD_VARIABLES}
    assert thread_share(3, cores=16, environ={}) == {v: "5" for v in THREAD_VARIABLES}
    assert thread_share(4, cores=2, environ={}) == {v: "1" for v in THREAD_VARIABLES}  # >= 1
    # what the user set is theirs
    kept = thread_share(2, cores=16, environ={"NUMBA_NUM_THREADS": "3"})
    assert "NUMBA_NUM_THREADS" not in kept and kept["TF_NUM_INTRAOP_THREADS"] == "8"


def test_started_ranks_see_their_share(tmp_path: Path, monkeypatch) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # set by the user: passed on as it is
    probe = ("import json, os, sys; open(os.path.join(sys.argv[1], os.environ['HOROVOD_RANK']),"
             f" 'w').write(json.dumps({{v: os.environ.get(v) for v in {list(THREAD_VARIABLES)}}}))")
    assert launch([sys.executable, "-c", probe, str(tmp_path)], LaunchSpec(2)) == 0
    share = str(max(1, usable_cores() // 2))
    want = {v: share for v in THREAD_VARIABLES} | {"OMP_NUM_THREADS": "7"}
    assert {p.name: json.loads(p.read_text()) for p in tmp_path.iterdir()} == {"0": want,
                                                                             "1": want}
