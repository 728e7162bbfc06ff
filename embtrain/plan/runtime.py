"""The memory every process needs before it holds any table: its runtime.

A rank is a Python process with TensorFlow, numba's compiled kernels and (with several
processes) Horovod/Gloo loaded: peak RSS measured here (2026-11-24, 2-core VM, the tiny
recipe of tests/test_reliability.py) 638 MiB for one process and 646 MiB per rank of 2; ~0.92
GB for a rank of the quickstart (issue 29's probe), whatever the tables. The
plan's memory per rank counts tables and the dense network; :func:`check_runtime` adds
:data:`RUNTIME_BYTES` per process and refuses a process count whose ranks cannot all hold it,
before any rank starts (`plan`, and `run`/`load` with several processes).
"""

from __future__ import annotations

from typing import Any

from embtrain.errors import UserInputError
from embtrain.plan.topology import GiB
from embtrain.recipe.units import format_bytes

#: Resident memory of one process's runtime (rounded up from the ~0.92 GB measured).
RUNTIME_BYTES = 1 * GiB


def planned_host_bytes(plan: Any) -> int:
    """The most host memory the plan gives one rank (tables and dense network)."""
    return max((int(r.memory.host) for r in plan.ranks), default=0)


def runtime_line(plan: Any, runs: str) -> str:
    """One line for `plan`: what a rank needs with its runtime (``runs``: what the process
    runs, e.g. "Python, TensorFlow, numba kernels"), against what it has."""
    need = planned_host_bytes(plan) + RUNTIME_BYTES
    return (f"runtime per process: {format_bytes(RUNTIME_BYTES)} ({runs}; "
            f"not in the figures above): {format_bytes(need)} of host memory per rank in all, "
            f"of {format_bytes(plan.topology.host_memory)}")


def check_runtime(plan: Any, source: str) -> None:
    """Refuse (exit 2) when a rank cannot hold its runtime besides what the plan gives it."""
    host = int(plan.topology.host_memory)
    planned = planned_host_bytes(plan)
    need = planned + RUNTIME_BYTES
    if need <= host:
        return
    w = int(plan.topology.world_size)
    most = max(0, (host * w) // need) if w else 0
    fewer = (f"at most {most} process{'es' if most != 1 else ''} fit"
             if most else "no process fits")
    raise UserInputError(
        f"{source}: {w} processes do not fit: each needs {format_bytes(RUNTIME_BYTES)} for its "
        f"runtime (Python, TensorFlow) plus {format_bytes(planned)} planned = "
        f"{format_bytes(need)}, more than its {format_bytes(host)} of host memory; {fewer} "
        "(or give each more memory)")
