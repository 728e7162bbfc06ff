"""GPU benchmark of the embedding engine alone, side by side with PyTorch on the same ids.

    python benchmarks/gpu_engine.py [--batch 65536] [--steps 20] [--scale 1.0] [--no-torch]

DE "tiny"'s embedding workload (:func:`embtrain.embedding.bench_engine.tiny_model`: 55 tables,
58 inputs), power-law ids (alpha 1.05), forward + backward + adagrad update, on the engine's
``cuda`` backend and, in the same process on the same ids and gradients, PyTorch
(``torch.nn.EmbeddingBag(mode="sum", sparse=True)`` per table, a shared table called once per
input reading it, ``torch.optim.Adagrad`` with the engine's lr, initial accumulator and eps).
The two take turns step by step. Reports medians from CUDA events (forward; backward +
update; total), the achieved bandwidth over the bytes that must move, and the ratio to
PyTorch. Needs CUDA, numba-cuda and CuPy (PyTorch for the comparison); no TensorFlow, no
Pydantic. Under ``NUMBA_ENABLE_CUDASIM=1`` (tiny ``--scale``/``--batch``, ``--no-torch``) it
runs on the CPU with wall-clock timers, as a smoke test.

Bytes that must move per step (float32 values, int64 ids): forward reads every key's row
and its id and writes the outputs; backward + adagrad reads the output gradients and, for
every unique row, reads and writes its values and accumulator (``4 × dim × 4`` bytes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from embtrain.embedding.bench_engine import make_batches, tiny_model
from embtrain.embedding.config import SparseInput, SparseOptimizerConfig
from embtrain.embedding.engine import EmbeddingEngine
from embtrain.kernels import available_backends, cuda_simulated


class Timer:
    """Elapsed milliseconds between marks: CUDA events on a GPU, wall clock in the simulator."""

    def __init__(self, xp: Any):
        self.gpu = xp is not np

    def mark(self) -> Any:
        """A point in the stream (or in time)."""
        if self.gpu:  # pragma: no cover (needs a GPU)
            import cupy

            ev = cupy.cuda.Event()
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, a: Any, b: Any) -> float:
        """Milliseconds from mark ``a`` to mark ``b`` (waits for ``b``)."""
        if self.gpu:  # pragma: no cover
            import cupy

            b.synchronize()
            return float(cupy.cuda.get_elapsed_time(a, b))
        return 1e3 * (b - a)


def moved_bytes(batches: list[dict[str, SparseInput]], feats: list, tables: list) -> float:
    """Mean bytes per step that must move (see the module docstring)."""
    dims = {t.name: t.dim for t in tables}
    total = 0.0
    for b in batches:
        fwd = 0
        out_bytes = 0
        by_table: dict[str, list[np.ndarray]] = {}
        for f, _h in feats:
            inp = b[f.name]
            d = dims[f.table]
            fwd += inp.keys.size * (d * 4 + 8)
            out_bytes += (len(inp.offsets) - 1) * d * 4
            by_table.setdefault(f.table, []).append(inp.keys)
        uniq = sum(np.unique(np.concatenate(k)).size * dims[t] * 16 for t, k in by_table.items())
        total += fwd + 2 * out_bytes + uniq  # outputs written, gradients read
    return total / len(batches)


def device_batches(batches: list[dict[str, SparseInput]], xp: Any) -> list[dict[str, SparseInput]]:
    """The batches with their arrays on the device (uploaded once, outside the timing)."""
    return [
        {
            k: SparseInput(xp.asarray(v.keys), xp.asarray(v.offsets), None, bag_size=v.bag_size)
            for k, v in b.items()
        }
        for b in batches
    ]


class TorchModel:  # pragma: no cover (needs PyTorch and a GPU)
    """PyTorch's EmbeddingBag per table + sparse Adagrad on the same workload."""

    def __init__(self, tables: list, feats: list, lr: float, acc0: float, eps: float):
        import torch

        self.torch = torch
        dev = torch.device("cuda")
        self.bags = {
            t.name: torch.nn.EmbeddingBag(t.rows, t.dim, mode="sum", sparse=True, device=dev)
            for t in tables
        }
        self.feats = feats
        params = [p for m in self.bags.values() for p in m.parameters()]
        self.opt = torch.optim.Adagrad(params, lr=lr, initial_accumulator_value=acc0, eps=eps)

    def to_device(self, batch: dict[str, SparseInput]) -> dict[str, tuple[Any, Any]]:
        """Ids and bag offsets as CUDA tensors."""
        t = self.torch
        return {
            k: (
                t.as_tensor(v.keys, device="cuda"),
                t.as_tensor(v.offsets[:-1], device="cuda"),
            )
            for k, v in batch.items()
        }

    def forward(self, batch: dict[str, tuple[Any, Any]]) -> list[Any]:
        """One pooled ``[batch, dim]`` tensor per input."""
        return [self.bags[f.table](*batch[f.name]) for f, _ in self.feats]

    def backward_update(self, outs: list[Any], grads: list[Any]) -> None:
        """Backward through the bags, then the sparse Adagrad step."""
        self.opt.zero_grad(set_to_none=True)
        self.torch.autograd.backward(outs, grads)
        self.opt.step()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints one JSON object (and a summary on stderr)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every table's rows")
    ap.add_argument("--alpha", type=float, default=1.05, help="power-law exponent of the ids")
    ap.add_argument("--batches", type=int, default=3, help="distinct pre-generated batches")
    ap.add_argument("--no-torch", action="store_true", help="the engine alone")
    args = ap.parse_args(argv)
    if "cuda" not in available_backends():
        print("no CUDA backend here (needs a GPU, numba-cuda and CuPy)", file=sys.stderr)
        return 2
    tables, feats = tiny_model(args.scale)
    host = make_batches(tables, feats, args.batch, args.batches, args.alpha, 0)
    lr, acc0, eps = 0.01, 0.1, 1e-7
    opt = SparseOptimizerConfig(kind="adagrad", lr=lr, initial_accumulator_value=acc0, epsilon=eps)
    t0 = time.perf_counter()
    engine = EmbeddingEngine(tables, [f for f, _ in feats], opt, seed=0, backend="cuda")
    xp = engine.backend.xp
    init_s = time.perf_counter() - t0
    batches = device_batches(host, xp)
    outs = engine.new_outputs(args.batch)
    rng = np.random.default_rng(1)
    host_grads = [rng.standard_normal(o.shape, dtype=np.float32) * 1e-3 for o in outs]
    grads = [xp.asarray(g) for g in host_grads]
    timer = Timer(xp)
    torch_model = None
    if not args.no_torch:  # pragma: no cover
        import torch

        torch_model = TorchModel(tables, feats, lr, acc0, eps)
        torch_batches = [torch_model.to_device(b) for b in host]
        tg = [torch.as_tensor(g, device="cuda") for g in host_grads]
        torch_grads = []  # per input: its columns of its group's gradient
        for f, _ in feats:
            g, c0, w = engine.layout[f.name]
            torch_grads.append(tg[g][:, c0 : c0 + w].contiguous())
    res: dict[str, list[float]] = {k: [] for k in ("fwd", "bwd", "tfwd", "tbwd")}
    for step in range(args.warmup + args.steps):
        i = step % len(batches)
        a = timer.mark()
        engine.forward(batches[i], out=outs)
        b = timer.mark()
        engine.backward_update(grads, step)
        c = timer.mark()
        if step >= args.warmup:
            res["fwd"].append(timer.ms(a, b))
            res["bwd"].append(timer.ms(b, c))
        if torch_model is not None:  # pragma: no cover
            a = timer.mark()
            touts = torch_model.forward(torch_batches[i])
            b = timer.mark()
            torch_model.backward_update(touts, torch_grads)
            c = timer.mark()
            if step >= args.warmup:
                res["tfwd"].append(timer.ms(a, b))
                res["tbwd"].append(timer.ms(b, c))
    med = {k: statistics.median(v) for k, v in res.items() if v}
    nbytes = moved_bytes(host, feats, tables)
    out: dict[str, Any] = {
        "simulated": cuda_simulated(),
        "batch": args.batch,
        "scale": args.scale,
        "steps": args.steps,
        "init_s": round(init_s, 3),
        "engine_forward_ms": med["fwd"],
        "engine_backward_update_ms": med["bwd"],
        "engine_total_ms": med["fwd"] + med["bwd"],
        "bytes_per_step": nbytes,
        "engine_gb_per_s": nbytes / (med["fwd"] + med["bwd"]) / 1e6,
    }
    if "tfwd" in med:  # pragma: no cover
        ttot = med["tfwd"] + med["tbwd"]
        out.update(
            torch_forward_ms=med["tfwd"],
            torch_backward_update_ms=med["tbwd"],
            torch_total_ms=ttot,
            torch_gb_per_s=nbytes / ttot / 1e6,
            speedup_vs_torch=ttot / out["engine_total_ms"],
        )
    print(json.dumps(out))
    print(
        f"engine: forward {med['fwd']:.2f} ms, backward+update {med['bwd']:.2f} ms, "
        f"{out['engine_gb_per_s']:.0f} GB/s"
        + (f"; torch total {out['torch_total_ms']:.2f} ms, engine speed-up "
           f"{out['speedup_vs_torch']:.2f}x" if "torch_total_ms" in out else ""),
        file=sys.stderr,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
