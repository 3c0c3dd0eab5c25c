"""Placement previews: every way a model could be placed now, and why each would or would not
fit. Pure, like `trexo.master.placement`, whose rules they apply (as exo's
`/instance/previews` does for its placements).

A preview's node set is in rank order; placing with `node_ids` in that order and the
preview's sharding (`"auto"` for `"whole"`) makes exactly the preview's runners, or is
refused with the preview's reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations
from typing import Literal

import attrs

from trexo.config import PLACEMENT_MEMORY_OVERHEAD
from trexo.master.placement import (
    Infeasible,
    by_free_memory,
    free_memory,
    memory_shortfall,
    runner_requirement,
    shard_plan,
)
from trexo.types.commands import PlacementSharding
from trexo.types.ids import NodeId
from trexo.types.models import ModelRef
from trexo.types.refusal import RefusalKind
from trexo.types.state import State

ALL_SUBSETS_MAX_NODES = 6
"""Up to this many nodes every node set is previewed (63 sets for 6); beyond, only the
freest 1, 2, ... n nodes, as the number of sets doubles with each node."""

PreviewSharding = Literal["whole", "pipeline", "tensor"]
SPLIT_SHARDINGS: tuple[PreviewSharding, ...] = ("pipeline", "tensor")


@attrs.frozen
class PreviewRank:
    """One runner of a previewed placement."""

    node_id: NodeId
    rank: int
    start_layer: int | None
    """None (with `end_layer`): the whole model."""
    end_layer: int | None
    memory_needed: int
    """bytes this runner would reserve"""
    memory_free: int
    """bytes its node has for a new placement now (may be negative)"""


@attrs.frozen
class PlacementPreview:
    sharding: PreviewSharding
    node_ids: tuple[NodeId, ...]
    """In rank order."""
    feasible: bool
    ranks: tuple[PreviewRank, ...] = ()
    """Empty when the model cannot be split this way at all."""
    error: str | None = None
    error_kind: RefusalKind | None = None


def previews(
    state: State,
    model: ModelRef,
    *,
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
    all_subsets_max_nodes: int = ALL_SUBSETS_MAX_NODES,
) -> list[PlacementPreview]:
    """Every candidate placement of `model`: the whole model on each node, then each split
    sharding over each node set of two or more, smaller sets first."""
    free = free_memory(state, overhead)
    result: list[PlacementPreview] = []
    for nodes in node_sets(free, all_subsets_max_nodes):
        shardings = ("whole",) if len(nodes) == 1 else SPLIT_SHARDINGS
        result.extend(
            preview(state, model, nodes, sharding, free, overhead) for sharding in shardings
        )
    return result


def node_sets(free: dict[NodeId, int], all_subsets_max_nodes: int) -> Iterator[tuple[NodeId, ...]]:
    """Node sets (each sorted by id, the rank order placement uses), smaller first."""
    ids = sorted(free)
    if len(ids) <= all_subsets_max_nodes:
        for k in range(1, len(ids) + 1):
            yield from combinations(ids, k)
        return
    freest = by_free_memory(free)
    for k in range(1, len(ids) + 1):
        yield tuple(sorted(freest[:k]))


def preview(
    state: State,
    model: ModelRef,
    nodes: Sequence[NodeId],
    sharding: PreviewSharding,
    free: dict[NodeId, int],
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> PlacementPreview:
    """`model` on exactly `nodes` with `sharding`, judged as `place` judges named nodes."""
    asked: PlacementSharding = "auto" if sharding == "whole" else sharding
    plan = shard_plan(model, nodes, asked, free)
    if isinstance(plan, Infeasible):
        return PlacementPreview(
            sharding, tuple(nodes), False, error=plan.reason, error_kind=plan.kind
        )
    ranks = tuple(
        PreviewRank(
            node_id=r.node_id,
            rank=r.shard.rank,
            start_layer=r.shard.start_layer,
            end_layer=r.shard.end_layer,
            memory_needed=runner_requirement(model, r.shard, overhead),
            memory_free=free[r.node_id],
        )
        for r in plan
    )
    short = memory_shortfall(state, model, plan, free, named=True, overhead=overhead)
    if short is None:
        return PlacementPreview(sharding, tuple(nodes), True, ranks)
    return PlacementPreview(
        sharding, tuple(nodes), False, ranks, error=short.reason, error_kind=short.kind
    )
