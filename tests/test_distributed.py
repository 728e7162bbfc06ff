"""Hybrid parallel over real Horovod ranks (Gloo on this machine): N ranks == 1 rank.

Engine level: every sharding mode, combiner, input kind and sparse optimizer, on 2 and 3
ranks, against a one-process engine on the same global batches. Job level: `embtrain run`
on 2 ranks equals 1 rank (losses, evaluations, tables, dense weights); checkpoints resume at
another world size; a killed rank stops the job and the run resumes; bad launches are one
line and exit 2; the per-node launch works between two network namespaces.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from embtrain.comm.launch import LaunchSpec, launch
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from embtrain.train.metrics_log import read_metrics
from tests.support.runs import SHARDED_RECIPE, dump, evals, rank_pids, start_two_ranks, train_losses

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.distributed


def write_recipe(root: Path, name: str, *, optimizer: str = "adam", steps: int = 20,
                 quantize: str = "none", user: str = "column") -> Path:
    path = root / f"{name}.yaml"
    path.write_text(SHARDED_RECIPE.format(data=root / "data", optimizer=optimizer, steps=steps,
                                          quantize=quantize, user=user))
    return path


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with generated data for the recipe above."""
    from tests.support.cli import run_cli

    root = tmp_path_factory.mktemp("dist")
    recipe = write_recipe(root, "gen")
    res = run_cli("gen-data", "--recipe", str(recipe), "--out", str(root / "data"),
                  "--rows", "30000", "--eval-rows", "6000", "--files", "3")
    assert res.returncode == 0, res.stderr
    return root


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    from tests.support.cli import run_cli

    return run_cli("run", *args, timeout=timeout)


# ------------------------------------------------------------------------- engine level


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_embedding_equals_one_process(world: int, tmp_path: Path) -> None:
    code = launch([sys.executable, str(REPO / "tests" / "workers" / "dist_sharded_worker.py"), str(tmp_path)],
                  LaunchSpec(world))
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text())
               for r in range(world) if (tmp_path / f"rank-{r}.json").exists()]
    problems = [p for rep in reports for p in rep["problems"]]
    assert not problems, "\n".join(problems[:10])
    assert code == 0 and len(reports) == world
    assert all(rep["checks"] == [*OPTIMIZER_NAMES, "fp16", "int8"] for rep in reports)
    assert all(rep["bytes_sent"] > 0 for rep in reports)


# ---------------------------------------------------------------------------- job level


@pytest.fixture(scope="module")
def runs(dist: Path) -> dict[str, Path]:
    """The same recipe trained on 1 rank and on 2 ranks (20 steps, checkpoints at 10, 20)."""
    recipe = write_recipe(dist, "adam")
    out = {}
    for n in (1, 2):
        run_dir = dist / f"run-{n}"
        res = run(str(recipe), "--np", str(n), "--run-dir", str(run_dir))
        assert res.returncode == 0, res.stderr
        out[str(n)] = run_dir
    return out


def test_two_ranks_equal_one_rank(runs: dict[str, Path], tmp_path: Path) -> None:
    one, two = runs["1"], runs["2"]
    a, b = train_losses(one), train_losses(two)
    assert sorted(a) == list(range(1, 21)) and sorted(b) == sorted(a)
    np.testing.assert_allclose([b[s] for s in sorted(a)], [a[s] for s in sorted(a)],
                               rtol=1e-5, atol=1e-6)
    ea, eb = evals(one), evals(two)
    assert [e[0] for e in ea] == [10, 20] and [e[3] for e in eb] == [6000, 6000]
    np.testing.assert_allclose([e[1:3] for e in eb], [e[1:3] for e in ea], rtol=1e-5)
    da, db = dump(one, tmp_path / "one"), dump(two, tmp_path / "two")
    assert sorted(da) == sorted(db) and any(k.startswith("tables/") for k in da)
    for key in da:
        np.testing.assert_allclose(db[key], da[key], rtol=1e-5, atol=1e-6, err_msg=key)
    plan = json.loads((two / "plan.json").read_text())
    modes = {t["name"]: t["sharding"] for t in plan["tables"]}
    assert modes == {"user": "column", "item": "row", "tag": "table", "category": "data_parallel"}
    summary = json.loads((two / "summary.json").read_text())
    assert summary["processes"] == 2
    last = [r for r in read_metrics(two) if r["kind"] == "train"][-1]
    assert last["comm_bytes_per_step"] > 0


@pytest.mark.parametrize("world", [1, 3])
def test_resume_at_another_world_size(runs: dict[str, Path], world: int, tmp_path: Path) -> None:
    """A 2-rank checkpoint at step 10 continues at 1 and at 3 ranks as the run did."""
    copy = tmp_path / "run"
    shutil.copytree(runs["2"], copy)
    res = run("--resume", str(copy), "--from-step", "10", "--np", str(world))
    assert res.returncode == 0, res.stderr
    want, got = train_losses(runs["2"]), train_losses(copy)
    steps = list(range(11, 21))
    np.testing.assert_allclose([got[s] for s in steps], [want[s] for s in steps],
                               rtol=1e-5, atol=1e-6)


def test_killed_rank_stops_the_job_then_resume(dist: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_two_ranks(write_recipe(dist, "long", optimizer="adagrad", steps=2000),
                                  run_dir)
    try:
        victims = rank_pids(proc.pid, 1)
        assert len(victims) == 1, victims
        killed = time.monotonic()
        os.kill(victims[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        stopped = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "rank 1 failed (killed by SIGKILL)" in err.splitlines()[-1]
    assert stopped < 10
    done = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))
    assert done and not any("tmp" in d for d in done)
    last = int(done[-1].split("-")[1])
    res = run("--resume", str(run_dir), "--np", "2", "--max-steps", str(last + 5))
    assert res.returncode == 0, res.stderr
    steps = sorted(train_losses(run_dir))
    assert steps[-1] == last + 5 and steps == list(range(1, last + 6))


def test_bad_launches_are_one_line(dist: Path) -> None:
    recipe = write_recipe(dist, "bad")
    cases = [
        (["-H", "local host:2", "--np", "2"], "hosts: bad entry 'local host:2'"),
        (["--np", "600"], "data.batch_size 512 is smaller than the 600 processes"),
        (["--np", "3", "--nodes", "2"], "--np 3 does not divide into --nodes 2"),
    ]
    for args, message in cases:
        res = run(str(recipe), *args)
        assert res.returncode == 2, (args, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, res.stderr)
    from tests.support.cli import run_cli

    started = time.monotonic()
    res = run_cli("run", str(recipe), "--np", "2", "--nodes", "2", "--node-rank", "1",
                  "--rendezvous", "127.0.0.1:9", env={"EMBTRAIN_RENDEZVOUS_TIMEOUT": "3"})
    assert res.returncode == 2 and "unreachable" in res.stderr.strip().splitlines()[-1]
    assert time.monotonic() - started < 60


def test_rank_with_bad_data_names_the_rank(dist: Path, tmp_path: Path) -> None:
    """An id out of range: the job stops with exit 2, one line naming the rank, file and column."""
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    shutil.copytree(dist / "data", data)
    first = sorted((data / "train").glob("*.parquet"))[0]
    table = pq.read_table(first)
    ids = table.column("user_id").to_numpy().copy()
    ids[300] = 10_000  # row 300 of batch 0: rank 0 holds rows 0-255, rank 1 rows 256-511
    table = table.set_column(table.schema.get_field_index("user_id"), "user_id",
                             __import__("pyarrow").array(ids))
    pq.write_table(table, first)
    recipe = tmp_path / "r.yaml"
    text = write_recipe(dist, "bad-data").read_text().replace(str(dist / "data"), str(data))
    recipe.write_text(text.replace("batch_size: 512}", "batch_size: 512, shuffle: {enabled: false}}"))
    res = run(str(recipe), "--np", "2", "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    # every rank decodes the rows around its slice, so either may be the first to see it
    assert re.match(r"embtrain: rank [01] failed \(exit 2\): .*part-00000\.parquet: "
                    r"column 'user_id' .*10000", last), last


def test_plan_fingerprint_is_stable(cli) -> None:
    prints = set()
    for _ in range(2):
        res = cli("plan", str(REPO / "recipes" / "criteo_dcn_v2.yaml"), "--world-size", "8",
                  "--json")
        assert res.returncode == 0, res.stderr
        prints.add(json.loads(res.stdout)["fingerprint"])
        time.sleep(1)
    assert len(prints) == 1


# ------------------------------------------------------------------- per-node launch


def _netns_available() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    probe = subprocess.run(["ip", "netns", "add", "embtrain-probe"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "embtrain-probe"], capture_output=True)
    return None


@pytest.fixture
def two_hosts():
    """Two hosts on this machine: network namespaces joined by a veth pair (10.231.7.1 and
    10.231.7.2), each run in its own UTS namespace with its own hostname that its
    ``/etc/netns/NAME/hosts`` resolves to its address, as on a real cluster."""
    why = _netns_available()
    if why:
        pytest.skip(why)
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to give each host its own hostname")
    tag = f"et{os.getpid() % 100000}"
    names = [f"{tag}a", f"{tag}b"]
    hosts = f"127.0.0.1 localhost\n10.231.7.1 {names[0]}\n10.231.7.2 {names[1]}\n"
    for n in names:
        Path(f"/etc/netns/{n}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{n}/hosts").write_text(hosts)
    cmds = [
        ["ip", "netns", "add", names[0]], ["ip", "netns", "add", names[1]],
        ["ip", "link", "add", f"{tag}x", "type", "veth", "peer", "name", f"{tag}y"],
        ["ip", "link", "set", f"{tag}x", "netns", names[0]],
        ["ip", "link", "set", f"{tag}y", "netns", names[1]],
        ["ip", "-n", names[0], "addr", "add", "10.231.7.1/24", "dev", f"{tag}x"],
        ["ip", "-n", names[1], "addr", "add", "10.231.7.2/24", "dev", f"{tag}y"],
        ["ip", "-n", names[0], "link", "set", f"{tag}x", "up"],
        ["ip", "-n", names[1], "link", "set", f"{tag}y", "up"],
        ["ip", "-n", names[0], "link", "set", "lo", "up"],
        ["ip", "-n", names[1], "link", "set", "lo", "up"],
    ]
    try:
        for cmd in cmds:
            subprocess.run(cmd, check=True, capture_output=True)
        yield names
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
            shutil.rmtree(f"/etc/netns/{n}", ignore_errors=True)


def test_per_node_launch_between_two_hosts(two_hosts: list[str], runs: dict[str, Path],
                                           dist: Path, tmp_path: Path) -> None:
    recipe = dist / "adam.yaml"
    run_dir = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    procs = []
    for k, ns in enumerate(two_hosts):
        cmd = ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
               f'hostname {ns} && exec "$@"', "sh", sys.executable, "-m", "embtrain", "run",
               str(recipe), "--np", "2", "--nodes", "2", "--node-rank", str(k), "--rendezvous",
               "10.231.7.1:29411", "--run-dir", str(run_dir)]
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    want, got = train_losses(runs["1"]), train_losses(run_dir)
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose([got[s] for s in sorted(want)], [want[s] for s in sorted(want)],
                               rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- compressed exchange


@pytest.mark.slow
def test_quantized_exchange_keeps_auc(dist: Path) -> None:
    aucs = {}
    for q in ("none", "fp16", "int8"):
        recipe = write_recipe(dist, f"q-{q}", optimizer="adagrad", steps=200, quantize=q)
        run_dir = dist / f"run-q-{q}"
        res = run(str(recipe), "--np", "2", "--run-dir", str(run_dir))
        assert res.returncode == 0, res.stderr
        aucs[q] = evals(run_dir)[-1][1]
    assert aucs["none"] > 0.6
    assert abs(aucs["fp16"] - aucs["none"]) < 0.005 and abs(aucs["int8"] - aucs["none"]) < 0.005


def test_load_and_incremental_export_on_two_ranks(runs: dict[str, Path], dist: Path,
                                                  tmp_path: Path) -> None:
    """`load` warm-starts 2 ranks as it does 1; `incremental-export` reads a 2-rank run."""
    from tests.support.cli import run_cli

    export = tmp_path / "export"
    assert run_cli("dump", str(runs["2"]), str(export)).returncode == 0
    recipe = dist / "adam.yaml"
    dirs = {}
    for n in (1, 2):
        dirs[n] = tmp_path / f"warm-{n}"
        res = run_cli("load", str(export), "--recipe", str(recipe), "--allow", "steps",
                      "--run-dir", str(dirs[n]), "--max-steps", "5", "--np", str(n))
        assert res.returncode == 0, res.stderr
    a, b = train_losses(dirs[1]), train_losses(dirs[2])
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], rtol=1e-5, atol=1e-6)
    inc = tmp_path / "inc"
    res = run_cli("incremental-export", str(runs["2"]), str(inc), "--since", "10")
    assert res.returncode == 0, res.stderr
    assert (inc / "manifest.json").is_file()


def test_horovodrun_started_ranks_run_as_their_rank(runs: dict[str, Path], dist: Path,
                                                    tmp_path: Path) -> None:
    """A job started by horovodrun itself (no embtrain launcher) trains as the same job."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    if not horovodrun.exists():
        pytest.skip("horovodrun is not installed next to this interpreter")
    run_dir = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    res = subprocess.run(
        [str(horovodrun), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, "-m",
         "embtrain", "run", str(dist / "adam.yaml"), "--run-dir", str(run_dir)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    want, got = train_losses(runs["1"]), train_losses(run_dir)
    np.testing.assert_allclose([got[s] for s in sorted(want)], [want[s] for s in sorted(want)],
                               rtol=1e-5, atol=1e-6)
    assert json.loads((run_dir / "summary.json").read_text())["processes"] == 2


def test_sigterm_stops_every_rank_after_the_same_step(dist: Path, tmp_path: Path) -> None:
    """SIGTERM to the launcher: every rank stops after the same step, rank 0 checkpoints it,
    exit 143, and the run resumes from there on 2 ranks."""
    run_dir = tmp_path / "run"
    proc = start_two_ranks(write_recipe(dist, "term", optimizer="adagrad", steps=2000),
                                  run_dir)
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] == "signal" and 10 < summary["steps"] < 2000
    done = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*"))
    assert done[-1] == summary["steps"]
    res = run("--resume", str(run_dir), "--np", "2", "--max-steps", str(summary["steps"] + 3))
    assert res.returncode == 0, res.stderr
    assert sorted(train_losses(run_dir))[-1] == summary["steps"] + 3
