"""The one place embtrain reaches into Horovod's launcher internals: its Gloo rendezvous.

Horovod's public launcher (``horovod.run``, ``horovodrun``) cannot start our ranks the way
``embtrain run`` must (docs/DESIGN_NOTES.md, "The launcher is ours, the rendezvous
Horovod's"): it prefixes every line of every rank, rank 0's standard output included, names
the first rank to *exit* rather than the one that failed first, gives a stopped rank 5 s
before SIGKILL, exits 1 for any failure, and reaches other machines only over ssh. So
:mod:`embtrain.comm.launch` starts the processes itself and borrows only what the ranks'
Gloo controller must meet: Horovod's HTTP rendezvous server, its slot assignment, and the
environment variables its C++ side reads. Those live in ``horovod.runner`` modules that are
not public API; every use of them is here, and ``tests/test_horovod_rendezvous.py`` checks
them against the installed Horovod (the version is pinned: scripts/bootstrap.sh).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from embtrain.errors import UserInputError

#: the Horovod version these internals were checked against
CHECKED_VERSION = "0.28.1"

#: the private Horovod names this module uses, module → names
INTERNALS: dict[str, tuple[str, ...]] = {
    "horovod.runner.http.http_server": ("RendezvousHTTPServer", "RendezvousHandler"),
    "horovod.runner.common.util.hosts": ("get_host_assignments", "parse_hosts", "SlotInfo"),
}


class HorovodInternalsChanged(RuntimeError):
    """The installed Horovod lacks a private name this module relies on."""


def horovod_version() -> str:
    """The installed Horovod's version (ImportError without Horovod)."""
    import horovod

    return str(getattr(horovod, "__version__", "unknown"))


def check_internals() -> None:
    """Raise :class:`HorovodInternalsChanged`, naming the installed and the checked version and
    the missing name, when one of :data:`INTERNALS` is gone; ImportError without Horovod."""
    import importlib

    version = horovod_version()
    for module, names in INTERNALS.items():
        try:
            loaded = importlib.import_module(module)
        except ImportError as exc:
            raise HorovodInternalsChanged(
                f"Horovod {version}: {module} cannot be imported ({exc}); embtrain's launcher "
                f"was checked against Horovod {CHECKED_VERSION}") from None
        missing = [n for n in names if not hasattr(loaded, n)]
        if missing:
            raise HorovodInternalsChanged(
                f"Horovod {version}: {module} has no {', '.join(missing)}; embtrain's launcher "
                f"was checked against Horovod {CHECKED_VERSION}")


@dataclass(frozen=True)
class Slot:
    """Where one rank sits: Horovod's ``SlotInfo``, in our own type."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def slot_assignments(hosts: str, processes: int) -> list[Slot]:
    """Horovod's assignment of ``processes`` ranks to ``hosts`` (``host:slots,...``), the one its
    rendezvous server expects the ranks to report."""
    return [Slot(s.hostname, s.rank, s.local_rank, s.cross_rank, s.size, s.local_size,
                 s.cross_size) for s in _horovod_assignments(hosts, processes)]


def _horovod_assignments(hosts: str, processes: int) -> list:
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    return get_host_assignments(parse_hosts(hosts), processes)


def gloo_rank_env(slot: Slot, addr: str, port: int, iface: str) -> dict[str, str]:
    """The variables Horovod's Gloo controller reads in a rank (the same ``horovodrun --gloo``
    sets: ``horovod/runner/gloo_run.py`` ``create_run_env_vars`` and
    ``create_slot_env_vars``)."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "NCCL_SOCKET_IFNAME": iface,
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }


class RendezvousServer:
    """Horovod's Gloo rendezvous (the HTTP key-value store the ranks meet at), served on
    ``addr:port`` (port 0: any free one, then :attr:`port`) for the ranks of ``hosts``."""

    def __init__(self, addr: str, port: int, hosts: str, processes: int):
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        try:
            self._server = RendezvousHTTPServer((addr, port), RendezvousHandler, 0)
        except OSError as exc:
            raise UserInputError(f"rendezvous {addr}:{port}: cannot listen: {exc}") from None
        self.port = int(self._server.server_address[1])
        self._server.init(_horovod_assignments(hosts, processes))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="embtrain-rendezvous")
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

