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
    type: Literal["uniform"] = "uniform"
    scale: Annotated[float, Field(gt=0)] = 0.05


class NormalInit(Strict):
    type: Literal["normal"]
    std: Annotated[float, Field(gt=0)] = 0.01


class TruncatedNormalInit(Strict):
    type: Literal["truncated_normal"]
    std: Annotated[float, Field(gt=0)] = 0.01


class ZerosInit(Strict):
    type: Literal["zeros"]


class ConstantInit(Strict):
    type: Literal["constant"]
    value: float


Initializer = Annotated[
    UniformInit | NormalInit | TruncatedNormalInit | ZerosInit | ConstantInit,
    Field(discriminator="type"),
]


class NoAdmission(Strict):
    type: Literal["none"] = "none"


class CountAdmission(Strict):
    """Admit a new key once it was seen ``min_count`` times (counted exactly)."""

    type: Literal["count"]
    min_count: Annotated[int, Field(ge=1, le=255)] = 2


class BloomAdmission(Strict):
    """Admit a new key once a counting Bloom filter saw it ``min_count`` times."""

    type: Literal["bloom"]
    min_count: Annotated[int, Field(ge=1, le=255)] = 2
    capacity: Count = 10_000_000
    false_positive_rate: Annotated[float, Field(gt=0, lt=1)] = 0.01


class ProbabilityAdmission(Strict):
    """Admit a new key with probability ``p`` (deterministic per key and seed)."""

    type: Literal["probability"]
    p: Annotated[float, Field(gt=0, le=1)]


Admission = Annotated[
    NoAdmission | CountAdmission | BloomAdmission | ProbabilityAdmission,
    Field(discriminator="type"),
]


class Dynamic(Strict):
    """A hash table that grows with new ids up to ``capacity`` rows."""

    capacity: Count
    eviction: Literal["lru", "lfu", "none"] = "lru"
    admission: Admission = NoAdmission()
    ttl_steps: PositiveInt | None = Field(None, description="drop a row not updated for this many steps")
    missing: Literal["zeros", "initial"] = Field(
        "zeros", description="what a key without a row reads at evaluation: zeros, or the "
                             "initializer's value for that key")


class Tier(Strict):
    """One storage tier of a table shard; tiers are listed fastest first."""

    tier: TierKind
    budget: ByteSize | None = Field(
        None, description="bytes this table may use in the tier (values plus optimizer state); "
                          "required on every tier but the last")
    path: str | None = Field(None, description="disk tier only: directory for the table's file")
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

    name: Name
    dim: PositiveInt
    rows: Count | None = None
    dynamic: Dynamic | None = None
    initializer: Initializer = UniformInit()
    dtype: TableDtype = "float32"
    rounding: Literal["stochastic", "nearest"] | None = Field(
        None, description="float16/bfloat16 tables: how an update's float32 result is narrowed "
                          "to the table's dtype: stochastic (the default; unbiased, random bits "
                          "from seed, step, table, key and column) or nearest (ties to even)")
    optimizer_state: Literal["float32", "table"] | None = Field(
        None, description="float16/bfloat16 tables: the optimizer's slots in float32 (the "
                          "default) or in the table's dtype (narrowed like the values)")
    sharding: Literal["auto", ShardingMode] = "auto"
    storage: list[Tier] = Field(default_factory=lambda: [Tier(tier="device")], min_length=1)

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
