"""Built-in synthetic data sets for ``embtrain gen-data --preset NAME``.

``criteo``: 13 dense columns ``I1..I13`` (non-negative heavy-tailed integer counts, about 5 %
nulls: read them with ``transform: log1p`` and ``fill_null: 0``), 26 one-hot int64 columns
``C1..C26`` whose table sizes follow the Criteo Kaggle data set's (the largest capped at 1M),
and an int8 ``label``. ``criteo-multihot``: the same plus three list<int64> columns ``M1..M3``.

Tables are named after their column in lower case (``C7`` reads table ``c7``).

``sparse-ids``: what dynamic tables are for. Four dense count columns ``I1..I4`` and
categorical int64 columns whose ids are not ``0..rows-1`` (:data:`SPARSE_COLUMNS`): random
non-negative 63-bit ids (``user_id``, ``item_id`` and the list ``item_history``, which
shares table ``item``) and hashed crossed features spread over all of int64, negative ones
included (``user_x_item``, ``ad_id``). Ids follow a power law over each table's universe, and
the universe grows over the train split in :data:`SPARSE_STAGES` stages (stage ``s`` draws from
the first ``(s+1)/8`` of it; the eval split from all of it), so later rows and files keep
bringing new ids. Its recipe reads every table as a dynamic table of capacity = universe.
``sparse-ids-dense``: the same rows, labels and order with every id remapped to its logical
id ``0..universe-1`` (:func:`embtrain.data.gen.logical_ids` maps one to the other), read
by static tables of ``rows`` = universe: the static twin to compare a dynamic run with.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from embtrain.data.gen_plan import GenPlan, interaction_pairs, make_plan
from embtrain.recipe.loader import parse_recipe_text
from embtrain.recipe.models import Recipe

PresetName = Literal["criteo", "criteo-multihot", "sparse-ids", "sparse-ids-dense"]
PRESETS: tuple[str, ...] = ("criteo", "criteo-multihot", "sparse-ids", "sparse-ids-dense")
SPARSE_PRESETS: tuple[str, ...] = ("sparse-ids", "sparse-ids-dense")

CRITEO_DENSE: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
"""Dense columns: int64 counts with nulls; read with ``transform: log1p, fill_null: 0``."""

DENSE_FILL_NULL = 0.0

CRITEO_CATEGORICAL: tuple[tuple[str, int], ...] = (
    ("C1", 1460), ("C2", 583), ("C3", 1_000_000), ("C4", 500_000), ("C5", 305),
    ("C6", 24), ("C7", 12_517), ("C8", 633), ("C9", 3), ("C10", 93_145),
    ("C11", 5683), ("C12", 1_000_000), ("C13", 3194), ("C14", 27), ("C15", 14_992),
    ("C16", 800_000), ("C17", 10), ("C18", 5652), ("C19", 2173), ("C20", 4),
    ("C21", 1_000_000), ("C22", 18), ("C23", 15), ("C24", 200_000), ("C25", 105),
    ("C26", 100_000),
)
"""One-hot int64 id columns and their table's rows (ids lie in ``[0, rows)``)."""

MULTIHOT_LISTS: tuple[tuple[str, int, int | Literal["variable"]], ...] = (
    ("M1", 1000, 3),
    ("M2", 100_000, 10),
    ("M3", 500_000, "variable"),
)
"""``criteo-multihot`` only: list<int64> columns, table rows, hotness (lists of 1..N ids;
``variable``: 1..20 ids)."""

SPARSE_DENSE: tuple[str, ...] = ("I1", "I2", "I3", "I4")
"""``sparse-ids`` dense columns (int64 counts with nulls, like Criteo's)."""

SPARSE_TABLES: tuple[tuple[str, int, str], ...] = (
    ("user", 1_000_000, "uint63"),
    ("item", 500_000, "uint63"),
    ("user_x_item", 2_000_000, "int64"),
    ("ad", 100_000, "int64"),
)
"""``sparse-ids`` tables: name, universe (logical ids; the dynamic capacity and the dense
twin's rows) and id encoding (``uint63``: non-negative 63-bit ids; ``int64``: any int64)."""

SPARSE_COLUMNS: tuple[tuple[str, str, int | Literal["variable"]], ...] = (
    ("user_id", "user", 1),
    ("item_id", "item", 1),
    ("item_history", "item", "variable"),
    ("user_x_item", "user_x_item", 1),
    ("ad_id", "ad", 1),
)
"""``sparse-ids`` categorical columns: column, table, hotness (``variable``: lists of 1..20
ids, pooled with ``mean``)."""

SPARSE_STAGES = 8
"""Stages in which a ``sparse-ids`` table's universe grows over the train split."""

LABEL = "label"


def preset_columns(name: str) -> dict[str, str]:
    """Column name → type (``data.columns`` vocabulary) of a preset's Parquet files."""
    _check(name)
    if name in SPARSE_PRESETS:
        cols = {c: "int" for c in SPARSE_DENSE}
        cols.update({c: "int" if hot == 1 else "list<int>" for c, _, hot in SPARSE_COLUMNS})
        cols[LABEL] = "int"
        return cols
    cols = {c: "int" for c in CRITEO_DENSE}
    cols.update({c: "int" for c, _ in CRITEO_CATEGORICAL})
    if name == "criteo-multihot":
        cols.update({c: "list<int>" for c, _, _ in MULTIHOT_LISTS})
    cols[LABEL] = "int"
    return cols


def _check(name: str) -> None:
    if name not in PRESETS:
        from embtrain.errors import UserInputError

        raise UserInputError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")


def preset_recipe_yaml(name: str, data_dir: str | None = None, dim: int = 16,
                       batch_size: int = 8192) -> str:
    """A complete, valid recipe (DLRM) that reads a preset's data from ``data_dir``.

    ``data_dir`` defaults to ``data/<name>``, i.e. what ``gen-data --preset NAME --out
    data/<name>`` writes.
    """
    _check(name)
    data_dir = data_dir or f"data/{name}"
    if name in SPARSE_PRESETS:
        return _sparse_recipe_yaml(name, data_dir, dim, batch_size)
    dense = ", ".join(CRITEO_DENSE)
    lines = [
        f"# Generated by embtrain.data.presets.preset_recipe_yaml({name!r})",
        "version: 1",
        f"name: {name.replace('-', '_')}",
        "data:",
        f"  train: {data_dir}/train/*.parquet",
        f"  eval: {data_dir}/eval/*.parquet",
        f"  label: {LABEL}",
        f"  batch_size: {batch_size}",
        "features:",
        f"  - {{kind: dense, name: dense, columns: [{dense}], transform: log1p, "
        f"fill_null: {DENSE_FILL_NULL}}}",
    ]
    lines += [f"  - {{kind: categorical, name: {c}, column: {c}, table: {c.lower()}}}"
              for c, _ in CRITEO_CATEGORICAL]
    tables = [(c.lower(), rows) for c, rows in CRITEO_CATEGORICAL]
    if name == "criteo-multihot":
        for c, rows, hot in MULTIHOT_LISTS:
            lines.append(f"  - {{kind: categorical, name: {c}, column: {c}, table: {c.lower()}, "
                         f"hotness: {hot}, combiner: mean}}")
            tables.append((c.lower(), rows))
    lines.append("tables:")
    lines += [f"  - {{name: {t}, dim: {dim}, rows: {rows}}}" for t, rows in tables]
    lines += [
        "optimizer:",
        "  sparse: {type: adagrad, lr: 0.05}",
        "  dense: {type: adam, lr: 0.001}",
        "model:",
        "  type: dlrm",
        f"  bottom: [64, {dim}]",
        "  top: [128, 64, 1]",
        "train:",
        "  epochs: 1",
        "  seed: 0",
    ]
    return "\n".join(lines) + "\n"


def _sparse_recipe_yaml(name: str, data_dir: str, dim: int, batch_size: int) -> str:
    dynamic = name == "sparse-ids"
    lines = [
        f"# Generated by embtrain.data.presets.preset_recipe_yaml({name!r})",
        "# sparse-ids: int64 ids read by dynamic tables; sparse-ids-dense: the same data with",
        "# ids remapped to 0..universe-1, read by static tables of that many rows.",
        "version: 1",
        f"name: {name.replace('-', '_')}",
        "data:",
        f"  train: {data_dir}/train/*.parquet",
        f"  eval: {data_dir}/eval/*.parquet",
        f"  label: {LABEL}",
        f"  batch_size: {batch_size}",
        "features:",
        f"  - {{kind: dense, name: dense, columns: [{', '.join(SPARSE_DENSE)}], "
        f"transform: log1p, fill_null: {DENSE_FILL_NULL}}}",
    ]
    for column, table, hot in SPARSE_COLUMNS:
        extra = "" if hot == 1 else f", hotness: {hot}, combiner: mean"
        lines.append(f"  - {{kind: categorical, name: {column}, column: {column}, "
                     f"table: {table}{extra}}}")
    lines.append("tables:")
    for table, universe, _ in SPARSE_TABLES:
        size = f"dynamic: {{capacity: {universe}}}" if dynamic else f"rows: {universe}"
        lines.append(f"  - {{name: {table}, dim: {dim}, {size}}}")
    lines += [
        "optimizer:",
        "  sparse: {type: adagrad, lr: 0.05}",
        "  dense: {type: adam, lr: 0.001}",
        "model:",
        "  type: dlrm",
        f"  bottom: [64, {dim}]",
        "  top: [128, 64, 1]",
        "train:",
        "  epochs: 1",
        "  seed: 0",
    ]
    return "\n".join(lines) + "\n"


def preset_recipe(name: str, data_dir: str | None = None) -> Recipe:
    """The validated recipe of :func:`preset_recipe_yaml`."""
    return parse_recipe_text(preset_recipe_yaml(name, data_dir), f"<preset {name}>")


def preset_plan(name: str, recipe: Recipe) -> GenPlan:
    """What ``gen-data --preset NAME`` writes for the preset's ``recipe``.

    The Criteo presets: :func:`~embtrain.data.gen.make_plan` of the recipe. ``sparse-ids``
    and ``sparse-ids-dense``: the same plan for both (so the same rows and labels), each
    table's universe, growth in :data:`SPARSE_STAGES` stages, and the table's encoding
    (``sparse-ids``) or dense logical ids (``sparse-ids-dense``).
    """
    _check(name)
    plan = make_plan(recipe)
    if name not in SPARSE_PRESETS:
        return plan
    tables = {t: (universe, encoding) for t, universe, encoding in SPARSE_TABLES}
    ids = tuple(
        dataclasses.replace(
            c, space=tables[c.table][0], stages=SPARSE_STAGES,
            encoding=tables[c.table][1] if name == "sparse-ids" else "dense")
        for c in plan.ids)
    return dataclasses.replace(plan, ids=ids, interactions=interaction_pairs(ids))
