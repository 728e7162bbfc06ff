"""Collectives between the ranks of a job (DESIGN.md decision 7).

:class:`Communicator` is the small protocol the sharded embedding and the job talk to;
:class:`LocalComm` serves one process, :class:`~embtrain.comm.shm.SharedMemoryComm` the ranks
of one machine, :class:`~embtrain.comm.horovod.HorovodComm` ranks on several (Gloo on CPU,
NCCL on GPU). No ``horovod`` import happens outside this package.
"""

from __future__ import annotations

from embtrain.comm.base import Communicator, LocalComm, TrafficCounter
from embtrain.comm.env import launched_rank, make_comm

__all__ = ["Communicator", "LocalComm", "TrafficCounter", "launched_rank", "make_comm"]
