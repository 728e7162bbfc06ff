"""The engine's own small, frozen configuration and input types.

:mod:`embtrain.embedding.from_recipe` converts the user's recipe into these; the engine
never sees the recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from embtrain.data.batch import SparseInput  # noqa: F401  (the engine's input, built by the data layer)
from embtrain.kernels.optimizer_spec import spec_of
from embtrain.recipe.kinds import HALF_TABLE_DTYPES, TABLE_DTYPES

InitializerKind = Literal["uniform", "normal", "truncated_normal", "zeros", "constant"]
Combiner = Literal["sum", "mean", "sqrtn", "concat"]
OptimizerKind = str  # a name of ``kernels.optimizer_spec.SPARSE_OPTIMIZERS``

INITIALIZER_KINDS: tuple[str, ...] = ("zeros", "constant", "uniform", "normal", "truncated_normal")
COMBINERS: tuple[str, ...] = ("sum", "mean", "sqrtn", "concat")
SUPPORTED_DTYPES: tuple[str, ...] = TABLE_DTYPES
HALF_DTYPES: tuple[str, ...] = HALF_TABLE_DTYPES
ROUNDINGS: tuple[str, ...] = ("stochastic", "nearest")
OPTIMIZER_STATES: tuple[str, ...] = ("float32", "table")


@dataclass(frozen=True)
class InitializerConfig:
    """How a table's rows start.

    ``uniform``: U[-scale, scale); ``normal``: N(0, std²); ``truncated_normal``: N(0, std²)
    redrawn outside ±2·std (like TF); ``zeros``; ``constant``: every value equals ``value``.
    """

    kind: InitializerKind = "uniform"
    scale: float = 0.05
    std: float = 0.05
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in INITIALIZER_KINDS:
            raise ValueError(f"unknown initializer kind {self.kind!r}; one of {INITIALIZER_KINDS}")
        if self.scale < 0 or self.std < 0:
            raise ValueError("initializer scale and std must be >= 0")


def uniform(scale: float = 0.05) -> InitializerConfig:
    """U[-scale, scale) initializer."""
    return InitializerConfig(kind="uniform", scale=scale)


def normal(std: float = 0.05) -> InitializerConfig:
    """N(0, std²) initializer."""
    return InitializerConfig(kind="normal", std=std)


def truncated_normal(std: float = 0.05) -> InitializerConfig:
    """N(0, std²) truncated at ±2·std initializer."""
    return InitializerConfig(kind="truncated_normal", std=std)


def zeros() -> InitializerConfig:
    """All-zero initializer."""
    return InitializerConfig(kind="zeros")


def constant(value: float) -> InitializerConfig:
    """Constant initializer."""
    return InitializerConfig(kind="constant", value=value)


@dataclass(frozen=True)
class ShardPlacement:
    """Where a table shard sits in its full table (for initial values and global keys).

    Local row ``i`` is global row ``row_offset + i * row_stride``; local column ``c`` is
    global column ``col_start + c`` of a table ``full_dim`` wide.
    """

    row_offset: int = 0
    row_stride: int = 1
    col_start: int = 0
    full_dim: int = 0

    def __post_init__(self) -> None:
        if self.row_offset < 0 or self.row_stride < 1 or self.col_start < 0:
            raise ValueError("shard placement: offset >= 0, stride >= 1, col_start >= 0")


ADMISSIONS: tuple[str, ...] = ("none", "count", "bloom", "probability")
EVICTIONS: tuple[str, ...] = ("lru", "lfu", "none")
MISSING: tuple[str, ...] = ("zeros", "initial")


@dataclass(frozen=True)
class DynamicConfig:
    """A dynamic (hash) table: int64 keys of any value, up to ``rows`` of them live.

    ``admission``: ``none``; ``count`` (a key gets a row once seen ``min_count`` times,
    counted exactly); ``bloom`` (a counting Bloom filter of ``bloom_capacity`` keys at
    ``false_positive_rate`` sees it ``min_count`` times); ``probability`` (admitted with
    probability ``p``, deterministic per seed, table and key). A key not admitted reads its
    initial value and is not updated. ``eviction`` when an insert finds the table full:
    ``lru`` (oldest ``last_step``), ``lfu`` (smallest ``update_count``), ties by key, rows the
    batch reads are never evicted; ``none``: :class:`TableFullError`. ``ttl_steps``: rows not
    updated for that many steps are removed at step boundaries. ``missing``: what a key
    without a row reads at evaluation: ``zeros`` or ``initial`` (its initializer's value).
    """

    eviction: str = "lru"
    admission: str = "none"
    min_count: int = 2
    bloom_capacity: int = 10_000_000
    false_positive_rate: float = 0.01
    p: float = 1.0
    ttl_steps: int | None = None
    missing: str = "zeros"

    def __post_init__(self) -> None:
        if self.eviction not in EVICTIONS:
            raise ValueError(f"unknown eviction {self.eviction!r}; one of {EVICTIONS}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"unknown admission {self.admission!r}; one of {ADMISSIONS}")
        if self.missing not in MISSING:
            raise ValueError(f"unknown missing {self.missing!r}; one of {MISSING}")
        if not 1 <= self.min_count <= 255:
            raise ValueError("admission min_count must be in 1..255")
        if not 0.0 < self.p <= 1.0 or not 0.0 < self.false_positive_rate < 1.0:
            raise ValueError("admission p must be in (0, 1], false_positive_rate in (0, 1)")
        if self.bloom_capacity < 1 or (self.ttl_steps is not None and self.ttl_steps < 1):
            raise ValueError("bloom capacity and ttl_steps must be positive")


@dataclass(frozen=True)
class TierConfig:
    """A table kept below memory: ``cache_rows`` rows in the first tier (a cache with
    LRU or LFU replacement) in front of a backing store holding every row (``store``:
    ``memory``, a host-memory array, or ``disk``, a file under ``path``). Lookups and updates
    happen in the cache, so results equal an all-in-memory table."""

    cache_rows: int
    store: str = "memory"
    path: str | None = None
    eviction: str = "lru"
    # the memory tiers' bytes and what one cached row costs (0: unknown): a shard of a
    # dynamic table, whose key directory is smaller than the whole table's, sizes its cache
    # from them (embtrain.embedding.sharded)
    budget: int = 0
    row_bytes: int = 0

    def __post_init__(self) -> None:
        if self.cache_rows < 1:
            raise ValueError("a tier's cache needs at least one row")
        if not self.store or self.eviction not in ("lru", "lfu"):
            raise ValueError("a tier needs a store kind (embtrain.storage.kinds); eviction: lru "
                             "or lfu")


@dataclass(frozen=True)
class TableConfig:
    """An embedding table: ``rows`` × ``dim`` values; keys are row ids (static) or, with
    ``dynamic``, int64 keys of any value held in a hash table of capacity ``rows``; with
    ``tier``, its rows live in a backing store behind a cache (static or dynamic).

    ``placement``: when the table is a shard of a larger one, where it sits in it (its
    initial values are then those of the full table's rows and columns).

    ``dtype``: the values' type; a ``float16``/``bfloat16`` table stores them as 16-bit
    patterns (``np.uint16``), computes in float32 and narrows each update with ``rounding``
    (``stochastic``: random bits from seed, step, table, global row and column; ``nearest``:
    ties to even). ``optimizer_state``: the slots in ``float32`` or in the ``table``'s dtype.
    """

    name: str
    rows: int
    dim: int
    initializer: InitializerConfig = field(default_factory=uniform)
    dtype: str = "float32"
    placement: ShardPlacement | None = None
    rounding: str = "stochastic"
    optimizer_state: str = "float32"
    dynamic: DynamicConfig | None = None
    tier: TierConfig | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("table name must not be empty")
        if self.rows <= 0 or self.dim <= 0:
            raise ValueError(f"table {self.name!r}: rows and dim must be positive")
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"table {self.name!r}: dtype {self.dtype!r} not supported; one of {SUPPORTED_DTYPES}"
            )
        if self.rounding not in ROUNDINGS or self.optimizer_state not in OPTIMIZER_STATES:
            raise ValueError(f"table {self.name!r}: rounding one of {ROUNDINGS}, "
                             f"optimizer_state one of {OPTIMIZER_STATES}")
        p = self.placement
        if p is not None and p.col_start + self.dim > max(p.full_dim, self.dim):
            raise ValueError(f"table {self.name!r}: shard columns beyond the full dim")


    @property
    def is_half(self) -> bool:
        """Whether the values are float16 or bfloat16 (stored as 16-bit patterns)."""
        return self.dtype in HALF_DTYPES

    @property
    def state_dtype(self) -> str:
        """The optimizer slots' dtype: the table's with ``optimizer_state: table``."""
        return self.dtype if self.optimizer_state == "table" else "float32"


@dataclass(frozen=True)
class FeatureConfig:
    """A sparse input feature reading table ``table`` and pooling its bag with ``combiner``.

    ``hotness`` is the fixed number of keys per sample, or ``None`` for variable length.
    ``concat`` needs a fixed hotness and yields ``hotness * dim`` columns (missing keys give
    zeros); the other combiners yield ``dim`` columns.
    """

    name: str
    table: str
    combiner: Combiner = "sum"
    hotness: int | None = None

    def __post_init__(self) -> None:
        if self.combiner not in COMBINERS:
            raise ValueError(
                f"feature {self.name!r}: unknown combiner {self.combiner!r}; one of {COMBINERS}"
            )
        if self.hotness is not None and self.hotness <= 0:
            raise ValueError(f"feature {self.name!r}: hotness must be positive")
        if self.combiner == "concat" and self.hotness is None:
            raise ValueError(f"feature {self.name!r}: combiner 'concat' needs a fixed hotness")


@dataclass(frozen=True)
class SparseOptimizerConfig:
    """The sparse optimizer shared by every table of the engine.

    Field names follow TensorFlow's ops and optimizers. Fields a kind does not use are ignored:
    ``adagrad``/``rowwise_adagrad``: ``initial_accumulator_value``, ``epsilon``;
    ``adam``/``lazy_adam``: ``beta1``, ``beta2``, ``epsilon``;
    ``ftrl``: ``learning_rate_power``, ``initial_accumulator_value``,
    ``l1_regularization_strength``, ``l2_regularization_strength``,
    ``l2_shrinkage_regularization_strength``, ``beta`` (Keras: adds ``beta / (2 lr)`` to l2).
    ``options``: ``(name, value)`` pairs of the kind's own options beyond these fields, as its
    spec declares them (:attr:`embtrain.kernels.optimizer_spec.OptimizerSpec.options`; the
    spec's default for one not given).
    """

    kind: OptimizerKind = "adagrad"
    lr: float = 0.01
    initial_accumulator_value: float = 0.1
    epsilon: float = 1e-7
    beta1: float = 0.9
    beta2: float = 0.999
    learning_rate_power: float = -0.5
    l1_regularization_strength: float = 0.0
    l2_regularization_strength: float = 0.0
    l2_shrinkage_regularization_strength: float = 0.0
    beta: float = 0.0
    # the learning rate's multiplier at a (0-based) step; None: constant lr
    lr_factor: Callable[[int], float] | None = field(default=None, compare=False)
    options: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        own = {name for name, _ in spec_of(self.kind).options}  # (unknown kind: ValueError)
        for name, _ in self.options:
            if name not in own:
                raise ValueError(f"sparse optimizer {self.kind!r} has no option {name!r}; "
                                 f"its own options: {sorted(own)}")
        if self.lr <= 0:
            raise ValueError("sparse optimizer lr must be positive")
        if self.initial_accumulator_value < 0:
            raise ValueError("initial_accumulator_value must be >= 0")
        if self.learning_rate_power > 0:
            raise ValueError("learning_rate_power must be <= 0")
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ValueError("beta1 and beta2 must be in [0, 1)")
