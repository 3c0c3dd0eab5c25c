"""Placement: which node(s) run a model, judged by memory. Pure functions of `State`.

A model needs `size_bytes * overhead` (weights plus KV cache and activations). A node can
give its OS-reported `memory_available` minus what instances already placed on it reserve,
so that two placements can never both claim the same bytes.

Only single-runner instances (the whole model on one node) exist for now. A multi-node split
extends `place` by choosing several candidates from `free_memory` and one `ShardSpec` each;
`runner_requirement` already prices a partial shard.
"""

from __future__ import annotations

import math

from trexo.config import PLACEMENT_MEMORY_OVERHEAD
from trexo.errors import PlacementRefused
from trexo.types.ids import InstanceId, NodeId, RunnerId
from trexo.types.models import ModelRef
from trexo.types.shard import ShardSpec
from trexo.types.state import Instance, RunnerAssignment, State

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int) -> str:
    """`n` bytes in binary units with one decimal: `"96.0 MiB"`, `"512 B"`."""
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in _UNITS[1:]:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def required_bytes(model: ModelRef, overhead: float = PLACEMENT_MEMORY_OVERHEAD) -> int:
    """Memory the whole of `model` needs on the node(s) that run it."""
    return math.ceil(model.size_bytes * overhead)


def runner_requirement(
    model: ModelRef, shard: ShardSpec, overhead: float = PLACEMENT_MEMORY_OVERHEAD
) -> int:
    """Memory one runner holding `shard` of `model` needs: an equal share of the whole.

    Equal shares until shards carry layer counts; a whole shard is the whole requirement.
    """
    return math.ceil(required_bytes(model, overhead) / max(1, shard.world_size))


def reserved_bytes(
    state: State, node_id: NodeId, overhead: float = PLACEMENT_MEMORY_OVERHEAD
) -> int:
    """Memory already promised to the runners of placed instances on `node_id`."""
    return sum(
        runner_requirement(instance.model, a.shard, overhead)
        for instance in state.instances.values()
        for a in instance.assignments
        if a.node_id == node_id
    )


def free_memory(state: State, overhead: float = PLACEMENT_MEMORY_OVERHEAD) -> dict[NodeId, int]:
    """Each node's memory available for a new placement (may be negative)."""
    return {
        node_id: node.memory_available - reserved_bytes(state, node_id, overhead)
        for node_id, node in state.nodes.items()
    }


def place(
    state: State,
    model: ModelRef,
    node_id: NodeId | None,
    instance_id: InstanceId,
    runner_id: RunnerId,
    *,
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> Instance:
    """An instance of `model` on `node_id`, or on the node with the most free memory.

    Ties go to the smallest node id, so every caller decides the same. Raises
    `PlacementRefused` naming required and available memory when nothing fits.
    """
    need = required_bytes(model, overhead)
    free = free_memory(state, overhead)
    if node_id is not None:
        if node_id not in free:
            raise PlacementRefused(f"node {node_id} is not in the cluster")
        chosen = node_id
    elif not free:
        raise PlacementRefused(
            f"model {model.model_id} needs {format_bytes(need)}, and the cluster has no nodes"
        )
    else:
        chosen = min(free, key=lambda n: (-free[n], n))
    if free[chosen] < need:
        raise PlacementRefused(_shortfall(state, model, chosen, need, free[chosen], node_id))
    assignment = RunnerAssignment(runner_id=runner_id, node_id=chosen, shard=ShardSpec())
    return Instance(instance_id=instance_id, model=model, assignments=(assignment,))


def _shortfall(
    state: State, model: ModelRef, node_id: NodeId, need: int, free: int, asked: NodeId | None
) -> str:
    where = f"node {node_id}" if asked is not None else f"the freest node, {node_id},"
    reserved = state.nodes[node_id].memory_available - free
    detail = f" ({format_bytes(reserved)} reserved by placed instances)" if reserved else ""
    return (
        f"model {model.model_id} needs {format_bytes(need)}, "
        f"{where} has {format_bytes(max(0, free))} available{detail}"
    )
