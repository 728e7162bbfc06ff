"""Writing a checkpoint of embeddings sharded over several ranks: the writer on rank 0 asks
for tables one at a time; every rank serves the same collectives in the same order.

:class:`CollectiveExport` adapts a :class:`~embtrain.embedding.sharded.ShardedEmbedding` to the
engine-like view :meth:`~embtrain.checkpoint.manager.CheckpointManager.save` writes from.
"""

from __future__ import annotations

from collections.abc import Iterator

from embtrain.checkpoint.layout import chunk_rows, config_row_bytes
from embtrain.embedding import TableConfig, TableState
from embtrain.embedding.sharded import ShardedEmbedding


class CollectiveExport:
    """An engine-like view of a :class:`ShardedEmbedding` over several ranks for writing a
    checkpoint on rank 0, with every table exported only when the writer asks for it.

    Rank 0 passes it to ``CheckpointManager.save``, which asks for the tables in
    ``table_names`` order: a tiered table as chunks (:meth:`ShardedEmbedding.table_stream`,
    written as they arrive), the others whole (:meth:`ShardedEmbedding.export_table`). Every
    rank then calls :meth:`drain`: on rank 0 it runs the collectives a failed write left out,
    on the others all of them, in the same order, so no rank waits forever for another.
    """

    def __init__(self, embedding: ShardedEmbedding, rows: int | None = None):
        self._embedding = embedding
        self.optimizer = embedding.optimizer
        self._rows = rows
        self._next = 0  # the next table whose collectives have not started
        self._open: Iterator[TableState | None] | None = None  # chunks of a table under way

    @property
    def table_names(self) -> tuple[str, ...]:
        return self._embedding.table_names

    @property
    def slot_names(self) -> tuple[str, ...]:
        return self._embedding.slot_names

    def table_config(self, name: str) -> TableConfig:
        return self._embedding.table_config(name)

    def streams(self, name: str) -> bool:
        return self._embedding.streams(name)

    def _start(self, name: str) -> None:
        names = self.table_names
        if self._next >= len(names) or names[self._next] != name:
            raise RuntimeError(f"table {name!r} exported out of order; the ranks' collectives "
                               "must run in table order")
        if self._open is not None:
            for _ in self._open:  # a table's chunks not taken: the other ranks still serve
                pass
            self._open = None
        self._next += 1

    def export_table(self, name: str) -> TableState:
        """The whole (untiered) table, gathered on rank 0 (collective)."""
        self._start(name)
        state = self._embedding.export_table(name)
        assert state is not None, "the writer runs on rank 0"
        return state

    def rows(self, name: str) -> int:
        """Rows per chunk of table ``name``: the ``rows`` given, else the checkpoint's
        default for the table's width (from the configuration: the same on every rank)."""
        if self._rows is not None:
            return max(1, int(self._rows))
        return chunk_rows(config_row_bytes(self.table_config(name).dim, len(self.slot_names)))

    def table_stream(self, name: str, rows: int) -> tuple[int, Iterator[TableState]]:
        """A tiered table's total rows and chunks (collective), cut at :meth:`rows` rows on
        every rank whatever ``rows`` the writer asks for."""
        self._start(name)
        total, chunks = self._embedding.table_stream(name, self.rows(name))
        self._open = chunks
        return total, (c for c in chunks if c is not None)

    def drain(self) -> None:
        """Run every collective of the tables not exported yet (all of them on ranks other
        than 0), in order."""
        if self._open is not None:
            for _ in self._open:
                pass
            self._open = None
        names = self.table_names
        while self._next < len(names):
            name = names[self._next]
            self._next += 1
            if self.streams(name):
                for _ in self._embedding.table_stream(name, self.rows(name))[1]:
                    pass
            else:
                self._embedding.export_table(name)


__all__ = ["CollectiveExport"]
