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
