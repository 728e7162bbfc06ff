"""Memory of the dense network on every rank: parameters, optimizer state, activations.

Every rank holds the whole dense network (data parallel), its dense optimizer's state, and
the activations of its share of one batch while a step runs. Parameter counts follow
:mod:`embtrain.models.networks` layer by layer (pure arithmetic, no TensorFlow); the
activations count every layer's output and its gradient in float32 (an estimate: TensorFlow
may keep a few more temporaries).
"""

from __future__ import annotations

from dataclasses import dataclass

from embtrain.recipe.models import (
    CategoricalFeature,
    DCNv2Model,
    DeepFMModel,
    DenseAdagrad,
    DenseAdam,
    DenseSGD,
    DLRMModel,
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


def dense_shape(recipe: Recipe) -> DenseShape:
    """Parameters and activation widths of the recipe's dense network."""
    dims = {t.name: t.dim for t in recipe.tables}
    num_dense = sum(len(f.columns) for f in recipe.dense_features)
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
    d = num_dense + emb_width
    model = recipe.model
    params, widths = 0, d  # the concatenated input counts as an activation
    if isinstance(model, MLPModel):
        p, w, out = _mlp(d, _hidden(model.hidden))
        params, widths = p + _dense_layer(out), widths + w + 1
    elif isinstance(model, DLRMModel):
        dim = min(dims.values()) if dims else 0
        has_bottom = num_dense > 0
        if has_bottom:
            p, w, _ = _mlp(num_dense, list(model.bottom))
            params, widths = params + p, widths + w
        if model.interaction == "dot":
            n = fields + (1 if has_bottom else 0)
            pairs = n * (n + 1) // 2 if model.self_interaction else n * (n - 1) // 2
            inter = pairs + (dim if has_bottom else 0)
            widths += n * n + inter  # the n×n dot matrix and the top MLP's input
        else:
            inter = emb_width + (dim if has_bottom else 0)
            widths += inter
        p, w, out = _mlp(inter, _hidden(model.top))
        params, widths = params + p + _dense_layer(out), widths + w + 1
    elif isinstance(model, DCNv2Model):
        for _ in range(model.cross_layers):
            params += (d * d if model.low_rank is None else 2 * d * model.low_rank) + d
            widths += 2 * d + (model.low_rank or 0)
        p, w, out = _mlp(d, _hidden(model.deep))
        out_in = out + (d if model.structure == "parallel" else 0)
        params, widths = params + p + _dense_layer(out_in), widths + w + 1
    elif isinstance(model, DeepFMModel):
        p, w, out = _mlp(d, _hidden(model.deep))
        params = _dense_layer(d) + p + _dense_layer(out)
        widths += w + 2 * emb_width + 3
    elif isinstance(model, WideDeepModel):
        wide = model.wide_features
        wide_in = num_dense + sum(w for name, w in feature_widths.items()
                                  if wide is None or name in wide)
        p, w, out = _mlp(d, _hidden(model.deep))
        params = (_dense_layer(wide_in) if wide_in else 0) + p + _dense_layer(out)
        widths += w + wide_in + 2
    elif isinstance(model, MMoEModel):
        heads = len(recipe.data.label_specs())
        p, w, out = _mlp(d, list(model.expert))
        params, widths = model.experts * p, widths + model.experts * w
        tp, tw, tout = _mlp(out, _hidden(model.tower))
        params += heads * (d * model.experts + model.experts + tp + _dense_layer(tout))
        widths += heads * (model.experts + out + tw + 1)
    # a keras model's size is known once built: the plan counts its activations' input only
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
