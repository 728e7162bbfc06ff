"""The shared-memory communicator (embtrain/comm/shm.py) against NumPy references, with real
processes on a real /dev/shm directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from embtrain.comm import shm
from embtrain.comm.launch import LOST_PEER, LaunchSpec, _remove_abandoned_job_dirs, lost_peer_line
from embtrain.errors import StorageError, UserInputError

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not shm.available(), reason="no shared-memory transport here")

# Every rank derives every rank's messages from (seed, call, rank), so each checks what it got
# against a NumPy reference of what the others sent.
_WORKER = textwrap.dedent('''
    import glob, json, os, sys, threading
    import numpy as np
    from embtrain.comm import shm
    from embtrain.comm.shm import SharedMemoryComm

    rank, size, root, calls = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    shm.KEEP_BYTES = 1 << 21  # the large messages below are given back after their call
    comm = SharedMemoryComm(rank, size, root)

    def message(call, src, salt):
        rng = np.random.default_rng([call, src, salt])
        # mostly small messages, some zero-length, some large (the data files grow)
        top = 3_000_000 if call % 7 == 3 else 5_000
        counts = rng.integers(0, top, size)
        counts[rng.random(size) < 0.2] = 0
        return rng.integers(0, 256, int(counts.sum()), dtype=np.uint8), [int(c) for c in counts]

    def expected(call, salt):
        parts, sizes = [], []
        for src in range(size):
            data, counts = message(call, src, salt)
            start = sum(counts[:rank])
            parts.append(data[start:start + counts[rank]])
            sizes.append(counts[rank])
        return np.concatenate(parts), np.array(sizes)

    failures = []

    def exchanges(purpose, salt):
        for call in range(calls):
            data, counts = message(call, rank, salt)
            got, sizes = comm.alltoallv(data, counts, purpose)
            want, want_sizes = expected(call, salt)
            if not (np.array_equal(got, want) and np.array_equal(sizes, want_sizes)):
                failures.append(f"{purpose} call {call}")

    # two purposes at once, as the pipeline's communication thread runs beside the step
    background = threading.Thread(target=exchanges, args=("ids.ahead", 1))
    background.start()
    exchanges("forward", 2)
    background.join()

    for call in range(calls):
        mine = np.random.default_rng([call, rank, 3]).normal(size=(5, 3))
        total = comm.allreduce_sum(mine, "dp")
        want = np.random.default_rng([call, 0, 3]).normal(size=(5, 3))
        for src in range(1, size):  # in rank order, as the communicator sums
            want = want + np.random.default_rng([call, src, 3]).normal(size=(5, 3))
        if total.tobytes() != want.tobytes():
            failures.append(f"allreduce_sum float64 call {call}")
        ints = comm.allreduce_sum(np.arange(4, dtype=np.int64) * (rank + 1), "control")
        if ints.tolist() != [k * size * (size + 1) // 2 for k in range(4)]:
            failures.append(f"allreduce_sum int64 call {call}")
        gathered, sizes = comm.allgatherv(np.full(rank + call % 3, rank, np.uint8), "eval")
        want = np.concatenate([np.full(r + call % 3, r, np.uint8) for r in range(size)])
        if not np.array_equal(gathered, want) or sizes.tolist() != [r + call % 3 for r in range(size)]:
            failures.append(f"allgatherv call {call}")
    text = comm.broadcast_bytes(b"from the last rank" if rank == size - 1 else None, root=size - 1)
    if text != b"from the last rank":
        failures.append("broadcast_bytes")
    comm.barrier()
    big = np.arange(size * (3 << 20), dtype=np.int64).view(np.uint8)[: size * (3 << 20)]
    got, _ = comm.alltoallv(big, [3 << 20] * size, "big")
    if not np.array_equal(got[: 3 << 20], big[rank * (3 << 20):(rank + 1) * (3 << 20)]):
        failures.append("big")
    if glob.glob(os.path.join(root, f"c.big.{rank}.d*")):
        failures.append("a data file over KEEP_BYTES was kept after its call")
    if not glob.glob(os.path.join(root, f"c.forward.{rank}.d*")):
        failures.append("the step's data file was not kept")
    print(json.dumps({"rank": rank, "failures": failures, "sent": comm.traffic.total()}))
    comm.shutdown()
''')


def _start(script: Path, rank: int, size: int, root: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(script), str(rank), str(size), root, *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("size", [2, 3])
def test_collectives_equal_numpy_references(size: int, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    with tempfile.TemporaryDirectory(dir=shm.SHM_ROOT) as root:
        procs = [_start(script, r, size, root, "24") for r in range(size)]
        outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        result = json.loads(out.strip().splitlines()[-1])
        assert result["failures"] == []
        assert result["sent"] > 0


_DIES = textwrap.dedent('''
    import os, sys, time
    import numpy as np
    from embtrain.comm.shm import SharedMemoryComm, PeerLost
    from embtrain.comm.launch import lost_peer_line

    rank, size, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    comm = SharedMemoryComm(rank, size, root)
    comm.barrier()
    if rank == 1:
        os._exit(3)  # gone without a word, as a killed process
    start = time.monotonic()
    try:
        comm.alltoallv(np.zeros(8, np.uint8), [4, 4], "forward")
    except PeerLost as exc:
        print(f"{time.monotonic() - start:.2f}")
        print(lost_peer_line(exc))
        sys.exit(0)
    sys.exit("the collective returned without its peer")
''')


def test_a_rank_whose_peer_ended_says_so_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(_DIES)
    with tempfile.TemporaryDirectory(dir=shm.SHM_ROOT) as root:
        procs = [_start(script, r, 2, root) for r in range(2)]
        outs = [p.communicate(timeout=60) for p in procs]
    assert procs[1].returncode == 3
    assert procs[0].returncode == 0, outs[0][1][-2000:]
    waited, line = outs[0][0].strip().splitlines()[-2:]
    assert float(waited) < 5.0  # liveness is checked every 0.25 s
    assert line == (f"{LOST_PEER}: rank 1 ended while rank 0 waited for it in a collective "
                    "(forward); that rank's own lines say why")


def test_lost_peer_line_only_for_a_lost_peer() -> None:
    assert lost_peer_line(shm.PeerLost("rank 2 ended")).startswith(LOST_PEER)
    assert lost_peer_line(RuntimeError("rank 2 ended")) is None


def test_transport_choice() -> None:
    assert not shm.available({shm.TRANSPORT_ENV: "horovod"})
    assert shm.available({shm.TRANSPORT_ENV: "auto"}) == shm.available({})


def test_a_message_larger_than_dev_shm_can_hold_is_refused_up_front(tmp_path: Path) -> None:
    """A data file that cannot get its pages fails when it is made, with one line that says
    what to do, not with SIGBUS when a step writes into it."""
    fs = os.statvfs(shm.SHM_ROOT)
    too_big = fs.f_blocks * fs.f_frsize * 2  # tmpfs refuses more than its size at once
    with tempfile.TemporaryDirectory(dir=shm.SHM_ROOT) as root:
        with pytest.raises(StorageError, match="transport: horovod") as caught:
            shm._Mapped(str(Path(root) / "d1"), too_big)
        assert "\n" not in str(caught.value)
        assert list(Path(root).iterdir()) == []


def test_the_launcher_removes_job_directories_of_launchers_that_are_gone() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    abandoned = Path(shm.SHM_ROOT) / f"embtrain-job-{gone.pid}-test{os.getpid()}"
    live = Path(shm.SHM_ROOT) / f"embtrain-job-{os.getpid()}-test"
    try:
        for d in (abandoned, live):
            d.mkdir()
            (d / "c.forward.0.h").write_bytes(b"\0" * 64)
        _remove_abandoned_job_dirs()
        assert not abandoned.exists() and live.exists()
    finally:
        for d in (abandoned, live):
            shutil.rmtree(d, ignore_errors=True)


def test_an_explicit_shared_memory_transport_needs_one_machine() -> None:
    with pytest.raises(UserInputError, match="every rank on this machine"):
        LaunchSpec(4, nodes=2, rendezvous="10.0.0.1:29400", transport="shared_memory")
