"""Integer codes and layouts shared by the engine and every kernel backend (no imports)."""

from __future__ import annotations

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

# Sparse optimizers.
OPT_SGD = 0
OPT_ADAGRAD = 1
OPT_ROWWISE_ADAGRAD = 2
OPT_ADAM = 3
OPT_LAZY_ADAM = 4
OPT_FTRL = 5

# Layout of the float32 hyper-parameter vector ``hp`` given to ``backward_update``.
HP_LR = 0
HP_EPS = 1
HP_BETA1 = 2
HP_BETA2 = 3
HP_ONE_MINUS_BETA1 = 4
HP_ONE_MINUS_BETA2 = 5
HP_LR_T = 6
HP_LR_POWER = 7
HP_L1 = 8
HP_L2 = 9
HP_L2_SHRINKAGE = 10
HP_SIZE = 11

# Columns of ``pool_forward``'s per-feature ``err`` array.
BAD_OFFSETS = 0  # a malformed bag
BAD_KEY = 1  # a key outside its table

# ``backward_update`` splits a table shared by several workers into parts of its rows.
SPLIT_BITS = 6
SPLIT_PARTS = 1 << SPLIT_BITS
