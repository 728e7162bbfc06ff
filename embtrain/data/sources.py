"""Input files of one split as Arrow tables: Parquet, or CSV/TSV streamed by pyarrow's reader.

Both kinds give the reader the same view: per file its row count cut into *groups*
(Parquet row groups; a text file is one group) and, from a row on, the file's rows as a
sequence of Arrow tables holding the columns the recipe reads. Everything above (file order,
shuffle windows, ranks, resume positions) is the same for every format.

Text files: the first row names the columns (``data.header``, default true unless
``data.columns`` is given, which then lists every column in file order). A column the recipe
reads has a fixed type, not an inferred one: its ``data.columns`` type (``int``: int64,
``float``: float64, ``string``), else its role (dense and label columns float64, integer ids
int64, string ids string, weights float64). An empty field is a null; other text is a value
("NA" is a string id). Row counts are the file's line count (less the header), so a field
holding a line break is not supported, nor is an empty line in the middle of a file.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from embtrain.data.columns import ReadSpec, check_schema
from embtrain.errors import DataError
from embtrain.recipe.models import Data

TEXT_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".txt": "tsv"}
_BLOCK_BYTES = 4 << 20  # bytes per decoded block of a text file
_COUNT_BYTES = 16 << 20


@dataclass(frozen=True)
class FileInfo:
    """One input file: its path and the row count of each group (Parquet: row group)."""

    path: str
    group_rows: tuple[int, ...]

    @property
    def rows(self) -> int:
        return sum(self.group_rows)


def file_format(path: str, declared: str | None) -> str:
    """``declared`` (``data.format``) or the format the file's extension says."""
    if declared is not None:
        return declared
    return TEXT_EXTENSIONS.get(os.path.splitext(path)[1].lower(), "parquet")


def split_format(paths: list[str], declared: str | None, what: str) -> str:
    """The one format of a split's files; files of several formats are a DataError."""
    kinds = {file_format(p, declared) for p in paths}
    if len(kinds) > 1:
        a, b = sorted(kinds)[:2]
        pa_ = next(p for p in paths if file_format(p, declared) == a)
        pb = next(p for p in paths if file_format(p, declared) == b)
        raise DataError(f"{what}: files of two formats ({pa_} is {a}, {pb} is {b}); "
                        "set data.format or narrow the glob")
    return kinds.pop() if kinds else "parquet"


# ------------------------------------------------------------------------------ Parquet


class ParquetFiles:
    """A split's Parquet files: footers read and schemas checked up front."""

    def __init__(self, paths: list[str], spec: ReadSpec):
        self.spec = spec
        try:  # the factory reads the first file's schema; every file's is checked below
            self._dataset = ds.dataset(paths, format="parquet")
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{paths[0]}: not a readable Parquet file: {exc}{_TEXT_HINT}") from None
        fragments = {os.path.normpath(f.path): f for f in self._dataset.get_fragments()}
        self.fragments: list[ds.ParquetFileFragment] = [fragments[os.path.normpath(p)]
                                                        for p in paths]
        infos = []
        for path, fragment in zip(paths, self.fragments, strict=True):
            try:
                schema = fragment.physical_schema
                meta = fragment.metadata
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{path}: not a readable Parquet file: {exc}{_TEXT_HINT}") from None
            check_schema(spec, schema, path)
            infos.append(FileInfo(path, tuple(meta.row_group(g).num_rows
                                              for g in range(meta.num_row_groups))))
        self.infos: tuple[FileInfo, ...] = tuple(infos)
        self.decoded_rows = 0  # rows decoded so far (a measure of reader work)

    def open(self, index: int) -> pq.ParquetFile:
        """File ``index`` opened with its footer as read up front (close it after use)."""
        info = self.infos[index]
        try:
            return pq.ParquetFile(info.path, metadata=self.fragments[index].metadata)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{info.path}: cannot open: {exc}") from None

    def tables(self, index: int, skip: int) -> Iterator[tuple[pa.Table, int]]:
        """File ``index``'s rows from row ``skip`` on, as (table, first row's file row)."""
        info = self.infos[index]
        parquet = self.open(index)
        try:
            base = 0
            for g, rows in enumerate(info.group_rows):
                if skip >= rows:
                    skip -= rows
                    base += rows
                    continue
                try:
                    table = parquet.read_row_group(g, columns=self.spec.columns, use_threads=True)
                except (pa.ArrowException, OSError) as exc:
                    raise DataError(f"{info.path}: cannot read row group {g}: {exc}") from None
                self.decoded_rows += table.num_rows
                yield (table.slice(skip) if skip else table), base + skip
                base += rows
                skip = 0
        finally:
            parquet.close()


_TEXT_HINT = " (for CSV or TSV files set data.format: csv or tsv)"


# --------------------------------------------------------------------------------- text


@lru_cache(maxsize=4096)
def _count_lines(path: str, size: int, mtime_ns: int) -> int:
    """Lines of a text file (a last line without a line break counts)."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(_COUNT_BYTES):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (0 if last == b"\n" else 1)


def count_lines(path: str) -> int:
    """Lines of ``path`` (cached per path, size and modification time)."""
    st = os.stat(path)
    return _count_lines(path, st.st_size, st.st_mtime_ns)


def text_digest(path: str) -> str:
    """A digest of a text file's size and its first and last MiB (for the data fingerprint)."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read())
    return h.hexdigest()[:16]


_ROLE_TYPES = {"int": pa.int64(), "float": pa.float64(), "string": pa.string()}


def column_types(spec: ReadSpec, data: Data) -> dict[str, pa.DataType]:
    """The type each column the recipe reads is decoded as (see the module docstring)."""
    types: dict[str, pa.DataType] = {c: pa.float64() for d in spec.dense for c in d.columns}
    for column, _ in spec.label_columns:
        types[column] = pa.float64()
    for s in spec.sparse:
        types[s.column] = pa.string() if s.string_ids else pa.int64()
        if s.weights:
            types[s.weights] = pa.float64()
    for col, declared in (data.columns or {}).items():
        if declared in _ROLE_TYPES:
            types[col] = _ROLE_TYPES[declared]
    return types


class TextFiles:
    """A split's CSV or TSV files: header and line count read up front, rows streamed."""

    def __init__(self, paths: list[str], spec: ReadSpec, data: Data, fmt: str,
                 check: bool = True):
        self.spec = spec
        self.delimiter = "," if fmt == "csv" else "\t"
        self.header = data.header if data.header is not None else data.columns is None
        self.declared_names = list(data.columns or {})
        self.types = column_types(spec, data)
        self.parse = pacsv.ParseOptions(delimiter=self.delimiter,
                                        quote_char='"' if fmt == "csv" else False)
        self.convert = pacsv.ConvertOptions(
            column_types=self.types, include_columns=spec.columns, null_values=[""],
            strings_can_be_null=True, quoted_strings_can_be_null=False)
        infos, self.names, self.schemas = [], [], []
        for path in paths:
            names = self._names(path)
            schema = pa.schema([(n, self.types.get(n, pa.string())) for n in names])
            self.schemas.append(schema)
            if check:
                check_schema(spec, schema, path)
            else:  # read what is there (validate --data reports what is not)
                self.convert.include_columns = [c for c in spec.columns if c in names]
            try:
                rows = count_lines(path) - (1 if self.header else 0)
            except OSError as exc:
                raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
            infos.append(FileInfo(path, (max(rows, 0),)))
            self.names.append(names)
        self.infos: tuple[FileInfo, ...] = tuple(infos)
        self.decoded_rows = 0  # rows decoded so far (a measure of reader work)

    def _names(self, path: str) -> list[str]:
        if not self.header:
            return self.declared_names
        try:
            with open(path, "rb") as f:
                first = f.readline()
        except OSError as exc:
            raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
        try:
            line = first.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: cannot read the header row: {exc}") from None
        quoting = {"quotechar": '"'} if self.delimiter == "," else {"quoting": csv.QUOTE_NONE}
        names = next(csv.reader([line], delimiter=self.delimiter, **quoting), []) if line else []
        if not names:
            raise DataError(f"{path}: empty file: no header row (set data.header: false and "
                            "data.columns for files without one)")
        return names

    def tables(self, index: int, skip: int) -> Iterator[tuple[pa.Table, int]]:
        """File ``index``'s rows from row ``skip`` on, as (table, first row's file row)."""
        info = self.infos[index]
        read = pacsv.ReadOptions(
            use_threads=True, block_size=_BLOCK_BYTES,
            column_names=None if self.header else self.names[index],
            skip_rows=0 if self.header else skip, skip_rows_after_names=skip if self.header else 0)
        try:
            stream = pacsv.open_csv(info.path, read, self.parse, self.convert)
        except (pa.ArrowException, OSError) as exc:
            raise self._error(index, skip, exc) from None
        base = skip
        try:
            while True:
                try:
                    batch = stream.read_next_batch()
                except StopIteration:
                    return
                except (pa.ArrowException, OSError) as exc:
                    raise self._error(index, base, exc) from None
                self.decoded_rows += batch.num_rows
                if batch.num_rows:
                    yield pa.Table.from_batches([batch]), base
                    base += batch.num_rows
        finally:
            stream.close()


    def _error(self, index: int, start: int, exc: BaseException) -> DataError:
        """One line for a read failure; a value that does not convert is named with its row."""
        path = self.infos[index].path
        match = re.match(r"In CSV column #(\d+): CSV conversion error to (\w+): invalid value",
                         str(exc))
        names = self.names[index]
        if match and int(match.group(1)) < len(names):
            column = names[int(match.group(1))]
            found = self._first_bad(index, start, column, self.types.get(column, pa.string()))
            if found is not None:
                row, value = found
                kind = {"int64": "an integer", "double": "a number"}.get(match.group(2),
                                                                          match.group(2))
                return DataError(f"{path}: column '{column}': value {value!r} at row {row} is "
                                 f"not {kind}")
        return DataError(f"{path}: cannot read rows from row {start} on: {_first_line(exc)}")

    def _first_bad(self, index: int, start: int, column: str, to: pa.DataType
                   ) -> tuple[int, str] | None:
        """(row, text) of the first value of ``column`` from ``start`` on that is not a ``to``
        (the error path only: the column is read again as text)."""
        read = pacsv.ReadOptions(
            block_size=_BLOCK_BYTES, column_names=None if self.header else self.names[index],
            skip_rows=0 if self.header else start, skip_rows_after_names=start if self.header else 0)
        convert = pacsv.ConvertOptions(column_types={column: pa.string()},
                                       include_columns=[column], null_values=[""],
                                       strings_can_be_null=True)
        try:
            row = start
            for batch in pacsv.open_csv(self.infos[index].path, read, self.parse, convert):
                values = batch.column(0)
                try:
                    values.cast(to)
                except pa.ArrowInvalid:
                    for i, v in enumerate(values.to_pylist()):
                        if v is not None:
                            try:
                                pa.array([v]).cast(to)
                            except pa.ArrowInvalid:
                                return row + i, v
                row += batch.num_rows
        except (pa.ArrowException, OSError):
            return None
        return None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def open_files(paths: list[str], spec: ReadSpec, data: Data, what: str) -> ParquetFiles | TextFiles:
    """The split's files as a source of tables, by ``data.format`` or the files' extension."""
    fmt = split_format(paths, data.format, what)
    if fmt == "parquet":
        return ParquetFiles(paths, spec)
    return TextFiles(paths, spec, data, fmt)


def first_rows(path: str, spec: ReadSpec, data: Data, rows: int) -> tuple[pa.Schema, pa.Table]:
    """A file's schema (text: as the reader types it) and its first ``rows`` rows of the
    columns the recipe reads that it has; no check (``validate --data``)."""
    fmt = file_format(path, data.format)
    if fmt == "parquet":
        try:
            parquet = pq.ParquetFile(path)
            schema = parquet.schema_arrow
            present = [c for c in spec.columns if c in schema.names]
            batch = next(parquet.iter_batches(batch_size=rows, columns=present), None)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: not a readable Parquet file: {exc}{_TEXT_HINT}") from None
        table = pa.Table.from_batches([batch]) if batch is not None else schema.empty_table()
        return schema, table
    text = TextFiles([path], spec, data, fmt, check=False)
    table = next(text.tables(0, 0), (None, 0))[0]
    if table is None:
        table = pa.schema([(c, text.types[c]) for c in text.convert.include_columns]).empty_table()
    return text.schemas[0], table.slice(0, rows)
