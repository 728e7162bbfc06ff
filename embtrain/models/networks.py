"""The dense networks of every recipe model type, written once for every Keras backend.

Every network maps ``(dense [b, num_dense], groups: list of [b, w_g]) -> logits [b]``, or
``[b, heads]`` with several heads (one per label: the output layer has ``heads`` units).
Variables are created in a fixed order from Keras initializers with explicit seeds,
so a given ``(config, num_dense, slots, seed)`` yields the same weights in every process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from embtrain.models.ops import on_tensorflow, ops
from embtrain.models.precision import FLOAT32, Precision
from embtrain.models.slots import FeatureSlot, Run, group_widths, input_blocks, merge_runs
from embtrain.recipe.models import (
    DENSE_MODELS,
    DCNv2Model,
    DeepFMModel,
    DLRMModel,
    KerasModel,
    MLPModel,
    MMoEModel,
    WideDeepModel,
)

ModelConfig = (MLPModel | DLRMModel | DCNv2Model | DeepFMModel | WideDeepModel | MMoEModel
               | KerasModel)
Tensor = Any  # a tensor of the process's backend (Tensor, jax.Array)
Variable = Any  # a weight: a tf.Variable on TensorFlow, a keras.Variable on other backends
Block = Tensor | list[Tensor]  # a tensor, or column blocks standing for their concat


class VariableFactory:
    """Creates variables in order, each random one from its own deterministic seed.

    The initial values are drawn by NumPy (Glorot uniform from a Philox stream per variable),
    not by Keras' random ops, which draw differently on each backend: the same
    ``(config, num_dense, slots, seed)`` gives the same weights on TensorFlow and on JAX.
    The weights are ``tf.Variable`` on TensorFlow and ``keras.Variable`` elsewhere (a
    stateless JAX step reads them through ``keras.StatelessScope``); :attr:`names` are their
    names as TensorFlow gives them (``mlp/out/kernel:0``) on every backend, the names a
    checkpoint records.
    """

    def __init__(self, seed: int, precision: Precision = FLOAT32):
        self.seed = int(seed)
        self.precision = precision  # the layers read their float32 weights in its dtype
        self.variables: list[Variable] = []
        self.names: list[str] = []
        self._count = 0

    def _next_seed(self) -> int:
        # Mix the model seed and the variable index so that seeds s and s+1 share no stream.
        index = self._count
        self._count += 1
        return (self.seed * 1_000_003 + index * 7919 + 17) % (2**31 - 1)

    def glorot(self, shape: tuple[int, ...], name: str) -> Variable:
        """A Glorot-uniform variable: uniform in ``±sqrt(6 / (fan_in + fan_out))``."""
        fan_in, fan_out = _fans(shape)
        limit = np.sqrt(6.0 / max(1.0, fan_in + fan_out))
        rng = np.random.Generator(np.random.Philox(self._next_seed()))
        return self._add(rng.uniform(-limit, limit, shape).astype(np.float32), name)

    def zeros(self, shape: tuple[int, ...], name: str) -> Variable:
        """A zero-initialised variable (biases)."""
        return self._add(np.zeros(shape, np.float32), name)

    def _add(self, value: np.ndarray, name: str) -> Variable:
        if on_tensorflow():
            import tensorflow as tf

            var = tf.Variable(value, name=name, trainable=True)
        else:  # Keras refuses '/' in names; the optimizer names its slots after this one
            var = keras.Variable(value, name=name.replace("/", "_") + "_0", trainable=True)
        self.variables.append(var)
        self.names.append(f"{name}:0")
        return var


def _fans(shape: tuple[int, ...]) -> tuple[float, float]:
    """Keras' fan-in and fan-out of a weight of ``shape`` (a kernel ``[in, out]``)."""
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    if len(shape) == 2:
        return float(shape[0]), float(shape[1])
    receptive = float(np.prod(shape[:-2]))
    return shape[-2] * receptive, shape[-1] * receptive


class Dense:
    """``y = x @ kernel + bias``, optionally followed by ReLU.

    ``x`` may be a list of column blocks: then ``y = Σ_i x_i @ kernel[rows of block i]``,
    which equals the layer on their concatenation without materialising it (the concat
    and its backward split cost ~5-10 % of an MLP step on a wide embedding input). Under
    mixed precision the blocks are concatenated once in the half type instead
    (:meth:`~embtrain.models.precision.Precision.matmul_parts`): there one matmul, fused with
    the bias and ReLU, and one block-summed weight gradient cost less than the per-block
    matmuls, their sum and the narrow blocks' (the dense features') poor kernel shapes.
    """

    def __init__(self, factory: VariableFactory, fan_in: int, units: int, relu: bool, name: str,
                 logits: bool = False):
        self.kernel = factory.glorot((fan_in, units), f"{name}/kernel")
        self.bias = factory.zeros((units,), f"{name}/bias")
        self.relu = relu
        self.fan_in = fan_in
        self.units = units
        # an output layer computes in float32 under mixed precision (as Keras' guide advises):
        # half-type logits would round each sample's loss gradient
        self.logits = logits and factory.precision.mixed
        self.precision = FLOAT32 if logits else factory.precision

    def __call__(self, x: Block) -> Tensor:
        if self.logits:
            x = [ops.cast(p, "float32") for p in x] if isinstance(x, (list, tuple)) else \
                ops.cast(x, "float32")
        kernel, matmul = self.kernel, self.precision.matmul
        if isinstance(x, (list, tuple)):
            if len(x) > 1 and self.precision.mixed:
                width = sum(int(part.shape[-1]) for part in x)
                if width != self.fan_in:
                    raise ValueError(f"blocks have {width} columns, the layer expects {self.fan_in}")
                y = self.precision.matmul_parts(x, kernel)
            elif len(x) == 1:
                y = matmul(x[0], kernel)
            else:
                terms, offset = [], 0
                for part in x:
                    width = int(part.shape[-1])
                    terms.append(matmul(part, kernel[offset:offset + width]))
                    offset += width
                if offset != self.fan_in:
                    raise ValueError(f"blocks have {offset} columns, the layer expects {self.fan_in}")
                y = ops.add_n(terms)
        else:
            y = matmul(x, kernel)
        y = self.precision.bias_add(y, self.bias)
        return ops.relu(y) if self.relu else y


class MLP:
    """A stack of ReLU layers (possibly empty: the identity)."""

    def __init__(self, factory: VariableFactory, fan_in: int, units: Sequence[int], name: str):
        self.layers: list[Dense] = []
        for i, n in enumerate(units):
            self.layers.append(Dense(factory, fan_in, n, True, f"{name}/{i}"))
            fan_in = n
        self.out_dim = fan_in

    def __call__(self, x: Block) -> Block:
        for layer in self.layers:
            x = layer(x)
        return x


def hidden_units(layers: Sequence[int]) -> list[int]:
    """The hidden layers of a layer list: a trailing 1 is the output layer, not a hidden one."""
    return list(layers[:-1]) if layers and layers[-1] == 1 else list(layers)


class InputBlocks:
    """The input block tensors of one forward pass, each built once: a block used twice (by
    the deep and the wide part, say) is one tensor, so its gradient sums over its uses as the
    all-in-memory group array's does, whatever the storage."""

    def __init__(self, inputs: Inputs, groups: Sequence[Tensor]):
        self.inputs = inputs
        self.groups = groups
        self._made: dict[tuple[Run, ...], Tensor] = {}

    def block(self, block: tuple[Run, ...]) -> Tensor:
        """The block's columns: its one run, or its runs concatenated."""
        tensor = self._made.get(block)
        if tensor is None:
            parts = [self.inputs.run(r, self.groups) for r in block]
            tensor = parts[0] if len(parts) == 1 else ops.concat(parts, axis=1)
            self._made[block] = tensor
        return tensor


Groups = Sequence[Tensor] | InputBlocks  # the engine's group arrays, or their blocks


class Inputs:
    """Reads the embeddings out of the group arrays without needless slicing.

    The network's inputs are *blocks* (:func:`~embtrain.models.slots.input_blocks`): each a
    run of columns of one group array, or, where tiers split a group of the all-in-memory
    layout, the concatenation of its runs, so that the dense arithmetic does not depend on
    where the tables are stored.
    """

    def __init__(self, num_dense: int, slots: Sequence[FeatureSlot], heads: int = 1):
        self.heads = int(heads)
        self.num_dense = int(num_dense)
        self.slots = list(slots)
        self.runs = merge_runs(self.slots)
        self.blocks = input_blocks(self.runs)
        self.group_widths = group_widths(self.slots)
        self.emb_width = sum(s.width for s in self.slots)
        self.fields = sum(s.fields for s in self.slots)

    def run(self, run: Run, groups: Sequence[Tensor]) -> Tensor:
        """The run's columns ``[b, run.width]`` (the whole array when the run covers it)."""
        g = groups[run.group]
        if run.start == 0 and run.width == self.group_widths[run.group]:
            return g
        return g[:, run.start:run.start + run.width]

    def read(self, groups: Groups) -> InputBlocks:
        """The blocks of ``groups`` (a network reads its groups once per call through this)."""
        return groups if isinstance(groups, InputBlocks) else InputBlocks(self, groups)

    def embeddings(self, groups: Groups, blocks: Sequence[tuple[Run, ...]] | None = None
                   ) -> list[Tensor]:
        """One ``[b, width]`` tensor per block (all blocks by default)."""
        reader = self.read(groups)
        return [reader.block(b) for b in (self.blocks if blocks is None else blocks)]

    def field_stacks(self, groups: Groups) -> list[Tensor]:
        """One ``[b, fields, dim]`` tensor per block."""
        reader = self.read(groups)
        return [ops.reshape(reader.block(b), (-1, sum(r.fields for r in b), b[0].dim))
                for b in self.blocks]

    def parts(self, dense: Tensor | None, groups: Groups,
              blocks: Sequence[tuple[Run, ...]] | None = None, dense_last: bool = False
              ) -> list[Tensor]:
        """The column blocks of ``concat(dense, embeddings)`` (dense last if asked)."""
        parts = self.embeddings(groups, blocks)
        if dense is not None and int(dense.shape[-1]):
            parts = [*parts, dense] if dense_last else [dense, *parts]
        if not parts:
            raise ValueError("the model has no inputs (no dense features and no embeddings)")
        return parts

    def concat(self, dense: Tensor | None, groups: Groups,
               blocks: Sequence[tuple[Run, ...]] | None = None, dense_last: bool = False
               ) -> Tensor:
        """``concat(dense, embeddings)`` along columns as one tensor."""
        parts = self.parts(dense, groups, blocks, dense_last)
        return parts[0] if len(parts) == 1 else ops.concat(parts, axis=1)

    def common_dim(self, model: str) -> int:
        """The single table dim every slot shares; ``ValueError`` otherwise."""
        if not self.slots:
            raise ValueError(f"{model}: needs at least one categorical feature")
        dims = sorted({s.dim for s in self.slots})
        if len(dims) != 1:
            raise ValueError(f"{model}: every categorical feature must have the same dim, got {dims}")
        return dims[0]


class Network:
    """Base class: ``__call__(dense, groups) -> logits [b]``."""

    def __init__(self, inputs: Inputs, factory: VariableFactory):
        self.inputs = inputs
        self.factory = factory

    def __call__(self, dense: Tensor, groups: Sequence[Tensor]) -> Tensor:
        raise NotImplementedError

    @property
    def weight_names(self) -> list[str]:
        """The weights' names (TensorFlow's, on every backend), in creation order."""
        return list(self.factory.names)

    def logits(self, out: Tensor) -> Tensor:
        """The output layer's ``[b, heads]`` as the network's logits: ``[b]`` for one head."""
        return out[:, 0] if self.inputs.heads == 1 else out


class MLPNet(Network):
    """concat(dense, embeddings) → ReLU hidden layers → 1 logit."""

    def __init__(self, cfg: MLPModel, inputs: Inputs, factory: VariableFactory):
        super().__init__(inputs, factory)
        fan_in = inputs.num_dense + inputs.emb_width
        self.mlp = MLP(factory, fan_in, hidden_units(cfg.hidden), "mlp/hidden")
        self.out = Dense(factory, self.mlp.out_dim, inputs.heads, False, "mlp/out", logits=True)

    def __call__(self, dense: Tensor, groups: Sequence[Tensor]) -> Tensor:
        return self.logits(self.out(self.mlp(self.inputs.parts(dense, groups))))


def interaction_pairs(n: int, self_interaction: bool) -> np.ndarray:
    """Flat indices into an ``[n, n]`` matrix of the pairs ``i < j`` (``i <= j``), row-major."""
    return np.array([i * n + j for i in range(n) for j in range(i if self_interaction else i + 1, n)],
                    dtype=np.int32)


class DLRMNet(Network):
    """Bottom MLP on dense, dot (or cat) interaction with the embeddings, top MLP."""

    def __init__(self, cfg: DLRMModel, inputs: Inputs, factory: VariableFactory):
        super().__init__(inputs, factory)
        self.cfg = cfg
        dim = inputs.common_dim("dlrm")
        self.dim = dim
        self.bottom: MLP | None = None
        if inputs.num_dense:
            if cfg.bottom[-1] != dim:
                raise ValueError(
                    f"dlrm: the bottom MLP's last layer ({cfg.bottom[-1]}) must equal the "
                    f"embedding dim ({dim})")
            self.bottom = MLP(factory, inputs.num_dense, cfg.bottom, "dlrm/bottom")
        has_bottom = self.bottom is not None
        if cfg.interaction == "dot":
            n = inputs.fields + (1 if has_bottom else 0)
            self.n_vectors = n
            self.pairs = interaction_pairs(n, cfg.self_interaction)
            inter_dim = len(self.pairs) + (dim if has_bottom else 0)
        else:
            inter_dim = inputs.emb_width + (dim if has_bottom else 0)
        self.top = MLP(factory, inter_dim, hidden_units(cfg.top), "dlrm/top")
        self.out = Dense(factory, self.top.out_dim, inputs.heads, False, "dlrm/out", logits=True)

    def interaction(self, dense: Tensor, groups: Groups) -> Block:
        """The top MLP's input: ``[bottom_out, pairwise dots]`` or ``[bottom_out, embeddings]``."""
        bottom = self.bottom(dense) if self.bottom is not None else None
        if self.cfg.interaction == "cat":
            return self.inputs.parts(bottom, groups)
        stacks = self.inputs.field_stacks(groups)
        if bottom is not None:
            stacks = [bottom[:, None, :], *stacks]
        t = stacks[0] if len(stacks) == 1 else ops.concat(stacks, axis=1)
        z = self.factory.precision.matmul_transposed(t, t)
        flat = ops.reshape(z, (-1, self.n_vectors * self.n_vectors))
        dots = ops.gather(flat, self.pairs, axis=1)
        return [dots] if bottom is None else [bottom, dots]

    def __call__(self, dense: Tensor, groups: Sequence[Tensor]) -> Tensor:
        return self.logits(self.out(self.top(self.interaction(dense, groups))))


class DCNv2Net(Network):
    """Cross layers ``x_{l+1} = x0 ⊙ (W x_l + b) + x_l`` and a deep MLP, stacked or parallel."""

    def __init__(self, cfg: DCNv2Model, inputs: Inputs, factory: VariableFactory):
        super().__init__(inputs, factory)
        self.cfg = cfg
        d = inputs.num_dense + inputs.emb_width
        self.cross: list[tuple[list[Variable], Variable]] = []
        for i in range(cfg.cross_layers):
            name = f"dcn_v2/cross/{i}"
            if cfg.low_rank is None:
                mats = [factory.glorot((d, d), f"{name}/w")]
            else:
                mats = [factory.glorot((d, cfg.low_rank), f"{name}/v"),
                        factory.glorot((cfg.low_rank, d), f"{name}/u")]
            self.cross.append((mats, factory.zeros((d,), f"{name}/bias")))
        self.deep = MLP(factory, d, hidden_units(cfg.deep), "dcn_v2/deep")
        out_in = self.deep.out_dim + (d if cfg.structure == "parallel" else 0)
        self.out = Dense(factory, out_in, inputs.heads, False, "dcn_v2/out", logits=True)

    def cross_net(self, x0: Tensor) -> Tensor:
        """The cross network on ``x0``."""
        x = x0
        precision = self.factory.precision
        for mats, bias in self.cross:
            y = x
            for m in mats:
                y = precision.matmul(y, m)
            x = x0 * precision.bias_add(y, bias) + x
        return x

    def __call__(self, dense: Tensor, groups: Sequence[Tensor]) -> Tensor:
        x0 = self.inputs.concat(dense, groups)
        h: Block
        if self.cfg.structure == "stacked":
            h = self.deep(self.cross_net(x0))
        else:
            h = [self.cross_net(x0), self.deep(x0)]
        return self.logits(self.out(h))


class DeepFMNet(Network):
    """First-order linear terms + FM second-order interaction + deep MLP, summed."""

    def __init__(self, cfg: DeepFMModel, inputs: Inputs, factory: VariableFactory):
        super().__init__(inputs, factory)
        inputs.common_dim("deepfm")
        d = inputs.num_dense + inputs.emb_width
        # One Dense(1) on concat(dense, embeddings) = Σ_f Dense(1)(e_f) + linear(dense).
        self.linear = Dense(factory, d, inputs.heads, False, "deepfm/linear", logits=True)
        self.deep = MLP(factory, d, hidden_units(cfg.deep), "deepfm/deep")
        self.out = Dense(factory, self.deep.out_dim, inputs.heads, False, "deepfm/out",
                         logits=True)

    def fm(self, groups: Groups) -> Tensor:
        """``0.5 Σ_d[(Σ_f e_f)² − Σ_f e_f²]`` over every field, ``[b]``."""
        stacks = self.inputs.field_stacks(groups)
        total = ops.add_n([ops.reduce_sum(s, axis=1) for s in stacks])
        squares = ops.add_n([ops.reduce_sum(ops.square(s), axis=1) for s in stacks])
        return 0.5 * ops.reduce_sum(ops.square(total) - squares, axis=1)

    def __call__(self, dense: Tensor, groups: Sequence[Tensor]) -> Tensor:
        groups = self.inputs.read(groups)
        x = self.inputs.parts(dense, groups)
        fm = ops.cast(self.fm(groups), "float32")  # a half type's sum, added to float32 logits
        if self.inputs.heads == 1:
            return self.linear(x)[:, 0] + fm + self.out(self.deep(x))[:, 0]
        return self.linear(x) + fm[:, None] + self.out(self.deep(x))


class WideDeepNet(Network):
    """Linear on concat(wide embeddings, dense) + deep MLP on concat(dense, all embeddings)."""

    def __init__(self, cfg: WideDeepModel, inputs: Inputs, factory: VariableFactory):
        super().__init__(inputs, factory)
        names = [s.name for s in inputs.slots]
        wide = names if cfg.wide_features is None else list(cfg.wide_features)
        unknown = sorted(set(wide) - set(names))
        if unknown:
            raise ValueError(f"wide_deep: wide_features {unknown} are not categorical features "
                             f"of the model (known: {names})")
        keep = set(wide)
        self.wide_blocks = input_blocks(merge_runs([s for s in inputs.slots if s.name in keep]))
        wide_in = sum(r.width for b in self.wide_blocks for r in b) + inputs.num_dense
        self.wide = (Dense(factory, wide_in, inputs.heads, False, "wide_deep/wide", logits=True)
                     if wide_in else None)
        d = inputs.num_dense + inputs.emb_width
        self.deep = MLP(factory, d, hidden_units(cfg.deep), "wide_deep/deep")
        self.out = Dense(factory, self.deep.out_dim, inputs.heads, False, "wide_deep/out",
                         logits=True)

    def __call__(self, dense: Tensor, groups: Sequence[Tensor]) -> Tensor:
        groups = self.inputs.read(groups)
        logit = self.logits(self.out(self.deep(self.inputs.parts(dense, groups))))
        if self.wide is not None:
            x = self.inputs.parts(dense, groups, blocks=self.wide_blocks, dense_last=True)
            logit = logit + self.logits(self.wide(x))
        return logit


class MMoENet(Network):
    """Shared experts; per head a softmax gate mixing them and a tower ending in one logit."""

    def __init__(self, cfg: MMoEModel, inputs: Inputs, factory: VariableFactory):
        super().__init__(inputs, factory)
        d = inputs.num_dense + inputs.emb_width
        self.experts = [MLP(factory, d, cfg.expert, f"mmoe/expert/{k}")
                        for k in range(cfg.experts)]
        width = self.experts[0].out_dim
        self.gates = [Dense(factory, d, cfg.experts, False, f"mmoe/gate/{t}")
                      for t in range(inputs.heads)]
        self.towers = [MLP(factory, width, hidden_units(cfg.tower), f"mmoe/tower/{t}")
                       for t in range(inputs.heads)]
        self.outs = [Dense(factory, tower.out_dim, 1, False, f"mmoe/out/{t}", logits=True)
                     for t, tower in enumerate(self.towers)]

    def __call__(self, dense: Tensor, groups: Sequence[Tensor]) -> Tensor:
        x = self.inputs.concat(dense, groups)
        experts = ops.stack([e(x) for e in self.experts], axis=1)  # [b, experts, width]
        logits = []
        for gate, tower, out in zip(self.gates, self.towers, self.outs, strict=True):
            weights = ops.softmax(gate(x), axis=-1)  # [b, experts]
            mixed = ops.reduce_sum(experts * weights[:, :, None], axis=1)
            logits.append(out(tower(mixed)))
        return self.logits(logits[0] if len(logits) == 1 else ops.concat(logits, axis=1))


class MixedNetwork:
    """A network computing in a half dtype behind a float32 face: the float32 inputs are cast
    to the compute dtype on entry, the logits back to float32 (for the loss, the sigmoid and a
    SavedModel's float32 signature); the gradients of the inputs are float32 (the cast's)."""

    def __init__(self, inner: Network | object, precision: Precision):
        self.inner = inner
        self.precision = precision

    @property
    def weight_names(self) -> list[str]:
        return list(self.inner.weight_names)  # type: ignore[attr-defined]

    def __call__(self, dense: Tensor, groups: Sequence[Tensor]) -> Tensor:
        read = self.precision.read
        logits = self.inner(read(dense), [read(g) for g in groups])  # type: ignore[operator]
        return ops.cast(logits, "float32")


NETWORKS: dict[type, type[Network]] = {
    MLPModel: MLPNet,
    DLRMModel: DLRMNet,
    DCNv2Model: DCNv2Net,
    DeepFMModel: DeepFMNet,
    WideDeepModel: WideDeepNet,
    MMoEModel: MMoENet,
}
if set(NETWORKS) | {KerasModel} != set(DENSE_MODELS.values()):  # pragma: no cover
    raise ImportError("models/networks.py NETWORKS and recipe/models.py DENSE_MODELS name "
                      "different model types")


def build_network(cfg: ModelConfig, num_dense: int, slots: Sequence[FeatureSlot], seed: int,
                  heads: int = 1, labels: Sequence[str] | None = None,
                  precision: Precision = FLOAT32) -> tuple[Network, list[Variable]]:
    """The network for ``cfg`` (``heads`` logits) and its variables in creation order.

    A ``keras`` model is the user's (:mod:`embtrain.models.keras_model`), told the label names
    ``labels``; its weights come from Keras' global seed, set from ``train.seed`` by the job.
    ``precision``: the compute dtype (:mod:`embtrain.models.precision`); the variables are
    float32 whatever it is, and the same as a float32 build's for the same seed."""
    if isinstance(cfg, KerasModel):
        from embtrain.models.keras_model import KerasNet

        names = list(labels) if labels else ["label"]
        if len(names) != heads:
            raise ValueError(f"{heads} heads but {len(names)} label names")
        keras_net = KerasNet(cfg, num_dense, slots, names, precision)
        return keras_net, keras_net.variables  # type: ignore[return-value]
    cls = NETWORKS.get(type(cfg))
    if cls is None:
        raise TypeError(f"not a recipe model config: {type(cfg).__name__}")
    if num_dense < 0:
        raise ValueError(f"num_dense must be >= 0, got {num_dense}")
    if num_dense == 0 and not slots:
        raise ValueError("the model has no inputs (no dense features and no categorical features)")
    factory = VariableFactory(seed, precision)
    net = cls(cfg, Inputs(num_dense, slots, heads), factory)  # type: ignore[arg-type]
    if not factory.variables:
        raise ValueError("the model has no variables")
    if precision.mixed:
        return MixedNetwork(net, precision), factory.variables  # type: ignore[return-value]
    return net, factory.variables
