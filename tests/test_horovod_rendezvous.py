"""The Horovod internals the launcher borrows (embtrain/comm/horovod_rendezvous.py) are still
there and still mean what the launcher assumes: a new Horovod fails here, naming its version,
before any multi-rank job does."""

from __future__ import annotations

import dataclasses
import urllib.error
import urllib.request

import pytest

hvd_hosts = pytest.importorskip("horovod.runner.common.util.hosts")

from embtrain.comm.horovod_rendezvous import (  # noqa: E402
    CHECKED_VERSION,
    RendezvousServer,
    check_internals,
    gloo_rank_env,
    horovod_version,
    slot_assignments,
)

LAYOUTS = [("node0:1", 1), ("node0:2", 2), ("node0:3,node1:3", 6), ("node0:2,node1:2,node2:2", 6)]


def test_the_installed_horovod_is_the_checked_one() -> None:
    assert horovod_version() == CHECKED_VERSION, (
        f"Horovod {horovod_version()} is installed; embtrain/comm/horovod_rendezvous.py was "
        f"checked against {CHECKED_VERSION}: re-check its internals, then CHECKED_VERSION")
    check_internals()


@pytest.mark.parametrize(("hosts", "processes"), LAYOUTS)
def test_slot_assignments_are_horovods(hosts: str, processes: int) -> None:
    theirs = hvd_hosts.get_host_assignments(hvd_hosts.parse_hosts(hosts), processes)
    ours = slot_assignments(hosts, processes)
    assert [dataclasses.asdict(s) for s in ours] == [dataclasses.asdict(s) for s in theirs]
    assert [s.rank for s in ours] == list(range(processes))


@pytest.mark.parametrize(("hosts", "processes"), LAYOUTS)
def test_rank_environment_is_what_horovodrun_sets(hosts: str, processes: int) -> None:
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

    theirs_run = create_run_env_vars("10.1.2.3", ["eth7"], 29517)
    for ours_slot, theirs_slot in zip(
            slot_assignments(hosts, processes),
            hvd_hosts.get_host_assignments(hvd_hosts.parse_hosts(hosts), processes), strict=True):
        expected = {k: str(v) for k, v in {**theirs_run, **create_slot_env_vars(theirs_slot)}
                    .items()}
        assert gloo_rank_env(ours_slot, "10.1.2.3", 29517, "eth7") == expected


def _request(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_rendezvous_stores_and_clears_a_scope_like_gloo_expects() -> None:
    """Gloo's HTTP store: PUT and GET ``/scope/key``; a scope of the plan is cleared once every
    rank of it has sent DELETE (so a second rendezvous on the same server starts clean)."""
    server = RendezvousServer("127.0.0.1", 0, "node0:2", 2)
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert _request("GET", f"{base}/global/rank0")[0] == 404
        assert _request("PUT", f"{base}/global/rank0", b"address-of-0")[0] == 200
        assert _request("GET", f"{base}/global/rank0") == (200, b"address-of-0")
        assert _request("DELETE", f"{base}/global/0")[0] == 200
        assert _request("GET", f"{base}/global/rank0") == (200, b"address-of-0")
        assert _request("DELETE", f"{base}/global/1")[0] == 200
        assert _request("GET", f"{base}/global/rank0")[0] == 404
    finally:
        server.close()


def test_a_horovod_without_those_internals_refuses_a_job_in_one_line(tiny, tmp_path) -> None:
    """Where the rendezvous module is gone (here: blocked), ``run --np 2`` stops before any
    rank starts, in one line naming the installed Horovod and the version checked."""
    import os
    import subprocess
    import sys

    from tests.support.cli import REPO
    from tests.support.tiny import one_line_error

    _, recipe = tiny
    run = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "workers" / "cli_with_blocked_imports.py"),
         "horovod.runner.http", "run", str(recipe), "--np", "2", "--run-dir", str(run)],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    one_line_error(result, f"Horovod {horovod_version()}: horovod.runner.http.http_server",
                   f"checked against Horovod {CHECKED_VERSION}",
                   "bash scripts/bootstrap.sh --horovod")
    assert not run.exists()
