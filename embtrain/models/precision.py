"""Mixed precision for the dense network (``train.mixed_precision: none | bf16 | fp16``).

The recipe's setting picks the dtype the network *computes* in; everything else stays
float32, as Keras' ``mixed_bfloat16`` / ``mixed_float16`` policies do:

- the weights are float32 variables (the checkpoint, the dense optimizer and its state are
  those of a float32 run); each layer reads its weights through a cast to the compute dtype;
- the engine's pooled vectors and the dense features enter as float32 and are cast on entry;
  the gradients that go back to the engine are float32 (the cast's gradient);
- the logits are cast back to float32 before the loss, the sigmoid and the metrics, so the
  loss, ``predict`` and the SavedModel's ``serve`` signature are float32;
- ``fp16`` (5 exponent bits) scales the loss dynamically against underflow
  (``keras.optimizers.LossScaleOptimizer``: the scale halves and the step is skipped on a
  non-finite gradient, and doubles after 2000 good steps; its two state variables are
  checkpointed with the optimizer's); ``bf16`` has float32's exponent range and needs none.

**Weight gradients summed in float32, per block of rows.** A half-type matmul rounds its output,
so the weight gradient ``xᵀ·dy`` of a whole batch rounded once differs from the sum of two
ranks' halves rounded apart (~2⁻⁹ relative): N ranks would drift from one. So each layer's
weight gradient is taken per block of :attr:`Precision.block_rows` consecutive rows in the half
type (one batched matmul, each block's sum rounded once) and the blocks are summed in float32,
and a bias's gradient likewise (the weight gradient of a column of ones): the rounding then
does not depend on how the batch is split, and N ranks equal one rank to float32's association
error, as in a float32 run, whenever each rank's slice is a multiple of the block.

The block comes from the global batch alone (:func:`block_rows_for`), so every rank count
takes the same one: the largest power of two from 256 to 4096 that divides ``batch_size / 16``
(256 when none does). So up to 16 ranks keep that equality (any N dividing 16, at a
power-of-two batch), and at DE tiny's 65536 the block is 4096 rows: the block partials of its
first layer are 16 × ``[256, 682]`` instead of 256 × (90 MB in bfloat16, then 181 MB widened),
which took the first layer's weight gradient from 81 to 67 ms here (its unblocked matmul: 69;
docs/PERFORMANCE.md, "Half precision"). Smaller batches keep 256-row blocks.
The blocks are summed by a float32 matmul with a row of ones, not ``reduce_sum`` over the
leading axis, and the bias gradient is not a float32 cast of the whole ``[batch, units]``
gradient: on DE tiny's MLP at batch 65536 these two took the bfloat16 step from 1.32x to 1.51x
float32's speed in CPU time (docs/PERFORMANCE.md, "The bfloat16 dense step").
Forward and input gradients are row by row and need nothing.

**One rounding per output, on every CPU** (:func:`half_kernel`). The rule above needs a half-type
matmul that sums its products in float32 and rounds each output once, as oneDNN's kernels do
(AMX or AVX512-BF16, and AVX-512 without native bfloat16 by widening). Where oneDNN has no
bfloat16 kernel (an AVX2 CPU such as an AMD EPYC without AVX-512; here, with
``TF_ENABLE_ONEDNN_OPTS=0``), TensorFlow's own bfloat16 matmul sums in float32 and then
*truncates* the sum to bfloat16 (rounds toward zero): about half of the outputs are one unit
smaller in magnitude, a bias that does not average out, so the block rule and the loss's
closeness to float32's did not hold there. So the first mixed model of a process asks
TensorFlow once (:func:`native_rounds_once`: a small product against NumPy's float32 sum
rounded to nearest): where the native kernel rounds to nearest the matmuls run in the half
type; where it does not, each half-type matmul widens its (half-valued) operands to float32,
multiplies in float32 (the products of two bfloat16 or float16 values are exact in float32) and
rounds the result once, to nearest, to the half type. Both give every output as its float32 sum rounded once, so the
block rule, N ranks == 1 rank, and the accuracy are the same on both kinds of CPU; only the
speed differs (docs/PERFORMANCE.md, "Mixed precision on a CPU without native bfloat16"). Keras
layers of a user's ``type: keras`` model use TensorFlow's own kernels as they are.

A user's Keras model (``model: {type: keras}``) is built while Keras' global policy is
``mixed_bfloat16`` / ``mixed_float16``, so its Keras layers compute in the half type with
float32 weights (see :mod:`embtrain.models.keras_model`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import keras
import numpy as np

from embtrain.models.ops import ops


class _LazyTensorFlow:
    """``tensorflow``, imported on first use: only mixed precision (a TensorFlow feature
    here) needs it, and a process on another Keras backend may have no TensorFlow."""

    def __getattr__(self, name: str) -> Any:
        import tensorflow

        return getattr(tensorflow, name)


tf: Any = _LazyTensorFlow()

PRECISIONS = ("none", "bf16", "fp16")
MIN_BLOCK_ROWS = 256  # rows per block of a weight gradient, fewest and most (see above)
MAX_BLOCK_ROWS = 4096
RANKS_KEPT_EQUAL = 16  # block_rows_for keeps N ranks == 1 rank for N dividing this
#: how a half-type matmul runs: ``auto`` (asks TensorFlow once, :func:`half_kernel`), ``native``
#: (TensorFlow's half-type kernel), ``float32`` (operands widened, one rounding of the result)
HALF_KERNELS = ("auto", "native", "float32")


def block_rows_for(batch_size: int | None) -> int:
    """The weight gradients' block for a global batch of ``batch_size`` rows: the largest power
    of two in ``[MIN_BLOCK_ROWS, MAX_BLOCK_ROWS]`` dividing ``batch_size / RANKS_KEPT_EQUAL``;
    ``MIN_BLOCK_ROWS`` when none does or the batch is not known."""
    if not batch_size or batch_size % RANKS_KEPT_EQUAL:
        return MIN_BLOCK_ROWS
    per_rank = batch_size // RANKS_KEPT_EQUAL
    largest = per_rank & -per_rank  # the largest power of two dividing it
    return max(MIN_BLOCK_ROWS, min(MAX_BLOCK_ROWS, largest))


@dataclass(frozen=True)
class Precision:
    """The dense network's compute dtype, whether the loss is scaled, and the rows per block
    of a half-type weight gradient (:func:`block_rows_for`)."""

    name: str = "none"
    block_rows: int = MIN_BLOCK_ROWS
    kernel: str = "auto"

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {self.name!r}")
        if self.block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {self.block_rows}")
        if self.kernel not in HALF_KERNELS:
            raise ValueError(f"kernel must be one of {HALF_KERNELS}, got {self.kernel!r}")

    @property
    def widen(self) -> bool:
        """Whether the half-type matmuls widen to float32 (:func:`half_kernel`); float32: no."""
        return self.mixed and half_kernel(self.compute_dtype, self.kernel) == "float32"

    @property
    def compute_dtype_name(self) -> str:
        """The compute dtype's name: ``float32``, ``bfloat16`` or ``float16``."""
        return {"none": "float32", "bf16": "bfloat16", "fp16": "float16"}[self.name]

    @property
    def compute_dtype(self) -> tf.DType:
        return {"none": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}[self.name]

    @property
    def mixed(self) -> bool:
        return self.name != "none"

    @property
    def loss_scaling(self) -> bool:
        return self.name == "fp16"

    @property
    def keras_policy(self) -> str:
        return {"none": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[self.name]

    def read(self, x: Any) -> Any:
        """``x`` (a float32 variable or tensor) in the compute dtype (itself for float32)."""
        return x if not self.mixed else tf.cast(x, self.compute_dtype)

    def matmul(self, x: tf.Tensor, w: Any) -> tf.Tensor:
        """``x @ w`` for a float32 weight ``w``: as it is in float32; in the compute dtype
        with a block-summed float32 weight gradient under mixed precision."""
        if not self.mixed:
            return ops.matmul(x, w)
        return _half_matmul(x, w, self.compute_dtype, self.block_rows, self.widen)

    def matmul_parts(self, parts: Sequence[tf.Tensor], w: Any) -> tf.Tensor:
        """``concat(parts, axis=1) @ w`` for a float32 weight ``w`` under mixed precision: the
        parts (cast to the compute dtype) concatenated once, one matmul and one block-summed
        weight gradient, and each part's input gradient straight from its rows of ``w``."""
        return _half_matmul_parts(list(parts), w, self.compute_dtype, self.block_rows,
                                  self.widen)

    def matmul_transposed(self, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        """``a @ bᵀ`` over the last two axes of two activations (e.g. DLRM's pairwise dots): as
        it is in float32 (any backend); in the compute dtype under mixed precision, each output
        one rounding of its float32 sum like the weight matmuls (:func:`matmul_once`)."""
        if not self.mixed:
            return ops.matmul_transposed(a, b)
        return matmul_once(a, b, self.widen, transpose_b=True)

    def bias_add(self, y: tf.Tensor, b: Any) -> tf.Tensor:
        """``y + b`` for a float32 bias ``b``; its gradient per block, summed in float32
        (:func:`block_column_sum`)."""
        if not self.mixed:
            return ops.bias_add(y, b)
        return _half_bias_add(y, b, self.compute_dtype, self.block_rows, self.widen)

    def wrap_optimizer(self, optimizer: keras.optimizers.Optimizer
                       ) -> keras.optimizers.Optimizer:
        """The dense optimizer, inside a dynamic loss scale where the dtype needs one."""
        if not self.loss_scaling:
            return optimizer
        return keras.optimizers.LossScaleOptimizer(optimizer)


FLOAT32 = Precision("none")


def matmul_once(a: tf.Tensor, b: tf.Tensor, widen: bool, **kwargs: Any) -> tf.Tensor:
    """``tf.matmul(a, b, **kwargs)`` in ``a``'s dtype, every output its float32 sum rounded
    once: TensorFlow's kernel where it does that (``widen`` false), else the operands widened to
    float32, multiplied there and the result rounded once (exact products for half types)."""
    if not widen:
        return tf.matmul(a, b, **kwargs)
    product = tf.matmul(tf.cast(a, tf.float32), tf.cast(b, tf.float32), **kwargs)
    return tf.cast(product, a.dtype)


PROBE_TERMS = 1024  # the probe's products per output
PROBE_AGREEMENT = 0.95  # fewest outputs equal to the once-rounded sum for a kernel to pass


@cache
def native_rounds_once(dtype: tf.DType) -> bool:
    """Whether TensorFlow's own ``dtype`` matmul, 2-D and batched, on this CPU gives each output
    as its float32 sum rounded once to the nearest ``dtype`` value. oneDNN's kernels do (all but
    the rare output whose float32 sum, summed in another order, sits at a rounding boundary);
    the kernel TensorFlow runs for bfloat16 where oneDNN has none (an AVX2 CPU) sums in float32
    and then truncates toward zero, so about half of the outputs are one unit smaller in
    magnitude. Asked once per process and dtype on a fixed
    ``[16, PROBE_TERMS] @ [PROBE_TERMS, 16]``: it passes when at least ``PROBE_AGREEMENT`` of
    the outputs equal NumPy's float32 sum rounded to nearest."""
    half = dtype.as_numpy_dtype
    rng = np.random.default_rng(20261127)
    a = rng.standard_normal((16, PROBE_TERMS)).astype(half)
    b = rng.standard_normal((PROBE_TERMS, 16)).astype(half)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(half)
    with tf.init_scope():  # eagerly, also when first asked while a tf.function traces
        products = (tf.matmul(tf.constant(a), tf.constant(b)).numpy(),
                    tf.matmul(tf.constant(a[None]), tf.constant(b[None]))[0].numpy())
    return all(float(np.mean(got == want)) >= PROBE_AGREEMENT for got in products)


def half_kernel(dtype: tf.DType, kernel: str = "auto") -> str:
    """``native`` or ``float32`` for the half-type matmuls in ``dtype``: ``kernel`` itself
    unless ``auto``, which is ``native`` exactly where :func:`native_rounds_once`."""
    if kernel != "auto":
        return kernel
    return "native" if native_rounds_once(dtype) else "float32"


def _blocks(t: tf.Tensor, rows: int) -> tf.Tensor:
    """``t`` ``[n_rows, n]`` as ``[blocks, rows, n]``, a last short block padded with zero rows
    (which add exact zeros; no copy when ``n_rows`` is a multiple of ``rows``)."""
    t = tf.pad(t, [[0, (-tf.shape(t)[0]) % rows], [0, 0]])
    return tf.reshape(t, [-1, rows, tf.shape(t)[1]])


def _sum_blocks(blocks: tf.Tensor) -> tf.Tensor:
    """``Σ_b blocks[b]`` in float32 for ``[blocks, m, n]`` partial sums in a half type: a float32
    matmul by a row of ones (faster here than ``reduce_sum`` over the leading axis)."""
    count, m, n = tf.shape(blocks)[0], tf.shape(blocks)[1], tf.shape(blocks)[2]
    flat = tf.reshape(tf.cast(blocks, tf.float32), [count, m * n])
    return tf.reshape(tf.matmul(tf.ones([1, count], tf.float32), flat), [m, n])


def block_weight_gradient(x: tf.Tensor, dy: tf.Tensor, rows: int = MIN_BLOCK_ROWS,
                          widen: bool = False) -> tf.Tensor:
    """``xᵀ·dy`` as float32: per block of ``rows`` rows in their dtype (one batched matmul, each
    block rounded once; :func:`matmul_once`), the blocks summed in float32. Computed as
    ``(dyᵀ·x)ᵀ``: the wider operand on the right suits oneDNN's batched kernel better."""
    return tf.transpose(_sum_blocks(matmul_once(_blocks(dy, rows), _blocks(x, rows), widen,
                                                transpose_a=True)))


def block_column_sum(dy: tf.Tensor, rows: int = MIN_BLOCK_ROWS, widen: bool = False
                     ) -> tf.Tensor:
    """``Σ_rows dy`` as float32 ``[n]``, by the same rule as :func:`block_weight_gradient` (the
    weight gradient of a column of ones): per block in ``dy``'s dtype, summed in float32.
    Cheaper than casting all of ``dy`` to float32 first."""
    ones = tf.ones([1, 1, rows], dy.dtype)
    return _sum_blocks(matmul_once(ones, _blocks(dy, rows), widen))[0]


def _half_matmul(x: tf.Tensor, w: Any, dtype: tf.DType, rows: int, widen: bool) -> tf.Tensor:
    @tf.custom_gradient
    def matmul(x: tf.Tensor, w: tf.Tensor) -> Any:
        wh = tf.cast(w, dtype)

        def grad(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return (matmul_once(dy, wh, widen, transpose_b=True),
                    block_weight_gradient(x, dy, rows, widen))

        return matmul_once(x, wh, widen), grad

    return matmul(tf.cast(x, dtype), w)


def _half_matmul_parts(parts: list[tf.Tensor], w: Any, dtype: tf.DType, rows: int,
                       widen: bool) -> tf.Tensor:
    widths = [int(p.shape[-1]) for p in parts]

    @tf.custom_gradient
    def matmul(*args: tf.Tensor) -> Any:
        *xs, w = args
        wh = tf.cast(w, dtype)
        x = tf.concat(xs, axis=1)

        def grad(dy: tf.Tensor) -> tuple[tf.Tensor, ...]:
            dxs, offset = [], 0
            for width in widths:
                dxs.append(matmul_once(dy, wh[offset:offset + width], widen, transpose_b=True))
                offset += width
            return (*dxs, block_weight_gradient(x, dy, rows, widen))

        return matmul_once(x, wh, widen), grad

    return matmul(*[tf.cast(p, dtype) for p in parts], w)


def _half_bias_add(y: tf.Tensor, b: Any, dtype: tf.DType, rows: int, widen: bool
                   ) -> tf.Tensor:
    @tf.custom_gradient
    def bias_add(y: tf.Tensor, b: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return dy, block_column_sum(dy, rows, widen)

        return tf.nn.bias_add(y, tf.cast(b, dtype)), grad

    return bias_add(tf.cast(y, dtype), b)


def as_precision(value: str | Precision | None, batch_size: int | None = None) -> Precision:
    """A :class:`Precision` from a recipe value (``None`` is float32) and the global batch size
    (which picks :attr:`Precision.block_rows`; ``None``: the smallest block)."""
    if isinstance(value, Precision):
        return value
    return Precision(value or "none", block_rows_for(batch_size))


@contextmanager
def keras_policy(precision: Precision) -> Iterator[None]:
    """Keras' global dtype policy set to ``precision``'s while the block runs (restored after)."""
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision.keras_policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(before)


def all_finite(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """A scalar bool: every element of every tensor is finite."""
    if not tensors:
        return tf.constant(True)
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def loss_scale_state(optimizer: Any) -> tf.Variable | None:
    """The dynamic loss scale of a :class:`keras.optimizers.LossScaleOptimizer`, else ``None``."""
    return getattr(optimizer, "dynamic_scale", None) if isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer) else None
