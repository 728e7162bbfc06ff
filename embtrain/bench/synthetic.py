"""The synthetic benchmark models of NVIDIA Merlin distributed-embeddings, as recipes.

The figures (``synthetic.yaml``, shipped inside the package) are the public "v3" configs of
``examples/benchmarks/synthetic_models``: per entry ``count`` tables of ``rows`` × ``dim``,
each read by one input per hotness in ``nnz`` (a shared table: two inputs, hotness 1 and N,
pooled with ``sum``), ``numerical`` dense features, an MLP of sizes ``mlp`` plus a 1-unit
output, and for the larger models a 1-D average pooling of stride ``interact_stride`` over
the concatenated embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml

from embtrain.recipe import models as rm

OptimizerName = Literal["sgd", "adagrad", "adam"]
OPTIMIZERS: tuple[str, ...] = ("sgd", "adagrad", "adam")

# distributed-embeddings' main.py: SGD(learning_rate=0.03), Adagrad() and Adam() with Keras'
# defaults (lr 0.001, initial accumulator 0.1, epsilon 1e-7; betas 0.9 / 0.999).
LEARNING_RATES: dict[str, float] = {"sgd": 0.03, "adagrad": 0.001, "adam": 0.001}
DEFAULT_BATCH = 65536
FP32 = 4


@dataclass(frozen=True)
class EmbeddingEntry:
    """``count`` identical tables, each read by one input per hotness in ``nnz``."""

    count: int
    nnz: tuple[int, ...]
    rows: int
    dim: int
    shared: bool


@dataclass(frozen=True)
class TableSpec:
    """One concrete table of a synthetic model."""

    name: str
    rows: int
    dim: int


@dataclass(frozen=True)
class InputSpec:
    """One categorical input: ``hotness`` ids per sample into ``table`` (rows, dim), summed."""

    name: str
    table: str
    hotness: int
    rows: int
    dim: int


@dataclass(frozen=True)
class SyntheticModel:
    """One synthetic model (criteo, tiny, small, medium, large, jumbo, colossal)."""

    name: str
    embedding: tuple[EmbeddingEntry, ...]
    mlp: tuple[int, ...]
    numerical: int
    interact_stride: int | None

    @property
    def num_tables(self) -> int:
        """Number of embedding tables."""
        return sum(e.count for e in self.embedding)

    @property
    def num_inputs(self) -> int:
        """Number of categorical inputs (a shared table counts once per hotness)."""
        return sum(e.count * len(e.nnz) for e in self.embedding)

    def table_bytes(self, scale: float = 1.0) -> int:
        """fp32 bytes of all tables' values (no optimizer state)."""
        return sum(t.rows * t.dim * FP32 for t in self.tables(scale))

    def tables(self, scale: float = 1.0) -> list[TableSpec]:
        """Every table in DE's order, rows multiplied by ``scale`` (at least 1 row)."""
        out: list[TableSpec] = []
        for entry in self.embedding:
            rows = scaled_rows(entry.rows, scale)
            for _ in range(entry.count):
                out.append(TableSpec(name=f"t{len(out)}", rows=rows, dim=entry.dim))
        return out

    def inputs(self, scale: float = 1.0) -> list[InputSpec]:
        """Every categorical input in DE's order (table by table, hotness by hotness)."""
        out: list[InputSpec] = []
        tables = iter(self.tables(scale))
        for entry in self.embedding:
            for _ in range(entry.count):
                table = next(tables)
                for hot in entry.nnz:
                    out.append(
                        InputSpec(
                            name=f"c{len(out)}",
                            table=table.name,
                            hotness=hot,
                            rows=table.rows,
                            dim=table.dim,
                        )
                    )
        return out

    @property
    def ids_per_sample(self) -> int:
        """Categorical ids one sample carries over all inputs."""
        return sum(e.count * sum(e.nnz) for e in self.embedding)

    def pooled_width(self) -> int:
        """Width of the concatenated pooled embeddings (before any interaction pooling)."""
        return sum(e.count * len(e.nnz) * e.dim for e in self.embedding)


def scaled_rows(rows: int, scale: float) -> int:
    """``rows × scale`` rounded, at least 1."""
    return max(1, round(rows * scale))


@cache
def _raw_models() -> dict[str, Any]:
    text = resources.files("embtrain.bench").joinpath("synthetic.yaml").read_text()
    return yaml.safe_load(text)


def model_names() -> list[str]:
    """Names of the synthetic models, smallest first as in the file."""
    return list(_raw_models())


def load_model(name: str) -> SyntheticModel:
    """The synthetic model ``name``; ``KeyError`` naming the known ones if there is none."""
    raw = _raw_models()
    if name not in raw:
        raise KeyError(f"unknown synthetic model {name!r}; one of {', '.join(raw)}")
    spec = raw[name]
    entries = tuple(
        EmbeddingEntry(
            count=int(e["count"]),
            nnz=tuple(int(n) for n in e["nnz"]),
            rows=int(e["rows"]),
            dim=int(e["dim"]),
            shared=bool(e["shared"]),
        )
        for e in spec["embedding"]
    )
    stride = spec.get("interact_stride")
    return SyntheticModel(
        name=name,
        embedding=entries,
        mlp=tuple(int(s) for s in spec["mlp"]),
        numerical=int(spec["numerical"]),
        interact_stride=None if stride is None else int(stride),
    )


def sparse_optimizer(kind: str) -> rm.SparseSGD | rm.SparseAdagrad | rm.SparseAdam:
    """The sparse optimizer of DE's benchmark for ``kind`` (its learning rates)."""
    lr = LEARNING_RATES[kind]
    if kind == "sgd":
        return rm.SparseSGD(type="sgd", lr=lr)
    if kind == "adagrad":
        return rm.SparseAdagrad(type="adagrad", lr=lr)
    if kind == "adam":
        return rm.SparseAdam(type="adam", lr=lr)
    raise ValueError(f"unknown optimizer {kind!r}; one of {', '.join(OPTIMIZERS)}")


def dense_optimizer(kind: str) -> rm.DenseSGD | rm.DenseAdagrad | rm.DenseAdam:
    """The dense optimizer: DE uses one optimizer (and learning rate) for every variable."""
    lr = LEARNING_RATES[kind]
    if kind == "sgd":
        return rm.DenseSGD(type="sgd", lr=lr)
    if kind == "adagrad":
        return rm.DenseAdagrad(type="adagrad", lr=lr)
    if kind == "adam":
        return rm.DenseAdam(type="adam", lr=lr)
    raise ValueError(f"unknown optimizer {kind!r}; one of {', '.join(OPTIMIZERS)}")


def build_recipe(
    model: SyntheticModel,
    *,
    optimizer: str = "adagrad",
    batch: int = DEFAULT_BATCH,
    scale: float = 1.0,
    steps: int = 100,
    seed: int = 0,
    storage: list[rm.Tier] | None = None,
    storage_by_table: dict[str, list[rm.Tier]] | None = None,
) -> rm.Recipe:
    """The recipe of a synthetic model: one table per table, one sum-pooled feature per input.

    ``storage`` is every table's tier list (default: the first tier only);
    ``storage_by_table`` overrides it for the tables it names. The interaction
    pooling of the larger models has no counterpart in the recipe language; the bench adds it
    (see :mod:`embtrain.bench.runner`).
    """
    tiers = storage or [rm.Tier(tier="device")]
    tables = [
        rm.Table(name=t.name, dim=t.dim, rows=t.rows,
                 storage=(storage_by_table or {}).get(t.name, tiers))
        for t in model.tables(scale)
    ]
    features: list[rm.DenseFeature | rm.CategoricalFeature] = [
        rm.DenseFeature(name="numerical", columns=[f"n{i}" for i in range(model.numerical)])
    ]
    features += [
        rm.CategoricalFeature(
            name=i.name, column=i.name, table=i.table, hotness=i.hotness, combiner="sum"
        )
        for i in model.inputs(scale)
    ]
    return rm.Recipe(
        version=1,
        name=f"synthetic-{model.name}",
        data=rm.Data(train=f"synthetic/{model.name}/*.parquet", batch_size=batch),
        features=features,
        tables=tables,
        optimizer=rm.Optimizers(
            sparse=sparse_optimizer(optimizer), dense=dense_optimizer(optimizer)
        ),
        model=rm.MLPModel(type="mlp", hidden=list(model.mlp)),
        train=rm.Train(steps=steps, seed=seed),
    )
