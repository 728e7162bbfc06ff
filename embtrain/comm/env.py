"""Which rank this process is: from the environment a launcher set."""

from __future__ import annotations

import os

from embtrain.comm.base import Communicator, LocalComm

_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def launched_rank() -> tuple[int, int] | None:
    """``(rank, size)`` when a launcher (embtrain, horovodrun, mpirun) started this process as
    one rank of several; None for a plain process."""
    for rank_var, size_var in zip(_RANK_VARS, _SIZE_VARS, strict=True):
        if rank_var in os.environ and size_var in os.environ:
            try:
                rank, size = int(os.environ[rank_var]), int(os.environ[size_var])
            except ValueError:
                continue
            if size > 1:
                return rank, size
    return None


def make_comm() -> Communicator:
    """The one-process communicator for a plain process; for a rank of a job whose ranks all
    run on this machine (the launcher made it a shared-memory directory), collectives through
    shared memory; else Horovod's."""
    launched = launched_rank()
    if launched is None:
        return LocalComm()
    from embtrain.comm import shm

    root = os.environ.get(shm.SHM_DIR_ENV)
    if root and os.path.isdir(root) and shm.available({}):
        from embtrain.comm.launch import die_with_launcher

        die_with_launcher()
        return shm.SharedMemoryComm(launched[0], launched[1], root)
    from embtrain.comm.horovod import HorovodComm
    from embtrain.comm.launch import die_with_launcher, quiet_horovod_log

    die_with_launcher()
    quiet_horovod_log()

    return HorovodComm()
