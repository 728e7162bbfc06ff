"""Write generated Parquet data as CSV or TSV (``embtrain gen-data --format tsv``).

The text holds exactly the values of the Parquet file: float32 columns are written as the
shortest decimal of their float64 value, which the reader parses back to the same float64 and
narrows to the same float32; a null is an empty field; columns follow ``data.columns`` when the
recipe lists them (Criteo's raw layout: label, I1..I13, C1..C26, no header), else the Parquet
order with a header row. A string holding the delimiter, a quote or a line break is refused
(text files here are written without quoting).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from embtrain.data.gen_plan import GenResult
from embtrain.errors import UserInputError
from embtrain.recipe.models import Recipe

EXTENSIONS = {"csv": ".csv", "tsv": ".tsv"}


def text_layout(recipe: Recipe) -> tuple[bool, list[str] | None]:
    """(header row?, column order or None for the file's own) of a recipe's text files."""
    data = recipe.data
    header = data.header if data.header is not None else data.columns is None
    return header, (list(data.columns) if data.columns else None)


def write_text(table: pa.Table, path: Path, fmt: str, header: bool,
               columns: list[str] | None = None) -> None:
    """Write ``table`` (columns in ``columns`` order, or its own) to ``path`` as CSV or TSV."""
    delimiter = "," if fmt == "csv" else "\t"
    order = columns or table.column_names
    missing = [c for c in order if c not in table.column_names]
    if missing:
        raise UserInputError(f"{path}: data.columns names '{missing[0]}', which the recipe does "
                             "not read, so gen-data has no values for it")
    arrays = []
    for name in order:
        col = table.column(name)
        t = col.type
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            raise UserInputError(f"{path}: column '{name}' is a list; {fmt} files have no list "
                                 "columns")
        if pa.types.is_floating(t):
            col = col.cast(pa.float64())
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            for bad in (delimiter, "\n", "\r", '"'):
                if pc.any(pc.match_substring(col, bad)).as_py():
                    raise UserInputError(f"{path}: column '{name}' holds {bad!r} in a value; "
                                         "write Parquet instead")
        arrays.append(col)
    out = pa.table(arrays, names=order)
    for name in order if header else ():
        if any(c in name for c in (delimiter, "\n", "\r", '"')):
            raise UserInputError(f"{path}: column name {name!r} cannot be a header field")
    with pa.OSFile(str(path), "wb") as f:
        if header:  # written by hand: Arrow's writer would quote the names
            f.write((delimiter.join(order) + "\n").encode("utf-8"))
        pacsv.write_csv(out, f, pacsv.WriteOptions(
            include_header=False, delimiter=delimiter, quoting_style="none"))


def convert_dataset(out: Path, files: list[str], recipe: Recipe, fmt: str) -> list[str]:
    """Replace the Parquet ``files`` (relative to ``out``) by text files; their new names.

    ``dataset.json`` (when there) lists the new files and the format."""
    header, columns = text_layout(recipe)
    written = []
    for rel in files:
        src = out / rel
        dst = src.with_suffix(EXTENSIONS[fmt])
        tmp = dst.with_name(f".{dst.name}.tmp")
        write_text(pq.read_table(src), tmp, fmt, header, columns)
        tmp.replace(dst)
        src.unlink()
        written.append(str(dst.relative_to(out)))
    info_path = out / "dataset.json"
    if info_path.is_file():
        info = json.loads(info_path.read_text(encoding="utf-8"))
        renamed = dict(zip(files, written, strict=True))
        for split in ("train", "eval"):
            info.get("files", {})[split] = [renamed.get(p, p)
                                            for p in info.get("files", {}).get(split, [])]
        info["format"] = {"kind": fmt, "header": header, "columns": columns}
        info_path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return written


def as_text(result: GenResult, recipe: Recipe, fmt: str) -> GenResult:
    """A gen-data result with its Parquet files rewritten as ``fmt`` (a GenResult)."""
    train = convert_dataset(result.out, list(result.train_files) + list(result.eval_files),
                            recipe, fmt)
    n = len(result.train_files)
    return dataclasses.replace(result, train_files=tuple(train[:n]), eval_files=tuple(train[n:]))
