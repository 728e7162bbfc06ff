"""The process memory each side of `embtrain bench` needs (tables and optimizer state, per-step
workspace, batches, runtime), estimated before anything large is allocated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embtrain.bench.synthetic import FP32, SyntheticModel

GiB = 2**30
# TFRA's CPU cuckoo hash tables over key + value bytes: DE tiny, Adagrad, 2026-11-23: 70.3M
# rows, 4.7 GiB of keys and values, 14.5 GiB peak RSS after warm-up (1.9 GiB of it workspace,
# batches and runtime): ~1.35; 1.45 leaves room.
TFRA_HASH_OVERHEAD = 1.45
# Python, TensorFlow, Keras, numba and their thread pools: measured ~0.7 GiB peak RSS for a
# side at --scale 0.001; 1 GiB leaves room.
RUNTIME_BYTES = 1 * GiB
# Memory the baseline keeps per table value: the value and its TF1 optimizer slots.
BASELINE_SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2}


# A tier run holds its batches in memory up to this many bytes; above it each side reads a
# batch from the batch files when a step needs it (the point of tiers is a process smaller
# than the model: DE small's 377 ids per sample make a batch 0.19 GiB).
BATCHES_IN_MEMORY_MAX = 1 * GiB


def batches_on_disk(total: int) -> bool:
    """Whether a tier run reads its batches (``total`` bytes) a step at a time."""
    return total > BATCHES_IN_MEMORY_MAX


def workspace_bytes(model: SyntheticModel, scale: float, batch: int) -> int:
    """Per-step transient memory of either side (gathered rows, gradients, ids, MLP activations).

    Per sample: every id's gathered row, its gradient and a deduplicated copy (3 × hotness ×
    dim floats per input), three int64 index arrays per id, and the MLP's activations and
    their gradients (4 × (input width + hidden sizes) floats).
    """
    rows = sum(i.hotness * i.dim for i in model.inputs(scale)) * FP32 * 3
    ids = model.ids_per_sample * 8 * 3
    width = (model.pooled_width() + model.numerical + sum(model.mlp)) * FP32 * 4
    return batch * (rows + ids + width)


def batch_bytes(model: SyntheticModel, batch: int, count: int) -> int:
    """Bytes of ``count`` pre-generated batches (int64 ids, float32 dense and labels)."""
    return count * batch * (model.ids_per_sample * 8 + (model.numerical + 1) * FP32)


def baseline_table_bytes(model: SyntheticModel, scale: float, optimizer: str,
                         baseline: str = "native-tf") -> int:
    """The baseline's tables: values plus the TF1 optimizer's slots (tfra: hash tables of
    int64 key + values pre-sized to the rows, one per value and per slot)."""
    if baseline == "tfra":
        per_table = sum(t.rows * (8 + t.dim * FP32) for t in model.tables(scale))
        return int(per_table * (1 + BASELINE_SLOTS[optimizer]) * TFRA_HASH_OVERHEAD)
    return model.table_bytes(scale) * (1 + BASELINE_SLOTS[optimizer])


@dataclass(frozen=True)
class MemoryCheck:
    """Estimated peak bytes of each side and the memory available to them."""

    available: int
    embtrain: int
    baseline: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "available_bytes": self.available,
            "embtrain_bytes": self.embtrain,
            "baseline_bytes": self.baseline,
        }


def available_memory() -> int:
    """MemAvailable of this machine in bytes."""
    from embtrain.plan.topology import host_memory_bytes

    return host_memory_bytes()


