"""What ``embtrain gen-data`` generates for a recipe: the columns (:class:`GenPlan`), the
options (:class:`GenConfig`) and the generator's fixed constants (see :mod:`embtrain.data.gen`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from embtrain.recipe.models import Recipe

LATENT_DIM = 4
LOGIT_STD = 1.45
TARGET_CTR = 0.25
NULL_RATE = 0.05
VARIABLE_MAX_LEN = 20
DYNAMIC_SPACE = 4
ROW_GROUP_ROWS = 131_072
SHARES = {"dense": 0.3, "categorical": 0.55, "interactions": 0.15}
MAX_INTERACTION_FEATURES = 4
EFFECT_DECAY = 0.15  # effect of logical id k is scaled by (1 + k) ** -EFFECT_DECAY
EXACT_HEAD = 1 << 20
CALIBRATION_ROWS = 100_000






@dataclass(frozen=True)
class DenseColumn:
    """One generated dense column."""

    name: str
    kind: str  # "count" | "signed" | "normal"
    integer: bool
    nulls: bool
    transform: str
    fill: float


@dataclass(frozen=True)
class IdColumn:
    """One generated id column (with its optional weight column)."""

    feature: str
    column: str
    table: str
    space: int  # logical ids drawn from [0, space)
    dynamic: bool
    hotness: int | None  # None: variable
    string_ids: bool
    weights: str | None
    exact: bool = False  # lists of exactly ``hotness`` ids (combiner: concat)
    encoding: str | None = None  # None: int64 for dynamic tables, dense otherwise
    stages: int = 1  # >1: the universe grows over the train split in this many stages

    @property
    def id_encoding(self) -> str:
        """How logical ids are written: ``dense``, ``int64`` or ``uint63``."""
        return self.encoding or ("int64" if self.dynamic else "dense")


@dataclass(frozen=True)
class GenPlan:
    """What to generate for a recipe."""

    dense: tuple[DenseColumn, ...]
    ids: tuple[IdColumn, ...]
    label: str
    label_float: bool
    interactions: tuple[tuple[int, int], ...]  # pairs of indices into ``ids``
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenConfig:
    """gen-data's arguments besides the recipe and the output folder."""

    rows: int = 200_000
    eval_rows: int = 50_000
    files: int = 4
    alpha: float = 1.05
    seed: int = 0


#: the options ``embtrain gen-data`` uses when given none
DEFAULT_CONFIG = GenConfig()


@dataclass(frozen=True)
class GenResult:
    """What gen-data wrote and the ground truth's quality on the eval split."""

    out: Path
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    rows: int
    eval_rows: int
    best_auc: float
    best_logloss: float
    ctr_train: float
    ctr_eval: float
    seconds: float
    columns: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def make_plan(recipe: Recipe) -> GenPlan:
    """Decide the columns to write for ``recipe``."""
    declared = recipe.data.columns or {}
    seen: set[str] = set()
    notes: list[str] = []
    dense: list[DenseColumn] = []
    for f in recipe.dense_features:
        kind = {"log1p": "count", "signed_log1p": "signed", "none": "normal"}[f.transform]
        for col in f.columns:
            if col in seen:
                continue
            seen.add(col)
            integer = declared.get(col, "int" if kind == "count" else "float") == "int"
            fill = 0.0 if f.fill_null is None else float(f.fill_null)
            dense.append(DenseColumn(col, kind, integer, f.fill_null is not None, f.transform, fill))
    ids: list[IdColumn] = []
    for f in recipe.categorical_features:
        if f.column in seen:
            continue
        seen.add(f.column)
        table = recipe.table(f.table)
        space = (int(table.dynamic.capacity) * DYNAMIC_SPACE if table.dynamic is not None
                 else int(table.rows or 1))
        if f.weights:
            seen.add(f.weights)
        if f.ids == "string" and table.dynamic is None and f.out_of_range == "error":
            notes.append(f"feature '{f.name}': string ids hash outside table '{table.name}' "
                         "rows; the reader needs out_of_range: modulo or a dynamic table")
        ids.append(IdColumn(f.name, f.column, table.name, space, table.dynamic is not None,
                            None if f.hotness == "variable" else int(f.hotness),
                            f.ids == "string", f.weights, f.combiner == "concat"))
    pairs = interaction_pairs(ids)
    label_float = declared.get(recipe.data.label) == "float"
    return GenPlan(tuple(dense), tuple(ids), recipe.data.label, label_float, pairs, tuple(notes))


def interaction_pairs(ids: tuple[IdColumn, ...] | list[IdColumn]) -> tuple[tuple[int, int], ...]:
    """Pairs of id columns whose latent vectors interact: those with the smallest universes
    of at least 100 ids (at most :data:`MAX_INTERACTION_FEATURES` columns)."""
    candidates = sorted(range(len(ids)), key=lambda i: (ids[i].space < 100, ids[i].space, i))
    chosen = sorted(candidates[:MAX_INTERACTION_FEATURES])
    return tuple((a, b) for i, a in enumerate(chosen) for b in chosen[i + 1:])


