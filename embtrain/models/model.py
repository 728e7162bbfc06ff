"""The dense model: TensorFlow forward/backward on the engine's pooled embeddings.

Per step the engine hands over one ``[batch, width_g]`` float32 array per embedding
group; :meth:`DenseModel.train_step` runs the network under one ``GradientTape``,
updates the dense weights with the recipe's dense optimizer and returns
``d(loss)/d(group arrays)`` for the engine's fused sparse backward (DESIGN.md decision 1).

Dense optimizer: Keras 3 (``keras.optimizers``). On the 2-core development machine, for an
MLP 256-128-1 on a ``[65536, 10 + 58×16]`` input, a whole Adam step (forward, backward,
update) cost the same with Keras 3 and with ``tf.compat.v1.train.AdamOptimizer`` (fused
``ResourceApplyAdam``): ~0.49 s wall (best of 15), ~1.0 s CPU, interleaved runs, because
three large matmuls dominate and the optimizer touches only ~270 k weights. Keras 3 wins on
the rest: ``optimizer.build()`` creates every slot eagerly before ``tf.function`` traces
(v1 optimizers create slots lazily, which a traced function may not do after its first
call), and ``optimizer.variables`` gives the exact state for checkpoints.

Mixed precision (``train.mixed_precision``, :mod:`embtrain.models.precision`): the network
computes in bfloat16 or float16 while the weights, the optimizer, the loss and every array
crossing to or from the engine stay float32; float16 scales the loss dynamically, and a step
whose gradients are not finite (dense or group, on any rank) is skipped on the dense side and
sends zero gradients to the engine.

Host arrays cross into TensorFlow without a copy when they are 64-byte aligned (DLPack,
see :mod:`embtrain.models.buffers`); otherwise TensorFlow copies them (~0.25 s more per
step for the case above). Gradients come back as read-only views, not copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from embtrain.models.buffers import is_aligned
from embtrain.models.build import recipe_arguments
from embtrain.models.dense_common import (
    DenseNetworkParts,
    DenseOptimizerConfig,
    RecipeScheduleBase,
    keras_optimizer,
    loss_scale_factor,
)
from embtrain.models.heads import label_losses, predictions, weighted_loss
from embtrain.models.networks import MixedNetwork, ModelConfig, Network
from embtrain.models.precision import Precision, all_finite, as_precision, loss_scale_state
from embtrain.models.slots import FeatureSlot, check_step_shapes
from embtrain.recipe.models import (
    Label,
    Optimizers,
    Recipe,
)

ArrayLike = np.ndarray | tf.Tensor
GradHook = Callable[[list[tf.Tensor]], list[tf.Tensor]]
#: (loss, group gradients, dense gradients) -> the dense gradients to apply (see train_step)
BackwardHook = Callable[[float, list[np.ndarray], list[np.ndarray]], Sequence[ArrayLike]]


class RecipeSchedule(RecipeScheduleBase):
    """A recipe :class:`~embtrain.recipe.models.Schedule` as a Keras schedule of the optimizer's
    iteration count (0-based, checkpointed with the optimizer state, so resume continues it);
    computed in float64 like the sparse side's, then float32."""

    def __call__(self, step: Any) -> Any:
        s = self.schedule
        t = tf.cast(step, tf.float64)
        one = tf.constant(1.0, tf.float64)  # a bare 1.0 first in an op would be float32
        warm = float(s.warmup_steps)
        since = tf.maximum(t - warm, tf.constant(0.0, tf.float64))
        if s.decay == "cosine":
            u = tf.minimum(one, since / float(s.decay_steps or 1))
            after = s.min_ratio + (1.0 - s.min_ratio) * 0.5 * (one + tf.cos(np.pi * u))
        elif s.decay == "step":
            after = tf.pow(tf.constant(s.decay_rate, tf.float64),
                           tf.floor(since / float(s.decay_steps or 1)))
        else:
            after = one
        factor = tf.where(t < warm, (t + 1.0) / max(warm, 1.0), after)
        return tf.cast(self.lr * factor, tf.float32)


def make_keras_optimizer(config: DenseOptimizerConfig | Optimizers | Recipe
                         ) -> keras.optimizers.Optimizer:
    """A Keras 3 optimizer for the recipe's dense optimizer (not yet built), its schedule a
    :class:`RecipeSchedule`."""
    return keras_optimizer(config, RecipeSchedule)


#: NumPy names of the half types a tensor may be made from as they are (``bfloat16``:
#: ml_dtypes', TensorFlow's own): a network computing in one takes its group arrays in it.
HALF_ARRAYS = {"bfloat16": tf.bfloat16, "float16": tf.float16}


def _half_type(x: Any) -> tf.DType | None:
    """The half type of an array of one (:data:`HALF_ARRAYS`), else ``None``."""
    return HALF_ARRAYS.get(getattr(getattr(x, "dtype", None), "name", ""))


def to_tensor(x: ArrayLike) -> tf.Tensor:
    """A float32 tensor, or a bfloat16/float16 one from an array of that type
    (:data:`HALF_ARRAYS`); a C-contiguous, writable, 64-byte aligned array is borrowed through
    DLPack without a copy (see :mod:`embtrain.models.buffers`), others are copied."""
    if isinstance(x, tf.Tensor):
        return x
    half = _half_type(x)
    if half is not None:
        return _half_tensor(np.asarray(x), half)
    arr = np.asarray(x, dtype=np.float32)
    if (arr.size and arr.flags.c_contiguous and arr.flags.writeable and is_aligned(arr)):
        try:
            return tf.experimental.dlpack.from_dlpack(arr.__dlpack__())
        except (BufferError, TypeError, ValueError, tf.errors.OpError):
            pass
    return tf.convert_to_tensor(arr)


def _half_tensor(arr: np.ndarray, dtype: tf.DType) -> tf.Tensor:
    """A half-type array as a tensor of ``dtype``: its 16-bit patterns borrowed through
    DLPack (NumPy cannot export ml_dtypes' bfloat16) and bit-cast, copied where they cannot
    be borrowed."""
    bits = arr.view(np.uint16)
    if bits.size and bits.flags.c_contiguous and bits.flags.writeable and is_aligned(bits):
        try:
            return tf.bitcast(tf.experimental.dlpack.from_dlpack(bits.__dlpack__()), dtype)
        except (BufferError, TypeError, ValueError, tf.errors.OpError):
            pass
    return tf.bitcast(tf.convert_to_tensor(bits), dtype)


def to_numpy(t: tf.Tensor) -> np.ndarray:
    """A read-only NumPy view of a CPU tensor (no copy; ``.numpy()`` would copy)."""
    return np.asarray(t)


def _name(var: Any) -> str:
    return str(getattr(var, "path", None) or var.name)


class DenseModel(DenseNetworkParts):
    """A built dense network plus its dense optimizer; NumPy in, NumPy out.

    ``groups[g]`` must be ``[batch, group_widths[g]]`` float32, or of :attr:`group_dtype` (the
    last column any slot of group ``g`` uses); ``dense`` is ``[batch, num_dense]`` float32 (``[batch, 0]`` when
    there are no dense features); ``labels`` is ``[batch]`` float32 in ``{0, 1}``.
    """

    def __init__(self, config: ModelConfig, num_dense: int, slots: Sequence[FeatureSlot],
                 seed: int, labels: Sequence[Label] | None = None,
                 label_names: Sequence[str] | None = None,
                 precision: str | Precision | None = None, batch_size: int | None = None):
        super().__init__(config, num_dense, slots, seed, labels, label_names,
                         as_precision(precision, batch_size))
        self.network: Network
        #: variables the network updates itself, not the optimizer (a Keras model's batch-norm
        #: moving statistics, its dropout seed state): checkpointed after the weights
        self._network_state: list[Any] = list(getattr(self.network, "state_variables", []))
        self.optimizer: keras.optimizers.Optimizer | None = None
        #: The dtype the network reads the group arrays in: a built-in network under mixed
        #: precision casts them to its compute dtype on entry, so it takes them in that dtype
        #: (arrays of it skip the cast, and the engine writes half the bytes); a user's Keras
        #: model and float32 take float32. Group arrays of another dtype are cast to it.
        self.group_dtype: tf.DType = (self.precision.compute_dtype if isinstance(
            self.network, MixedNetwork) else tf.float32)
        self._dense_spec = tf.TensorSpec([None, self.num_dense], tf.float32)
        self._group_specs = [tf.TensorSpec([None, w], self.group_dtype)
                             for w in self.group_widths]
        self._labels_spec = tf.TensorSpec([None] if self.labels is None else [None, self.heads],
                                          tf.float32)
        self._scale_spec = tf.TensorSpec([], tf.float32)
        self._grad_fn = self._traced_gradients()
        self._predict_fn = tf.function(
            self._predict, input_signature=[self._dense_spec, self._group_specs],
            reduce_retracing=True)
        self._step_fn: Any = None
        self._apply_fn: Any = None
        #: each label's loss at the latest step (see :meth:`label_losses`), set by the traced step
        self._label_losses = (None if self.labels is None else
                              tf.Variable(tf.zeros([self.heads], tf.float32), trainable=False))

    @property
    def _training(self) -> dict[str, bool]:
        """The keyword that puts a network with state in training mode (batch statistics,
        moving averages updated, dropout on) in the training step."""
        return {"training": True} if self._network_state else {}

    def _traced_gradients(self) -> Any:
        return tf.function(
            self._gradients,
            input_signature=[self._dense_spec, self._group_specs, self._labels_spec,
                             self._scale_spec],
            reduce_retracing=True)

    # ------------------------------------------------------------------ variables

    @property
    def trainable_variables(self) -> list[tf.Variable]:
        """The dense weights in creation order (the first of get/set_weights)."""
        return list(self._variables)

    @property
    def state_variables(self) -> list[Any]:
        """The network's own state (batch-norm moving statistics...), after the weights in
        get/set_weights; none for the built-in networks."""
        return list(self._network_state)

    @property
    def trainable_weight_count(self) -> int:
        """How many of :meth:`get_weights` are trainable (a checkpoint written before the
        network's state was kept holds these only)."""
        return len(self._variables)

    def weight_names(self) -> list[str]:
        """Names of the dense weights, aligned with :meth:`get_weights`."""
        return [_name(v) for v in [*self._variables, *self._network_state]]

    def get_weights(self) -> list[np.ndarray]:
        """Copies of the dense weights, then of the network's state."""
        return [v.numpy() for v in [*self._variables, *self._network_state]]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Assign the dense weights and state (same order and shapes as :meth:`get_weights`;
        the weights alone leave the state as it is)."""
        every = [*self._variables, *self._network_state]
        self._assign(every[:len(weights)] if len(weights) == len(self._variables) else every,
                     weights, "weights")

    # ------------------------------------------------------------------ optimizer

    def make_optimizer(self, config: DenseOptimizerConfig | Optimizers | Recipe
                       ) -> keras.optimizers.Optimizer:
        """Create, build (all slots) and attach the recipe's dense optimizer."""
        optimizer = self.precision.wrap_optimizer(make_keras_optimizer(config))
        optimizer.build(self._variables)
        self.optimizer = optimizer
        self._grad_fn = self._traced_gradients()  # now with the loss scale, if any
        variables = self._variables
        scaled = loss_scale_state(optimizer) is not None

        def step(dense: tf.Tensor, groups: list[tf.Tensor], labels: tf.Tensor,
                 scale: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
            loss, group_grads, dense_grads = self._gradients(dense, groups, labels, scale)
            optimizer.apply_gradients(zip(dense_grads, variables, strict=True))
            if scaled:  # a skipped step sends the engine zeros
                finite = all_finite(dense_grads)
                group_grads = [tf.where(finite, g, tf.zeros_like(g)) for g in group_grads]
            return loss, group_grads

        def apply(grads: list[tf.Tensor]) -> tf.Tensor:
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return all_finite(grads) if scaled else tf.constant(True)

        self._step_fn = tf.function(
            step, input_signature=[self._dense_spec, self._group_specs, self._labels_spec,
                                   self._scale_spec],
            reduce_retracing=True)
        self._apply_fn = tf.function(
            apply, input_signature=[[tf.TensorSpec(v.shape, v.dtype) for v in variables]])
        return optimizer

    def _state_variables(self) -> list[Any]:
        if self.optimizer is None:
            raise RuntimeError("no dense optimizer: call make_optimizer(config) first")
        # The learning rate comes from the recipe, not from the saved state.
        return [v for v in self.optimizer.variables if not _name(v).endswith("learning_rate")]

    def learning_rate(self) -> float:
        """The learning rate of the dense optimizer's latest update: its schedule at its
        iteration count less one (a float16 step it skipped does not count), else ``lr``."""
        if self.optimizer is None:
            raise RuntimeError("no dense optimizer: call make_optimizer(config) first")
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        rate = inner._learning_rate  # Keras 3: the schedule, or the variable holding lr
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
            return float(rate(max(int(inner.iterations.numpy()) - 1, 0)))
        return float(np.asarray(rate))

    def label_losses(self) -> np.ndarray | None:
        """Each label's loss (not weighted) at the latest gradient computation, as a share of
        that step's loss: ``Σ_local rows loss_t × scale``, so that with ``global_batch_size``
        the ranks' arrays sum to each label's mean over the global batch; ``None`` without
        ``labels``."""
        return None if self._label_losses is None else self._label_losses.numpy().copy()

    def optimizer_state_names(self) -> list[str]:
        """Stable names of the optimizer state arrays, aligned with :meth:`optimizer_state`."""
        # Keras prefixes a per-process unique optimizer name ("adam_3/..."): drop it; a loss
        # scale's own variables (float16) are named "loss_scale/...".
        own = {id(v) for v in getattr(self.optimizer, "_variables", [])} if (
            loss_scale_state(self.optimizer) is not None) else set()
        return [("loss_scale/" if id(v) in own else "") + _name(v).split("/", 1)[-1]
                for v in self._state_variables()]

    def optimizer_state(self) -> list[np.ndarray]:
        """The optimizer's iteration count and slots (momenta, accumulators) as NumPy arrays."""
        return [np.asarray(v.numpy()).copy() for v in self._state_variables()]

    def load_optimizer_state(self, arrays: Sequence[np.ndarray]) -> None:
        """Restore what :meth:`optimizer_state` returned (exact resume)."""
        self._assign(self._state_variables(), arrays, "optimizer state")

    @staticmethod
    def _assign(variables: Sequence[Any], arrays: Sequence[np.ndarray], what: str) -> None:
        if len(arrays) != len(variables):
            raise ValueError(f"{what}: expected {len(variables)} arrays, got {len(arrays)}")
        for var, arr in zip(variables, arrays, strict=True):
            arr = np.asarray(arr)
            if tuple(arr.shape) != tuple(var.shape):
                raise ValueError(f"{what}: {_name(var)} has shape {tuple(var.shape)}, "
                                 f"got {tuple(arr.shape)}")
        for var, arr in zip(variables, arrays, strict=True):
            dtype = np.dtype(getattr(var.dtype, "as_numpy_dtype", var.dtype))
            var.assign(np.asarray(arr).astype(dtype, copy=False))

    # ----------------------------------------------------------------- traced cores

    def _gradients(self, dense: tf.Tensor, groups: list[tf.Tensor], labels: tf.Tensor,
                   scale: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
        groups = list(groups)
        loss_scale = loss_scale_state(self.optimizer)
        with tf.GradientTape() as tape:
            tape.watch(groups)
            logits = self.network(dense, groups, **self._training)
            if self.labels is None:
                losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
                loss = tf.reduce_sum(losses) * scale
            else:
                heads = self._heads(logits)
                terms = label_losses(self.labels, labels, heads)
                loss = weighted_loss(self.labels, labels, heads, terms) * scale
                self._label_losses.assign(
                    tf.cast(tf.stack(terms), tf.float32) * tf.cast(scale, tf.float32))
            target = loss if loss_scale is None else loss * loss_scale
        grads = tape.gradient(target, [*self._variables, *groups],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads = [tf.convert_to_tensor(g) for g in grads]
        n = len(self._variables)
        dense_grads, group_grads = grads[:n], grads[n:]
        if loss_scale is not None:
            # dense gradients stay scaled (the LossScaleOptimizer unscales them); a non-finite
            # group gradient poisons them so that every rank skips the step together; the
            # group gradients are unscaled in float32 (float16 would lose their small values)
            group_grads = [tf.cast(g, tf.float32) / loss_scale for g in group_grads]
            poison = tf.where(all_finite(group_grads), 0.0, float("nan"))
            dense_grads = [dense_grads[0] + poison, *dense_grads[1:]]
        return loss, group_grads, dense_grads

    @property
    def loss_scaled(self) -> bool:
        """Whether the dense optimizer scales the loss (float16): a step may then be skipped."""
        return self.optimizer is not None and loss_scale_state(self.optimizer) is not None

    def _predict(self, dense: tf.Tensor, groups: list[tf.Tensor]) -> tf.Tensor:
        logits = self.network(dense, list(groups))
        if self.labels is None:
            return tf.sigmoid(logits)
        return predictions(self.labels, self._heads(logits))

    # -------------------------------------------------------------------- public API

    def group_tensor(self, group: ArrayLike) -> tf.Tensor:
        """A group array as the network takes it: a tensor of :attr:`group_dtype` (borrowed
        when the array is of that dtype and aligned, else cast as the network would)."""
        tensor = to_tensor(group)
        return tensor if tensor.dtype == self.group_dtype else tf.cast(tensor, self.group_dtype)

    @staticmethod
    def _as_given(grads: Sequence[tf.Tensor], groups: Sequence[ArrayLike]) -> list[tf.Tensor]:
        """The group gradients in float32 for the groups given in float32 (which the network
        read through a cast: as the gradient of that cast), else as the network made them."""
        def given(g: ArrayLike) -> Any:
            if isinstance(g, tf.Tensor):
                return g.dtype
            return _half_type(g) or tf.float32

        return [tf.cast(d, tf.float32) if d.dtype != tf.float32 and given(g) == tf.float32
                else d for d, g in zip(grads, groups, strict=True)]

    def _inputs(self, dense: ArrayLike, groups: Sequence[ArrayLike],
                labels: ArrayLike | None = None
                ) -> tuple[tf.Tensor, list[tf.Tensor], Any, int]:
        dense = to_tensor(dense)
        groups = [self.group_tensor(g) for g in groups]
        if labels is not None:
            labels = to_tensor(labels)
        batch = check_step_shapes(dense, groups, labels, self.num_dense, self.group_widths,
                                  None if self.labels is None else self.heads)
        return dense, groups, labels, batch

    @staticmethod
    def _scale(batch: int, global_batch_size: int | None, loss_scale: float | None) -> tf.Tensor:
        return tf.constant(loss_scale_factor(batch, global_batch_size, loss_scale), tf.float32)

    def gradients(self, dense: ArrayLike, groups: Sequence[ArrayLike], labels: ArrayLike, *,
                  global_batch_size: int | None = None, loss_scale: float | None = None
                  ) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
        """``(loss, group_grads, dense_grads)`` without updating the weights (a network's own
        state, e.g. batch-norm moving statistics, is updated as by a training step).

        The loss is ``loss_scale · Σ_i bce_i``; ``loss_scale`` defaults to ``1/global_batch_size``
        when that is given, else ``1/local batch`` (the local mean). Under float16's dynamic
        loss scale the gradients returned are unscaled.
        """
        given = list(groups)
        dense, groups, labels, batch = self._inputs(dense, groups, labels)
        loss, group_grads, dense_grads = self._grad_fn(
            dense, groups, labels, self._scale(batch, global_batch_size, loss_scale))
        group_grads = self._as_given(group_grads, given)
        scaled = loss_scale_state(self.optimizer)
        dense_out = [to_numpy(g) for g in dense_grads]
        if scaled is not None:
            dense_out = [g / np.float32(scaled.numpy()) for g in dense_out]
        return float(loss), [to_numpy(g) for g in group_grads], dense_out

    def train_step(self, dense: ArrayLike, groups: Sequence[ArrayLike], labels: ArrayLike, *,
                   global_batch_size: int | None = None, loss_scale: float | None = None,
                   allreduce_dense_grads: GradHook | None = None,
                   grads_as_tensors: bool = False,
                   backward: BackwardHook | None = None) -> tuple[float, list[Any]]:
        """One dense step; returns ``(loss, d(loss)/d(groups[g]) as float32 [b, w_g])`` (for a
        group given in the network's half :attr:`group_dtype`, in that dtype when the network
        makes it so: bfloat16; float16's loss-scaled gradients are unscaled in float32).

        Global-batch convention: with ``global_batch_size=B`` the loss is ``Σ_local bce / B``,
        so the group gradients are d(mean loss over the global batch)/d(group) and the
        processes' dense gradients must be SUMMED (``allreduce_dense_grads``, e.g. Horovod
        ``op=Sum``); without it the loss is the local mean and the hook should average.
        The hook gets and returns eager tensors aligned with ``trainable_variables``.
        ``backward`` (instead of ``allreduce_dense_grads``) gets the loss, the group gradients
        and the dense gradients as NumPy arrays once they are known, before the dense update,
        and returns the dense gradients to apply: the whole step's backward traffic in one
        exchange (the sharded embedding's).
        Inputs that are 64-byte aligned (:func:`embtrain.models.aligned_empty`) are borrowed,
        not copied; the returned gradients are read-only views of TensorFlow's buffers
        (``grads_as_tensors``: TensorFlow's tensors themselves, for a DLPack crossing).
        """
        if self._step_fn is None:
            raise RuntimeError("no dense optimizer: call make_optimizer(config) first")
        given = list(groups)
        dense, groups, labels, batch = self._inputs(dense, groups, labels)
        scale = self._scale(batch, global_batch_size, loss_scale)
        if backward is not None:
            if self.loss_scaled:  # a skipped step must reach the engine as zeros: decide first
                raise ValueError("train_step: backward= cannot skip a float16 loss-scaled step; "
                                 "use allreduce_dense_grads")
            loss, group_grads, dense_grads = self._grad_fn(dense, groups, labels, scale)
            group_np = [to_numpy(g) for g in self._as_given(group_grads, given)]
            reduced = list(backward(float(loss), group_np, [to_numpy(g) for g in dense_grads]))
            if len(reduced) != len(self._variables):
                raise ValueError(f"backward returned {len(reduced)} gradients, "
                                 f"expected {len(self._variables)}")
            self._apply_fn([tf.convert_to_tensor(g, tf.float32) for g in reduced])
            return float(loss), group_np
        if allreduce_dense_grads is None:
            loss, group_grads = self._step_fn(dense, groups, labels, scale)
        else:
            loss, group_grads, dense_grads = self._grad_fn(dense, groups, labels, scale)
            reduced = list(allreduce_dense_grads(list(dense_grads)))
            if len(reduced) != len(self._variables):
                raise ValueError(f"allreduce_dense_grads returned {len(reduced)} tensors, "
                                 f"expected {len(self._variables)}")
            finite = self._apply_fn([tf.convert_to_tensor(g, tf.float32) for g in reduced])
            if not bool(finite):  # a skipped step (float16 loss scaling) sends the engine zeros
                return float(loss), [np.zeros(g.shape, np.float32) for g in group_grads]
        group_grads = self._as_given(group_grads, given)
        if grads_as_tensors:
            return float(loss), list(group_grads)
        return float(loss), [to_numpy(g) for g in group_grads]

    def predict(self, dense: ArrayLike, groups: Sequence[ArrayLike]) -> np.ndarray:
        """Click probabilities ``[b]``; with ``labels``: ``[b, labels]``, a probability per
        bce label and the output itself per mse label."""
        dense, groups, _, _ = self._inputs(dense, groups)
        return to_numpy(self._predict_fn(dense, groups))


def build_model(config: ModelConfig | Recipe, num_dense: int, slots: Sequence[FeatureSlot],
                seed: int, labels: Sequence[Label] | None = None,
                label_names: Sequence[str] | None = None,
                precision: str | Precision | None = None,
                batch_size: int | None = None) -> DenseModel:
    """The dense model for a recipe's ``model`` section (or a whole recipe: then with its
    ``data.labels``, ``train.mixed_precision`` and ``data.batch_size``); ``labels``: one head
    per label, the weighted sum of their losses; ``precision``: ``none | bf16 | fp16``;
    ``batch_size``: the global batch, which sets a half network's weight-gradient blocks
    (:func:`embtrain.models.precision.block_rows_for`)."""
    config, labels, label_names, precision, batch_size = recipe_arguments(
        config, labels, label_names, precision, batch_size)
    return DenseModel(config, num_dense, slots, seed, labels, label_names, precision,
                      batch_size)
