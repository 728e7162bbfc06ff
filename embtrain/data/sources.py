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
("NA" is a string id). Empty lines are skipped, as pyarrow's reader skips them: a file's row
count is its count of non-empty lines (less the header), and a row position is turned into the
count of lines before it (pyarrow's ``skip_rows`` counts empty lines too), so text with empty
lines gives the rows the same data in Parquet gives. A field holding a line break is not
supported.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from embtrain.data.columns import ReadSpec, check_schema
from embtrain.errors import DataError
from embtrain.recipe.models import Data

TEXT_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".txt": "tsv"}
_BLOCK_BYTES = 4 << 20  # bytes per decoded block of a text file (first try)
#: The largest block a text file is read in: a row (a line, quoted line breaks included) must
#: fit in one block; a longer one is grown into up to this.
MAX_BLOCK_BYTES = 1 << 30
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
            _check_names(paths[0], spec)  # a column named twice: said as such
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


def _check_names(path: str, spec: ReadSpec) -> None:
    """A Parquet file with a column name twice (which pyarrow's dataset refuses): one line."""
    try:
        names = pq.read_schema(path).names
    except (pa.ArrowException, OSError):
        return
    check_schema(spec, pq.read_schema(path), path)  # a column the recipe reads, twice
    twice = [n for n in dict.fromkeys(names) if names.count(n) > 1]
    if twice:
        raise DataError(f"{path}: column '{twice[0]}' appears {names.count(twice[0])} times in "
                        "the file; rename all but one")


# --------------------------------------------------------------------------------- text


def text_names(path: str, delimiter: str, header: bool, declared: list[str]) -> list[str]:
    """A text file's column names: its header row's (a name may be quoted), else
    ``declared`` (``data.columns``)."""
    if not header:
        return declared
    try:
        with open(path, "rb") as f:
            first = f.readline()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        line = first.decode("utf-8-sig").rstrip("\r\n")  # a byte-order mark is no name
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: cannot read the header row: {exc}") from None
    names = next(csv.reader([line], delimiter=delimiter, quotechar='"'), []) if line else []
    if not names:
        raise DataError(f"{path}: empty file: no header row (set data.header: false and "
                        "data.columns for files without one)")
    return names


def _text_layout(data: Data, fmt: str) -> tuple[str, bool, list[str]]:
    """(delimiter, whether files have a header row, ``data.columns`` names) of text files."""
    header = data.header if data.header is not None else data.columns is None
    return ("," if fmt == "csv" else "\t"), header, list(data.columns or {})


def column_names(path: str, data: Data) -> list[str]:
    """The column names of ``path``, read as the recipe's ``data`` reads it (Parquet, or
    CSV/TSV by ``data.format`` or the extension)."""
    fmt = file_format(path, data.format)
    if fmt == "parquet":
        try:
            return list(pq.read_schema(path).names)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: not a readable Parquet file: {exc}{_TEXT_HINT}") from None
    return text_names(path, *_text_layout(data, fmt))


def read_columns(path: str, data: Data, columns: list[str],
                 types: dict[str, pa.DataType] | None = None) -> pa.Table:
    """Every row of ``columns`` of ``path`` (read as :func:`column_names` reads it); a text
    column is typed by ``types``, else a string."""
    fmt = file_format(path, data.format)
    try:
        if fmt == "parquet":
            return pq.read_table(path, columns=columns)
        delimiter, header, declared = _text_layout(data, fmt)
        convert = pacsv.ConvertOptions(
            column_types={c: (types or {}).get(c, pa.string()) for c in columns},
            include_columns=columns, null_values=[""], strings_can_be_null=True,
            quoted_strings_can_be_null=False)
        block = _BLOCK_BYTES
        while True:  # a larger block when a row does not fit in one
            read = pacsv.ReadOptions(block_size=block, column_names=None if header else declared)
            try:
                return pacsv.read_csv(path, read, pacsv.ParseOptions(delimiter=delimiter,
                                                                     quote_char='"'), convert)
            except pa.ArrowInvalid as exc:
                if not _straddles(exc) or block >= MAX_BLOCK_BYTES:
                    raise
                block = min(block * 4, MAX_BLOCK_BYTES)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot read columns {', '.join(columns)}: "
                        f"{_first_line(exc)}") from None


def _straddles(exc: BaseException) -> bool:
    """pyarrow's error for a row longer than the block a text file is read in."""
    return "straddl" in str(exc) or "block size" in str(exc)


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


_LF, _CR = 10, 13


def _line_starts(path: str) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Per block of ``path``: (its offset, where a line starts, where a non-empty one does),
    as pyarrow's reader cuts lines: a line ends at ``\n``, ``\r\n`` or ``\r``; an empty
    line is one with nothing between its start and its end."""
    carry, offset = _LF, 0  # the file starts as if after a line break
    with open(path, "rb") as f:
        while block := f.read(_COUNT_BYTES):
            yield offset, *_starts(block, carry)
            carry, offset = block[-1], offset + len(block)


def _starts(block: bytes, carry: int) -> tuple[np.ndarray, np.ndarray]:
    """Where a line starts in ``block`` and where a non-empty one does (``carry``: the byte
    before it; see :func:`_line_starts`)."""
    a = np.frombuffer(block, np.uint8)
    prev = np.empty_like(a)
    prev[0], prev[1:] = carry, a[:-1]
    after_lf, after_cr = prev == _LF, prev == _CR
    line = after_lf | (after_cr & (a != _LF))
    filled = (after_lf | after_cr) & (a != _LF) & (a != _CR)
    return line, filled


@lru_cache(maxsize=4096)
def _count_text_rows(path: str, size: int, mtime_ns: int) -> tuple[int, int]:
    """(non-empty lines, lines) of a text file. A block without ``\r`` or an empty line (the
    usual one) is counted by ``bytes.count``; others by :func:`_starts`."""
    filled = lines = 0
    carry = _LF
    with open(path, "rb") as f:
        while block := f.read(_COUNT_BYTES):
            if carry != _CR and b"\r" not in block and b"\n\n" not in block and not (
                    carry == _LF and block[0] == _LF):
                n = (1 if carry == _LF else 0) + block.count(b"\n", 0, len(block) - 1)
                lines, filled = lines + n, filled + n
            else:
                line, full = _starts(block, carry)
                lines += int(np.count_nonzero(line))
                filled += int(np.count_nonzero(full))
            carry = block[-1]
    return filled, lines


def count_text_rows(path: str) -> tuple[int, int]:
    """(non-empty lines, all lines) of ``path``: the rows pyarrow reads (with the header) and
    the lines its ``skip_rows`` counts (cached per path, size and modification time)."""
    st = os.stat(path)
    return _count_text_rows(path, st.st_size, st.st_mtime_ns)


def lines_before(path: str, filled: int) -> int:
    """The number of lines (empty ones included) before the non-empty line number ``filled``
    (0-based) of ``path``; all lines when it has fewer."""
    seen = before = 0
    for _, line, full in _line_starts(path):
        starts = np.flatnonzero(full)
        if seen + starts.size > filled:
            at = starts[filled - seen]
            return before + int(np.count_nonzero(line[:at]))
        seen += starts.size
        before += int(np.count_nonzero(line))
    return before


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
        self.delimiter, self.header, self.declared_names = _text_layout(data, fmt)
        self.types = column_types(spec, data)
        # a field may be quoted (pyarrow's write_csv quotes header names and strings, in
        # CSV and TSV alike); a quote inside an unquoted field is text
        self.parse = pacsv.ParseOptions(delimiter=self.delimiter, quote_char='"')
        self.convert = pacsv.ConvertOptions(
            column_types=self.types, include_columns=spec.columns, null_values=[""],
            strings_can_be_null=True, quoted_strings_can_be_null=False)
        infos, self.names, self.schemas = [], [], []
        self.empty_lines: list[int] = []  # per file: where rows and lines differ
        for path in paths:
            names = self._names(path)
            schema = pa.schema([(n, self.types.get(n, pa.string())) for n in names])
            self.schemas.append(schema)
            if check:
                check_schema(spec, schema, path)
            else:  # read what is there (validate --data reports what is not)
                self.convert.include_columns = [c for c in spec.columns if c in names]
            try:
                filled, lines = count_text_rows(path)
            except OSError as exc:
                raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
            infos.append(FileInfo(path, (max(filled - (1 if self.header else 0), 0),)))
            self.names.append(names)
            self.empty_lines.append(lines - filled)
        self.infos: tuple[FileInfo, ...] = tuple(infos)
        self.decoded_rows = 0  # rows decoded so far (a measure of reader work)
        self.block_bytes = _BLOCK_BYTES  # grown when a row does not fit (:meth:`_grow_block`)

    def _names(self, path: str) -> list[str]:
        return text_names(path, self.delimiter, self.header, self.declared_names)

    def _read_options(self, index: int, skip: int, **more: object) -> pacsv.ReadOptions:
        """pyarrow's options to read file ``index`` from row ``skip`` on: its ``skip_rows``
        count lines, empty ones too, so a row is turned into the lines before it."""
        lines = skip
        if skip and self.empty_lines[index]:
            header = 1 if self.header else 0
            lines = lines_before(self.infos[index].path, skip + header) - header
        return pacsv.ReadOptions(
            block_size=self.block_bytes,
            column_names=None if self.header else self.names[index],
            skip_rows=0 if self.header else lines,
            skip_rows_after_names=lines if self.header else 0, **more)

    def tables(self, index: int, skip: int) -> Iterator[tuple[pa.Table, int]]:
        """File ``index``'s rows from row ``skip`` on, as (table, first row's file row)."""
        info = self.infos[index]
        base = skip
        while True:  # again from ``base`` with a larger block when a row did not fit in one
            read = self._read_options(index, base, use_threads=True)
            try:
                stream = pacsv.open_csv(info.path, read, self.parse, self.convert)
            except (pa.ArrowException, OSError) as exc:
                if self._grow_block(index, base, exc):
                    continue
                raise self._error(index, base, exc) from None
            try:
                while True:
                    try:
                        batch = stream.read_next_batch()
                    except StopIteration:
                        return
                    except (pa.ArrowException, OSError) as exc:
                        if self._grow_block(index, base, exc):
                            break
                        raise self._error(index, base, exc) from None
                    self.decoded_rows += batch.num_rows
                    if batch.num_rows:
                        yield pa.Table.from_batches([batch]), base
                        base += batch.num_rows
            finally:
                stream.close()

    def _grow_block(self, index: int, row: int, exc: BaseException) -> bool:
        """Whether ``exc`` is pyarrow's "straddles two block boundaries" (a row longer than a
        block): the block is made 4 times larger (True), up to :data:`MAX_BLOCK_BYTES`, past
        which the row is refused in one line."""
        if not _straddles(exc):
            return False
        if self.block_bytes >= MAX_BLOCK_BYTES:
            raise DataError(f"{self.infos[index].path}: a row at or after row {row} is longer "
                            f"than {MAX_BLOCK_BYTES >> 20} MiB, the largest block a text file is "
                            "read in; shorten that field, or store the data as Parquet")
        self.block_bytes = min(self.block_bytes * 4, MAX_BLOCK_BYTES)
        return True


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
        ragged = re.match(r"CSV parse error: Expected (\d+) columns, got (\d+)", str(exc))
        if ragged:
            want = int(ragged.group(1))
            for row, fields in self._rows(index, start):
                if len(fields) != want:
                    return DataError(f"{path}: row {row} has {len(fields)} fields, expected "
                                     f"{want} (one per column of the "
                                     f"{'header' if self.header else 'data.columns'})")
        if match is None and "invalid UTF8" in str(exc):
            utf8 = re.match(r"In CSV column #(\d+)", str(exc))
            column = int(utf8.group(1)) if utf8 else None
            for row, fields in self._rows(index, start):
                bad = [i for i, f in enumerate(fields) if _undecodable(f)]
                if bad and (column is None or column in bad):
                    at = column if column is not None else bad[0]
                    name = names[at] if at < len(names) else f"#{at}"
                    return DataError(f"{path}: column '{name}': row {row} is not UTF-8 text "
                                     f"({fields[at].encode('utf-8', 'surrogateescape')[:40]!r})")
        return DataError(f"{path}: cannot read rows from row {start} on: {_first_line(exc)}")

    def _rows(self, index: int, start: int) -> Iterator[tuple[int, list[str]]]:
        """(row, fields) of file ``index`` from row ``start`` on, parsed line by line in Python
        (the error path only: to name the row pyarrow's message does not)."""
        quoting = {"quotechar": '"'}
        path, row = self.infos[index].path, -1 if self.header else 0  # the header: row -1
        with open(path, "rb") as f:
            for raw in f:
                line = raw.decode("utf-8", "surrogateescape").rstrip("\r\n")
                if not line:
                    continue
                if row >= start:
                    yield row, next(csv.reader([line], delimiter=self.delimiter, **quoting), [])
                row += 1

    def _first_bad(self, index: int, start: int, column: str, to: pa.DataType
                   ) -> tuple[int, str] | None:
        """(row, text) of the first value of ``column`` from ``start`` on that is not a ``to``
        (the error path only: the column is read again as text)."""
        read = self._read_options(index, start)
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


def _undecodable(text: str) -> bool:
    """Whether ``text`` (decoded with ``surrogateescape``) held bytes that are not UTF-8."""
    return any("\udc80" <= c <= "\udcff" for c in text)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def open_files(paths: list[str], spec: ReadSpec, data: Data, what: str) -> ParquetFiles | TextFiles:
    """The split's files as a source of tables, by ``data.format`` or the files' extension."""
    fmt = split_format(paths, data.format, what)
    if fmt == "parquet":
        return ParquetFiles(paths, spec)
    return TextFiles(paths, spec, data, fmt)


def first_rows(path: str, spec: ReadSpec, data: Data, rows: int | None
               ) -> tuple[pa.Schema, pa.Table]:
    """A file's schema (text: as the reader types it) and its first ``rows`` rows (``None``:
    all) of the columns the recipe reads that it has; no check (``validate --data``)."""
    fmt = file_format(path, data.format)
    if fmt == "parquet":
        try:
            parquet = pq.ParquetFile(path)
            schema = parquet.schema_arrow
            present = [c for c in spec.columns if c in schema.names]
            if rows is None:
                table = parquet.read(columns=present)
            else:
                batch = next(parquet.iter_batches(batch_size=rows, columns=present), None)
                table = (pa.Table.from_batches([batch]) if batch is not None
                         else schema.empty_table())
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: not a readable Parquet file: {exc}{_TEXT_HINT}") from None
        return schema, table
    text = TextFiles([path], spec, data, fmt, check=False)
    empty = pa.schema([(c, text.types[c]) for c in text.convert.include_columns]).empty_table()
    parts: list[pa.Table] = []
    got = 0
    for part, _ in text.tables(0, 0):
        parts.append(part)
        got += part.num_rows
        if rows is not None and got >= rows:
            break
    table = pa.concat_tables(parts) if parts else empty
    return text.schemas[0], table if rows is None else table.slice(0, rows)
