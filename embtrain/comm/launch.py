"""Start the ranks of a job: local processes meeting through Horovod's Gloo rendezvous.

Horovod's public launcher cannot keep the behaviour below (docs/DESIGN_NOTES.md); what this
module borrows from Horovod's internals is all in :mod:`embtrain.comm.horovod_rendezvous`.

``embtrain run --np N`` starts N ranks on this machine; with ``--nodes M --node-rank K
--rendezvous ADDR:PORT`` each of M machines starts its N/M ranks and all meet at ADDR:PORT
(node 0 serves the rendezvous there), with no ssh, like ``torchrun``; a node other than 0
waits up to ``EMBTRAIN_RENDEZVOUS_TIMEOUT`` seconds (default 60) for it to answer. With ``-H``/``hosts``
the job is handed to ``horovodrun`` (which reaches other hosts over ssh).

The launcher passes rank 0's standard output through untouched (so ``--json`` stays clean),
prefixes every other line with ``[rank K]`` on standard error, and watches the ranks: when
one fails, the others are stopped within seconds and one line names the rank that failed
first and how (the errors of the ranks that lost it as a peer are not shown). Exit code: 0
when every rank succeeded, 2 when the failure was bad input (exit code 2 of that rank), 1
otherwise; a rank stopped by SIGTERM/SIGINT (all ranks then stop after the same step with a
checkpoint) is a graceful stop of the job: 143/130.

Every rank (whichever launcher started it: this one, ``--nodes``, ``horovodrun``) runs with
Horovod's C++ log at FATAL (:func:`quiet_horovod_log`): its ERROR line when a peer is lost
(``operations.cc … Connection closed by peer``) said nothing the rank's own line does not,
and a rank that lost its peers says so in one line (:func:`lost_peer_line`).

Ranks this launcher starts share the machine's cores (:func:`thread_share`): each sizes
numba's, OpenMP's and TensorFlow's thread pools to cores ÷ ranks on this node, unless the
environment already sets them. Two ranks with both cores each on a 2-core machine ran the
quickstart's step 2.5-4× slower (numba's OpenMP workers spin-wait for work, TensorFlow's
pools wake on every op: docs/PERFORMANCE.md).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import IO

from embtrain.comm.horovod_rendezvous import (
    HorovodInternalsChanged,
    RendezvousServer,
    Slot,
    check_internals,
    gloo_rank_env,
    slot_assignments,
)
from embtrain.comm.shm import MIN_FREE_BYTES, SHM_DIR_ENV, SHM_ROOT, PeerLost, free_bytes
from embtrain.comm.shm import available as shm_available
from embtrain.errors import JobFailed, UserInputError

_RENDEZVOUS_WAIT_S = 60.0
LAUNCHER_PID_ENV = "EMBTRAIN_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class LaunchSpec:
    """How many ranks, and where: ``nodes`` machines, this one being ``node_rank``."""

    processes: int
    nodes: int = 1
    node_rank: int = 0
    rendezvous: str | None = None  # ADDR:PORT, needed with nodes > 1
    hosts: str | None = None  # horovodrun -H syntax: host:slots,...
    transport: str = "auto"  # distributed.comm.transport: auto | shared_memory | horovod

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise UserInputError(f"--np: {self.processes} processes; give at least 1")
        if self.nodes < 1 or not 0 <= self.node_rank < self.nodes:
            raise UserInputError(
                f"--node-rank {self.node_rank} is not in [0, --nodes {self.nodes})")
        if self.processes % self.nodes:
            raise UserInputError(
                f"--np {self.processes} does not divide into --nodes {self.nodes} equal parts")
        if self.nodes > 1 and self.rendezvous is None:
            raise UserInputError("--nodes > 1 needs --rendezvous ADDR:PORT (node 0's address)")
        if self.transport == "shared_memory":
            if self.nodes > 1 or self.hosts is not None:
                raise UserInputError(
                    "distributed.comm.transport: shared_memory needs every rank on this "
                    "machine; ranks on several machines use horovod (or give auto)")
            if not shm_available({}):
                raise UserInputError(
                    "distributed.comm.transport: shared_memory needs Linux on x86-64 with a "
                    f"writable {SHM_ROOT}; give auto or horovod")

    @property
    def local_processes(self) -> int:
        """Ranks started on this node."""
        return self.processes // self.nodes


def parse_address(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` → (addr, port); one-line error otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserInputError(f"--rendezvous {text!r}: expected ADDR:PORT (port 1-65535)")
    try:
        addr = socket.gethostbyname(host.strip("[]"))
    except OSError as exc:
        raise UserInputError(f"--rendezvous {text!r}: cannot resolve {host!r}: {exc}") from None
    return addr, int(port)


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``host:slots,host:slots`` → list; one-line error naming the bad entry."""
    out = []
    for entry in text.split(","):
        host, sep, slots = entry.strip().rpartition(":")
        if (not sep or not re.fullmatch(r"[A-Za-z0-9_.\-]+", host) or not slots.isdigit()
                or int(slots) < 1):
            raise UserInputError(f"hosts: bad entry {entry.strip()!r}; expected host:slots")
        out.append((host, int(slots)))
    return out


_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def all_local(hosts: list[tuple[str, int]]) -> bool:
    """Whether every host entry names this machine (then no ssh is needed)."""
    names = {*_LOCAL_NAMES, socket.gethostname(), socket.getfqdn()}
    return all(h in names for h, _ in hosts)


def interface_for(addr: str) -> str:
    """The network interface this machine reaches ``addr`` through (Gloo listens there)."""
    import psutil

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((addr, 9))
        ip = probe.getsockname()[0]
    except OSError as exc:
        raise UserInputError(f"no route to the rendezvous address {addr}: {exc}") from None
    finally:
        probe.close()
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            return name
    raise UserInputError(f"no network interface holds {ip} (the way to {addr})")


def check_hostname() -> None:
    """Horovod 0.28's Gloo connects a process set's ranks at the address this node's hostname
    resolves to (it ignores ``HOROVOD_GLOO_IFACE`` there): refuse a loopback one up front."""
    name = socket.gethostname()
    try:
        ip = socket.gethostbyname(name)
    except OSError as exc:
        raise UserInputError(f"this node's hostname {name!r} does not resolve ({exc}); "
                             "Gloo reaches the other nodes by it") from None
    if ip.startswith("127."):
        raise UserInputError(
            f"this node's hostname {name!r} resolves to the loopback address {ip}; Horovod's "
            "Gloo reaches ranks at their hostname's address, so map it to this node's address "
            "on the network the nodes share (e.g. in /etc/hosts)")


def _wait_reachable(addr: str, port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((addr, port), timeout=2):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise UserInputError(
                    f"--rendezvous {addr}:{port}: unreachable after {seconds:.0f} s ({exc}); "
                    "start node 0 first and check the address") from None
            time.sleep(0.5)


class _Gate:
    """The ranks' output on its way to this terminal, held back :data:`_HOLD_S` seconds.

    When a rank fails, the others fail after it (a lost peer: Horovod's ``Connection closed by
    peer`` and the error it raises), within milliseconds; the launcher notices the first
    failure within one poll. Holding lines back lets it drop those consequences, so a failed
    job ends in one line naming the rank that failed and how.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: deque[tuple[float, IO[str], str]] = deque()
        self.closed = False

    def put(self, sink: IO[str], text: str) -> None:
        with self.lock:
            if not self.closed:
                self.held.append((time.monotonic(), sink, text))

    def release(self, everything: bool = False) -> None:
        """Write the lines held long enough (``everything``: all of them)."""
        now = time.monotonic()
        with self.lock:
            while self.held and (everything or now - self.held[0][0] >= _HOLD_S):
                _, sink, text = self.held.popleft()
                try:
                    sink.write(text)
                    sink.flush()
                except (OSError, ValueError):
                    pass

    def drop(self) -> None:
        """Forget what is held and everything that follows."""
        with self.lock:
            self.closed = True
            self.held.clear()


_HOLD_S = 0.5  # how long a rank's line waits before it is shown
_SETTLE_S = 5.0  # after an ``exit 1``, how long the others may take to show the cause
_GRACEFUL_WAIT_S = 120.0  # after one rank stopped on a signal, how long the others may take


def _pump(stream: IO[str], sink: IO[str], prefix: str, last: deque[str], gate: _Gate) -> None:
    for line in stream:
        if line.strip():
            last.append(line.rstrip("\n"))
        gate.put(sink, prefix + line)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def _cause(failed: dict[int, int], lost_peer: frozenset[int] = frozenset()) -> int:
    """The rank whose failure caused the others': a death by a signal before bad input (exit 2)
    before an error before a rank that said it lost its peers (``lost_peer``: those fail with
    exit 1 too); then the lowest rank."""
    def weight(rank: int) -> tuple[int, int]:
        code = failed[rank]
        return (0 if code < 0 else 1 if code == 2 else 3 if rank in lost_peer else 2, rank)

    return min(failed, key=weight)


def _rank_error(path: str) -> tuple[int, str] | None:
    """The ``(code, line)`` a rank wrote as its final error, if it did."""
    try:
        with open(path, encoding="utf-8") as f:
            code, _, line = f.read().partition(" ")
        return int(code), line
    except (OSError, ValueError):
        return None


def _run_ranks(commands: list[tuple[int, list[str], dict[str, str]]]) -> tuple[int, str | None]:
    """Start one process per ``(rank, argv, env)``; watch them; the job's exit code and, when a
    rank failed, the one line that says which and how."""
    import tempfile

    procs: list[tuple[int, subprocess.Popen[str]]] = []
    lasts: dict[int, deque[str]] = {}
    pumps = []
    gate = _Gate()
    errors_dir = tempfile.TemporaryDirectory(prefix="embtrain-ranks-")
    error_files = {rank: os.path.join(errors_dir.name, f"rank-{rank}") for rank, _, _ in commands}
    for rank, argv, env in commands:
        proc = subprocess.Popen(
            argv, env={**env, "EMBTRAIN_RANK_ERROR_FILE": error_files[rank]}, text=True, bufsize=1,
            stdout=None if rank == 0 else subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append((rank, proc))
        lasts[rank] = deque(maxlen=20)
        streams = [(proc.stderr, sys.stderr)]
        if rank != 0:
            streams.append((proc.stdout, sys.stderr))
        for stream, sink in streams:
            t = threading.Thread(target=_pump, daemon=True,
                                 args=(stream, sink, f"[rank {rank}] ", lasts[rank], gate))
            t.start()
            pumps.append(t)

    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    def graceful(code: int) -> bool:
        # a rank that stopped on a stop signal (forwarded by us, or sent to it alone: the
        # ranks vote and all stop after the same step with a checkpoint) exits 128 + signal;
        # one that dies of a second forwarded signal is no failure either
        return code in (128 + signal.SIGTERM, 128 + signal.SIGINT) or any(
            code == -s for s in forwarded)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    failed: dict[int, int] = {}
    stopped: dict[int, int] = {}
    first_failure = graceful_since = None
    try:
        while True:
            running = 0
            for rank, p in procs:
                code = p.poll()
                if code is None:
                    running += 1
                elif code != 0 and rank not in failed and rank not in stopped:
                    if graceful(code):
                        stopped[rank] = code
                        graceful_since = graceful_since or time.monotonic()
                    else:
                        failed[rank] = code
                        first_failure = first_failure or time.monotonic()
            if failed:
                gate.drop()
                # an error (exit 1) may be the consequence of another rank's failure, which
                # that rank is about to report: give it a moment, then stop everyone
                worst = failed[_cause(failed)]
                if (worst < 0 or worst == 2 or running == 0
                        or time.monotonic() - first_failure > _SETTLE_S):
                    break
            elif running == 0 or (graceful_since is not None
                                  and time.monotonic() - graceful_since > _GRACEFUL_WAIT_S):
                break
            else:
                gate.release()
            time.sleep(0.05)
        leftover = [r for r, p in procs if p.poll() is None]
        if failed or leftover:
            # the others wait in collectives that can no longer complete: stop them now
            # (checkpoints are written to a temporary name and renamed, so none is torn)
            for _, p in procs:
                if p.poll() is None:
                    p.kill()
            for _, p in procs:
                p.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for t in pumps:
        t.join(timeout=2)
    try:
        if failed:
            lost = frozenset(r for r in failed if (_rank_error(error_files[r]) or (0, ""))[1]
                             .startswith(LOST_PEER))
            rank = _cause(failed, lost)
            code = failed[rank]
            said = _rank_error(error_files[rank])
            if said is not None:
                why = said[1]
            else:
                lines = [ln for ln in lasts[rank] if not ln.startswith("Traceback")]
                why = lines[-1] if lines else ""
            how = _describe(code)
            line = (f"embtrain: rank {rank} failed ({how}): {why}" if why else
                    f"embtrain: rank {rank} failed ({how}); the other ranks were stopped")
            return (2 if code == 2 else 1), line
        gate.release(everything=True)
        for rank in sorted(stopped):  # a rank stopped before training: say what it said
            said = _rank_error(error_files[rank])
            if said is not None:
                sys.stderr.write(said[1] + "\n")
                sys.stderr.flush()
                break
        if leftover:
            rank, code = next(iter(stopped.items()))
            return 1, (f"embtrain: rank {rank} stopped ({_describe(code)}) but ranks "
                       f"{', '.join(map(str, leftover))} did not stop within "
                       f"{_GRACEFUL_WAIT_S:.0f} s; they were killed")
        if forwarded:
            return 128 + forwarded[0], None
        if stopped:
            return max(stopped.values()), None
        return 0, None
    finally:
        errors_dir.cleanup()


def gpu_binding(local_rank: int, gpus: Sequence[str]) -> dict[str, str]:
    """One process per GPU: local rank ``r`` sees only the ``r``-th of this machine's GPUs
    ``gpus`` (their ids as ``CUDA_VISIBLE_DEVICES`` names them), as its device 0 (CuPy,
    numba.cuda and TensorFlow alike); a rank beyond the last GPU sees none. No GPU: nothing."""
    if not gpus:
        return {}
    return {"CUDA_VISIBLE_DEVICES": gpus[local_rank] if local_rank < len(gpus) else ""}


def visible_gpus() -> tuple[str, ...]:
    """The GPUs this launcher may hand out: ``CUDA_VISIBLE_DEVICES`` where set, else every
    GPU ``nvidia-smi`` lists (none without it; asked once per process)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(v.strip() for v in visible.split(",") if v.strip())
    return _smi_gpus()


@cache
def _smi_gpus() -> tuple[str, ...]:
    from embtrain.plan.topology import gpu_memories

    return tuple(str(i) for i in range(len(gpu_memories())))


#: the thread pools a rank sizes to its share of the machine: numba's kernels (OpenMP
#: layer), OpenMP itself, TensorFlow's intra-op and inter-op pools
THREAD_VARIABLES = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                    "TF_NUM_INTEROP_THREADS")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def thread_share(local_ranks: int, cores: int | None = None,
                 environ: dict[str, str] | None = None) -> dict[str, str]:
    """The thread-pool sizes of one of ``local_ranks`` ranks on a machine of ``cores`` cores
    (default: :func:`usable_cores`): ``cores // local_ranks``, at least 1, for each of
    :data:`THREAD_VARIABLES` that ``environ`` (default ``os.environ``) does not set."""
    environ = os.environ if environ is None else environ
    cores = usable_cores() if cores is None else int(cores)
    share = str(max(1, cores // max(1, int(local_ranks))))
    return {name: share for name in THREAD_VARIABLES if name not in environ}


def rank_env(slot: Slot, addr: str, port: int, iface: str) -> dict[str, str]:
    """The environment of one rank: what Horovod's Gloo controller reads
    (:func:`~embtrain.comm.horovod_rendezvous.gloo_rank_env`), its GPU and its share of the
    machine's cores (:func:`thread_share`)."""
    return {
        **thread_share(slot.local_size),
        **os.environ,
        **gpu_binding(slot.local_rank, visible_gpus()),
        **gloo_rank_env(slot, addr, port, iface),
        "PYTHONUNBUFFERED": "1",
        LAUNCHER_PID_ENV: str(os.getpid()),  # the ranks die with it (die_with_launcher)
    }


def launch(command: Sequence[str], spec: LaunchSpec, env: dict[str, str] | None = None) -> int:
    """Run ``command`` (an argv) as this node's ranks of the job ``spec``; the exit code (a
    failed rank: after one line on stderr naming it).

    ``env``: extra environment variables for every rank.
    """
    code, line = _launch(command, spec, env)
    if line is not None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    return code


def launch_job(command: Sequence[str], spec: LaunchSpec, env: dict[str, str] | None = None
               ) -> int:
    """:func:`launch`, but a failed rank raises :class:`~embtrain.errors.JobFailed` (its one
    line and the job's exit code), which the CLI reports (``--json`` included)."""
    code, line = _launch(command, spec, env)
    if line is not None:
        raise JobFailed(line, code)
    return code


#: the command that installs Horovod where the quickstart's set-up left it out
INSTALL_HOROVOD = "bash scripts/bootstrap.sh --horovod"


def require_horovod(processes: int) -> None:
    """Refuse a job of several processes, in one line naming the command that installs it,
    where Horovod cannot be imported: the launcher meets its ranks at Horovod's rendezvous
    (and ranks on several machines exchange through it). ``bash scripts/bootstrap.sh``
    without ``--horovod`` (the quickstart's set-up) does not build it: one process needs none
    of it, and its build took minutes of a fresh set-up."""
    try:
        check_internals()
    except ImportError:
        raise UserInputError(
            f"{processes} processes need Horovod, which is not installed in {sys.prefix}: "
            f"install it with `{INSTALL_HOROVOD}` (builds it, 2-4 minutes), or run one "
            "process") from None
    except HorovodInternalsChanged as exc:
        raise UserInputError(f"{exc}: install that version with `{INSTALL_HOROVOD}`") from None


def horovod_installed() -> bool:
    """Whether Horovod can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("horovod") is not None


def process_runtime(processes: int, transport: str = "auto", hosts: Sequence[str] = (),
                    dense: str = "TensorFlow") -> str:
    """What each process of a job of ``processes`` ranks runs besides its tables, as `plan`
    states it: Python, the dense network's library (``dense``) and the numba kernels, and with several processes the
    collectives' path (shared memory for ranks all on this machine, as :func:`_launch` chooses,
    else Horovod over Gloo); where Horovod, which the launcher needs for several processes, is
    missing, the command that installs it."""
    parts = f"Python, {dense}, numba kernels"
    if processes == 1:
        return parts
    one_machine = all_local([(h.partition(":")[0], 1) for h in hosts])
    shared = (transport == "shared_memory"
              or (transport == "auto" and one_machine and shm_available()))
    parts += (", collectives through shared memory" if shared else ", Horovod over Gloo")
    if not horovod_installed():
        parts += (f"; Horovod is not installed, and {processes} processes need it: "
                  f"`{INSTALL_HOROVOD}`")
    return parts


def _launch(command: Sequence[str], spec: LaunchSpec, env: dict[str, str] | None
            ) -> tuple[int, str | None]:
    require_horovod(spec.processes)
    if spec.hosts is not None:
        return _horovodrun(command, spec), None
    nodes = ",".join(f"node{k}:{spec.local_processes}" for k in range(spec.nodes))
    server: RendezvousServer | None = None
    if spec.nodes == 1:
        addr, iface = "127.0.0.1", "lo"
        server = RendezvousServer(addr, 0, nodes, spec.processes)
        port = server.port
    else:
        assert spec.rendezvous is not None
        addr, port = parse_address(spec.rendezvous)
        iface = interface_for(addr)
        if not addr.startswith("127."):  # nodes on other machines
            check_hostname()
        if spec.node_rank == 0:
            server = RendezvousServer(addr, port, nodes, spec.processes)
        else:
            _wait_reachable(addr, port, float(os.environ.get("EMBTRAIN_RENDEZVOUS_TIMEOUT",
                                                             _RENDEZVOUS_WAIT_S)))
    shm_dir = _shared_memory_dir(spec.transport) if spec.nodes == 1 else None
    try:
        mine = [s for s in slot_assignments(nodes, spec.processes)
                if s.hostname == f"node{spec.node_rank}"]
        job_env = {**(env or {}), **({SHM_DIR_ENV: shm_dir} if shm_dir else {})}
        return _run_ranks([(s.rank, list(command), {**rank_env(s, addr, port, iface), **job_env})
                           for s in mine])
    finally:
        if server is not None:
            server.close()
        if shm_dir is not None:
            shutil.rmtree(shm_dir, ignore_errors=True)


def _shared_memory_dir(transport: str) -> str | None:
    """A directory on ``/dev/shm`` for the collectives of a job whose ranks all run here
    (:mod:`embtrain.comm.shm`), or None for Horovod's: ``transport`` ``horovod``, or ``auto``
    where shared memory is not available (or ``EMBTRAIN_TRANSPORT=horovod`` is set)."""
    import tempfile

    if transport == "horovod" or (transport == "auto" and not shm_available()):
        return None
    _remove_abandoned_job_dirs()
    if transport == "auto" and free_bytes() < MIN_FREE_BYTES:
        return None
    try:
        return tempfile.mkdtemp(prefix=f"{_JOB_DIR_PREFIX}{os.getpid()}-", dir=SHM_ROOT)
    except OSError as exc:
        if transport == "shared_memory":
            raise UserInputError(f"distributed.comm.transport: shared_memory: cannot make a "
                                 f"directory in {SHM_ROOT} ({exc.strerror or exc})") from None
        return None


_JOB_DIR_PREFIX = "embtrain-job-"


def _remove_abandoned_job_dirs() -> None:
    """Remove the shared-memory directories of jobs whose launcher is gone (killed with
    ``kill -9``, so its ``finally`` never ran): their files hold memory until removed."""
    try:
        names = os.listdir(SHM_ROOT)
    except OSError:
        return
    for name in names:
        m = re.fullmatch(re.escape(_JOB_DIR_PREFIX) + r"(\d+)-\w+", name)
        if m is None:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(SHM_ROOT, name), ignore_errors=True)
        except OSError:  # alive (another user's): not ours to remove
            continue


def _horovodrun(command: Sequence[str], spec: LaunchSpec) -> int:
    assert spec.hosts is not None
    hosts = parse_hosts(spec.hosts)
    if sum(s for _, s in hosts) < spec.processes:
        raise UserInputError(
            f"hosts {spec.hosts}: {sum(s for _, s in hosts)} slots for {spec.processes} processes")
    for host, _ in hosts:  # horovodrun would answer an unknown host with a traceback
        try:
            socket.getaddrinfo(host, None)
        except OSError as exc:
            raise UserInputError(f"hosts: cannot resolve host {host!r} ({exc.strerror or exc}); "
                                 "check the name in -H/--hosts or distributed.hosts") from None
    exe = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(exe):
        raise UserInputError("hosts: horovodrun is not installed in this environment")
    argv = [exe, "--gloo", "-np", str(spec.processes), "-H", spec.hosts, *command]
    sys.stderr.write(f"embtrain: {' '.join(shlex.quote(a) for a in argv)}\n")
    return subprocess.call(argv)


def python_command(args: Sequence[str]) -> list[str]:
    """``python -m embtrain ARGS`` with this interpreter."""
    return [sys.executable, "-m", "embtrain", *args]


HOROVOD_LOG_LEVEL = "fatal"
#: how a rank that lost its peers begins its line (the launcher names another rank first)
LOST_PEER = "lost the other ranks"
_HOROVOD_SHUT_DOWN = "Horovod has been shut down"
_GLOO_TRANSPORT = "gloo/transport/"
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def quiet_horovod_log() -> None:
    """In a rank, before Horovod starts: its C++ log at FATAL unless ``HOROVOD_LOG_LEVEL`` is
    set. At ERROR it prints, when a peer rank dies, ``[…operations.cc:697] Horovod background
    loop uncaught exception: […pair.cc:598] Connection closed by peer`` on every surviving
    rank, before the rank's own line says the same; its WARNINGs (stalled collectives) go
    too: ``HOROVOD_LOG_LEVEL=warning`` shows them again."""
    os.environ.setdefault("HOROVOD_LOG_LEVEL", HOROVOD_LOG_LEVEL)


def lost_peer_line(exc: BaseException) -> str | None:
    """The one line of a rank whose collective failed because another rank died or failed
    (not a bug of this one); None for any other error.

    Two forms reach the rank: the collectives still queued get Horovod's "has been shut down"
    status, and the one in flight when the peer's socket closed gets Gloo's own exception as an
    ``UnknownError`` (``[…gloo/transport/tcp/pair.cc:598] Connection closed by peer …``, inside
    TensorFlow's "Graph execution error" when the collective ran in a graph)."""
    if isinstance(exc, PeerLost):
        return f"{LOST_PEER}: {exc}; that rank's own lines say why"
    text = str(exc)
    if _HOROVOD_SHUT_DOWN not in text and not _gloo_lost_a_peer(text):
        return None
    return (f"{LOST_PEER}: another rank of the job failed or was stopped, so Horovod shut down "
            "(that rank's own lines say why)")


def _gloo_lost_a_peer(text: str) -> bool:
    """Whether an error's text is Gloo's transport failing because the other end went away."""
    return _GLOO_TRANSPORT in text and any(why in text for why in _PEER_GONE)


def die_with_launcher() -> None:
    """In a rank that ``embtrain run --np N`` started: the kernel sends it SIGKILL when the
    launcher dies (``prctl(PR_SET_PDEATHSIG)``), so a ``kill -9`` of the launcher leaves no
    rank training on (and holding the run lock); checkpoints are atomic, so the next
    ``--resume`` continues from the last one. A launcher already gone: exit at once."""
    expected = os.environ.get(LAUNCHER_PID_ENV)
    if not expected or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return  # not available: the launcher's own watch still stops failed jobs
    if str(os.getppid()) != expected:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
