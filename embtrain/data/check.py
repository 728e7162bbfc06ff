"""Checks of a recipe's data before training starts (cheap: Parquet footers only)."""

from __future__ import annotations

import sys

from embtrain.recipe.models import Recipe


def check_eval_split(recipe: Recipe) -> int | None:
    """Open every eval file and check its schema now, not at the first evaluation.

    Returns the split's row count (``None`` without ``data.eval``); a split with no rows is
    said on stderr, since every evaluation of the run will be skipped. Raises the reader's
    one-line :class:`~embtrain.errors.DataError` for a glob matching nothing, an unreadable
    file or a wrong schema.
    """
    if recipe.data.eval is None:
        return None
    from embtrain.data.reader import BatchReader

    reader = BatchReader(recipe, "eval", prefetch=0)
    rows = reader.total_rows
    if rows == 0:
        print(f"note: data.eval: the {len(reader.files)} file(s) hold no rows; "
              "every evaluation of this run is skipped", file=sys.stderr)
    return rows


#: Rows of each split's first file ``validate --data`` checks unless told (``--rows``).
CHECK_ROWS = 10_000


def check_data(recipe: Recipe, rows: int | None = CHECK_ROWS,
               notes: list[str] | None = None) -> list[str]:
    """``validate --data``: the first file of each split against the recipe, every problem.

    Every column the recipe reads: present, of the right type (:func:`schema_problems`), and
    its first ``rows`` values (``None``: every row of the file) as the reader takes them
    (nulls, NaN, list shapes, ids outside a static table, labels): one line per problem, file
    and column named. ``notes`` receives one line per split saying which rows were checked."""
    from embtrain.data.columns import read_spec, schema_problems, value_problems
    from embtrain.data.reader import list_files
    from embtrain.data.sources import first_rows
    from embtrain.errors import DataError

    spec = read_spec(recipe)
    out: list[str] = []
    for patterns, what in ((recipe.data.train, "data.train"), (recipe.data.eval, "data.eval")):
        if patterns is None:
            continue
        try:
            first = list_files(patterns, what)[0]
            schema, table = first_rows(first, spec, recipe.data, rows)
        except DataError as exc:
            out.append(str(exc))
            continue
        out += schema_problems(spec, schema, first)
        out += value_problems(table, spec, first)
        if notes is not None:
            n = table.num_rows
            notes.append(
                f"{what}: checked every row of {first} ({n:,} rows)" if rows is None else
                f"{what}: checked the first {n:,} rows of {first} (--rows 0: every row)"
                if n >= rows else f"{what}: checked every row of {first} ({n:,} rows)")
    return list(dict.fromkeys(out))
