"""Checkpoints, exports and increments (DESIGN.md decision 6).

Independent of world size: per table keys, values, one array per optimizer slot and
per-row metadata; the dense model; a manifest with checksums and the recipe fingerprint
written last, then the directory renamed into place. No pickle. The file layout is
described in :mod:`embtrain.checkpoint.layout`, the manifest in :mod:`embtrain.checkpoint.bundle`.

The training loop uses :class:`CheckpointManager` (``save``/``restore``); the commands use
:func:`dump`, :func:`warm_start`, :func:`incremental_export` and :func:`apply_increments`.
"""

from embtrain.checkpoint.bundle import Bundle, open_bundle, verify_bundle
from embtrain.checkpoint.bundle_format import FORMAT, FORMAT_VERSION, CheckpointError
from embtrain.checkpoint.export import dump, write_parquet_table
from embtrain.checkpoint.incremental import apply_increment, apply_increments, incremental_export
from embtrain.checkpoint.layout import TableData, read_dense, read_table, read_tables
from embtrain.checkpoint.load_export import WarmStart, parse_allow, warm_start
from embtrain.checkpoint.manager import (
    CheckpointManager,
    LoadedCheckpoint,
    TrainState,
    find_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_from_state,
    rng_state,
)

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Bundle",
    "CheckpointError",
    "CheckpointManager",
    "LoadedCheckpoint",
    "TableData",
    "TrainState",
    "WarmStart",
    "apply_increment",
    "apply_increments",
    "dump",
    "find_checkpoint",
    "incremental_export",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "open_bundle",
    "parse_allow",
    "read_dense",
    "read_table",
    "read_tables",
    "rng_from_state",
    "rng_state",
    "verify_bundle",
    "warm_start",
    "write_parquet_table",
]
