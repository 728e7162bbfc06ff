"""The recipe's tables: initializers, admission policies, dynamic (hash) tables, storage tiers
and :class:`Table` (re-exported by :mod:`embtrain.recipe.models`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from embtrain.recipe.base import (
    Name,
    PositiveInt,
    Strict,
)
from embtrain.recipe.kinds import ShardingMode, TableDtype, TierKind
from embtrain.recipe.units import ByteSize, Count

# --------------------------------------------------------------------------- tables


class UniformInit(Strict):
    """Uniform initial values in ``[-scale, scale)``, a function of (seed, table, row, column)."""

    type: Literal["uniform"] = Field("uniform", description="initializer kind")
    scale: Annotated[float, Field(gt=0)] = Field(0.05, description="half-width of the interval")


class NormalInit(Strict):
    """Normal initial values with mean 0 (Box-Muller over the row's counter hash)."""

    type: Literal["normal"] = Field(description="initializer kind")
    std: Annotated[float, Field(gt=0)] = Field(0.01, description="standard deviation")


class TruncatedNormalInit(Strict):
    """Normal initial values with mean 0, redrawn until within two standard deviations."""

    type: Literal["truncated_normal"] = Field(description="initializer kind")
    std: Annotated[float, Field(gt=0)] = Field(
        0.01, description="standard deviation before truncation at ±2·std")


class ZerosInit(Strict):
    """Every initial value 0."""

    type: Literal["zeros"] = Field(description="initializer kind")


class ConstantInit(Strict):
    """Every initial value the same number."""

    type: Literal["constant"] = Field(description="initializer kind")
    value: float = Field(description="the initial value of every element")


Initializer = Annotated[
    UniformInit | NormalInit | TruncatedNormalInit | ZerosInit | ConstantInit,
    Field(discriminator="type"),
]


class NoAdmission(Strict):
    """Every new key gets a row at once."""

    type: Literal["none"] = Field("none", description="admission policy")


class CountAdmission(Strict):
    """Admit a new key once it was seen ``min_count`` times (counted exactly)."""

    type: Literal["count"] = Field(description="admission policy")
    min_count: Annotated[int, Field(ge=1, le=255)] = Field(
        2, description="times a key must be seen before it gets a row; until then it reads its "
                       "initial value and gets no update")


class BloomAdmission(Strict):
    """Admit a new key once a counting Bloom filter saw it ``min_count`` times."""

    type: Literal["bloom"] = Field(description="admission policy")
    min_count: Annotated[int, Field(ge=1, le=255)] = Field(
        2, description="times a key must be seen before it gets a row")
    capacity: Count = Field(
        10_000_000, description="keys the filter is sized for (uint8 counters); it never "
                                "forgets, so a key evicted and seen again is admitted at once")
    false_positive_rate: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.01, description="the filter's false-positive rate at capacity keys")


class ProbabilityAdmission(Strict):
    """Admit a new key with probability ``p`` (deterministic per key and seed)."""

    type: Literal["probability"] = Field(description="admission policy")
    p: Annotated[float, Field(gt=0, le=1)] = Field(
        description="probability that a new key is admitted, decided by a hash of (seed, "
                    "table, key): the same key is always decided the same way")


Admission = Annotated[
    NoAdmission | CountAdmission | BloomAdmission | ProbabilityAdmission,
    Field(discriminator="type"),
]


class Dynamic(Strict):
    """A hash table that grows with new ids up to ``capacity`` rows."""

    capacity: Count = Field(
        description="rows the table may hold, over all ranks (a row-sharded table holds "
                    "capacity / N per rank)")
    eviction: Literal["lru", "lfu", "none"] = Field(
        "lru", description="when admitted keys find the table full: lru evicts the rows with the "
                           "oldest last update, lfu those with the fewest updates (ties by key); "
                           "rows the current batch reads are never evicted; none stops the run "
                           "with one line naming the table and step (exit 2)")
    admission: Admission = Field(
        NoAdmission(), description="which new keys get a row (none, count, bloom, probability)")
    ttl_steps: PositiveInt | None = Field(None, description="drop a row not updated for this many steps")
    missing: Literal["zeros", "initial"] = Field(
        "zeros", description="what a key without a row reads at evaluation: zeros, or the "
                             "initializer's value for that key")


class Tier(Strict):
    """One storage tier of a table shard; tiers are listed fastest first."""

    tier: TierKind = Field(
        description="device (GPU memory; host memory on a machine without a GPU), host or disk; "
                    "tiers are listed fastest first, the last one holds every row",
        examples=["host", "disk"])
    budget: ByteSize | None = Field(
        None, description="bytes this table may use in the tier (values plus optimizer state); "
                          "required on every tier but the last")
    path: str | None = Field(
        None, description="disk tier only: an existing, writable directory for the table's "
                          "file (it is not created for you)")
    eviction: Literal["lru", "lfu"] | None = Field(
        None, description="the cache's replacement (a tier above the last): lru, the default, "
                          "or lfu")

    @model_serializer(mode="wrap")
    def _drop_unset_eviction(self, handler: SerializerFunctionWrapHandler) -> dict:
        """No ``eviction`` key when none is chosen: recipes (and their fingerprints) written
        before the field existed stay the same."""
        out = handler(self)
        if out.get("eviction") is None:
            out.pop("eviction", None)
        return out


class Table(Strict):
    """An embedding table: static (``rows``) or dynamic (``dynamic``)."""

    name: Name = Field(description="the name features refer to (features[].table)")
    dim: PositiveInt = Field(description="width of a row (the embedding's dimension)",
                             examples=[16, 128])
    rows: Count | None = Field(
        None, description="static table: ids 0 .. rows-1; give rows or dynamic, not both")
    dynamic: Dynamic | None = Field(
        None, description="dynamic table: a hash table from int64 keys of any value to rows")
    initializer: Initializer = Field(
        UniformInit(), description="initial values, a function of (seed, table, row or key) "
                                   "only")
    dtype: TableDtype = Field(
        "float32", description="value type of the stored rows; float16 and bfloat16 take half "
                               "the bytes (computed in float32, each update narrowed)")
    rounding: Literal["stochastic", "nearest"] | None = Field(
        None, description="float16/bfloat16 tables: how an update's float32 result is narrowed "
                          "to the table's dtype: stochastic (the default; unbiased, random bits "
                          "from seed, step, table, key and column) or nearest (ties to even)")
    optimizer_state: Literal["float32", "table"] | None = Field(
        None, description="float16/bfloat16 tables: the optimizer's slots in float32 (the "
                          "default) or in the table's dtype (narrowed like the values)")
    sharding: Literal["auto", ShardingMode] = Field(
        "auto", description="how the table is placed on the ranks: data_parallel (a replica "
                            "each), table (whole on one rank), column (a slice of the dim "
                            "each), row (keys by key mod ranks), or auto (the planner "
                            "chooses)")
    storage: list[Tier] = Field(
        default_factory=lambda: [Tier(tier="device")], min_length=1,
        description="ordered storage tiers with budgets; more than one: a cache in memory "
                    "over the last tier (see docs/TIERS.md)")

    @model_serializer(mode="wrap")
    def _drop_unset_half_options(self, handler: SerializerFunctionWrapHandler) -> dict:
        """No ``rounding`` / ``optimizer_state`` key when none is chosen: recipes (and their
        fingerprints) written before the fields existed stay the same."""
        out = handler(self)
        for key in ("rounding", "optimizer_state"):
            if out.get(key) is None:
                out.pop(key, None)
        return out

    @property
    def rounding_mode(self) -> str:
        """``rounding``, or its default ``stochastic``."""
        return self.rounding or "stochastic"

    @property
    def state_dtype(self) -> str:
        """The dtype of the optimizer's slots: ``float32``, or the table's dtype with
        ``optimizer_state: table``."""
        return self.dtype if self.optimizer_state == "table" else "float32"

    @property
    def is_dynamic(self) -> bool:
        return self.dynamic is not None

    @property
    def capacity(self) -> int:
        """Rows the table can hold: ``rows`` for static tables, ``dynamic.capacity`` otherwise."""
        return self.dynamic.capacity if self.dynamic is not None else int(self.rows or 0)
