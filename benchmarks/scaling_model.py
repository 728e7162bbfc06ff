"""A cost model on paper: step time of the DE synthetic models at many ranks (docs/SCALING.md).

    python benchmarks/scaling_model.py [--models tiny small medium] [--ranks 8 64 512]
                                       [--json]

Per (model, cluster, ranks) the plan (:func:`embtrain.plan.make_plan`, the same planner as
``embtrain plan --world-size N``) gives what each rank owns and moves per step: its lookups as
a table owner, the ids it receives, the pooled vectors it sends, the gradients it receives and
the replicas it all-reduces; the dense network's parameters. Each term is turned into time with
the constants of :data:`CLUSTERS` (kernel rates measured on this repository's machine or
calibrated on published step times; wire figures from the hardware's specification; every
constant names its source) and the slowest rank sets the step:

    embedding   lookups of the busiest owner x seconds per lookup (scaled by row bytes)
    dense       6 x parameters x (batch / ranks) / FLOP rate        (forward + backward)
    exchange    alltoall calls x latency(ranks) + busiest rank's bytes / bandwidth(ranks)
    allreduce   2 x log2(ranks) x latency + 2 (ranks - 1) / ranks x bytes / bandwidth
    step        embedding + dense + exchange + allreduce (today's synchronous step)
    overlapped  max(embedding + dense, exchange + allreduce) (a perfect pipeline, issue 31)

The global batch stays at 65,536 (strong scaling, as distributed-embeddings' published runs).
The model is arithmetic on stated constants: it says which term bounds each point and how the
terms move with the plan's bytes, not what a cluster will measure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from embtrain.bench.synthetic import SyntheticModel, build_recipe, load_model
from embtrain.plan import Topology, make_plan

GiB = 1 << 30
BATCH = 65536
TINY_LOOKUPS = 5_570_560  # DE tiny's ids per step at batch 65536


@dataclass(frozen=True)
class Cluster:
    """What one rank of a cluster does per second, with sources (see docs/SCALING.md)."""

    name: str
    device_memory: int | None  # per rank (None: CPU ranks, tables in host memory)
    host_memory: int
    ranks_per_node: int
    lookup_ns: float  # nanoseconds per lookup (fwd + bwd + update) of a DE tiny-like row;
    # the cost grows with the row's 64-byte cache lines (random access, memory bound)
    flops: float  # dense forward + backward FLOP/s per rank
    intra_bw: float  # alltoall bytes/s a rank sends inside a node
    inter_bw: float  # bytes/s a rank sends to other nodes
    alltoall_latency: float  # seconds per alltoall call, fixed part
    per_peer_latency: float  # seconds per alltoall call per peer rank
    allreduce_latency: float  # seconds per step of a tree/halving-doubling all-reduce
    alltoall_calls: int  # alltoall calls per step
    allreduce_calls: int  # all-reduce calls per step


def _dense_flops_per_sample(model: SyntheticModel) -> float:
    """6 x weights of the MLP (forward 2, backward 4 FLOP per weight and sample)."""
    widths = [model.pooled_width() + model.numerical, *model.mlp, 1]
    weights = sum(a * b for a, b in itertools.pairwise(widths))
    return 6.0 * weights


def _mean_lines(model: SyntheticModel) -> float:
    """64-byte cache lines per looked-up float32 row, weighted by lookups."""
    ids = [(i.hotness, math.ceil(4 * i.dim / 64)) for i in model.inputs()]
    return sum(h * n for h, n in ids) / sum(h for h, _ in ids)


# --- measured here (docs/PERFORMANCE.md) and published figures (docs/SCALING.md cites them)
TINY = load_model("tiny")
# this machine, 2 vCPU, one process: the engine alone (static tables, fwd + bwd + Adagrad)
# 69.7 ms for DE tiny's 5,570,560 lookups; the dense MLP fwd + bwd 257.1 ms at batch 65536
HERE_LOOKUP_NS = 69.7e-3 / TINY_LOOKUPS * 1e9
HERE_FLOPS = _dense_flops_per_sample(TINY) * BATCH / 257.1e-3
# the A100: dense at an assumed 40 % of its 156 TFLOP/s (TF32); the embedding calibrated on
# distributed-embeddings' published one-GPU step of DE tiny (24.433 ms, synthetic.yaml) less
# that dense part: everything else of that step counted as per-lookup cost
A100_FLOPS = 0.40 * 156e12
A100_LOOKUP_S = (24.433e-3 - _dense_flops_per_sample(TINY) * BATCH / A100_FLOPS) / TINY_LOOKUPS
# distributed-embeddings' published multi-GPU steps (DGX A100, batch 65536, Adagrad; ms)
PUBLISHED_GPU = {("tiny", 8): 5.537, ("tiny", 16): 4.867, ("small", 8): 17.203,
                 ("small", 16): 12.461, ("small", 32): 11.839, ("medium", 8): 63.393,
                 ("medium", 128): 27.329}

CLUSTERS = {
    "gpu": Cluster(
        name="DGX A100 nodes: 8 x A100-80GB on NVSwitch, 8 x HDR 200 Gb/s InfiniBand",
        device_memory=80 * GiB, host_memory=2048 * GiB // 8, ranks_per_node=8,
        lookup_ns=A100_LOOKUP_S * 1e9, flops=A100_FLOPS,
        intra_bw=200e9,  # nccl-tests busbw on 8 x A100 NVLink: 230-250 GB/s; 200 taken
        inter_bw=22e9,  # one HDR port per GPU: 25 GB/s line rate, ~90 % achieved
        alltoall_latency=20e-6, per_peer_latency=1e-6, allreduce_latency=8e-6,
        alltoall_calls=4, allreduce_calls=2),
    "cpu": Cluster(
        name="CPU nodes: 32 cores, 256 GiB, one rank per node, 25 GbE (TCP, Gloo)",
        device_memory=None, host_memory=256 * GiB, ranks_per_node=1,
        # 16x the cores of this machine: 8x the lookups (memory bound), 16x the FLOPs
        lookup_ns=HERE_LOOKUP_NS / 8, flops=HERE_FLOPS * 16,
        intra_bw=2.8e9, inter_bw=2.8e9,  # 25 Gb/s = 3.125 GB/s line rate, ~90 % over TCP
        alltoall_latency=60e-6,  # Gloo's per-call software cost measured here (loopback)
        per_peer_latency=30e-6,  # one TCP message per peer: a datacenter round trip
        allreduce_latency=60e-6,
        alltoall_calls=4, allreduce_calls=2),
}


def _bandwidth(cluster: Cluster, ranks: int) -> float:
    """Alltoall bytes/s of one rank: the share for its own node at the node's bandwidth,
    the rest at the network's."""
    local = min(ranks, cluster.ranks_per_node) / ranks
    return 1.0 / (local / cluster.intra_bw + (1.0 - local) / cluster.inter_bw)


def model_point(model: SyntheticModel, cluster: Cluster, ranks: int) -> dict[str, Any]:
    """The terms of one point (seconds) and which bounds it."""
    recipe = build_recipe(model, batch=BATCH)
    topo = Topology(ranks, cluster.device_memory, cluster.host_memory, 16 * 1024 * GiB)
    plan = make_plan(recipe, topo, batch_size=BATCH)
    t = plan.traffic
    row_scale = _mean_lines(model) / _mean_lines(TINY)
    # the busiest rank as a table owner, and every rank as a consumer of its batch share
    owner = max(plan.ranks, key=lambda r: r.lookups)
    wire = max(plan.ranks, key=lambda r: r.ids_bytes + r.forward_bytes + r.backward_bytes)
    owner_bytes = wire.ids_bytes + wire.forward_bytes + wire.backward_bytes
    consumer_bytes = (t.ids_bytes + t.forward_bytes + t.backward_bytes) / ranks
    exchange_bytes = max(owner_bytes, consumer_bytes) if ranks > 1 else 0.0
    dense_params = plan.dense.parameter_bytes if plan.dense is not None else 0
    reduce_bytes = (dense_params + max(r.allreduce_bytes for r in plan.ranks)) if ranks > 1 \
        else 0.0
    terms = {
        "embedding": owner.lookups * cluster.lookup_ns * 1e-9 * row_scale,
        "dense": _dense_flops_per_sample(model) * BATCH / ranks / cluster.flops,
        "exchange": 0.0 if ranks == 1 else (
            cluster.alltoall_calls * (cluster.alltoall_latency
                                      + (ranks - 1) * cluster.per_peer_latency)
            + exchange_bytes / _bandwidth(cluster, ranks)),
        "allreduce": 0.0 if ranks == 1 else (
            cluster.allreduce_calls * 2 * math.log2(ranks) * cluster.allreduce_latency
            + 2 * (ranks - 1) / ranks * reduce_bytes / _bandwidth(cluster, ranks)),
    }
    step = sum(terms.values())
    overlapped = max(terms["embedding"] + terms["dense"], terms["exchange"] + terms["allreduce"])
    mean_lookups = sum(r.lookups for r in plan.ranks) / ranks
    # the same step if the busiest owner had only the mean lookups (a lookup-balanced plan)
    balanced = step - terms["embedding"] * (1.0 - mean_lookups / max(owner.lookups, 1))
    return {
        "model": model.name, "ranks": ranks, "cluster": cluster.name,
        "owner_lookups": owner.lookups, "mean_lookups": mean_lookups,
        "exchange_bytes": exchange_bytes, "allreduce_bytes": reduce_bytes,
        "bytes_per_rank": max(r.bytes for r in plan.ranks),
        "terms_ms": {k: v * 1e3 for k, v in terms.items()},
        "step_ms": step * 1e3, "overlapped_ms": overlapped * 1e3,
        "balanced_ms": balanced * 1e3,
        "bound_by": max(terms, key=lambda k: terms[k]),
        "samples_per_s": BATCH / step,
    }


def table(points: list[dict[str, Any]]) -> str:
    """The points as a Markdown table."""
    head = ("| model | cluster | ranks | GiB/rank | busiest owner lookups (mean) | exchange MiB "
            "| embedding | dense | exchange | allreduce | **step ms** | overlapped | balanced "
            "| bound by |")
    rows = [head, "|" + "---|" * 14]
    for p in points:
        t = p["terms_ms"]
        rows.append(
            f"| {p['model']} | {p['cluster_key']} | {p['ranks']} | "
            f"{p['bytes_per_rank'] / GiB:.1f} | {p['owner_lookups'] / 1e6:.2f} M "
            f"({p['mean_lookups'] / 1e6:.2f} M) | {p['exchange_bytes'] / 2**20:.1f} | "
            f"{t['embedding']:.2f} | {t['dense']:.2f} | {t['exchange']:.2f} | "
            f"{t['allreduce']:.2f} | **{p['step_ms']:.2f}** | {p['overlapped_ms']:.2f} | "
            f"{p['balanced_ms']:.2f} | {p['bound_by']} |")
    return "\n".join(rows)


def points(models: list[str], ranks: list[int], clusters: list[str]) -> list[dict[str, Any]]:
    """Every (model, cluster, ranks) point."""
    out = []
    for name in models:
        model = load_model(name)
        for key in clusters:
            for n in ranks:
                p = model_point(model, CLUSTERS[key], n)
                p["cluster_key"] = key
                out.append(p)
    return out


def published_check() -> str:
    """The GPU cluster's model against distributed-embeddings' published multi-GPU steps
    (none of them used in the fit)."""
    lines = ["| model | GPUs | published ms | model ms (÷ published) | lookup-balanced ms "
             "(÷ published) |", "|---|---|---|---|---|"]
    for (name, n), ms in PUBLISHED_GPU.items():
        p = model_point(load_model(name), CLUSTERS["gpu"], n)
        lines.append(f"| {name} | {n} | {ms:.2f} | {p['step_ms']:.2f} "
                     f"({p['step_ms'] / ms:.2f}) | {p['balanced_ms']:.2f} "
                     f"({p['balanced_ms'] / ms:.2f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "small", "medium"])
    ap.add_argument("--ranks", nargs="+", type=int, default=[8, 64, 512])
    ap.add_argument("--clusters", nargs="+", default=["gpu", "cpu"], choices=sorted(CLUSTERS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    pts = points(args.models, args.ranks, args.clusters)
    if args.json:
        print(json.dumps({"points": pts, "clusters": {k: asdict(c) for k, c in CLUSTERS.items()},
                          "a100_lookup_ns": A100_LOOKUP_S * 1e9,
                          "here_lookup_ns": HERE_LOOKUP_NS,
                          "here_flops": HERE_FLOPS}, indent=1))
    else:
        print(table(pts))
        print()
        print(published_check())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
