"""Periodic checkpoints of a training run: save, find the latest, verify, restore.

A run's checkpoints live in ``RUN_DIR/checkpoints/step-00000120/`` (``step`` = number of
completed training steps). Each holds every table (``tables/<name>/...npy``), the dense
model (``dense/``), ``state.json`` (step, reader position, seed, RNG state, caller's extra
values) and ``manifest.json`` (written last). A checkpoint is written into
``checkpoints/.tmp-step-00000120/`` and renamed into place when complete; older ones are
pruned only afterwards. Directories whose name is not ``step-<digits>`` (temporary,
superseded) are never taken as checkpoints.

Training-loop integration (what ``TrainJob`` does; exact resume needs all of it)::

    checkpoints = CheckpointManager.for_recipe(run_dir, recipe)
    if resuming:
        state = checkpoints.restore(engine, model, step=from_step)   # verified, then imported
        step, (epoch, batch) = state.step, (state.epoch, state.batch)
        losses, evals = state.extra["losses"], state.extra["evals"]
    ...  # reader starts at BatchReader(..., epoch=epoch, start_batch=batch)
    # after step `step` is complete, its periodic evaluation done:
    if checkpoints.due(step, total_steps):
        checkpoints.save(step, engine, model, divmod(step, batches_per_epoch),
                         {"samples": samples, "losses": losses[-log_every:], "evals": evals},
                         seed=seed)

The final checkpoint is saved after the final evaluation so that a run stopped there and
resumed reports the same evaluations as an uninterrupted one.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.checkpoint.bundle import (
    Bundle,
    check_content_fingerprint,
    load_arrays,
    open_bundle,
    read_json_member,
    verify_bundle,
)
from embtrain.checkpoint.bundle_format import (
    FORMAT,
    FORMAT_VERSION,
    TMP_PREFIX,
    CheckpointError,
    FileEntry,
    json_bytes,
    utc_now,
)
from embtrain.checkpoint.bundle_write import BytesSource, Source, write_bundle
from embtrain.checkpoint.layout import (
    EXTRA_ARRAYS,
    DenseModelLike,
    EngineLike,
    TableData,
    chunk_rows,
    config_row_bytes,
    dense_files,
    dense_members,
    dense_meta,
    dtypes_of,
    iter_table_chunks,
    table_files,
    table_members,
    table_meta,
    table_names,
    table_stream,
)
from embtrain.errors import StorageError

CHECKPOINTS = "checkpoints"
STATE = "state.json"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def checkpoint_name(step: int) -> str:
    """``step-00000120``."""
    return f"step-{int(step):08d}"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first (temporary and superseded ones ignored)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / "manifest.json").is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or ``None``."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def find_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """The checkpoint at ``step`` (default: the latest); a clear error when there is none."""
    run_dir = Path(run_dir)
    found = list_checkpoints(run_dir)
    if not found:
        raise CheckpointError(f"{run_dir}: no complete checkpoint in {run_dir / CHECKPOINTS}")
    if step is None:
        return found[-1][1]
    for s, path in found:
        if s == step:
            return path
    have = ", ".join(str(s) for s, _ in found)
    raise CheckpointError(f"{run_dir}: no checkpoint at step {step} (have: {have})")


def position_of(reader_position: Any) -> tuple[int, int]:
    """``(epoch, batch)`` from a ``ReaderPosition`` or a pair."""
    if hasattr(reader_position, "epoch"):
        return int(reader_position.epoch), int(reader_position.batch)
    epoch, batch = reader_position
    return int(epoch), int(batch)


def rng_state(generator: np.random.Generator) -> dict[str, Any]:
    """A NumPy generator's exact state as JSON-ready data."""
    return dict(generator.bit_generator.state)


def rng_from_state(state: Mapping[str, Any]) -> np.random.Generator:
    """A NumPy generator continuing exactly from :func:`rng_state`'s output."""
    bit_generator = getattr(np.random, str(state["bit_generator"]))()
    bit_generator.state = dict(state)
    return np.random.Generator(bit_generator)


@dataclass(frozen=True)
class TrainState:
    """Where a restored run continues: the step, the reader position and what the loop saved."""

    step: int
    epoch: int
    batch: int
    seed: int | None
    path: Path
    rng: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadedCheckpoint:
    """A checkpoint (or ``.npy`` export) fully read into memory and verified."""

    path: Path
    manifest: dict[str, Any]
    tables: dict[str, TableData]
    dense_weights: list[np.ndarray]
    dense_optimizer: list[np.ndarray]
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.manifest["step"])


def load_checkpoint(path: Path, verify: bool = True) -> LoadedCheckpoint:
    """Read a whole checkpoint; every checksum, dtype and shape is checked before it returns."""
    bundle = open_bundle(Path(path), kinds=("checkpoint", "export"))
    if bundle.manifest.get("array_format", "npy") != "npy":
        raise CheckpointError(
            f"{bundle.path}: a Parquet export; load_checkpoint reads .npy bundles"
        )
    if verify:
        check_content_fingerprint(bundle)
    names = table_names(bundle)
    members = {n: table_members(bundle, n) for n in names}
    weights, optimizer = dense_members(bundle)
    all_members = [m for ms in members.values() for m in ms] + weights + optimizer
    arrays = load_arrays(bundle, all_members, verify=verify)
    state = read_json_member(bundle, STATE) if STATE in bundle.files else {}
    tables = {}
    for n in names:
        slots = list(bundle.manifest["tables"][n].get("slots", {}))
        base = f"tables/{n}/"
        tables[n] = TableData(
            arrays[base + "keys.npy"],
            arrays[base + "values.npy"],
            {s: arrays[f"{base}{s}.npy"] for s in slots},
            arrays[base + "update_count.npy"],
            arrays[base + "last_step.npy"],
            extra={s: arrays[f"{base}{s}.npy"] for s in EXTRA_ARRAYS
                   if f"{base}{s}.npy" in arrays},
            **dtypes_of(bundle.manifest["tables"][n]),
        )
    return LoadedCheckpoint(
        bundle.path,
        bundle.manifest,
        tables,
        [arrays[m] for m in weights],
        [arrays[m] for m in optimizer],
        state,
    )


def history_entry(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What later checkpoints remember of this one (for increments' bases)."""
    return {
        "step": int(manifest["step"]),
        "time_utc": manifest["time_utc"],
        "content_fingerprint": manifest["content_fingerprint"],
        "rows": {n: int(t["rows"]) for n, t in manifest.get("tables", {}).items()},
    }


def check_compatible(
    bundle: Bundle, engine: EngineLike, model: DenseModelLike | None, what: str = "checkpoint"
) -> None:
    """Every table, slot and dense array of ``bundle`` fits ``engine``/``model``; all problems at once."""
    problems = []
    tables = bundle.manifest.get("tables", {})
    engine_tables = list(engine.table_names)
    slots = set(engine.slot_names)
    for name in engine_tables:
        if name not in tables:
            problems.append(f"table {name}: not in the {what}")
            continue
        meta = tables[name]
        cfg = engine.table_config(name) if hasattr(engine, "table_config") else None
        dynamic_now = cfg is not None and getattr(cfg, "dynamic", None) is not None
        if cfg is not None and (dynamic_now or meta.get("dynamic")):
            # keys of a dynamic table (or into one): as many as fit; the import checks each key
            if int(meta["rows"]) > int(cfg.rows):
                problems.append(f"table {name}: {meta['rows']} keys in the {what}, more than "
                                f"its {'capacity' if dynamic_now else 'rows'} {cfg.rows} now")
        elif cfg is not None and int(meta["rows"]) != int(cfg.rows):
            problems.append(f"table {name}: {meta['rows']} rows in the {what}, {cfg.rows} now")
        if cfg is not None and int(meta["dim"]) != int(cfg.dim):
            problems.append(f"table {name}: dim {meta['dim']} in the {what}, {cfg.dim} now")
        have = {k: list(v) for k, v in meta.get("slots", {}).items()}
        want = _slot_shapes(engine, int(cfg.dim) if cfg is not None else int(meta["dim"]))
        if set(have) != slots or (want is not None and have != want):
            problems.append(
                f"table {name}: optimizer slots {have} in the {what}, "
                f"{want if want is not None else sorted(slots)} now (the sparse optimizer changed)"
            )
    for name in tables:
        if name not in engine_tables:
            problems.append(f"table {name}: in the {what} but not in the recipe")
    if model is not None:
        weights, _ = dense_members(bundle)
        current = model.get_weights()
        # a checkpoint written before the network's state was kept holds the weights only
        trainable = int(getattr(model, "trainable_weight_count", len(current)))
        if len(weights) == trainable:
            current = current[:trainable]
        if len(weights) != len(current):
            problems.append(
                f"dense model: {len(weights)} weight arrays in the {what}, {len(current)} now"
            )
        else:
            for i, (rel, w) in enumerate(zip(weights, current, strict=True)):
                shape = bundle.files[rel].shape if rel in bundle.files else None
                if shape is not None and tuple(shape) != tuple(np.shape(w)):
                    problems.append(
                        f"dense model: weight {i} is {list(shape)} in the {what}, "
                        f"{list(np.shape(w))} now"
                    )
    if problems:
        raise CheckpointError(f"{bundle.path}: does not fit this recipe: " + "; ".join(problems))


def _slot_shapes(engine: Any, dim: int) -> dict[str, list[int]] | None:
    """Trailing shape of every slot array of a table of width ``dim`` (when the engine says)."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None:
        return None
    from embtrain.embedding.optimizers import slot_specs

    return {s.name: ([] if s.per_row else [dim]) for s in slot_specs(optimizer)}


def streams(engine: Any, name: str) -> bool:
    """Whether ``engine`` moves table ``name`` in chunks (a tiered table)."""
    fn = getattr(engine, "streams", None)
    return bool(fn(name)) if fn is not None else False


def table_chunks(engine: Any, name: str, rows: int) -> tuple[int, Iterator[Any]]:
    """``(total rows, key-ordered chunks of at most about rows rows)`` of table ``name``: the
    engine's ``table_stream`` where it has one (a collective over ranks), else its
    ``export_rows`` and ``export_chunks``."""
    fn = getattr(engine, "table_stream", None)
    if fn is not None:
        return fn(name, rows)  # type: ignore[no-any-return]
    return int(engine.export_rows(name)), engine.export_chunks(name, rows)


def _key_error(bundle: Bundle, name: str, key: int, rows: int) -> CheckpointError:
    return CheckpointError(
        f"{bundle.path}: table {name}: key {key} does not fit a static table of "
        f"{rows} rows (keys 0..{(rows or 1) - 1}); make the table dynamic"
    )


def check_stream_import(bundle: Bundle, engine: Any, name: str) -> None:
    """What ``import_table`` checks of a whole table, for one imported chunk by chunk, so a
    refused import changes nothing: member shapes, static keys in range, ``last_step``
    representable. Reads only ``keys`` and ``last_step``, a chunk at a time."""
    base = f"tables/{name}/"
    meta = bundle.manifest["tables"][name]
    cfg = engine.table_config(name)
    rows, dim = int(meta["rows"]), int(cfg.dim)
    parquet = bundle.manifest.get("array_format") == "parquet"
    want = {"keys": (rows,), "values": (rows, dim), "update_count": (rows,),
            "last_step": (rows,)}
    want.update({s: (rows, *shape) for s, shape in meta.get("slots", {}).items()})
    for stem, shape in ({} if parquet else want).items():
        entry = bundle.files.get(f"{base}{stem}.npy")
        if entry is None or entry.shape != shape:
            got = None if entry is None else list(entry.shape or ())
            raise CheckpointError(f"{bundle.path / base}{stem}.npy: shape {got}, this table "
                                  f"needs {list(shape)}")
    static = getattr(cfg, "dynamic", None) is None
    limit = int(np.iinfo(np.int32).max)
    for keys, last in _keys_and_steps(bundle, name):
        if static and keys.size and (int(keys.min()) < 0 or int(keys.max()) >= int(cfg.rows)):
            raise _key_error(bundle, name, int(keys.min() if keys.min() < 0 else keys.max()),
                             int(cfg.rows))
        if last.size and int(last.max()) + 1 > limit:
            raise CheckpointError(f"{bundle.path}: table {name}: a last_step above "
                                  f"{limit - 1} is not supported")


def _keys_and_steps(bundle: Bundle, name: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A table's ``keys`` and ``last_step``, a chunk at a time (``.npy`` or Parquet)."""
    if bundle.manifest.get("array_format") == "parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(bundle.file(f"tables/{name}.parquet"))
        for batch in parquet.iter_batches(batch_size=chunk_rows(24),
                                          columns=["key", "last_step"]):
            yield (batch.column(0).to_numpy(zero_copy_only=False),
                   batch.column(1).to_numpy(zero_copy_only=False))
        return
    for part in iter_table_chunks(bundle, name, members=["keys", "last_step"]):
        assert part.last_step is not None
        yield part.keys, part.last_step


def import_bundle(
    bundle: Bundle,
    engine: EngineLike,
    model: DenseModelLike | None,
    load_dense_optimizer: bool = True,
    transform: Any = None,
) -> None:
    """Import an already verified bundle's tables (and dense model) table by table.

    A table the engine streams (tiered) is imported chunk by chunk, read with ``pread``
    (never whole, never mapped), after its checks (:func:`check_stream_import`), which for
    every such table come before anything is imported. Other tables' arrays are
    memory-mapped, so peak memory stays at one table's worth of page cache.
    ``transform(name, TableData) -> TableData`` may adjust rows before import (warm start).
    """
    from embtrain.checkpoint.layout import iter_parquet_chunks, read_table

    parquet = bundle.manifest.get("array_format") == "parquet"
    chunked = [n for n in engine.table_names if streams(engine, n)]
    for name in chunked:
        check_stream_import(bundle, engine, name)
    for name in engine.table_names:
        if name in chunked:
            parts: Iterable[TableData] = (iter_parquet_chunks(bundle, name) if parquet
                                          else iter_table_chunks(bundle, name))
        elif parquet:
            parts = [read_table(bundle, name, verify=False)]
        else:
            parts = [_mapped_table(bundle, name)]
        for data in parts:
            if transform is not None:
                data = transform(name, data)
            _import_part(bundle, engine, name, data)
    if model is not None:
        weights, optimizer = dense_members(bundle)
        model.set_weights([np.load(bundle.file(m), allow_pickle=False) for m in weights])
        if load_dense_optimizer and optimizer:
            model.load_optimizer_state(
                [np.load(bundle.file(m), allow_pickle=False) for m in optimizer]
            )


def _import_part(bundle: Bundle, engine: EngineLike, name: str, data: TableData) -> None:
    """``engine.import_table`` with its refusals as one-line checkpoint errors."""
    from embtrain.embedding.engine import KeyOutOfRangeError

    try:
        engine.import_table(name, _in_table_dtype(engine, name, data))
    except KeyOutOfRangeError as e:
        raise _key_error(bundle, name, int(e.value), int(e.rows or 0)) from None
    except ValueError as e:
        raise CheckpointError(f"{bundle.path}: {e}") from None


def _in_table_dtype(engine: EngineLike, name: str, data: TableData) -> TableData:
    """``data`` as the table stores it: 16-bit patterns of another dtype than the table's
    (``load --allow dtype``) widened to float32 here, exactly, so every importer (the
    engine narrows float32 to nearest) reads them right whatever it knows of their dtype."""
    cfg = engine.table_config(name) if hasattr(engine, "table_config") else None
    if cfg is None:
        return data
    from embtrain.embedding.halves import DTYPE_CODES, to_float32

    values, slots = data.values, data.slots
    dtype, state_dtype = data.dtype, data.state_dtype
    if dtype != cfg.dtype and dtype != "float32":
        values, dtype = to_float32(values, DTYPE_CODES[dtype]), "float32"
    if state_dtype != cfg.state_dtype and state_dtype != "float32":
        slots = {k: to_float32(v, DTYPE_CODES[state_dtype]) for k, v in slots.items()}
        state_dtype = "float32"
    if values is data.values and slots is data.slots:
        return data
    return TableData(data.keys, values, slots, data.update_count, data.last_step,
                     data.removed_keys, data.extra, dtype, state_dtype)


def _mapped_table(bundle: Bundle, name: str) -> TableData:
    arrays = {
        m.rsplit("/", 1)[1][:-4]: np.load(bundle.file(m), mmap_mode="r", allow_pickle=False)
        for m in table_members(bundle, name)
    }
    slots = {s: arrays[s] for s in bundle.manifest["tables"][name].get("slots", {})}
    return TableData(
        arrays["keys"], arrays["values"], slots, arrays["update_count"], arrays["last_step"],
        extra={s: np.asarray(arrays[s]) for s in EXTRA_ARRAYS if s in arrays},
        **dtypes_of(bundle.manifest["tables"][name]),
    )


class CheckpointManager:
    """Saves and restores a run's checkpoints (the training loop's side of checkpointing).

    ``keep``: complete checkpoints kept; ``every``: steps between checkpoints (``None``: only
    at the end when ``at_end``); ``recipe_fingerprint`` is recorded and checked on restore.
    """

    def __init__(
        self,
        run_dir: Path,
        keep: int = 3,
        recipe_fingerprint: str = "",
        every: int | None = None,
        at_end: bool = True,
        fsync: bool = True,
        model_module: Any = None,
        accepted_fingerprints: frozenset[str] = frozenset(),
    ):
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.run_dir = Path(run_dir)
        self.directory = self.run_dir / CHECKPOINTS
        self.keep = keep
        self.recipe_fingerprint = recipe_fingerprint
        #: what a checkpoint may record and still be this recipe's (older fingerprints of it)
        self.accepted_fingerprints = accepted_fingerprints | {recipe_fingerprint}
        #: a ``type: keras`` recipe's ``(model config, module identity)``: the module's content
        #: is recorded in every checkpoint and checked on restore
        self.model_module = model_module
        self.every = every
        self.at_end = at_end
        self.fsync = fsync
        self.history: list[dict[str, Any]] = []

    @classmethod
    def for_recipe(cls, run_dir: Path, recipe: Any) -> CheckpointManager:
        """A manager with the recipe's ``train.checkpoint`` cadence and fingerprint."""
        from embtrain.recipe.loader import accepted_fingerprints, recipe_fingerprint

        ck = recipe.train.checkpoint
        module = None
        if recipe.model.type == "keras":
            from embtrain.models.keras_model import module_identity

            module = (recipe.model, module_identity(recipe.model))
        return cls(
            run_dir,
            keep=ck.keep,
            recipe_fingerprint=recipe_fingerprint(recipe),
            every=ck.every,
            at_end=ck.at_end,
            model_module=module,
            accepted_fingerprints=accepted_fingerprints(recipe),
        )

    def due(self, step: int, total_steps: int) -> bool:
        """Whether the loop should checkpoint after completing ``step`` steps."""
        if self.every and step % self.every == 0:
            return True
        return self.at_end and step == total_steps

    def latest(self) -> Path | None:
        """The newest complete checkpoint of this run."""
        return latest_checkpoint(self.run_dir)

    # ------------------------------------------------------------------ save
    def save(
        self,
        step: int,
        engine: EngineLike,
        model: DenseModelLike | None,
        reader_position: Any,
        extra: Mapping[str, Any] | None = None,
        *,
        seed: int | None = None,
        rng: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write ``checkpoints/step-<step>`` atomically, then prune old ones; returns its path.

        ``reader_position``: the reader's ``(epoch, batch)`` of the *next* batch to train on.
        ``extra``: JSON-ready values the loop needs to continue exactly (loss window, samples,
        evaluations so far); ``rng``: JSON-ready RNG states (see :func:`rng_state`).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        for child in self.directory.iterdir():
            if child.name.startswith(TMP_PREFIX):  # left by a writer that was killed
                shutil.rmtree(child, ignore_errors=True)
        name = checkpoint_name(step)
        dest = self.directory / name
        epoch, batch = position_of(reader_position)
        state = {
            "step": int(step),
            "reader": {"epoch": epoch, "batch": batch},
            "seed": seed,
            "rng": dict(rng or {}),
            "extra": dict(extra or {}),
            "recipe_fingerprint": self.recipe_fingerprint,
        }
        tables: dict[str, Any] = {}
        dense: dict[str, Any] = {}

        def files() -> Iterator[tuple[str, Source]]:
            for table in engine.table_names:
                dynamic = getattr(engine.table_config(table), "dynamic", None) is not None
                if streams(engine, table):  # a tiered table: chunk by chunk, never whole
                    cfg = engine.table_config(table)
                    rows = chunk_rows(config_row_bytes(cfg.dim, len(engine.slot_names)))
                    total, chunks = table_chunks(engine, table, rows)
                    source, tables[table] = table_stream(table, total, chunks)
                    if dynamic:
                        tables[table]["dynamic"] = True
                    yield f"tables/{table}", source
                    continue
                data = TableData.from_state(engine.export_table(table))
                tables[table] = table_meta(data)
                if dynamic:
                    tables[table]["dynamic"] = True
                yield from table_files(table, data)
            if model is not None:
                weights, opt = model.get_weights(), model.optimizer_state()
                dense.update(
                    dense_meta(
                        weights,
                        opt,
                        _names(model, "weight_names"),
                        _names(model, "optimizer_state_names"),
                    )
                )
                yield from dense_files(weights, opt)
            yield STATE, BytesSource(json_bytes(state))

        def finish(entries: list[FileEntry]) -> dict[str, Any]:
            return {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "kind": "checkpoint",
                "recipe_fingerprint": self.recipe_fingerprint,
                **({"model_module": self.model_module[1]} if self.model_module else {}),
                "step": int(step),
                "time_utc": utc_now(),
                "tables": tables,
                "slots": list(engine.slot_names),
                "dense": dense,
                "history": list(self.history),
            }

        try:
            manifest = write_bundle(
                dest, files(), finish, fsync=self.fsync, tmp_name=f"{TMP_PREFIX}{name}",
                replace=True,
            )
        except StorageError as exc:
            kept = self.latest()
            raise StorageError(
                f"{exc}; " + (f"the last complete checkpoint {kept} is intact: resume with "
                              f"`embtrain run --resume {self.run_dir}`" if kept is not None
                              else "this run has no complete checkpoint yet")
            ) from exc
        self.history.append(history_entry(manifest))
        self.prune()
        return dest

    def prune(self) -> None:
        """Delete all but the newest ``keep`` complete checkpoints."""
        found = list_checkpoints(self.run_dir)
        for _, path in found[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    # ---------------------------------------------------------------- restore
    def restore(
        self,
        engine: EngineLike,
        model: DenseModelLike | None,
        path: Path | None = None,
        *,
        step: int | None = None,
        check_fingerprint: bool = True,
        supersede_newer: bool = True,
    ) -> TrainState:
        """Load a checkpoint (``path``, the one at ``step``, or the latest) into engine and model.

        Every file is verified and every shape checked against the engine and model before
        anything is imported. Checkpoints of this run newer than the restored one are renamed
        ``step-N.superseded-<time>`` (kept, but no longer taken as the latest or pruned);
        ``supersede_newer=False`` leaves them (ranks other than 0 of a job).
        """
        if path is None:
            path = find_checkpoint(self.run_dir, step)
        bundle = open_bundle(Path(path), kinds=("checkpoint",))
        if (
            check_fingerprint
            and self.recipe_fingerprint
            and bundle.manifest["recipe_fingerprint"] not in self.accepted_fingerprints
        ):
            raise CheckpointError(
                f"{bundle.path}: written by recipe {bundle.manifest['recipe_fingerprint']}, this recipe "
                f"is {self.recipe_fingerprint}; --resume needs the run's own recipe "
                "(start a new run from a dump with `embtrain load` to change it)"
            )
        if check_fingerprint and self.model_module is not None:
            from embtrain.models.keras_model import check_module_identity

            check_module_identity(bundle.manifest.get("model_module"), self.model_module[0],
                                  str(bundle.path))
        verify_bundle(bundle)
        check_compatible(bundle, engine, model)
        state = read_json_member(bundle, STATE)
        import_bundle(bundle, engine, model)
        if supersede_newer and bundle.path.parent.resolve() == self.directory.resolve():
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            for s, newer in list_checkpoints(self.run_dir):
                if s > bundle.step:
                    os.rename(newer, newer.with_name(f"{newer.name}.superseded-{stamp}"))
        self.history = [*bundle.manifest.get("history", []), history_entry(bundle.manifest)]
        reader = state.get("reader", {})
        return TrainState(
            step=int(state["step"]),
            epoch=int(reader.get("epoch", 0)),
            batch=int(reader.get("batch", 0)),
            seed=state.get("seed"),
            path=bundle.path,
            rng=dict(state.get("rng") or {}),
            extra=dict(state.get("extra") or {}),
        )


def _names(model: Any, attribute: str) -> Sequence[str] | None:
    names = getattr(model, attribute, None)
    if callable(names):
        names = names()
    return list(names) if names is not None else None
