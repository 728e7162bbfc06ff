"""Small engines and their training without TensorFlow: a three-table engine, deterministic
steps, a dense model of NumPy arrays, every array of its tables; the warm-start recipe."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embtrain.embedding import (
    EmbeddingEngine,
    FeatureConfig,
    SparseInput,
    SparseOptimizerConfig,
    TableConfig,
)
from embtrain.embedding.from_recipe import feature_configs, sparse_optimizer_config, table_configs
from embtrain.recipe import parse_recipe_text


def make_engine(kind: str = "adagrad", seed: int = 0) -> EmbeddingEngine:
    """Two groups (dims 8 and 4), three tables, one shared by two features."""
    tables = [TableConfig("user", 120, 8), TableConfig("item", 200, 4), TableConfig("cat", 7, 4)]
    features = [
        FeatureConfig("user", "user"),
        FeatureConfig("item", "item"),
        FeatureConfig("hist", "item", combiner="mean"),
        FeatureConfig("cat", "cat"),
    ]
    return EmbeddingEngine(tables, features, SparseOptimizerConfig(kind, 0.05), seed=seed)


def train(engine: EmbeddingEngine, model: FakeModel | None, start: int, steps: int) -> list[float]:
    """Deterministic steps: the batch of step ``s`` depends only on ``s``."""
    losses = []
    for s in range(start, start + steps):
        rng = np.random.default_rng(1000 + s)
        batch = 32
        hist = rng.integers(0, 200, size=(batch, 3))
        inputs = {
            "user": SparseInput.one_hot(rng.integers(0, 120, batch)),
            "item": SparseInput.one_hot(rng.integers(0, 200, batch)),
            "hist": SparseInput.fixed_hotness(hist),
            "cat": SparseInput.one_hot(rng.integers(0, 7, batch)),
        }
        out = engine.forward(inputs)
        grads = [np.tanh(o) * np.float32(0.1) for o in out]
        engine.backward_update(grads, s)
        loss = float(sum(float(np.square(o).sum()) for o in out))
        if model is not None:
            model.step(loss)
        losses.append(loss)
    return losses


class FakeModel:
    """A dense model with weights and optimizer state as NumPy arrays (no TensorFlow)."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.weights = [rng.standard_normal((5, 3)).astype(np.float32), np.zeros(3, np.float32)]
        self.state = [np.zeros((), np.int64), np.zeros((5, 3), np.float32), np.zeros(3, np.float32)]

    def step(self, loss: float) -> None:
        self.state[0] = self.state[0] + 1
        for i, w in enumerate(self.weights):
            w -= np.float32(1e-4 * loss)
            self.state[i + 1] += w

    def get_weights(self) -> list[np.ndarray]:
        return [w.copy() for w in self.weights]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        assert [w.shape for w in weights] == [w.shape for w in self.weights]
        self.weights = [np.array(w) for w in weights]

    def weight_names(self) -> list[str]:
        return ["w", "b"]

    def optimizer_state(self) -> list[np.ndarray]:
        return [s.copy() for s in self.state]

    def load_optimizer_state(self, arrays: Sequence[np.ndarray]) -> None:
        self.state = [np.array(a) for a in arrays]


def tables_of(engine: EmbeddingEngine) -> dict[str, dict[str, np.ndarray]]:
    """Every table's keys, values, counters and slots, by table and array name."""
    out = {}
    for name in engine.table_names:
        st = engine.export_table(name)
        out[name] = {
            "keys": st.keys,
            "values": st.values,
            "update_count": st.update_count,
            "last_step": st.last_step,
            **{f"slot:{k}": v for k, v in st.slots.items()},
        }
    return out




WARM_START_RECIPE = """
version: 1
name: warm
data: {{train: data/train/*.parquet, batch_size: 32}}
features:
  - {{kind: categorical, name: user, column: user, table: user}}
  - {{kind: categorical, name: item, column: item, table: item}}
  - {{kind: categorical, name: hist, column: hist, table: item, hotness: variable, combiner: mean}}
  - {{kind: categorical, name: cat, column: cat, table: cat}}
tables:
  - {{name: user, dim: {user_dim}, rows: 120}}
  - {{name: item, dim: 4, rows: {item_rows}}}
  {cat}
optimizer:
  sparse: {{type: {sparse}, lr: {lr}}}
  dense: {{type: adam, lr: 0.001}}
model: {{type: mlp, hidden: [8]}}
train: {{steps: {steps}, seed: 0}}
"""


def warm_start_recipe(
    user_dim: int = 8,
    item_rows: int = 200,
    sparse: str = "adagrad",
    lr: float = 0.05,
    steps: int = 10,
    cat: bool = True,
):
    """The warm-start recipe with these fields changed (``cat``: with the ``cat`` table)."""
    text = WARM_START_RECIPE.format(
        user_dim=user_dim,
        item_rows=item_rows,
        sparse=sparse,
        lr=lr,
        steps=steps,
        cat="- {name: cat, dim: 4, rows: 7}" if cat else "",
    )
    if not cat:
        text = text.replace("  - {kind: categorical, name: cat, column: cat, table: cat}\n", "")
    return parse_recipe_text(text, "warm.yaml")


def engine_for(r) -> EmbeddingEngine:
    """The engine a run of recipe ``r`` starts with."""
    return EmbeddingEngine(
        table_configs(r),
        feature_configs(r),
        sparse_optimizer_config(r.optimizer.sparse),
        seed=r.train.seed,
    )

