"""What an embedding model is made of, by name: its tables, features and optimizer slots
(shared by :class:`~embtrain.embedding.engine.EmbeddingEngine` and
:class:`~embtrain.embedding.sharded.ShardedEmbedding`, which hold the same three)."""

from __future__ import annotations

from embtrain.embedding.config import FeatureConfig, TableConfig
from embtrain.embedding.optimizers import SlotSpec

__all__ = ["ModelCatalog"]


class ModelCatalog:
    """Names and configurations of a model's tables, features and optimizer slots; the
    class using it sets ``_tables`` (by name, in the order given), ``_features`` and
    ``_slot_specs``."""

    _tables: dict[str, TableConfig]
    _features: tuple[FeatureConfig, ...]
    _slot_specs: tuple[SlotSpec, ...]

    @property
    def table_names(self) -> tuple[str, ...]:
        """Every table, in the order given."""
        return tuple(self._tables)

    @property
    def slot_names(self) -> tuple[str, ...]:
        """The sparse optimizer's slot names (e.g. ``("accumulator",)`` for adagrad)."""
        return tuple(s.name for s in self._slot_specs)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Every feature, in the order given."""
        return tuple(f.name for f in self._features)

    def table_config(self, name: str) -> TableConfig:
        """The configuration of table ``name`` (the full table, also when it is sharded)."""
        return self._tables[name]
