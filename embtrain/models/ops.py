"""The array ops of the built-in networks and heads, on this process's Keras backend.

The networks (:mod:`embtrain.models.networks`) and the heads are written once against this
module. On the TensorFlow backend every op is the TensorFlow op the networks have always
used (``tf.nn.bias_add``, ``tf.add_n``, ``tf.matmul(..., transpose_b=True)``, ...), so their
graphs, speed and bits are unchanged (grappler still fuses MatMul + BiasAdd + Relu); on any
other Keras backend (JAX: :mod:`embtrain.models.dense_jax`) each op is its ``keras.ops``
equivalent. The backend is Keras' for the whole process (chosen before Keras is first
imported: :mod:`embtrain.models.backend`), so the choice is made once, on import.

``tensorflow`` is imported only on the TensorFlow backend: a JAX process needs no TensorFlow.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import keras


class KerasOps:
    """The ops as ``keras.ops`` (any Keras backend)."""

    name = "keras"

    @staticmethod
    def concat(xs: Sequence[Any], axis: int) -> Any:
        return keras.ops.concatenate(list(xs), axis=axis)

    @staticmethod
    def reshape(x: Any, shape: tuple[int, ...]) -> Any:
        return keras.ops.reshape(x, shape)

    @staticmethod
    def matmul(x: Any, w: Any) -> Any:
        return keras.ops.matmul(x, w)

    @staticmethod
    def matmul_transposed(a: Any, b: Any) -> Any:
        """``a @ bᵀ`` over the last two axes (batched)."""
        return keras.ops.einsum("...ij,...kj->...ik", a, b)

    @staticmethod
    def gather(x: Any, indices: Any, axis: int) -> Any:
        return keras.ops.take(x, indices, axis=axis)

    @staticmethod
    def bias_add(y: Any, b: Any) -> Any:
        return keras.ops.add(y, b)

    @staticmethod
    def add_n(xs: Sequence[Any]) -> Any:
        return functools.reduce(keras.ops.add, xs)

    @staticmethod
    def relu(x: Any) -> Any:
        return keras.ops.relu(x)

    @staticmethod
    def reduce_sum(x: Any, axis: int | None = None) -> Any:
        return keras.ops.sum(x, axis=axis)

    @staticmethod
    def square(x: Any) -> Any:
        return keras.ops.square(x)

    @staticmethod
    def sigmoid(x: Any) -> Any:
        return keras.ops.sigmoid(x)

    @staticmethod
    def softmax(x: Any, axis: int = -1) -> Any:
        return keras.ops.softmax(x, axis=axis)

    @staticmethod
    def stack(xs: Sequence[Any], axis: int) -> Any:
        return keras.ops.stack(list(xs), axis=axis)

    @staticmethod
    def cast(x: Any, dtype: Any) -> Any:
        return keras.ops.cast(x, dtype)

    @staticmethod
    def zeros(shape: Sequence[int], dtype: str = "float32") -> Any:
        return keras.ops.zeros(tuple(shape), dtype=dtype)

    @staticmethod
    def sigmoid_cross_entropy(labels: Any, logits: Any) -> Any:
        """Binary cross-entropy of logits, TensorFlow's stable form
        ``max(x, 0) - x·z + log1p(exp(-|x|))`` with its selects, so that the gradient at
        ``x = 0`` (a zero logit: zero biases and a dead ReLU row) is TensorFlow's too."""
        x, z = logits, labels
        o = keras.ops
        positive = o.greater_equal(x, 0.0)
        relu_logits = o.where(positive, x, o.zeros_like(x))
        neg_abs_logits = o.where(positive, -x, x)
        return relu_logits - x * z + o.log1p(o.exp(neg_abs_logits))


class TensorFlowOps(KerasOps):
    """The ops as the TensorFlow ops the networks were written with."""

    name = "tensorflow"

    def __init__(self) -> None:
        import tensorflow as tf

        self.tf = tf

    def concat(self, xs: Sequence[Any], axis: int) -> Any:  # type: ignore[override]
        return self.tf.concat(list(xs), axis=axis)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:  # type: ignore[override]
        return self.tf.reshape(x, shape)

    def matmul(self, x: Any, w: Any) -> Any:  # type: ignore[override]
        return self.tf.matmul(x, w)

    def matmul_transposed(self, a: Any, b: Any) -> Any:  # type: ignore[override]
        return self.tf.matmul(a, b, transpose_b=True)

    def gather(self, x: Any, indices: Any, axis: int) -> Any:  # type: ignore[override]
        return self.tf.gather(x, indices, axis=axis)

    def bias_add(self, y: Any, b: Any) -> Any:  # type: ignore[override]
        return self.tf.nn.bias_add(y, b)

    def add_n(self, xs: Sequence[Any]) -> Any:  # type: ignore[override]
        return self.tf.add_n(list(xs))

    def relu(self, x: Any) -> Any:  # type: ignore[override]
        return self.tf.nn.relu(x)

    def reduce_sum(self, x: Any, axis: int | None = None) -> Any:  # type: ignore[override]
        return self.tf.reduce_sum(x, axis=axis)

    def square(self, x: Any) -> Any:  # type: ignore[override]
        return self.tf.square(x)

    def sigmoid(self, x: Any) -> Any:  # type: ignore[override]
        return self.tf.sigmoid(x)

    def softmax(self, x: Any, axis: int = -1) -> Any:  # type: ignore[override]
        return self.tf.nn.softmax(x, axis=axis)

    def stack(self, xs: Sequence[Any], axis: int) -> Any:  # type: ignore[override]
        return self.tf.stack(list(xs), axis=axis)

    def cast(self, x: Any, dtype: Any) -> Any:  # type: ignore[override]
        return self.tf.cast(x, dtype)

    def zeros(self, shape: Sequence[int], dtype: str = "float32") -> Any:  # type: ignore[override]
        return self.tf.zeros(tuple(shape), dtype)

    def sigmoid_cross_entropy(self, labels: Any, logits: Any) -> Any:  # type: ignore[override]
        return self.tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)


def on_tensorflow() -> bool:
    """Whether this process's Keras runs on TensorFlow."""
    return keras.backend.backend() == "tensorflow"


#: The ops of this process's Keras backend.
ops: KerasOps = TensorFlowOps() if on_tensorflow() else KerasOps()
