"""Shared by `run` and `load`: check a multi-process job, then start this node's ranks."""

from __future__ import annotations

from typing import Any


def launch_ranks(recipe: Any, source: str, processes: int, hosts: str | None, nodes: int,
                 node_rank: int, rendezvous: str | None, args: list[str]) -> int:
    """Check what can be checked before any rank starts (recipe support, hosts, batch size,
    the plan), then run ``embtrain ARGS`` as this node's ranks; the job's exit code."""
    from embtrain.comm.launch import LaunchSpec, all_local, launch_job, parse_hosts, python_command
    from embtrain.errors import UserInputError
    from embtrain.plan import Topology, make_plan
    from embtrain.train.support import check_supported

    check_supported(recipe, source, processes)
    if hosts is not None:
        entries = parse_hosts(hosts)
        if all_local(entries):
            if sum(s for _, s in entries) < processes:
                raise UserInputError(
                    f"hosts: {sum(s for _, s in entries)} slots for {processes} processes")
            hosts = None
    spec = LaunchSpec(processes, nodes, node_rank, rendezvous, hosts,
                      transport=recipe.distributed.comm.transport)
    batch = recipe.data.batch_size
    if batch < processes:
        raise UserInputError(
            f"{source}: data.batch_size {batch} is smaller than the {processes} processes; "
            "every rank needs at least one row per batch")
    from embtrain.plan.runtime import check_runtime

    # this node's ranks, each with its runtime, in this node's memory: refused before any starts
    check_runtime(make_plan(recipe, Topology.detect(processes)), source)
    return launch_job(python_command(args), spec)
