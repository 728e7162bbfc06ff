"""The dense network's own state (a Keras model's batch-norm moving statistics) over ranks.

Each rank normalizes its slice of a batch with that slice's statistics and updates its own
moving averages from them, so the ranks' averages drift apart between synchronization points.
Before every checkpoint and evaluation they are replaced by their mean over the ranks. A moving
average is updated linearly (``m ← μ·m + (1-μ)·x``) and training never reads it (training mode
normalizes with the batch's statistics), so averaging at these points gives what averaging
after every step would, and every rank then holds, checkpoints and evaluates the same state
(a resume continues exactly). Integer state (a dropout layer's seed) is the same on every rank
and is left as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embtrain.comm import Communicator


def average_network_state(model: Any, comm: Communicator) -> None:
    """Replace every floating-point state variable of ``model`` by its mean over the ranks
    (collective: every rank calls it at the same point); nothing with one rank or no state."""
    if comm.size == 1:
        return
    state = [v for v in getattr(model, "state_variables", [])
             if np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype)).kind == "f"]
    if not state:
        return
    values = [np.asarray(v.numpy(), np.float64) for v in state]
    flat = np.concatenate([a.reshape(-1) for a in values])
    mean = comm.allreduce_sum(flat, "other") / comm.size
    at = 0
    for var, arr in zip(state, values, strict=True):
        part = mean[at:at + arr.size].reshape(arr.shape)
        at += arr.size
        var.assign(part.astype(np.dtype(getattr(var.dtype, "as_numpy_dtype", var.dtype))))
