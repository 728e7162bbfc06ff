"""Warm start (``embtrain load``): a new run whose tables and dense model start from an export.

Two checks, all differences reported at once (one line each, exit 2):

* **Always refused**: a recipe table missing from the export (or an export table missing
  from the recipe), a table whose ``rows`` or ``dim`` changed, optimizer slots that differ
  (the sparse optimizer kind changed to one with other state).
* **Allowed when named with ``--allow``**, found by comparing the export's ``recipe.yaml``
  with the new recipe, by category:

  ``lr``          optimizer hyper-parameters (learning rates, betas, epsilon, ...)
  ``optimizer``   an optimizer kind change that keeps the same slots (sparse ``adam`` ↔
                  ``lazy_adam``) or a dense optimizer change (its state is then not loaded)
  ``steps``       ``train.steps`` / ``train.epochs``
  ``eval``        ``train.eval_every``, ``eval_at_end``, ``eval_max_batches``, ``log_every``
  ``checkpoint``  ``train.checkpoint``
  ``seed``        ``train.seed``
  ``data``        data paths, batch size, shuffling
  ``features``    the features (the dense model must still fit the export's weights)
  ``model``       the dense model (its weights and optimizer state are then not loaded)
  ``train``       any other ``train`` field
  ``dtype``       a table's ``dtype`` (float32 ↔ float16 / bfloat16), ``rounding`` or
                  ``optimizer_state``: values and slots are converted as they load (widened
                  exactly, or narrowed to nearest)

  Always accepted silently: ``name``, ``distributed`` (exports do not depend on world
  size), and a table's ``sharding``, ``storage`` and ``initializer``.

The new run starts at step 0. Rows keep their values, optimizer slots and ``update_count``;
``last_step`` is shifted by the export's step (a row last updated at the export's final step
gets ``-1``, as if updated just before the new run's step 0; never-updated rows stay ``-1``),
so step-dependent optimizers (``adam``'s decay for skipped steps) see the same gaps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embtrain.checkpoint.bundle import Bundle, open_bundle, verify_bundle
from embtrain.checkpoint.bundle_format import CheckpointError
from embtrain.checkpoint.keycheck import check_keys
from embtrain.checkpoint.layout import DenseModelLike, EngineLike, TableData
from embtrain.checkpoint.manager import check_compatible, import_bundle

CATEGORIES = (
    "lr",
    "optimizer",
    "steps",
    "eval",
    "checkpoint",
    "seed",
    "data",
    "features",
    "model",
    "train",
    "dtype",
)
RECIPE = "recipe.yaml"


@dataclass
class WarmStart:
    """What a warm start loaded."""

    path: Path
    step: int
    tables: list[str]
    dense_weights: bool
    dense_optimizer: bool
    allowed: list[str] = field(default_factory=list)


def parse_allow(text: str | Iterable[str] | None) -> set[str]:
    """``"lr,steps"`` → ``{"lr", "steps"}``; unknown names are an error."""
    if text is None:
        return set()
    items = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    names = {p.strip() for p in items if p.strip()}
    unknown = names - set(CATEGORIES)
    if unknown:
        raise CheckpointError(
            f"--allow: unknown {', '.join(sorted(unknown))}; choose from {', '.join(CATEGORIES)}"
        )
    return names


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = obj
    return out


def _keyed(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """Recipe dict with tables and features keyed by name (so reordering is no change)."""
    out = dict(recipe)
    out["tables"] = {
        t["name"]: {k: v for k, v in t.items() if k != "name"} for t in recipe.get("tables", [])
    }
    out["features"] = {f["name"]: f for f in recipe.get("features", [])}
    return out


def category(path: str) -> str | None:
    """The ``--allow`` category of a changed recipe field; ``None``: always fine."""
    parts = path.split(".")
    top = parts[0]
    if top in ("name", "version", "distributed"):
        return None
    if top == "tables":
        if len(parts) > 2 and parts[2] in ("sharding", "storage", "initializer"):
            return None
        if len(parts) > 2 and parts[2] in ("dtype", "rounding", "optimizer_state"):
            return "dtype"
        return "tables"
    if top == "optimizer":
        return "optimizer" if parts[-1] == "type" else "lr"
    if top == "train":
        field_ = parts[1] if len(parts) > 1 else ""
        if field_ in ("steps", "epochs"):
            return "steps"
        if field_ in ("eval_every", "eval_at_end", "eval_max_batches", "log_every"):
            return "eval"
        if field_ in ("checkpoint", "seed"):
            return field_
        return "train"
    return top


def _slot_shapes(recipe: Any) -> dict[str, dict[str, list[int]]]:
    from embtrain.embedding.from_recipe import sparse_optimizer_config
    from embtrain.embedding.optimizers import slot_specs

    specs = slot_specs(sparse_optimizer_config(recipe.optimizer.sparse))
    return {t.name: {s.name: ([] if s.per_row else [t.dim]) for s in specs} for t in recipe.tables}


def differences(bundle: Bundle, recipe: Any, allow: set[str]) -> tuple[list[str], list[str]]:
    """``(refused, allowed)`` lines: what stops the warm start and what ``allow`` let through."""
    refused: list[str] = []
    allowed: list[str] = []
    tables = bundle.manifest.get("tables", {})
    slots = _slot_shapes(recipe)
    for t in recipe.tables:
        meta = tables.get(t.name)
        if meta is None:
            refused.append(f"table {t.name}: missing from the export")
            continue
        if meta.get("dynamic") or t.is_dynamic:
            # keys of (or into) a dynamic table: as many as fit; the import checks every key
            if int(meta["rows"]) > t.capacity:
                refused.append(f"table {t.name}: {meta['rows']} keys in the export do not fit "
                               f"its {'capacity' if t.is_dynamic else 'rows'} {t.capacity}")
        elif int(meta["rows"]) != t.capacity:
            refused.append(
                f"table {t.name}: rows {meta['rows']} in the export, {t.capacity} in the recipe"
            )
        if int(meta["dim"]) != t.dim:
            refused.append(
                f"table {t.name}: dim {meta['dim']} in the export, {t.dim} in the recipe"
            )
        if meta.get("dtype", "float32") != t.dtype:
            line = (f"table {t.name}: dtype {meta.get('dtype', 'float32')} in the export, "
                    f"{t.dtype} in the recipe")
            if "dtype" in allow:
                allowed.append(f"{line} (allowed: dtype)")
            else:
                refused.append(f"{line} (allow with --allow dtype: converted as it loads)")
        have = {k: list(v) for k, v in meta.get("slots", {}).items()}
        if have != slots[t.name]:
            refused.append(
                f"table {t.name}: optimizer slots {_fmt_slots(have)} in the export, "
                f"{_fmt_slots(slots[t.name])} for the recipe's sparse optimizer "
                f"{recipe.optimizer.sparse.type}"
            )
    names = {t.name for t in recipe.tables}
    for name in tables:
        if name not in names:
            refused.append(f"table {name}: in the export but not in the recipe")
    old = _export_recipe(bundle)
    if old is not None:
        before, after = _flatten(_keyed(old)), _flatten(_keyed(recipe.model_dump(mode="json")))
        for path in sorted(set(before) | set(after)):
            if before.get(path) == after.get(path) or (
                path.startswith("tables.") and path.split(".")[1] not in tables
            ):
                continue
            cat = category(path)
            if cat is None or (cat in ("tables", "dtype")
                               and path.split(".")[-1] in ("rows", "dim", "dtype")):
                continue
            if cat == "tables" and (".dynamic" in path or path.endswith(".rows")):
                continue  # static ↔ dynamic and capacity: checked by keys above and on import
            line = f"{path}: {before.get(path, '(absent)')!r} in the export, {after.get(path, '(absent)')!r} now"
            if cat in allow:
                allowed.append(f"{line} (allowed: {cat})")
            elif cat == "tables":
                refused.append(line)
            else:
                refused.append(f"{line} (allow with --allow {cat})")
    return refused, allowed


def _fmt_slots(slots: Mapping[str, list[int]]) -> str:
    return "{" + ", ".join(f"{k}{v}" for k, v in sorted(slots.items())) + "}" if slots else "{}"


def _export_recipe(bundle: Bundle) -> dict[str, Any] | None:
    if RECIPE not in bundle.files:
        return None
    import yaml

    verify_bundle(bundle, [RECIPE])
    data = yaml.safe_load(bundle.file(RECIPE).read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None


def shift_last_step(step: int) -> Any:
    """A transform for :func:`import_bundle` that re-bases ``last_step`` on the new run's step 0."""

    def transform(_: str, data: TableData) -> TableData:
        if data.last_step is None:
            return data
        last = np.asarray(data.last_step)
        shifted = np.where(last >= 0, last - np.int64(step), last).astype(np.int64)
        return TableData(data.keys, data.values, data.slots, data.update_count, shifted,
                         extra=data.extra, dtype=data.dtype, state_dtype=data.state_dtype)

    return transform


def warm_start(
    engine: EngineLike,
    model: DenseModelLike | None,
    export_dir: Path,
    recipe: Any,
    allow: Iterable[str] | str | None = None,
) -> WarmStart:
    """Load an export (or checkpoint) into a freshly built engine and model for a new run.

    Every difference is checked and every file verified before anything is imported.
    """
    allowed_set = parse_allow(allow) if not isinstance(allow, set) else allow
    bundle = open_bundle(Path(export_dir), kinds=("export", "checkpoint"))
    refused, allowed = differences(bundle, recipe, allowed_set)
    if refused:
        lines = [f"{bundle.path}: does not fit the recipe: {len(refused)} difference(s)"]
        lines += [f"{bundle.path}: {r}" for r in refused]
        raise CheckpointError("\n".join(lines))
    check_keys(bundle, recipe)  # as `load --check` does
    load_dense = model is not None and not any(a.endswith("(allowed: model)") for a in allowed)
    dense_type_changed = any(
        a.startswith("optimizer.dense") and "(allowed: optimizer)" in a for a in allowed
    )
    verify_bundle(bundle)
    check_compatible(bundle, engine, model if load_dense else None, what="export")
    import_bundle(
        bundle,
        engine,
        model if load_dense else None,
        load_dense_optimizer=not dense_type_changed,
        transform=shift_last_step(bundle.step),
    )
    return WarmStart(
        path=bundle.path,
        step=bundle.step,
        tables=list(engine.table_names),
        dense_weights=load_dense,
        dense_optimizer=load_dense and not dense_type_changed,
        allowed=allowed,
    )
