"""``embtrain export RUN_DIR OUT --format saved_model``: a TensorFlow SavedModel of a run.

The checkpoint is world-size-free, so every table is assembled whole from it whatever
sharding, tiers or number of processes trained it: static tables as ``[rows, dim]`` variables
(rows the checkpoint does not hold start at their initial values, as in training), dynamic
tables as their rows plus a hash table key → row. The dense network is the recipe's, built as
training builds it (one head per label) and given the checkpoint's weights; its outputs are
predict's columns. The checkpoint is checked as predict and ``--resume`` check it: written by
the run's recipe as it is now (fingerprint), its manifest's content fingerprint, every array's
checksum, every shape against the recipe, and finite values. ``OUT/<step>/`` is the layout TensorFlow
Serving loads (integer version directories): it is written under a temporary name owned by the
process (``OUT/.tmp-<step>-<pid>-<hex>@<host>``) and renamed into place; an existing version is
never overwritten; temporaries of dead exports are removed by the next export into ``OUT``.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.errors import UserInputError
from embtrain.recipe import Recipe

SIGNATURE = "serving_default"


@dataclass
class ExportSummary:
    """What `export` reports."""

    run_dir: str
    checkpoint: str
    step: int
    path: str
    bytes: int  # tables and dense weights as exported
    seconds: float
    inputs: dict[str, str]  # signature input -> dtype[shape]
    outputs: list[str]  # signature outputs: predict's columns

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_limit() -> int:
    """Half the memory available now: the tables are read whole, and each is held twice while
    it becomes a TensorFlow variable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2


def _schema_types(recipe: Recipe) -> dict[str, Any]:
    """Arrow types of the recipe's columns, from the first data file found (eval, then train)."""
    import glob

    import pyarrow.parquet as pq

    for patterns in (recipe.data.eval, recipe.data.train):
        if patterns is None:
            continue
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            files = sorted(glob.glob(pattern, recursive=True))
            if files:
                try:
                    schema = pq.read_schema(files[0])
                except Exception:  # unreadable: fall back to the recipe's defaults
                    continue
                return {name: schema.field(name).type for name in schema.names}
    return {}


def _is_list(t: Any) -> bool:
    import pyarrow as pa

    if t is None:
        return False
    if pa.types.is_dictionary(t):
        t = t.value_type
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t)
                or pa.types.is_fixed_size_list(t))


def serving_spec(recipe: Recipe) -> tuple[Any, list[Any]]:
    """The :class:`~embtrain.serving.graph.ServingSpec` of a recipe and the model's slots."""
    import pyarrow as pa

    from embtrain.embedding.engine import fused_layout
    from embtrain.embedding.from_recipe import feature_configs, table_configs
    from embtrain.embedding.initializers import initializer_code, table_base
    from embtrain.models.slots import feature_slots
    from embtrain.serving.graph import DenseInput, FeatureInput, ServingSpec, TableSpec

    types = _schema_types(recipe)
    configs = table_configs(recipe)
    layout, _ = fused_layout(configs, feature_configs(recipe))
    slots = feature_slots(recipe, layout)
    dense = []
    for d in recipe.dense_features:
        dtypes = tuple("int64" if c in types and pa.types.is_integer(types[c]) else "float32"
                       for c in d.columns)
        dense.append(DenseInput(d.name, tuple(d.columns), dtypes, d.fill_null, d.transform))
    tables = []
    seed = recipe.train.seed
    for t, c in zip(recipe.tables, configs, strict=True):
        kind = c.initializer.kind
        _, param = initializer_code(c.initializer)
        tables.append(TableSpec(t.name, t.dim, None if t.dynamic is not None else int(t.rows),
                                t.dynamic.missing if t.dynamic is not None else "zeros",
                                kind, float(param), int(table_base(seed, t.name)),
                                t.dtype))
    features = []
    for f in recipe.categorical_features:
        g, start, width = layout[f.name]
        table = recipe.table(f.table)
        features.append(FeatureInput(
            f.name, f.column, f.table,
            is_list=f.hotness != 1 or _is_list(types.get(f.column)),
            string_ids=f.ids == "string", id_dtype="string" if f.ids == "string" else "int64",
            weights=f.weights, combiner=f.combiner,
            hotness=None if f.hotness == "variable" else int(f.hotness),
            modulo=table.dynamic is None and f.out_of_range == "modulo",
            group=g, start=start, width=width,
            null=f.null if isinstance(f.null, str) else "id",
            null_id=None if isinstance(f.null, str) else f.null.id))
    from embtrain.models.slots import group_widths

    labels = (tuple((lab.name, lab.loss) for lab in recipe.data.label_specs())
              if recipe.data.labels is not None else None)
    spec = ServingSpec(tuple(dense), tuple(features), tuple(tables),
                       tuple(group_widths(slots)), sum(len(d.columns) for d in dense), labels)
    return spec, slots


def export_bytes(recipe: Recipe, manifest: dict[str, Any]) -> int:
    """Bytes of the tables as exported: static tables whole, dynamic tables the checkpoint's
    rows and their keys, float32 (the dense network is small beside them and not counted)."""
    total = 0
    tables = manifest.get("tables", {})
    for t in recipe.tables:
        rows = int(tables.get(t.name, {}).get("rows", 0))
        if t.dynamic is None:
            total += int(t.rows) * t.dim * 4
        else:
            total += rows * (t.dim * 4 + 16)
    return total


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _table_arrays(bundle: Any, recipe: Recipe) -> tuple[dict[str, np.ndarray],
                                                         dict[str, np.ndarray]]:
    """Every table whole: values (static ``[rows, dim]``, dynamic ``[n, dim]``) and dynamic keys."""
    from embtrain.checkpoint.bundle import load_arrays
    from embtrain.checkpoint.bundle_format import CheckpointError
    from embtrain.embedding.from_recipe import table_configs
    from embtrain.embedding.halves import DTYPE_CODES, stored_as, to_float32
    from embtrain.embedding.initializers import initial_rows

    values, keys = {}, {}
    configs = {c.name: c for c in table_configs(recipe)}
    for t in recipe.tables:
        base = f"tables/{t.name}/"
        arrays = load_arrays(bundle, [base + "keys.npy", base + "values.npy"], verify=True)
        k = np.asarray(arrays[base + "keys.npy"], np.int64)
        raw = arrays[base + "values.npy"]
        check_table_fits(bundle, t, k, raw)
        # a half table's 16-bit patterns widened to float32 (exact: the values it trained)
        code = DTYPE_CODES[bundle.manifest["tables"][t.name].get("dtype", "float32")]
        v = to_float32(raw, code).reshape(-1, t.dim)
        if not bool(np.isfinite(v).all()):
            raise CheckpointError(f"{bundle.path}: table {t.name}: holds non-finite values "
                                  "(NaN or inf); the export would serve them")
        if t.dynamic is not None:
            values[t.name], keys[t.name] = v, k
            continue
        rows = int(t.rows)
        if k.shape[0] == rows and (rows == 0 or (int(k[0]) == 0 and int(k[-1]) == rows - 1)):
            values[t.name] = v  # every row, in order (keys are sorted and unique)
            continue
        full = initial_rows(configs[t.name], recipe.train.seed, np.arange(rows, dtype=np.int64))
        if code:  # a half table starts from its initial values narrowed to nearest
            full = to_float32(stored_as(full, code), code)
        full[k] = v
        values[t.name] = full
    return values, keys


def check_table_fits(bundle: Any, table: Any, keys: np.ndarray, values: np.ndarray) -> None:
    """A table's keys and values as the recipe's table needs them (one line otherwise):
    ``[n]`` keys, ``[n, dim]`` values, a static table's keys in ``[0, rows)``, a dynamic
    table's at most its capacity."""
    from embtrain.checkpoint.bundle_format import CheckpointError

    where = f"{bundle.path}: table {table.name}"
    n = int(keys.shape[0]) if keys.ndim == 1 else -1
    if keys.ndim != 1 or values.ndim != 2 or tuple(values.shape) != (n, table.dim):
        raise CheckpointError(f"{where}: keys {list(keys.shape)} and values "
                              f"{list(values.shape)}; this recipe's table needs [n] and "
                              f"[n, {table.dim}] (dim {table.dim})")
    if table.dynamic is None:
        rows = int(table.rows)
        if n > rows or (n and (int(keys.min()) < 0 or int(keys.max()) >= rows)):
            raise CheckpointError(f"{where}: {n} keys from {int(keys.min()) if n else 0} to "
                                  f"{int(keys.max()) if n else 0}, outside a static table of "
                                  f"{rows} rows")
    elif n > int(table.dynamic.capacity):
        raise CheckpointError(f"{where}: {n} keys, more than its capacity "
                              f"{table.dynamic.capacity}")


def check_dense_fits(bundle: Any, model: Any, weights: list[np.ndarray]) -> None:
    """The checkpoint's dense arrays are the model's (count and shapes) and finite."""
    from embtrain.checkpoint.bundle_format import CheckpointError

    want = model.get_weights()
    if len(weights) == model.trainable_weight_count:  # written before the state was kept
        want = want[:len(weights)]
    if len(weights) != len(want):
        raise CheckpointError(f"{bundle.path}: does not fit this recipe: dense model: "
                              f"{len(weights)} weight arrays in the checkpoint, {len(want)} now")
    for i, (got, now) in enumerate(zip(weights, want, strict=True)):
        if tuple(np.shape(got)) != tuple(np.shape(now)):
            raise CheckpointError(f"{bundle.path}: does not fit this recipe: dense model: "
                                  f"weight {i} is {list(np.shape(got))} in the checkpoint, "
                                  f"{list(np.shape(now))} now")
        if not bool(np.isfinite(np.asarray(got, np.float64)).all()):
            raise CheckpointError(f"{bundle.path}: dense weight {i} holds non-finite values "
                                  "(NaN or inf); the export would serve them")


def check_recipe_fingerprint(run_dir: Path, recipe: Recipe, bundle: Any) -> None:
    """The checkpoint was written by the run's recipe as it is now (as predict and --resume
    check): a recipe.yaml edited after training would serve other features than trained."""
    from embtrain.checkpoint.bundle import check_content_fingerprint
    from embtrain.checkpoint.bundle_format import CheckpointError
    from embtrain.recipe import fingerprint_matches, recipe_fingerprint

    check_content_fingerprint(bundle)  # a manifest edited by hand is refused here
    now = recipe_fingerprint(recipe)
    was = bundle.manifest.get("recipe_fingerprint")
    if was and not fingerprint_matches(was, recipe):
        raise CheckpointError(
            f"{bundle.path}: written by recipe {was}, {Path(run_dir) / 'recipe.yaml'} is now "
            f"{now} (edited after training); export needs the run's own recipe: restore it "
            "(or train a new run from this one with `embtrain load`)")
    if recipe.model.type == "keras":
        from embtrain.models.keras_model import check_module_identity

        check_module_identity(bundle.manifest.get("model_module"), recipe.model,
                              str(bundle.path))


def serving_module(recipe: Recipe, bundle: Any) -> tuple[Any, int]:
    """The :class:`~embtrain.serving.graph.ServingModule` of a verified checkpoint bundle, and
    the bytes of its tables and dense weights."""
    from embtrain.checkpoint.layout import read_dense
    from embtrain.models import build_model
    from embtrain.serving.graph import ServingModule

    spec, slots = serving_spec(recipe)
    values, keys = _table_arrays(bundle, recipe)
    weights, _ = read_dense(bundle)
    # the network computes as training and predict do (train.mixed_precision: bf16 or fp16
    # matmuls on float32 weights), so the export scores what the run evaluated
    # the whole recipe: one head per label of data.labels, the run's precision
    model = build_model(recipe, num_dense=spec.num_dense, slots=slots, seed=recipe.train.seed)
    check_dense_fits(bundle, model, weights)
    model.set_weights(weights)
    size = sum(v.nbytes for v in values.values()) + sum(k.nbytes for k in keys.values()) + sum(
        int(np.asarray(w).nbytes) for w in weights)
    module = ServingModule(spec, values, keys, model.network,
                           [*model.trainable_variables, *model.state_variables])
    return module, size


def load_run(run_dir: Path, step: int | None = None,
             allow_outside_module: bool = False) -> tuple[Recipe, Any]:
    """A run's recipe and its latest (or chosen) checkpoint, opened (not yet verified)."""
    from embtrain.checkpoint.bundle import open_bundle
    from embtrain.checkpoint.manager import find_checkpoint
    from embtrain.train.predict import run_recipe

    recipe, _ = run_recipe(Path(run_dir), allow_outside_module)
    return recipe, open_bundle(find_checkpoint(Path(run_dir), step), kinds=("checkpoint",))


def next_version_dir(out: Path, step: int) -> Path:
    """``OUT/<step>``; one line when that version exists."""
    target = out / str(int(step))
    if target.exists():
        raise UserInputError(f"{target}: version {step} is already exported (a version is never "
                             "overwritten; export another checkpoint with --checkpoint STEP)")
    return target


def write_saved_model(module: Any, out: Path, version: int, target: Path) -> None:
    """``module`` saved under an owned temporary name in ``out`` and renamed to ``target``.

    Temporaries that killed exports left in ``out`` are removed first
    (:func:`~embtrain.checkpoint.tmpdirs.sweep_dead`); this one is removed on any failure,
    Ctrl-C and SIGTERM included (the CLI turns SIGTERM into an exit). An ``out`` that cannot be
    written (read-only, full, no permission) is one line, exit 1, like dump's."""
    import tensorflow as tf

    from embtrain.checkpoint.tmpdirs import owned_name, sweep_dead
    from embtrain.errors import StorageError, os_error_line

    concrete = module.serve.get_concrete_function()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot write the export: {os_error_line(exc)}") from None
    sweep_dead(out)
    tmp = out / owned_name(str(version))
    try:
        tf.saved_model.save(module, str(tmp), signatures={SIGNATURE: concrete})
        next_version_dir(out, version)  # still free (another export may have written it)
        os.rename(tmp, target)
    except OSError as exc:
        raise StorageError(f"cannot write the export: {os_error_line(exc)}") from None
    except tf.errors.OpError as exc:  # TensorFlow's own file errors (read-only, no space)
        if isinstance(exc, (tf.errors.PermissionDeniedError, tf.errors.ResourceExhaustedError,
                            tf.errors.FailedPreconditionError, tf.errors.NotFoundError,
                            tf.errors.UnimplementedError)):
            reason = (exc.message or type(exc).__name__).strip().splitlines()[0]
            raise StorageError(f"{out}: cannot write the export: {reason}") from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_saved_model(run_dir: Path, out: Path, step: int | None = None,
                       max_bytes: int | None = None,
                       allow_outside_module: bool = False) -> ExportSummary:
    """Write ``OUT/<step>/`` from the run's latest (or chosen) checkpoint
    (``allow_outside_module``: a Keras module outside the run directory may be imported)."""
    start = time.perf_counter()
    run_dir, out = Path(run_dir), Path(out)
    recipe, bundle = load_run(run_dir, step, allow_outside_module)
    check_recipe_fingerprint(run_dir, recipe, bundle)
    chosen = bundle.path
    version = int(bundle.manifest["step"])
    if out.exists() and not out.is_dir():
        raise UserInputError(f"{out}: exists and is not a directory")
    target = next_version_dir(out, version)
    limit = default_limit() if max_bytes is None else int(max_bytes)
    size = export_bytes(recipe, bundle.manifest)
    if size > limit:
        raise UserInputError(f"{run_dir}: the model is {_human(size)} ({size} bytes) whole, more "
                             f"than the export limit {_human(limit)} ({limit} bytes); nothing "
                             "was written")
    module, size = serving_module(recipe, bundle)  # every array read is verified
    write_saved_model(module, out, version, target)
    inputs = {name: f"{s.dtype.name}{list(s.shape)}"
              for name, s in module.spec.input_specs().items()}
    return ExportSummary(str(run_dir), str(chosen), version, str(target), size,
                         time.perf_counter() - start, inputs, module.spec.output_names())
