"""Memory of the dense network on every rank: parameters, optimizer state, activations.

Every rank holds the whole dense network (data parallel), its dense optimizer's state, and
the activations of its share of one batch while a step runs. Parameter counts follow
:mod:`embtrain.models.networks` layer by layer (pure arithmetic, no TensorFlow); the
activations count every layer's output and its gradient in float32 (an estimate: TensorFlow
may keep a few more temporaries).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from embtrain.recipe.models import (
    DENSE_MODELS,
    CategoricalFeature,
    DCNv2Model,
    DeepFMModel,
    DenseAdagrad,
    DenseAdam,
    DenseSGD,
    DLRMModel,
    KerasModel,
    MLPModel,
    MMoEModel,
    Recipe,
    WideDeepModel,
)

FLOAT_BYTES = 4


@dataclass(frozen=True)
class DenseShape:
    """What the dense network's size depends on, per sample."""

    parameters: int
    widths: int  # activations per sample: every layer's output width (and the input), summed
    optimizer_slots: int  # optimizer arrays the size of the parameters


@dataclass(frozen=True)
class DenseMemory:
    """Bytes of the dense network on one rank."""

    parameters: int
    parameter_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    batch_per_rank: int

    @property
    def bytes(self) -> int:
        """Everything: parameters, optimizer state and one batch's activations."""
        return self.parameter_bytes + self.optimizer_bytes + self.activation_bytes

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready mapping."""
        return {"parameters": self.parameters, "parameter_bytes": self.parameter_bytes,
                "optimizer_bytes": self.optimizer_bytes,
                "activation_bytes": self.activation_bytes,
                "batch_per_rank": self.batch_per_rank, "bytes": self.bytes}


def _hidden(layers: list[int]) -> list[int]:
    return list(layers[:-1]) if layers and layers[-1] == 1 else list(layers)


def _mlp(fan_in: int, units: list[int]) -> tuple[int, int, int]:
    """(parameters, summed output widths, output width) of a ReLU stack."""
    params = widths = 0
    for n in units:
        params += fan_in * n + n
        widths += n
        fan_in = n
    return params, widths, fan_in


def _dense_layer(fan_in: int) -> int:
    return fan_in + 1  # one output unit


@dataclass(frozen=True)
class DenseInputs:
    """What a network's size depends on besides its own options: its inputs, per sample."""

    num_dense: int
    emb_width: int  # the embedding vectors' concatenated width
    fields: int  # embedding vectors
    min_dim: int  # the smallest table dim (0 without tables)
    feature_widths: dict[str, int]  # each categorical feature's width
    heads: int  # logits (one per label)

    @property
    def width(self) -> int:
        """The concatenated input: dense features and embeddings."""
        return self.num_dense + self.emb_width


def _mlp_shape(model: MLPModel, x: DenseInputs) -> tuple[int, int]:
    p, w, out = _mlp(x.width, _hidden(model.hidden))
    return p + _dense_layer(out), w + 1


def _dlrm_shape(model: DLRMModel, x: DenseInputs) -> tuple[int, int]:
    params = widths = 0
    has_bottom = x.num_dense > 0
    if has_bottom:
        p, w, _ = _mlp(x.num_dense, list(model.bottom))
        params, widths = params + p, widths + w
    if model.interaction == "dot":
        n = x.fields + (1 if has_bottom else 0)
        pairs = n * (n + 1) // 2 if model.self_interaction else n * (n - 1) // 2
        inter = pairs + (x.min_dim if has_bottom else 0)
        widths += n * n + inter  # the n×n dot matrix and the top MLP's input
    else:
        inter = x.emb_width + (x.min_dim if has_bottom else 0)
        widths += inter
    p, w, out = _mlp(inter, _hidden(model.top))
    return params + p + _dense_layer(out), widths + w + 1


def _dcn_v2_shape(model: DCNv2Model, x: DenseInputs) -> tuple[int, int]:
    d = x.width
    params = widths = 0
    for _ in range(model.cross_layers):
        params += (d * d if model.low_rank is None else 2 * d * model.low_rank) + d
        widths += 2 * d + (model.low_rank or 0)
    p, w, out = _mlp(d, _hidden(model.deep))
    out_in = out + (d if model.structure == "parallel" else 0)
    return params + p + _dense_layer(out_in), widths + w + 1


def _deepfm_shape(model: DeepFMModel, x: DenseInputs) -> tuple[int, int]:
    p, w, out = _mlp(x.width, _hidden(model.deep))
    return _dense_layer(x.width) + p + _dense_layer(out), w + 2 * x.emb_width + 3


def _wide_deep_shape(model: WideDeepModel, x: DenseInputs) -> tuple[int, int]:
    wide = model.wide_features
    wide_in = x.num_dense + sum(w for name, w in x.feature_widths.items()
                                if wide is None or name in wide)
    p, w, out = _mlp(x.width, _hidden(model.deep))
    return (_dense_layer(wide_in) if wide_in else 0) + p + _dense_layer(out), w + wide_in + 2


def _mmoe_shape(model: MMoEModel, x: DenseInputs) -> tuple[int, int]:
    d = x.width
    p, w, out = _mlp(d, list(model.expert))
    params, widths = model.experts * p, model.experts * w
    tp, tw, tout = _mlp(out, _hidden(model.tower))
    params += x.heads * (d * model.experts + model.experts + tp + _dense_layer(tout))
    widths += x.heads * (model.experts + out + tw + 1)
    return params, widths


def _keras_shape(model: KerasModel, x: DenseInputs) -> tuple[int, int]:
    """A keras model's size is known once built: the plan counts its activations' input only."""
    return 0, 0


#: Each model type's size, by its recipe model (:data:`embtrain.recipe.models.DENSE_MODELS`):
#: ``(model, inputs) -> (parameters, activation widths per sample beyond the input)``, layer
#: by layer as :mod:`embtrain.models.networks` builds it.
DENSE_SHAPES: dict[type, Callable[[Any, DenseInputs], tuple[int, int]]] = {
    MLPModel: _mlp_shape,
    DLRMModel: _dlrm_shape,
    DCNv2Model: _dcn_v2_shape,
    DeepFMModel: _deepfm_shape,
    WideDeepModel: _wide_deep_shape,
    MMoEModel: _mmoe_shape,
    KerasModel: _keras_shape,
}
if set(DENSE_SHAPES) != set(DENSE_MODELS.values()):  # pragma: no cover
    raise ImportError("plan/dense.py DENSE_SHAPES and recipe/models.py DENSE_MODELS name "
                      "different model types")


def dense_inputs(recipe: Recipe) -> DenseInputs:
    """The dense network's inputs of ``recipe``."""
    dims = {t.name: t.dim for t in recipe.tables}
    emb_width = fields = 0
    feature_widths: dict[str, int] = {}
    for f in recipe.features:
        if not isinstance(f, CategoricalFeature):
            continue
        dim = dims[f.table]
        hot = int(f.hotness) if f.combiner == "concat" and f.hotness != "variable" else 1
        feature_widths[f.name] = dim * hot
        emb_width += dim * hot
        fields += hot
    return DenseInputs(sum(len(f.columns) for f in recipe.dense_features), emb_width, fields,
                       min(dims.values()) if dims else 0, feature_widths,
                       len(recipe.data.label_specs()))


def dense_shape(recipe: Recipe) -> DenseShape:
    """Parameters and activation widths of the recipe's dense network."""
    x = dense_inputs(recipe)
    params, widths = DENSE_SHAPES[type(recipe.model)](recipe.model, x)
    widths += x.width  # the concatenated input counts as an activation
    optimizer = recipe.optimizer.dense
    if isinstance(optimizer, DenseAdam):
        slots = 2
    elif isinstance(optimizer, DenseAdagrad):
        slots = 1
    else:
        assert isinstance(optimizer, DenseSGD)
        slots = 1 if optimizer.momentum else 0
    return DenseShape(params, widths, slots)


def dense_memory(shape: DenseShape, batch_size: int, world_size: int) -> DenseMemory:
    """Bytes per rank for a global ``batch_size`` split over ``world_size`` ranks."""
    per_rank = -(-batch_size // max(1, world_size))
    param_bytes = shape.parameters * FLOAT_BYTES
    return DenseMemory(
        parameters=shape.parameters,
        parameter_bytes=param_bytes,
        optimizer_bytes=param_bytes * shape.optimizer_slots,
        activation_bytes=2 * shape.widths * per_rank * FLOAT_BYTES,  # values and gradients
        batch_per_rank=per_rank,
    )
