"""The dense model on Keras 3's JAX backend: one jitted, stateless step.

The same networks as on TensorFlow (:mod:`embtrain.models.networks`, written against
:mod:`embtrain.models.ops`; a user's ``type: keras`` model as it is), the same loss, the same
Keras optimizers, behind the interface of :class:`embtrain.models.model.DenseModel`:

- the weights and the optimizer's variables are held as JAX arrays; the network reads its
  ``keras.Variable`` weights through ``keras.StatelessScope`` mapped to them;
- one step is ``jax.value_and_grad`` of the loss over the weights and the group arrays, then
  the optimizer's ``stateless_apply``, all under one ``jax.jit`` (traced once per batch shape);
- host arrays enter through DLPack (no copy where they are aligned), device arrays (CuPy's,
  on a GPU) as they are; gradients come back as read-only NumPy views, or as JAX arrays for a
  DLPack crossing (``grads_as_tensors``).

Checkpoints hold the same arrays as TensorFlow's (same order, names and dtypes: the
optimizer's iteration as int64), so a run moves between the backends at any checkpoint.
Mixed precision runs on TensorFlow only (the job refuses it here in one line:
:func:`embtrain.models.backend.recipe_problems`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from embtrain.models.buffers import is_aligned
from embtrain.models.dense_common import (
    DenseNetworkParts,
    DenseOptimizerConfig,
    RecipeScheduleBase,
    keras_optimizer,
    loss_scale_factor,
)
from embtrain.models.heads import label_losses, predictions, weighted_loss
from embtrain.models.networks import ModelConfig
from embtrain.models.ops import ops
from embtrain.models.precision import Precision, as_precision
from embtrain.models.slots import FeatureSlot, check_step_shapes
from embtrain.recipe.models import (
    Label,
    Optimizers,
    Recipe,
)

#: (loss, group gradients, dense gradients) -> the dense gradients to apply (see train_step)
BackwardHook = Callable[[float, list[np.ndarray], list[np.ndarray]], Sequence[Any]]


class KerasRecipeSchedule(RecipeScheduleBase):
    """A recipe :class:`~embtrain.recipe.models.Schedule` in ``keras.ops`` (the JAX twin of
    :class:`embtrain.models.model.RecipeSchedule`), computed in float32: JAX has no float64
    unless enabled process-wide; the factor differs from float64's by float32 rounding."""

    def __call__(self, step: Any) -> Any:
        o, s = keras.ops, self.schedule
        t = o.cast(step, "float32")
        warm = float(s.warmup_steps)
        since = o.maximum(t - warm, 0.0)
        if s.decay == "cosine":
            u = o.minimum(1.0, since / float(s.decay_steps or 1))
            after = s.min_ratio + (1.0 - s.min_ratio) * 0.5 * (1.0 + o.cos(np.pi * u))
        elif s.decay == "step":
            after = o.power(float(s.decay_rate), o.floor(since / float(s.decay_steps or 1)))
        else:
            after = o.ones_like(t)
        factor = o.where(t < warm, (t + 1.0) / max(warm, 1.0), after)
        return o.cast(self.lr * factor, "float32")


def make_keras_optimizer(config: DenseOptimizerConfig | Optimizers | Recipe
                         ) -> keras.optimizers.Optimizer:
    """A Keras 3 optimizer for the recipe's dense optimizer (not yet built), as
    :func:`embtrain.models.model.make_keras_optimizer` makes it on TensorFlow, its schedule a
    :class:`KerasRecipeSchedule`."""
    return keras_optimizer(config, KerasRecipeSchedule)


def to_jax(x: Any, dtype: Any = np.float32) -> jax.Array:
    """``x`` as a JAX array of ``dtype``: a JAX array as it is, a device array (CuPy's) and an
    aligned, writable, C-contiguous host array through DLPack without a copy, others copied."""
    if isinstance(x, jax.Array):
        return x if x.dtype == dtype else x.astype(dtype)
    if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
        arr = jnp.from_dlpack(x)
        return arr if arr.dtype == dtype else arr.astype(dtype)
    arr = np.asarray(x)
    if arr.dtype != dtype:
        arr = arr.astype(dtype)
    if arr.size and arr.flags.c_contiguous and arr.flags.writeable and is_aligned(arr):
        try:
            return jnp.from_dlpack(arr)
        except (BufferError, TypeError, ValueError, RuntimeError):
            pass
    return jnp.asarray(arr)


def _numpy_dtype(var: Any) -> np.dtype:
    """A Keras variable's dtype in NumPy; integers (the optimizer's iteration) as int64, what
    TensorFlow keeps (JAX keeps int32 unless 64-bit types are enabled process-wide)."""
    dtype = np.dtype(str(getattr(var.dtype, "name", var.dtype)))
    return np.dtype(np.int64) if np.issubdtype(dtype, np.integer) else dtype


class JaxDenseModel(DenseNetworkParts):
    """A built dense network plus its dense optimizer on JAX; NumPy (or device arrays) in,
    NumPy out. The interface and conventions are those of
    :class:`embtrain.models.model.DenseModel` (see its docstrings)."""

    def __init__(self, config: ModelConfig, num_dense: int, slots: Sequence[FeatureSlot],
                 seed: int, labels: Sequence[Label] | None = None,
                 label_names: Sequence[str] | None = None,
                 precision: str | Precision | None = None, batch_size: int | None = None):
        resolved = as_precision(precision, batch_size)
        if resolved.mixed:
            raise ValueError(f"mixed precision ({resolved.name}) runs on the TensorFlow "
                             "dense backend only")
        super().__init__(config, num_dense, slots, seed, labels, label_names, resolved)
        if getattr(self.network, "state_variables", None):
            raise ValueError("a Keras model with non-trainable state (BatchNormalization's "
                             "moving statistics, Dropout's seed) runs on the TensorFlow dense "
                             "backend only (train.dense_backend: tensorflow)")
        self._names: list[str] = list(self.network.weight_names)  # type: ignore[attr-defined]
        self._weights: list[jax.Array] = [jnp.asarray(v.value) for v in self._variables]
        #: the dtype the network reads the group arrays in (float32: no mixed precision here)
        self.group_dtype = np.dtype(np.float32)
        self.optimizer: keras.optimizers.Optimizer | None = None
        self._opt_state: list[jax.Array] = []
        self._grad_fn = jax.jit(self._gradients)
        self._predict_fn = jax.jit(self._predict)
        self._step_fn: Any = None
        self._apply_fn: Any = None
        #: each label's loss at the latest step (see :meth:`label_losses`)
        self._label_losses: np.ndarray | None = None

    # ------------------------------------------------------------------ variables

    @property
    def state_variables(self) -> list[Any]:
        """The network's own state: none on JAX (a network with state is refused)."""
        return []

    @property
    def trainable_weight_count(self) -> int:
        """How many of :meth:`get_weights` are trainable: all of them."""
        return len(self._variables)

    @property
    def trainable_variables(self) -> list[Any]:
        """The dense weights' Keras variables in creation order (their shapes; the values are
        in :meth:`get_weights`)."""
        return list(self._variables)

    def weight_names(self) -> list[str]:
        """Names of the dense weights (TensorFlow's), aligned with :meth:`get_weights`."""
        return list(self._names)

    def get_weights(self) -> list[np.ndarray]:
        """Copies of the dense weights."""
        return [np.array(w) for w in self._weights]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Assign the dense weights (same order and shapes as :meth:`get_weights`)."""
        self._weights = self._checked(self._variables, weights, "weights", self._names)

    # ------------------------------------------------------------------ optimizer

    def make_optimizer(self, config: DenseOptimizerConfig | Optimizers | Recipe
                       ) -> keras.optimizers.Optimizer:
        """Create, build (all slots) and attach the recipe's dense optimizer."""
        optimizer = make_keras_optimizer(config)
        optimizer.build(self._variables)
        self.optimizer = optimizer
        self._opt_state = [jnp.asarray(v.value) for v in optimizer.variables]
        donate = (0, 1) if jax.default_backend() != "cpu" else ()

        def step(weights: list[jax.Array], state: list[jax.Array], dense: jax.Array,
                 groups: list[jax.Array], labels: jax.Array, scale: jax.Array) -> Any:
            loss, group_grads, dense_grads, terms = self._gradients(weights, dense, groups,
                                                                    labels, scale)
            weights, state = optimizer.stateless_apply(state, dense_grads, weights)
            return loss, group_grads, weights, state, terms

        def apply(weights: list[jax.Array], state: list[jax.Array],
                  grads: list[jax.Array]) -> Any:
            return optimizer.stateless_apply(state, grads, weights)

        self._step_fn = jax.jit(step, donate_argnums=donate)
        self._apply_fn = jax.jit(apply, donate_argnums=donate)
        return optimizer

    def _state_indices(self) -> list[int]:
        if self.optimizer is None:
            raise RuntimeError("no dense optimizer: call make_optimizer(config) first")
        # The learning rate comes from the recipe, not from the saved state.
        return [i for i, v in enumerate(self.optimizer.variables)
                if not str(v.path).endswith("learning_rate")]

    def learning_rate(self) -> float:
        """The learning rate of the dense optimizer's latest update: its schedule at its
        iteration count less one, else ``lr`` (as
        :meth:`embtrain.models.model.DenseModel.learning_rate`)."""
        if self.optimizer is None:
            raise RuntimeError("no dense optimizer: call make_optimizer(config) first")
        rate = self.optimizer._learning_rate  # Keras 3: the schedule, or the variable holding lr
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
            names = [str(v.path) for v in self.optimizer.variables]
            index = next(i for i, name in enumerate(names) if name.endswith("iteration"))
            return float(rate(max(int(np.asarray(self._opt_state[index])) - 1, 0)))
        return float(np.asarray(getattr(rate, "value", rate)))

    def label_losses(self) -> np.ndarray | None:
        """Each label's loss (not weighted) at the latest gradient computation, as a share of
        that step's loss (as :meth:`embtrain.models.model.DenseModel.label_losses`); ``None``
        without ``labels``."""
        return None if self._label_losses is None else self._label_losses.copy()

    def optimizer_state_names(self) -> list[str]:
        """Stable names of the optimizer state arrays, aligned with :meth:`optimizer_state`."""
        assert self.optimizer is not None
        variables = self.optimizer.variables
        return [str(variables[i].path).split("/", 1)[-1] for i in self._state_indices()]

    def optimizer_state(self) -> list[np.ndarray]:
        """The optimizer's iteration count and slots as NumPy arrays, in the dtypes Keras
        declares (the iteration int64, as on TensorFlow)."""
        assert self.optimizer is not None
        variables = self.optimizer.variables
        return [np.array(self._opt_state[i]).astype(_numpy_dtype(variables[i]))
                for i in self._state_indices()]

    def load_optimizer_state(self, arrays: Sequence[np.ndarray]) -> None:
        """Restore what :meth:`optimizer_state` returned (exact resume)."""
        indices = self._state_indices()
        assert self.optimizer is not None
        variables = [self.optimizer.variables[i] for i in indices]
        loaded = self._checked(variables, arrays, "optimizer state",
                               [str(v.path) for v in variables])
        state = list(self._opt_state)
        for i, value in zip(indices, loaded, strict=True):
            state[i] = value.astype(self._opt_state[i].dtype)
        self._opt_state = state

    @staticmethod
    def _checked(variables: Sequence[Any], arrays: Sequence[np.ndarray], what: str,
                 names: Sequence[str]) -> list[jax.Array]:
        if len(arrays) != len(variables):
            raise ValueError(f"{what}: expected {len(variables)} arrays, got {len(arrays)}")
        for var, arr, name in zip(variables, arrays, names, strict=True):
            if tuple(np.shape(arr)) != tuple(var.shape):
                raise ValueError(f"{what}: {name} has shape {tuple(var.shape)}, "
                                 f"got {tuple(np.shape(arr))}")
        return [jnp.asarray(np.asarray(arr).astype(_numpy_dtype(var), copy=False),
                            dtype=var.value.dtype)
                for var, arr in zip(variables, arrays, strict=True)]

    #: With several ranks the dense gradients ride the embedding's backward exchange as host
    #: arrays (``train_step(backward=...)``), whatever their size: the tensor all-reduces
    #: (Horovod's, the shared-memory one) hand TensorFlow tensors back.
    host_exchange = True

    @property
    def loss_scaled(self) -> bool:
        """Never: float16's loss scaling is TensorFlow's only."""
        return False

    # ----------------------------------------------------------------- traced cores

    def _logits(self, weights: list[jax.Array], dense: jax.Array,
                groups: list[jax.Array]) -> jax.Array:
        with keras.StatelessScope(state_mapping=list(zip(self._variables, weights,
                                                         strict=True))):
            return self.network(dense, list(groups))

    def _loss(self, weights: list[jax.Array], groups: list[jax.Array], dense: jax.Array,
              labels: jax.Array, scale: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The scaled loss, and each label's loss times ``scale`` (an empty array without
        labels)."""
        logits = self._logits(weights, dense, groups)
        if self.labels is None:
            loss = ops.reduce_sum(ops.sigmoid_cross_entropy(labels, logits)) * scale
            return loss, jnp.zeros([0], jnp.float32)
        heads = self._heads(logits)
        terms = label_losses(self.labels, labels, heads)
        loss = weighted_loss(self.labels, labels, heads, terms) * scale
        return loss, jnp.stack(terms).astype(jnp.float32) * scale

    def _gradients(self, weights: list[jax.Array], dense: jax.Array, groups: list[jax.Array],
                   labels: jax.Array, scale: jax.Array) -> Any:
        (loss, terms), (dense_grads, group_grads) = jax.value_and_grad(
            self._loss, argnums=(0, 1), has_aux=True)(weights, groups, dense, labels, scale)
        return loss, group_grads, dense_grads, terms

    def _keep_label_losses(self, terms: Any) -> None:
        if self.labels is not None:
            self._label_losses = np.asarray(terms, dtype=np.float32)

    def _predict(self, weights: list[jax.Array], dense: jax.Array,
                 groups: list[jax.Array]) -> jax.Array:
        logits = self._logits(weights, dense, groups)
        if self.labels is None:
            return ops.sigmoid(logits)
        return predictions(self.labels, self._heads(logits))

    # -------------------------------------------------------------------- public API

    def group_tensor(self, group: Any) -> jax.Array:
        """A group array as the network takes it (float32 JAX array)."""
        return to_jax(group)

    def _inputs(self, dense: Any, groups: Sequence[Any], labels: Any = None
                ) -> tuple[jax.Array, list[jax.Array], Any, int]:
        dense = to_jax(dense)
        groups = [to_jax(g) for g in groups]
        if labels is not None:
            labels = to_jax(labels)
        batch = check_step_shapes(dense, groups, labels, self.num_dense, self.group_widths,
                                  None if self.labels is None else self.heads)
        return dense, groups, labels, batch

    @staticmethod
    def _scale(batch: int, global_batch_size: int | None, loss_scale: float | None
               ) -> jax.Array:
        return jnp.float32(loss_scale_factor(batch, global_batch_size, loss_scale))

    def gradients(self, dense: Any, groups: Sequence[Any], labels: Any, *,
                  global_batch_size: int | None = None, loss_scale: float | None = None
                  ) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
        """``(loss, group_grads, dense_grads)`` without updating anything (see
        :meth:`embtrain.models.model.DenseModel.gradients`)."""
        dense, groups, labels, batch = self._inputs(dense, groups, labels)
        loss, group_grads, dense_grads, terms = self._grad_fn(
            self._weights, dense, groups, labels, self._scale(batch, global_batch_size,
                                                              loss_scale))
        self._keep_label_losses(terms)
        return (float(loss), [np.asarray(g) for g in group_grads],
                [np.asarray(g) for g in dense_grads])

    def train_step(self, dense: Any, groups: Sequence[Any], labels: Any, *,
                   global_batch_size: int | None = None, loss_scale: float | None = None,
                   allreduce_dense_grads: Callable[[list[Any]], list[Any]] | None = None,
                   grads_as_tensors: bool = False,
                   backward: BackwardHook | None = None) -> tuple[float, list[Any]]:
        """One dense step; returns ``(loss, d(loss)/d(groups[g]) as float32 [b, w_g])`` (see
        :meth:`embtrain.models.model.DenseModel.train_step`: the same conventions; the hooks
        get and return NumPy arrays here)."""
        if self._step_fn is None:
            raise RuntimeError("no dense optimizer: call make_optimizer(config) first")
        dense, groups, labels, batch = self._inputs(dense, groups, labels)
        scale = self._scale(batch, global_batch_size, loss_scale)
        if backward is None and allreduce_dense_grads is None:
            loss, group_grads, self._weights, self._opt_state, terms = self._step_fn(
                self._weights, self._opt_state, dense, groups, labels, scale)
            self._keep_label_losses(terms)
        else:
            loss, group_grads, dense_grads, terms = self._grad_fn(self._weights, dense, groups,
                                                                  labels, scale)
            self._keep_label_losses(terms)
            host = [np.asarray(g) for g in dense_grads]
            if backward is not None:
                group_np = [np.asarray(g) for g in group_grads]
                reduced = list(backward(float(loss), group_np, host))
            else:
                reduced = list(allreduce_dense_grads(host))  # type: ignore[misc]
            if len(reduced) != len(self._variables):
                raise ValueError(f"the hook returned {len(reduced)} gradients, "
                                 f"expected {len(self._variables)}")
            self._weights, self._opt_state = self._apply_fn(
                self._weights, self._opt_state, [to_jax(np.asarray(g)) for g in reduced])
            if backward is not None:
                return float(loss), group_np
        if grads_as_tensors:
            return float(loss), list(group_grads)
        return float(loss), [np.asarray(g) for g in group_grads]

    def predict(self, dense: Any, groups: Sequence[Any]) -> np.ndarray:
        """Click probabilities ``[b]``; with ``labels``: ``[b, labels]``."""
        dense, groups, _, _ = self._inputs(dense, groups)
        return np.asarray(self._predict_fn(self._weights, dense, groups))
