"""Where a rank trains (``train.device``) and how arrays cross between engine and network.

``resolve_device`` turns the recipe's ``train.device`` into a :class:`Device`: the kernel
backend of the engine (``cpu``: NumPy + numba; ``cuda``: numba.cuda kernels on CuPy arrays)
and where TensorFlow runs the dense network. ``gpu`` on a machine without one stops before
training with one line (exit 2) saying what is missing. numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported) is the documented switch that
lets ``gpu`` run without a GPU: the same ``cuda`` kernels, run thread by thread on the CPU,
with NumPy arrays standing in for CuPy's and TensorFlow on the CPU — the path CI exercises.
``auto`` never picks the simulator.

The job, builder and sharding strategies are the same for both devices; only the backend
(its array module ``xp``) and the :class:`Device`'s two crossings differ:

``to_network``    the engine's pooled group arrays → TensorFlow tensors (JAX arrays)
``from_network``  TensorFlow's (JAX's) gradient tensors → the engine's arrays

On ``cuda`` both cross by DLPack (CuPy ↔ TensorFlow or JAX on the GPU, no host round trip;
NumPy ↔ TensorFlow or JAX on the CPU under the simulator), for the dense backend of the
process (``train.dense_backend``, :mod:`embtrain.models.backend`). On ``cpu`` they are the model's own NumPy path
(aligned arrays are already borrowed through DLPack by ``models.model.to_tensor``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embtrain.errors import UserInputError
from embtrain.kernels import cuda_simulated

__all__ = ["Device", "bind", "gpu_problem", "resolve_device", "scoring_device",
           "table_problems"]


def gpu_problem() -> str | None:
    """Why this process cannot train on a GPU (None: it can). The simulator counts as one."""
    try:
        from numba import cuda
    except Exception as exc:  # pragma: no cover - numba is a dependency
        return f"numba.cuda cannot be imported ({exc})"
    if cuda_simulated():
        return None
    try:
        available = bool(cuda.is_available())
    except Exception:  # pragma: no cover - a broken driver
        available = False
    if not available:
        return "no CUDA device (numba.cuda finds none)"
    try:
        import cupy  # noqa: F401
    except Exception:
        return "CuPy is not installed (pip install cupy-cuda12x)"
    return None


@dataclass(frozen=True)
class Device:
    """This rank's device: ``name`` ``cpu`` or ``gpu``; ``backend`` the engine's kernel
    backend; ``simulated`` under numba's CUDA simulator."""

    name: str
    backend: str
    simulated: bool = False
    #: ``train.device: auto``: which device it chose and why (one line for the user)
    reason: str = field(default="", compare=False)

    @property
    def on_gpu(self) -> bool:
        return self.name == "gpu"

    @property
    def host_arrays(self) -> bool:
        """Whether the engine's arrays are NumPy arrays (cpu, or the simulator)."""
        return not self.on_gpu or self.simulated

    def describe(self) -> str:
        if not self.on_gpu:
            return "cpu"
        return "gpu (numba CUDA simulator)" if self.simulated else "gpu"

    # ------------------------------------------------------------------ crossings

    def to_network(self, arrays: Sequence[Any]) -> list[Any]:
        """The engine's pooled arrays as the network takes them (see the module docstring)."""
        if not self.on_gpu:
            return list(arrays)
        if _dense_on_jax():
            import jax.numpy as jnp

            # CuPy's arrays stay on the device; the simulator's NumPy ones are borrowed
            return [jnp.from_dlpack(a) if not isinstance(a, np.ndarray) else a
                    for a in arrays]
        import tensorflow as tf

        return [tf.experimental.dlpack.from_dlpack(_capsule(a)) for a in arrays]

    def from_network(self, tensors: Sequence[Any]) -> list[Any]:
        """TensorFlow's gradient tensors as the engine's arrays (DLPack on ``gpu``)."""
        if not self.on_gpu:
            return [np.asarray(t) for t in tensors]
        if _dense_on_jax():
            if self.simulated:  # writable host copies (the simulator's launch refuses views)
                return [np.array(t) for t in tensors]
            import cupy  # pragma: no cover - needs a GPU

            return [cupy.from_dlpack(t) for t in tensors]  # pragma: no cover
        import tensorflow as tf

        out = []
        for t in tensors:
            capsule = tf.experimental.dlpack.to_dlpack(t)
            if self.simulated:  # a read-only view of TensorFlow's buffer, which the
                # simulator's kernel launch refuses: one host copy (no GPU here anyway)
                out.append(np.array(np.from_dlpack(_Exported(capsule))))
            else:  # pragma: no cover - needs a GPU
                import cupy

                out.append(cupy.from_dlpack(capsule))
        return out


def _dense_on_jax() -> bool:
    """Whether the dense network runs on JAX in this process (its crossings: JAX's DLPack)."""
    from embtrain.models.backend import current_backend

    return current_backend() == "jax"


class _Exported:
    """A DLPack capsule TensorFlow exported from the CPU, in the protocol NumPy reads."""

    def __init__(self, capsule: Any):
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


def _capsule(array: Any) -> Any:
    """``array``'s DLPack capsule. TensorFlow needs 64-byte aligned buffers (it aborts on
    others): CuPy's always are; a NumPy array (the simulator's) that is not, or is read-only
    (NumPy exports only writable arrays), is first copied into one that is."""
    from embtrain.models.buffers import ALIGNMENT, aligned_empty

    if isinstance(array, np.ndarray) and not (
            array.flags.writeable and array.flags.c_contiguous
            and array.ctypes.data % ALIGNMENT == 0):
        copy = aligned_empty(array.shape, array.dtype)
        copy[...] = array
        array = copy
    return array.__dlpack__()


def table_problems(recipe: Any) -> list[str]:
    """Tables a real GPU cannot hold yet: tiered tables (dynamic or not) run their key → row
    phase on the host (kernels/dynamic.py), which reads the group arrays directly; under the
    simulator those are NumPy arrays, on a GPU they are not. A dynamic table in memory, in
    any dtype, runs its key → row phase on the device (embedding/dynamic_device.py)."""
    out = []
    for i, table in enumerate(recipe.tables):
        if len(table.storage) > 1:
            out.append(f"tables[{i}]: a tiered table (table '{table.name}') does not run on a "
                       "GPU yet; use train.device: cpu")
    return out


def resolve_device(recipe: Any, source: str = "recipe", world_size: int = 1) -> Device:
    """The device of ``recipe.train.device`` on this machine (see the module docstring).

    ``gpu`` without a usable GPU, or with what a real GPU cannot run yet (tiered tables;
    several ranks, whose exchanges are host code not yet run on a GPU), raises
    :class:`~embtrain.errors.UserInputError` (one line, exit 2) before anything is built.
    """
    wanted = recipe.train.device
    simulated = cuda_simulated()
    if wanted == "cpu":
        return Device("cpu", "cpu")
    problem = gpu_problem()
    if wanted == "auto":
        limits = gpu_limits(recipe, world_size) if problem is None else []
        if problem is not None:
            why = problem
        elif simulated:
            why = ("auto never picks numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1; "
                   "train.device: gpu runs on it)")
        elif limits:
            why = f"a GPU is here, but {limits[0]}"
        else:
            return Device("gpu", "cuda", reason="train.device: auto: training on the GPU")
        return Device("cpu", "cpu", reason=f"train.device: auto: training on the CPU: {why}")
    if problem is not None:
        raise UserInputError(f"{source}: train.device: gpu, but {problem}; use "
                             "train.device: cpu or auto")
    if not simulated:
        problems = gpu_limits(recipe, world_size)
        if problems:
            raise UserInputError(f"{source}: train.device: gpu: {problems[0]}")
    return Device("gpu", "cuda", simulated)


def scoring_device(recipe: Any, world_size: int = 1) -> Device:
    """Where ``predict`` scores a run: its ``train.device``, except that a ``gpu`` run is
    scored on the CPU where no GPU can take it (the device changes no checkpoint)."""
    if recipe.train.device == "gpu":
        recipe = recipe.model_copy(update={"train": recipe.train.model_copy(
            update={"device": "gpu" if cuda_simulated() else "auto"})})
    return resolve_device(recipe, world_size=world_size)


def gpu_limits(recipe: Any, world_size: int) -> list[str]:
    """What a real GPU cannot run yet in ``recipe`` at ``world_size`` ranks (one line each)."""
    out = table_problems(recipe)
    if world_size > 1:
        out.append(f"{world_size} ranks: the id, pooled and gradient exchanges between ranks "
                   "are host code not yet run on GPUs; train one rank (--np 1) or use "
                   "train.device: cpu")
    return out


def local_rank() -> int:
    """This process's rank on its machine (0 outside a launched job)."""
    for name in ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def bind(device: Device) -> None:
    """This rank's GPU for CuPy, numba.cuda and TensorFlow: none on ``cpu``; on ``gpu`` the
    one the launcher bound (``CUDA_VISIBLE_DEVICES`` leaves one), or, where several are
    visible (a job started by ``horovodrun``), the one of this rank's ``local_rank``. Call
    before TensorFlow first touches a GPU. With the JAX dense backend, JAX keeps to the
    CPU on ``cpu`` and under the simulator (set before JAX is imported), and TensorFlow is
    not touched."""
    if device.on_gpu and not device.simulated:  # pragma: no cover - needs a GPU
        import cupy
        from numba import cuda

        index = local_rank() % cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(index).use()
        cuda.select_device(index)
    if _dense_on_jax():
        if (not device.on_gpu or device.simulated) and "jax" not in sys.modules:
            os.environ["JAX_PLATFORMS"] = "cpu"
        return
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    try:
        if not device.on_gpu or device.simulated:
            tf.config.set_visible_devices([], "GPU")
        else:  # pragma: no cover - needs a GPU
            mine = gpus[local_rank() % len(gpus)]
            tf.config.set_visible_devices([mine], "GPU")
            tf.config.experimental.set_memory_growth(mine, True)
    except RuntimeError:  # pragma: no cover - TensorFlow already initialised its devices
        pass
