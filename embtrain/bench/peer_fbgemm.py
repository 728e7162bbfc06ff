"""``embtrain bench --baseline fbgemm``: the runner's side of the FBGEMM and torch peers.

The peers run in their own environment (``bash scripts/bootstrap.sh --fbgemm`` makes
``.venv-fbgemm``: fbgemm-gpu-cpu 1.8.0 and the torch 2.13.0 CPU wheel it was built against) as
children running :mod:`embtrain.bench.baseline_fbgemm`. Two sides: ``fbgemm`` (FBGEMM's CPU
table-batched embedding, exact Adagrad fused into its backward) and ``torch``
(``torch.nn.EmbeddingBag`` + ``torch.optim.Adagrad``), both element-wise Adagrad as embtrain's
bench. Before the first timed round, :func:`verify_peers` runs each peer on a small case and
compares its pooled outputs and updated rows with a plain NumPy reference of embtrain's
embedding step (sum pooling, ``acc += g²; w -= lr·g / (sqrt(acc) + eps)``, accumulators
from 0.1): a peer that computes something else is not timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.bench.worker import SideSpec
from embtrain.errors import EmbtrainError, UserInputError

FBGEMM_VENV_ENV = "EMBTRAIN_FBGEMM_VENV"
FBGEMM_SCRIPT = Path(__file__).with_name("baseline_fbgemm.py")
#: what ``bootstrap.sh --fbgemm`` writes last, once the environment imports torch and FBGEMM
FBGEMM_STAMP = ".fbgemm-stamp"
#: the sides ``--baseline fbgemm`` adds after embtrain's, in this order
PEER_SIDES = ("fbgemm", "torch")
#: the optimizers the peers run (FBGEMM's exact Adagrad is element-wise, as embtrain's)
PEER_OPTIMIZERS = ("adagrad",)
INITIAL_ACCUMULATOR = 0.1
EPSILON = 1e-7
#: settings that make the peers fair on a shared CPU: OpenMP threads sleep rather than spin
#: between parallel regions, and glibc keeps freed memory (no mmap for large blocks, no trim)
#: so each step's outputs and gradients reuse the last step's pages
PEER_ENVIRONMENT = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(2**62),
}


def fbgemm_python() -> Path:
    """The Python of the FBGEMM environment (``$EMBTRAIN_FBGEMM_VENV`` or ``.venv-fbgemm`` at
    the repository root); one line naming the command that makes it when it is missing."""
    default = Path(__file__).resolve().parents[2] / ".venv-fbgemm"
    venv = Path(os.environ.get(FBGEMM_VENV_ENV) or default)
    python = venv / "bin" / "python"
    if not (python.exists() and (venv / FBGEMM_STAMP).exists()):  # a half-made one: neither
        raise UserInputError(
            f"--baseline fbgemm: no FBGEMM environment at {venv}; make it with "
            f"`bash scripts/bootstrap.sh --fbgemm` (or point {FBGEMM_VENV_ENV} at one it made)")
    return python


def check_optimizer(optimizer: str) -> None:
    """One line when the peers cannot run ``optimizer``."""
    if optimizer not in PEER_OPTIMIZERS:
        raise UserInputError(
            f"--baseline fbgemm: --optimizer {optimizer}: the FBGEMM and torch peers run "
            f"{', '.join(PEER_OPTIMIZERS)} (element-wise, as embtrain's)")


def _child_env() -> dict[str, str]:
    env = {**os.environ, **PEER_ENVIRONMENT}
    env.pop("PYTHONPATH", None)  # the child imports nothing of embtrain or its environment
    return env


def _run_child(args: list[str], what: str) -> None:
    proc = subprocess.run([str(fbgemm_python()), "-P", str(FBGEMM_SCRIPT), *args],
                          capture_output=True, text=True, env=_child_env())
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise EmbtrainError(f"bench: {what} failed (exit {proc.returncode}): {tail}")


def run_peer_side(spec: SideSpec, resolved: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run one peer side (``spec.side`` in :data:`PEER_SIDES`) on the saved batches;
    ``resolved`` is the model resolved for a child (``runner.tfra_spec``)."""
    path = workdir / f"{spec.side}.spec.json"
    path.write_text(json.dumps({**resolved, "kernel": spec.side}))
    _run_child([str(path)], f"the {spec.side} side")
    return json.loads(Path(spec.out).read_text())


# ---------------------------------------------------------------------------- check


def reference_step(weights: list[np.ndarray], input_tables: list[int], ids: list[np.ndarray],
                   upstream: np.ndarray, lr: float) -> tuple[np.ndarray, list[np.ndarray]]:
    """embtrain's embedding step in plain NumPy: pooled sums of every input (concatenated),
    and the tables after element-wise Adagrad on the summed gradients of their rows."""
    pooled = np.concatenate([weights[t][x].sum(axis=1) for t, x in
                             zip(input_tables, ids, strict=True)], axis=1)
    grads = [np.zeros_like(w, dtype=np.float64) for w in weights]
    col = 0
    for t, x in zip(input_tables, ids, strict=True):
        dim = weights[t].shape[1]
        g = upstream[:, col:col + dim].astype(np.float64)
        col += dim
        for h in range(x.shape[1]):
            np.add.at(grads[t], x[:, h], g)
    after = []
    for w, g in zip(weights, grads, strict=True):
        acc = INITIAL_ACCUMULATOR + g * g
        touched = np.zeros(w.shape[0], bool)
        touched[np.flatnonzero(np.any(g != 0, axis=1))] = True
        new = w.astype(np.float64) - lr * g / (np.sqrt(acc) + EPSILON)
        after.append(np.where(touched[:, None], new, w).astype(np.float32))
    return pooled, after


def small_case(seed: int = 0, batch: int = 64) -> dict[str, np.ndarray]:
    """A small random case: a shared table read at hotness 1 and 3, two more tables of other
    widths, skewed ids (duplicates within and across bags)."""
    rng = np.random.default_rng(seed)
    rows, dims = [50, 7, 300], [8, 16, 4]
    input_tables = [0, 0, 1, 2]
    hotness = [1, 3, 2, 1]
    case: dict[str, np.ndarray] = {
        "learning_rate": np.float64(0.05),
        "rows": np.asarray(rows, np.int64),
        "dims": np.asarray(dims, np.int64),
        "input_tables": np.asarray(input_tables, np.int64),
    }
    for t, (r, d) in enumerate(zip(rows, dims, strict=True)):
        case[f"w_{t}"] = rng.uniform(-0.05, 0.05, (r, d)).astype(np.float32)
    for i, (t, h) in enumerate(zip(input_tables, hotness, strict=True)):
        case[f"ids_{i}"] = np.minimum(rng.zipf(1.3, (batch, h)) - 1, rows[t] - 1).astype(np.int64)
    width = sum(dims[t] for t in input_tables)
    case["upstream"] = rng.normal(0, 1, (batch, width)).astype(np.float32)
    return case


def peer_step(kernel: str, case: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``case`` through the ``kernel`` peer (a child in the FBGEMM environment)."""
    with tempfile.TemporaryDirectory(prefix="embtrain-peer-check-") as tmp:
        src, dst = Path(tmp) / "case.npz", Path(tmp) / "out.npz"
        np.savez(src, kernel=np.asarray(kernel), **case)
        _run_child(["--check", str(src), str(dst)], f"the {kernel} peer's check")
        with np.load(dst) as out:
            return dict(out)


def verify_peers(seed: int = 0) -> dict[str, dict[str, float]]:
    """Each peer's largest difference from :func:`reference_step` on :func:`small_case`;
    an :class:`EmbtrainError` when a peer differs by more than float32 rounding."""
    case = small_case(seed)
    tables = int(case["rows"].size)
    weights = [case[f"w_{t}"] for t in range(tables)]
    ids = [case[f"ids_{i}"] for i in range(int(case["input_tables"].size))]
    pooled, after = reference_step(weights, case["input_tables"].tolist(), ids,
                                   case["upstream"], float(case["learning_rate"]))
    errors: dict[str, dict[str, float]] = {}
    for kernel in PEER_SIDES:
        out = peer_step(kernel, case)
        errors[kernel] = {
            "pooled": float(np.abs(out["pooled"] - pooled).max()),
            "updated": max(float(np.abs(out[f"w_{t}"] - after[t]).max()) for t in range(tables)),
        }
        if errors[kernel]["pooled"] > 1e-5 or errors[kernel]["updated"] > 1e-5:
            raise EmbtrainError(f"bench: the {kernel} peer does not compute embtrain's step on "
                                f"a small case (largest differences {errors[kernel]}); not timed")
    return errors


# -------------------------------------------------------------------------- summary


def peer_summary(reports: dict[str, dict[str, Any]],
                 rounds: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Each peer against embtrain, round by round (the sides alternate within a round):
    peer ÷ embtrain of the embedding part and of the whole step, each round's and their
    median (above 1: embtrain faster), next to the sides' round medians in ms."""
    out: dict[str, Any] = {}
    emb_rounds = rounds["embtrain"]
    for side in PEER_SIDES:
        if side not in reports:
            continue
        summary: dict[str, Any] = {}
        for part in ("embedding", "step"):
            per_round = [p[part] / e[part] if e[part] else float("inf")
                         for p, e in zip(rounds[side], emb_rounds, strict=True)]
            summary[part] = {
                "embtrain_ms": [e[part] for e in emb_rounds],
                f"{side}_ms": [p[part] for p in rounds[side]],
                "ratio_by_round": per_round,
                "ratio_median": float(np.median(per_round)),
            }
        out[side] = summary
    return out
