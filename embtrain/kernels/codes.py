"""Integer codes and layouts shared by the engine and every kernel backend (the sparse
optimizers' codes and hyper-parameter layout are defined with their spec,
:mod:`embtrain.kernels.optimizer_spec`, and re-exported here)."""

from __future__ import annotations

from embtrain.kernels.optimizer_spec import (  # noqa: F401 (re-exported)
    HP_BETA1,
    HP_BETA2,
    HP_EPS,
    HP_L1,
    HP_L2,
    HP_L2_SHRINKAGE,
    HP_LR,
    HP_LR_POWER,
    HP_LR_T,
    HP_ONE_MINUS_BETA1,
    HP_ONE_MINUS_BETA2,
    HP_OPTIONS,
    HP_SIZE,
    OPT_ADAGRAD,
    OPT_ADAM,
    OPT_FTRL,
    OPT_LAZY_ADAM,
    OPT_ROWWISE_ADAGRAD,
    OPT_SGD,
)

# Initializer kinds.
INIT_ZEROS = 0
INIT_CONSTANT = 1
INIT_UNIFORM = 2
INIT_NORMAL = 3
INIT_TRUNCATED_NORMAL = 4

# Combiners.
COMB_SUM = 0
COMB_MEAN = 1
COMB_SQRTN = 2
COMB_CONCAT = 3

# Columns of ``pool_forward``'s per-feature ``err`` array.
BAD_OFFSETS = 0  # a malformed bag
BAD_KEY = 1  # a key outside its table

# Value dtypes of a table (half tables hold the 16-bit patterns in ``np.uint16`` arrays; the
# conversions: :mod:`embtrain.kernels.rules.halves`).
VAL_F32 = 0
VAL_BF16 = 1
VAL_F16 = 2

#: The dtypes (by NumPy name; ``bfloat16`` is ml_dtypes') of pooled outputs and gradients in a
#: half type, handed to and taken from a network that computes in it.
HALF_OUTPUTS = {"bfloat16": VAL_BF16, "float16": VAL_F16}


def half_code(array: object) -> int:
    """``VAL_BF16``/``VAL_F16`` for an array of that dtype (:data:`HALF_OUTPUTS`), else 0."""
    return HALF_OUTPUTS.get(getattr(getattr(array, "dtype", None), "name", ""), 0)


# How an update is rounded back to a half table's dtype.
ROUND_NEAREST = 0  # to nearest, ties to even
ROUND_STOCHASTIC = 1  # up or down with probability proportional to the distance (unbiased)

# ``backward_update`` splits a table shared by several workers into parts of its rows.
SPLIT_BITS = 6
SPLIT_PARTS = 1 << SPLIT_BITS
