"""Row spaces: each table's kind of rows is its own object, and row stores are handed in."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import numpy as np

from embtrain.embedding.config import (
    DynamicConfig,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
    TierConfig,
)
from embtrain.embedding.engine import EmbeddingEngine
from embtrain.embedding.rows_cache import CachedRows
from embtrain.embedding.rows_directory import DirectoryRows
from embtrain.embedding.rows_hash import HashRows
from embtrain.embedding.rows_static import StaticRows
from embtrain.embedding.tiers import MemoryStore
from embtrain.storage import ROW_STORES, open_store

EMBEDDING = Path(__file__).resolve().parents[1] / "embtrain" / "embedding"


def _tables() -> list[TableConfig]:
    tier = TierConfig(16, store="memory", eviction="lru")
    return [TableConfig("s", 50, 4), TableConfig("h", 64, 4, dynamic=DynamicConfig()),
            replace(TableConfig("c", 50, 4), tier=tier),
            replace(TableConfig("d", 64, 4, dynamic=DynamicConfig()), tier=tier)]


def _features() -> list[FeatureConfig]:
    return [FeatureConfig(f"f{t}", t, "sum", None) for t in "shcd"]


def test_each_table_gets_its_kind_of_row_space_and_the_stores_handed_in() -> None:
    opened: list[tuple[str, list[int], list[float]]] = []

    def stores(t: TableConfig, widths: list[int], seed: int, inits: list[float]) -> MemoryStore:
        opened.append((t.name, widths, inits))
        return MemoryStore(t.rows, t.dim, widths)

    opt = SparseOptimizerConfig("adagrad", lr=0.1)
    engine = EmbeddingEngine(_tables(), _features(), opt, seed=3, stores=stores)
    kinds = {name: type(engine._space(name)) for name in engine.table_names}
    assert kinds == {"s": StaticRows, "h": HashRows, "c": CachedRows, "d": DirectoryRows}
    init = opt.initial_accumulator_value
    assert sorted(opened) == [("c", [4], [init]), ("d", [4], [init])]
    # the handed-in opener's stores serve the step: one that evicts writes back
    rng = np.random.default_rng(0)
    for step in range(8):
        inputs = {f.name: SparseInput(rng.integers(0, 50, 10).astype(np.int64),
                                      np.arange(0, 11, dtype=np.int64)) for f in _features()}
        outs = engine.forward(inputs, step=step + 1)
        engine.backward_update([np.ones_like(o) for o in outs], step)
    tiers = engine.tier_metrics()
    assert set(tiers) == {"c", "d"} and all(m["rows_written"] > 0 for m in tiers.values())
    assert set(engine.dynamic_metrics()) == {"h", "d"}


def test_the_registry_of_tier_kinds_opens_each_kind(tmp_path: Path) -> None:
    assert set(ROW_STORES) >= {"memory", "disk"}
    t = replace(TableConfig("m", 10, 2), tier=TierConfig(4, store="memory"))
    assert isinstance(open_store(t, [2], 0, [0.0]), MemoryStore)
    disk = open_store(replace(t, tier=TierConfig(4, store="disk", path=str(tmp_path))), [2], 0,
                      [0.0])
    disk.close()
    assert (tmp_path / "m.tier").is_file()


def test_embedding_does_not_import_storage() -> None:
    """Row stores are handed in: no module of embtrain.embedding imports embtrain.storage
    (lazy imports included)."""
    for path in sorted(EMBEDDING.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith("embtrain.storage"), f"{path.name} imports {name}"
