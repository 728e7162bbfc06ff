"""The recipe language: Pydantic v2 models, frozen, unknown keys rejected.

Choices are discriminated unions keyed by ``type`` (optimizers, initializers,
admission policies, models) or ``kind`` (features). Checks that span several
parts of a recipe live in :mod:`embtrain.recipe.checks` so that they run even
when another part of the file is invalid and every error is reported at once.

The tables (:mod:`embtrain.recipe.tables`) and optimizers (:mod:`embtrain.recipe.optimizers`)
live in modules of their own on the ground of :mod:`embtrain.recipe.base`; their names are
re-exported here, where every recipe model can be found.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
    model_validator,
)

from embtrain.recipe.base import (
    CURRENT_VERSION,
    MAX_EPOCHS,
    MAX_INT,
    MAX_LR,
    MAX_SEED,
    MIN_LR,
    Decay,
    Epsilon,
    LearningRate,
    Name,
    NonNegativeInt,
    PositiveInt,
    Seed,
    Strict,
    registry_of,
    tagged_union,
)
from embtrain.recipe.optimizers import (
    DenseAdagrad,
    DenseAdam,
    DenseOptimizer,
    DenseSGD,
    Optimizers,
    Schedule,
    Scheduled,
    SparseAdagrad,
    SparseAdam,
    SparseFtrl,
    SparseLazyAdam,
    SparseOptimizer,
    SparseRowwiseAdagrad,
    SparseSGD,
    SparseSGDMomentum,
)
from embtrain.recipe.tables import (
    Admission,
    BloomAdmission,
    ConstantInit,
    CountAdmission,
    Dynamic,
    Initializer,
    NoAdmission,
    NormalInit,
    ProbabilityAdmission,
    Table,
    Tier,
    TruncatedNormalInit,
    UniformInit,
    ZerosInit,
)

__all__ = [
    "CURRENT_VERSION",
    "DENSE_MODELS",
    "MAX_EPOCHS",
    "MAX_INT",
    "MAX_LR",
    "MAX_SEED",
    "MIN_LR",
    "Admission",
    "BloomAdmission",
    "CategoricalFeature",
    "Checkpoint",
    "ColumnType",
    "Comm",
    "ConstantInit",
    "CountAdmission",
    "DCNv2Model",
    "DLRMModel",
    "Data",
    "Decay",
    "DeepFMModel",
    "DenseAdagrad",
    "DenseAdam",
    "DenseFeature",
    "DenseModel",
    "DenseOptimizer",
    "DenseSGD",
    "Distributed",
    "Dynamic",
    "Epsilon",
    "Feature",
    "HostSpec",
    "Initializer",
    "KerasModel",
    "Label",
    "LabelSpec",
    "Layers",
    "LearningRate",
    "MLPModel",
    "MMoEModel",
    "Name",
    "NoAdmission",
    "NonNegativeInt",
    "NormalInit",
    "NullId",
    "NullRule",
    "Optimizers",
    "PositiveInt",
    "ProbabilityAdmission",
    "Recipe",
    "Schedule",
    "Scheduled",
    "Seed",
    "Shuffle",
    "SparseAdagrad",
    "SparseAdam",
    "SparseFtrl",
    "SparseLazyAdam",
    "SparseOptimizer",
    "SparseRowwiseAdagrad",
    "SparseSGD",
    "SparseSGDMomentum",
    "Strict",
    "Table",
    "Tier",
    "Train",
    "TruncatedNormalInit",
    "UniformInit",
    "WideDeepModel",
    "ZerosInit",
]

# ----------------------------------------------------------------------------- data


class Shuffle(Strict):
    """Shuffling of the training split: file order each epoch, then rows within a window."""

    enabled: bool = Field(True, description="shuffle the training split; false: files and rows "
                                            "in order")
    window_batches: PositiveInt = Field(
        16, description="rows are shuffled within windows of this many batches")


ColumnType = Literal["float", "int", "string", "list<int>", "list<string>", "list<float>"]


class LabelSpec(Strict):
    """One label of a model with several: its column, loss and weight in the summed loss."""

    column: str = Field(description="the label's column")
    loss: Literal["bce", "mse"] = Field(
        "bce", description="bce: a click 0/1 or a probability, the head's logit through a "
                           "sigmoid; mse: any number, the head's output is the prediction")
    weight: Annotated[float, Field(gt=0)] = Field(
        1.0, description="the label's weight in the summed loss")


class Label(Strict):
    """A label as the reader and the model take it (see :meth:`Data.label_specs`)."""

    name: str = Field(description="the label's name (its head, its metrics)")
    column: str = Field(description="the label's column")
    loss: Literal["bce", "mse"] = Field("bce", description="bce or mse")
    weight: float = Field(1.0, description="weight in the summed loss")


class Data(Strict):
    """Where the data lives (Parquet, CSV or TSV files) and how it is cut into batches.

    Text files (CSV, TSV) cannot hold list columns: a feature with ``hotness`` above 1 or
    ``variable`` needs Parquet. In text files an empty field is a null, every other text a
    value; a column's type is its ``data.columns`` type, else set by its role (dense and label
    columns float64, integer ids int64, string ids string).
    """

    train: str | list[str] = Field(
        description="glob(s) of training files (Parquet, CSV or TSV), relative to the working "
                    "directory", examples=["data/train/*.parquet"])
    eval: str | list[str] | None = Field(
        None, description="glob(s) of evaluation files; none: no evaluation")
    label: str = Field(
        "label", description="label column: numbers (or bools) in [0, 1], a click 0/1 or a "
                             "probability; null, NaN or a value outside [0, 1] is an error")
    labels: Annotated[
        Annotated[Annotated[list[str], Field(min_length=1)], Tag("list")]
        | Annotated[dict[Name, LabelSpec], Tag("mapping")],
        Discriminator(lambda v: "list" if isinstance(v, list) else "mapping"),
    ] | None = Field(
        None, description="several labels instead of data.label: a list of columns (each bce, "
                          "weight 1), or a mapping of name to {column, loss, weight}; built-in "
                          "models get one head per label, the loss is the weighted sum")
    batch_size: PositiveInt = Field(description="global batch size (all processes together)",
                                    examples=[2048, 65536])
    eval_batch_size: PositiveInt | None = Field(
        None, description="batch size of evaluation and predict; default: batch_size")
    shuffle: Shuffle = Field(Shuffle(), description="shuffling of the training split")
    last_batch: Literal["drop", "keep"] = Field(
        "drop", description="training: drop the last partial batch of an epoch, or keep it smaller")
    prefetch: NonNegativeInt = Field(2, description="batches prepared ahead by a background thread")
    shards: PositiveInt = Field(
        1, description="training: virtual shards of the sample stream; each process decodes "
                       "only the shards its rows of a batch come from (a multiple of every "
                       "process count you run at divides the reading evenly); the stream "
                       "depends on this number, not on the process count; must divide "
                       "batch_size; 1: every process decodes whole batches")
    columns: dict[str, ColumnType] | None = Field(
        None, description="declared column types, checked against every file's schema. For "
                          "CSV/TSV files, giving data.columns switches to header-less parsing "
                          "(header defaults to false): the mapping must then list every "
                          "column, in file order, and a header row would be read as data; a "
                          "partial mapping fails to read (CSV parse error: expected N columns, "
                          "got M). Set header: true to keep the header row and declare only "
                          "some types. Text files take no list<...> types",
        examples=[{"label": "int", "I1": "float", "C1": "string"}])
    format: Literal["parquet", "csv", "tsv"] | None = Field(
        None, description="file format; default: by extension (.csv: csv; .tsv, .tab, .txt: "
                          "tsv; anything else: parquet)")
    header: bool | None = Field(
        None, description="CSV/TSV: the first row names the columns; default: true unless "
                          "data.columns is given")

    def label_specs(self) -> list[Label]:
        """Every label, in recipe order: ``data.labels``, else ``data.label`` (bce, weight 1)."""
        if self.labels is None:
            return [Label(name=self.label, column=self.label)]
        if isinstance(self.labels, list):
            return [Label(name=c, column=c) for c in self.labels]
        return [Label(name=n, column=s.column, loss=s.loss, weight=s.weight)
                for n, s in self.labels.items()]

    @model_validator(mode="after")
    def _one_label_field(self) -> Data:
        if self.labels is not None and "label" in self.model_fields_set:
            raise ValueError("give data.label or data.labels, not both")
        if isinstance(self.labels, list) and len(set(self.labels)) != len(self.labels):
            raise ValueError("data.labels names a column twice")
        return self

    @model_validator(mode="after")
    def _shards_divide_batch(self) -> Data:
        if self.batch_size % self.shards:
            raise ValueError(f"shards: {self.shards} does not divide batch_size: "
                             f"{self.batch_size} (every shard gives batch_size / shards rows "
                             "to each batch)")
        return self

    @model_validator(mode="after")
    def _text_columns(self) -> Data:
        if self.header is False and not self.columns:
            raise ValueError("header: false needs data.columns: every column, in file order")
        if self.format in ("csv", "tsv") and self.columns:
            lists = [c for c, t in self.columns.items() if t.startswith("list")]
            if lists:
                raise ValueError(f"{self.format} files have no list columns "
                                 f"(data.columns: {lists[0]!r})")
        return self

    @model_serializer(mode="wrap")
    def _drop_unset_text_options(self, handler: SerializerFunctionWrapHandler) -> dict:
        """No ``format``/``header``/``labels`` keys when unset (nor ``shards`` when 1): older
        recipes keep their fingerprints."""
        out = handler(self)
        for key in ("format", "header", "labels"):
            if out.get(key) is None:
                out.pop(key, None)
        if out.get("shards") == 1:
            out.pop("shards", None)
        if "labels" in out:  # data.label is data.labels' first: written, it reads as both
            out.pop("label", None)
        return out


# ------------------------------------------------------------------------- features


class DenseFeature(Strict):
    """Numerical columns fed to the dense model."""

    kind: Literal["dense"] = Field("dense", description="feature kind")
    name: Name = Field(description="the feature's name (a Keras model's input name)")
    columns: list[str] = Field(min_length=1, description="numeric columns, each one input",
                               examples=[["I1", "I2", "I3"]])
    transform: Literal["none", "log1p", "signed_log1p"] = Field(
        "none", description="log1p: log(1 + max(x, 0)); signed_log1p: sign(x)·log(1 + |x|)")
    fill_null: float | None = Field(
        None, description="value for null or NaN; without it such a value is an error")


class NullId(Strict):
    """A null id reads as this id (an integer for ``ids: int``, a string for ``ids: string``)."""

    id: int | str = Field(description="the id a null reads as")


NullRule = Literal["error", "skip"] | NullId


class CategoricalFeature(Strict):
    """Ids looked up in an embedding table and pooled into one vector per sample."""

    kind: Literal["categorical"] = Field("categorical", description="feature kind")
    name: Name = Field(description="the feature's name (a Keras model's input name)")
    column: str = Field(description="the id column (scalar, or a list for hotness above 1)")
    table: Name = Field(description="the table the ids are looked up in; several features may "
                                    "share one")
    hotness: PositiveInt | Literal["variable"] = Field(
        1, description="1 for one-hot, N for a fixed-length list column, 'variable' for ragged lists")
    ids: Literal["int", "string"] = Field(
        "int", description="int: int64 ids; string: strings hashed to int64 with xxHash64 "
                           "(seed 0), in training and in the exported SavedModel alike")
    weights: str | None = Field(None, description="column of per-id weights, shaped like the ids")
    combiner: Literal["sum", "mean", "sqrtn", "concat"] = Field(
        "sum", description="how a row's ids pool into one vector (weighted when weights is "
                           "given); concat needs a fixed hotness and pads short lists with zeros")
    out_of_range: Literal["error", "modulo"] = Field(
        "error", description="static tables: an id outside [0, rows) is an error, or taken modulo rows")
    dim: PositiveInt | None = Field(None, description="optional; if given it must equal the table's dim")
    null: NullRule = Field(
        "error", description="a null id (or null list) in training, evaluation and predict: "
                             "error stops the run with one line; skip: the row has no id for "
                             "this feature (a one-hot feature reads zeros); {id: VALUE}: it "
                             "reads as that id. An id the rule supplies weighs 1. The exported "
                             "SavedModel does not apply this rule (a tensor holds no null): the "
                             "client sends the rule's id, or an empty list for skip",
        examples=["skip", {"id": 0}])

    @model_serializer(mode="wrap")
    def _drop_default_null(self, handler: SerializerFunctionWrapHandler) -> dict:
        """No ``null`` key for the default rule: fingerprints of recipes written before the
        field existed stay the same."""
        out = handler(self)
        if out.get("null") == "error":
            out.pop("null", None)
        return out


Feature = Annotated[DenseFeature | CategoricalFeature, Field(discriminator="kind")]


# --------------------------------------------------------------------------- models

Layers = Annotated[list[PositiveInt], Field(min_length=1)]


class MLPModel(Strict):
    """Concatenate dense features and embeddings, then an MLP. A 1-unit output layer is appended."""

    type: Literal["mlp"] = Field(description="model type")
    hidden: Layers = Field(description="hidden layer widths (ReLU)", examples=[[256, 128]])


class DLRMModel(Strict):
    """Bottom MLP on dense features, pairwise interaction, top MLP (a trailing 1 is the output)."""

    type: Literal["dlrm"] = Field(description="model type")
    bottom: Layers = Field(
        description="bottom MLP on the dense features; its last width must equal the tables' "
                    "common dim", examples=[[512, 256, 64]])
    top: Layers = Field(description="top MLP on the interaction (a trailing 1 is the output)",
                        examples=[[512, 256, 1]])
    interaction: Literal["dot", "cat"] = Field(
        "dot", description="dot: pairwise dot products of the vectors; cat: concatenate them")
    self_interaction: bool = Field(
        False, description="dot interaction: include each vector's product with itself")


class DCNv2Model(Strict):
    """DCN-v2: cross network (full or low-rank) and a deep MLP, stacked or parallel."""

    type: Literal["dcn_v2"] = Field(description="model type")
    cross_layers: PositiveInt = Field(3, description="number of cross layers")
    low_rank: PositiveInt | None = Field(
        None, description="rank of each cross layer's factored matrix; none: a full matrix")
    deep: Layers = Field(description="the deep MLP's layer widths")
    structure: Literal["stacked", "parallel"] = Field(
        "stacked", description="stacked: the deep MLP on the cross network's output; parallel: "
                               "both on the input, concatenated")


class DeepFMModel(Strict):
    """DeepFM: first-order terms, FM second-order interaction and a deep MLP on shared embeddings."""

    type: Literal["deepfm"] = Field(description="model type")
    deep: Layers = Field(description="the deep MLP's layer widths")


class WideDeepModel(Strict):
    """Wide & Deep: a linear part on the named features' embeddings plus a deep MLP on everything."""

    type: Literal["wide_deep"] = Field(description="model type")
    deep: Layers = Field(description="the deep MLP's layer widths")
    wide_features: list[Name] | None = Field(None, description="default: every categorical feature")


class MMoEModel(Strict):
    """Multi-gate mixture of experts: shared expert MLPs on concat(dense, embeddings), and per
    label a softmax gate over the experts and a tower MLP ending in that label's logit."""

    type: Literal["mmoe"] = Field(description="model type")
    experts: Annotated[int, Field(ge=1, le=64)] = Field(4, description="number of experts")
    expert: Layers = Field(description="each expert's ReLU layers")
    tower: list[PositiveInt] = Field(
        default_factory=list, description="each label's tower layers (a trailing 1 is the output)")


class KerasModel(Strict):
    """Your own Keras model: embtrain calls ``function(inputs, options)`` (see
    :mod:`embtrain.models.keras_model`) and trains what it returns."""

    type: Literal["keras"] = Field(description="model type")
    build: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
                       description="package.module:function, found on the Python path or in "
                                   "the recipe's directory",
                       examples=["two_tower_model:build"])
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="handed to the function as its second argument")
    path: str | None = Field(None, description="directory searched for the module before the "
                                               "Python path; default: the recipe's directory")


#: The recipe model of each dense model type (``model.type``), by name. A type's network is
#: in ``models/networks.py`` (``NETWORKS``), its size in ``plan/dense.py`` (``DENSE_SHAPES``);
#: both refuse to import when they and this registry name different types.
DENSE_MODELS: dict[str, type[Strict]] = registry_of(
    (MLPModel, DLRMModel, DCNv2Model, DeepFMModel, WideDeepModel, MMoEModel, KerasModel))
DenseModel = tagged_union(DENSE_MODELS.values())


# ------------------------------------------------------------------ train, distributed


class Checkpoint(Strict):
    """When checkpoints are written and how many are kept (see docs/CHECKPOINTS.md)."""

    every: PositiveInt | None = Field(None, description="steps between checkpoints; none: only at the end")
    keep: PositiveInt = Field(3, description="how many complete checkpoints to keep")
    at_end: bool = Field(True, description="write a checkpoint when training ends")


class Train(Strict):
    """How long to train, when to evaluate and checkpoint."""

    steps: PositiveInt | None = Field(None, description="training steps; give steps or epochs")
    epochs: Annotated[float, Field(gt=0, le=MAX_EPOCHS)] | None = Field(
        None, description="passes over the training split (may be fractional); give steps or "
                          "epochs")
    eval_every: PositiveInt | None = Field(None, description="steps between evaluations")
    eval_at_end: bool = Field(True, description="evaluate when training ends")
    eval_max_batches: PositiveInt | None = Field(
        None, description="evaluate on the first this many batches only; none: the whole split")
    log_every: PositiveInt = Field(
        50, description="steps between progress lines (and metrics.jsonl train records); the "
                        "loss shown is the mean over them")
    checkpoint: Checkpoint = Field(Checkpoint(), description="checkpoint cadence and retention")
    seed: Seed = Field(0, description="seeds initial values, shuffling and the dense model")
    mixed_precision: Literal["none", "fp16", "bf16"] = Field(
        "none", description="the dense network computes in bfloat16 or float16 while its "
                            "weights, optimizer state and loss stay float32; fp16 scales the "
                            "loss dynamically")
    device: Literal["auto", "cpu", "gpu"] = Field(
        "cpu", description="where the engine and the dense network run: gpu (one per rank; "
        "stops with one line when there is none), cpu, or auto (a GPU when CuPy and "
        "numba.cuda find one, else cpu); cpu until the GPU path has run on hardware; not "
        "part of the recipe fingerprint")
    dense_backend: Literal["auto", "tensorflow", "jax"] = Field(
        "auto", description="the Keras 3 backend of the dense network: tensorflow (Horovod, "
        "mixed precision, SavedModel export), jax (a jitted stateless step; GPU machines "
        "without TensorFlow), or auto (tensorflow when it imports, else jax); checkpoints "
        "are the same on both, so a run resumes on the other; not part of the recipe "
        "fingerprint")

    @model_validator(mode="after")
    def _one_length(self) -> Train:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of 'steps' or 'epochs'")
        return self


class Comm(Strict):
    """How the ranks exchange embeddings."""

    quantize: Literal["none", "fp16", "int8"] = Field(
        "none", description="compress the embedding all-to-all forward and backward (int8: one "
                            "scale per vector)")
    transport: Literal["auto", "shared_memory", "horovod"] = Field(
        "auto", description="how the ranks of a job on one machine exchange: shared_memory "
        "(files on /dev/shm; Linux x86-64), horovod (Gloo over loopback), or auto (shared "
        "memory where available); ranks on several machines use Horovod; not part of the "
        "recipe fingerprint")


HostSpec = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]+(:\d+)?$")]


class Distributed(Strict):
    """Number of processes, the hosts they run on and how they exchange."""

    processes: PositiveInt = Field(
        1, description="number of processes (ranks); embtrain run --np overrides it")
    hosts: list[HostSpec] | None = Field(None, description="host:slots entries, as horovodrun -H takes",
                                         examples=[["host1:4", "host2:4"]])
    comm: Comm = Field(Comm(), description="how the ranks exchange")


# --------------------------------------------------------------------------- recipe


class Recipe(Strict):
    """A whole training job."""

    version: Literal[1] = Field(description="recipe language version (1, the only one so far)")
    name: Name | None = Field(None, description="default: the recipe file's name")
    data: Data = Field(description="where the data lives and how it is batched")
    features: list[Feature] = Field(
        min_length=1, description="the model's inputs: dense columns and categorical ids")
    tables: list[Table] = Field(min_length=1, description="the embedding tables")
    optimizer: Optimizers = Field(description="the sparse and the dense optimizer")
    model: DenseModel = Field(description="the dense network")
    train: Train = Field(description="how long to train, when to evaluate and checkpoint")
    distributed: Distributed = Field(Distributed(), description="processes and how they exchange")

    def table(self, name: str) -> Table:
        """The table called ``name``."""
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(name)

    @property
    def categorical_features(self) -> list[CategoricalFeature]:
        return [f for f in self.features if isinstance(f, CategoricalFeature)]

    @property
    def dense_features(self) -> list[DenseFeature]:
        return [f for f in self.features if isinstance(f, DenseFeature)]

    def features_of(self, table: str) -> list[CategoricalFeature]:
        """Features that read ``table`` (more than one: a shared table)."""
        return [f for f in self.categorical_features if f.table == table]
