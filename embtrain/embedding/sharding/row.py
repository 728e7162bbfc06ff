"""``row`` sharding: owner ``r`` holds the keys ``k ≡ r (mod world size)`` as local rows
``k // world size``; a dynamic table the keys whose hash (:func:`shard_of_keys`) is ``r``, as
they are, in its own hash table.

Ids: each key goes to its owner only (bag lengths per sample and owner, one route per concat
position); owners pool partial sums (``sum``) of the samples with a key there, which travel
only for those samples and are summed by the requester, then scaled for ``mean`` and
``sqrtn`` (:meth:`ShardedEmbedding._exchange_pooled`); gradients go back, scaled the same
way, only for those samples. Traffic: :class:`embtrain.plan.shardings.RowModel`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from embtrain.embedding.config import FeatureConfig, SparseInput, TableConfig
from embtrain.embedding.dynamic import shard_of_keys
from embtrain.embedding.engine import EmbeddingEngine, TableState
from embtrain.embedding.sharding.base import (
    Outbound,
    Pending,
    Route,
    Samples,
    ShardingStrategy,
    TablePlacement,
)
from embtrain.plan.shardings import MODELS


def merge_admission(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One table's admission state from its row shards': counted keys concatenated (each key
    lives on one shard) and sorted; Bloom counters added (saturating), which is the filter one
    rank would hold."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    if "bloom" in parts[0]:
        total = np.sum([p["bloom"].astype(np.int64) for p in parts], axis=0)
        return {"bloom": np.minimum(total, 255).astype(np.uint8)}
    keys = np.concatenate([p["admission_keys"] for p in parts])
    counts = np.concatenate([p["admission_counts"] for p in parts])
    order = np.argsort(keys, kind="stable")
    return {"admission_keys": keys[order], "admission_counts": counts[order]}


class RowSharding(ShardingStrategy):
    """Owners each with a share of the keys, every column."""

    name = "row"
    model = MODELS["row"]

    def routes(self, feature: FeatureConfig, table: TableConfig,
               placement: TablePlacement) -> list[Route]:
        pieces = int(feature.hotness or 1) if feature.combiner == "concat" else 1
        positions = range(pieces) if feature.combiner == "concat" else [-1]
        out = []
        for o in placement.owners:
            for pos in positions:
                local = feature.name if pos < 0 else f"{feature.name}#{pos}"
                out.append(Route(feature.name, local, table.name, o, self, pos, table.dim,
                                 (0, table.dim), pieces))
        return out

    def local_feature(self, route: Route, feature: FeatureConfig) -> FeatureConfig:
        return FeatureConfig(route.local, feature.table, "sum", None)

    def outbound(self, route: Route, inp: SparseInput, samples: Samples, world: int,
                 dynamic: bool) -> Outbound:
        """The keys of ``inp`` this owner holds (of one concat position), as local keys,
        with per-sample lengths, and which samples have one."""
        keys = np.asarray(inp.keys, dtype=np.int64)
        weights = None if inp.weights is None else np.asarray(inp.weights, dtype=np.float32)
        sample_of = samples.of(route.feature, inp)
        owner = shard_of_keys(keys, world) if dynamic else keys % world
        mask = owner == route.owner
        if route.position >= 0:
            offsets = np.asarray(inp.offsets, dtype=np.int64)
            pos = np.arange(keys.shape[0], dtype=np.int64) - offsets[sample_of]
            mask &= pos == route.position
        lengths = np.bincount(sample_of[mask], minlength=inp.batch_size).astype(np.int32)
        arrays = [lengths, keys[mask] if dynamic else keys[mask] // world]
        if weights is not None:
            arrays.append(weights[mask])
        return Outbound([int(mask.sum()), int(weights is not None), 0], arrays, lengths > 0)

    def received(self, pending: Pending, index: int, src: int, lengths: np.ndarray) -> None:
        pending.recv_present[(index, src)] = lengths > 0

    def place(self, result: list[np.ndarray], where: tuple[int, int, int], route: Route,
              block: np.ndarray, dim: int, row_sums: dict[str, np.ndarray],
              present: np.ndarray | None) -> None:
        """Add the partial sums of the samples with a key at this owner into ``row_sums``."""
        G, _, W = where
        acc = row_sums.get(route.feature)
        if acc is None:
            acc = row_sums[route.feature] = np.zeros((result[G].shape[0], W), np.float32)
        cols = slice(0, dim) if route.position < 0 else slice(route.position * dim,
                                                              (route.position + 1) * dim)
        assert present is not None
        acc[present, cols] += block

    def partial_sums(self, route: Route) -> bool:
        return route.position < 0  # a concat position's rows are whole at one owner

    def grad_block(self, g: np.ndarray, route: Route, pending: Pending, batch: int,
                   dim: int) -> np.ndarray:
        if route.position >= 0:
            return g[:, route.position * dim:(route.position + 1) * dim]
        scale = pending.scales.get(route.feature)
        return g if scale is None else g * scale[:, None]

    def export_range(self, engine: EmbeddingEngine, name: str, lo: int, hi: int, rank: int,
                     world: int, dynamic: bool) -> TableState:
        if dynamic:
            return engine.export_range(name, lo, hi)
        # local row l is key l * world + rank
        first = max(0, -(-(lo - rank) // world))
        last = max(first, -(-(hi - rank) // world))
        return engine.export_range(name, first, last)

    def merge(self, states: Mapping[int, TableState], placement: TablePlacement, world: int,
              dynamic: bool, slot_names: Sequence[str]) -> TableState:
        """Row shards merged by global key."""
        owners = placement.owners
        keys = np.concatenate([states[o].keys if dynamic else states[o].keys * world + o
                               for o in owners])
        order = np.argsort(keys, kind="stable")

        def merged(arrays: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(arrays)[order]

        return TableState(
            keys=keys[order],
            values=merged([states[o].values for o in owners]),
            slots={s: merged([states[o].slots[s] for o in owners]) for s in slot_names},
            update_count=merged([states[o].update_count for o in owners]),  # type: ignore[misc]
            last_step=merged([states[o].last_step for o in owners]),  # type: ignore[misc]
            extra=merge_admission([states[o].extra for o in owners]),
            dtype=states[owners[0]].dtype,
            state_dtype=states[owners[0]].state_dtype,
        )

    def select(self, keys: np.ndarray, extra: dict[str, Any], rank: int, world: int,
               dynamic: bool) -> tuple[Any, np.ndarray, dict[str, Any]]:
        if not dynamic:
            sel = np.flatnonzero(keys % world == rank)
            return sel, keys[sel] // world, extra
        sel = np.flatnonzero(shard_of_keys(keys, world) == rank)
        if "admission_keys" in extra:
            mine = shard_of_keys(extra["admission_keys"], world) == rank
            extra = {"admission_keys": np.asarray(extra["admission_keys"])[mine],
                     "admission_counts": np.asarray(extra["admission_counts"])[mine]}
        return sel, keys[sel], extra


STRATEGY = RowSharding()
traffic = STRATEGY.traffic

__all__ = ["STRATEGY", "RowSharding", "merge_admission", "traffic"]
