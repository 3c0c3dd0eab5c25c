"""Placement: which nodes run a model, and which part each holds. Pure functions of `State`.

A model needs `size_bytes * overhead` (weights plus KV cache and activations); a runner
needs its share of that: all of it for a whole model, its layers' fraction for a pipeline
shard, 1/n for a tensor shard. A node can give its OS-reported `memory_available` minus what
the runners already placed on it reserve, so two placements can never claim the same bytes.

`try_place` answers an `Instance` or an `Infeasible` (why, as a refusal kind and a message
with the numbers); `place` raises `PlacementRefused` instead. Every choice is ordered by
(free memory, node id), so every node that decides decides the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs

from trexo.config import PLACEMENT_MEMORY_OVERHEAD
from trexo.engine.pipeline_cuts import fit_shares
from trexo.engine.tensor_shares import largest_share
from trexo.engine.tensor_shares import refusal as tensor_refusal
from trexo.errors import PlacementRefused
from trexo.types.commands import PlacementSharding
from trexo.types.ids import InstanceId, NodeId, RunnerId
from trexo.types.models import ModelRef, TensorShape
from trexo.types.refusal import RefusalKind
from trexo.types.shard import Sharding, ShardSpec
from trexo.types.state import Instance, RunnerAssignment, State
from trexo.units import format_bytes


@attrs.frozen
class Infeasible:
    """Why a placement cannot be made: the refusal kind, and a message with the numbers."""

    kind: RefusalKind
    reason: str


@attrs.frozen
class RankPlan:
    """One runner of a planned instance, before it has an id."""

    node_id: NodeId
    shard: ShardSpec


Plan = tuple[RankPlan, ...]
"""A planned instance's runners in rank order."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# --- memory ----------------------------------------------------------------------------------


def required_bytes(model: ModelRef, overhead: float = PLACEMENT_MEMORY_OVERHEAD) -> int:
    """Memory the whole of `model` needs on the node(s) that run it."""
    return math.ceil(model.size_bytes * overhead)


def runner_requirement(
    model: ModelRef, shard: ShardSpec, overhead: float = PLACEMENT_MEMORY_OVERHEAD
) -> int:
    """Memory one runner holding `shard` of `model` needs.

    The whole requirement for a whole shard; for a tensor shard the largest rank's share of
    the blocks plus the embedding, final norm and head, which every rank holds whole; for a
    pipeline shard its layers' share of the blocks, plus the embedding on rank 0 and the
    final norm and head on the last rank (an equal share if the layout is unknown).
    """
    need = required_bytes(model, overhead)
    if shard.is_whole:
        return need
    layers = shard.layer_count
    layout = model.layout
    if shard.sharding == "tensor" and layout is not None and layout.tensor is not None:
        blocks = _fraction(layout.blocks_fraction)
        share = largest_share(layout.tensor, shard.world_size)
        return math.ceil(need * ((1.0 - blocks) + blocks * share))
    if shard.sharding == "tensor" or layers is None or layout is None or layout.n_layers <= 0:
        return _ceil_div(need, max(1, shard.world_size))
    share = _fraction(layout.blocks_fraction) * layers / layout.n_layers
    if shard.rank == 0 or layout.embedding_on_every_rank:
        share += _fraction(layout.embedding_fraction)
    if shard.rank == shard.world_size - 1:
        share += _fraction(layout.head_fraction)
    return math.ceil(need * share)


def _fraction(value: float) -> float:
    return min(max(value, 0.0), 1.0)


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


def by_free_memory(free: dict[NodeId, int]) -> list[NodeId]:
    """Node ids, the most free memory first; ties go to the smallest id."""
    return sorted(free, key=lambda n: (-free[n], n))


# --- splitting ---------------------------------------------------------------------------------


def split_layers(n_layers: int, weights: Sequence[int]) -> tuple[int, ...]:
    """`n_layers` shared in proportion to `weights` (largest remainder), each share >= 1.

    Needs `1 <= len(weights) <= n_layers`. Negative weights count as 0; all zero: equal
    shares. Remainders tie to the earlier rank. Integer arithmetic, so every node agrees.
    """
    count = len(weights)
    clamped = [max(0, w) for w in weights]
    if sum(clamped) == 0:
        clamped = [1] * count
    total = sum(clamped)
    quotas = [n_layers * w for w in clamped]  # rank i's exact share is quotas[i] / total
    shares = [q // total for q in quotas]
    by_remainder = sorted(range(count), key=lambda i: (-(quotas[i] % total), i))
    for i in by_remainder[: n_layers - sum(shares)]:
        shares[i] += 1
    for i in range(count):
        if shares[i] == 0:
            # Some rank has 2 or more (n_layers >= count): the largest gives one, ties the last.
            donor = max(range(count), key=lambda j: (shares[j], j))
            shares[donor] -= 1
            shares[i] = 1
    return tuple(shares)


def _no_layout(model: ModelRef) -> Infeasible:
    return Infeasible(
        RefusalKind.UNSHARDABLE,
        f"model {model.model_id} has no known layer layout (config.json), "
        "so it can only be placed whole, on one node",
    )


def whole_plan(node_id: NodeId) -> Plan:
    return (RankPlan(node_id, ShardSpec()),)


def pipeline_plan(
    model: ModelRef, nodes: Sequence[NodeId], free: dict[NodeId, int]
) -> Plan | Infeasible:
    """Layers split over `nodes` (rank order) in proportion to their free memory."""
    if model.layout is None:
        return _no_layout(model)
    n_layers = model.layout.n_layers
    if len(nodes) > n_layers:
        return Infeasible(
            RefusalKind.UNSHARDABLE,
            f"model {model.model_id} has {n_layers} layers, "
            f"too few to split across {len(nodes)} nodes",
        )
    shares = split_layers(n_layers, [free.get(n, 0) for n in nodes])
    if model.layout.pipeline_cuts is not None:
        fitted = fit_shares(shares, model.layout.pipeline_cuts)
        if fitted is None:
            return Infeasible(
                RefusalKind.UNSHARDABLE,
                f"model {model.model_id} can be cut as a pipeline only before blocks "
                f"{', '.join(map(str, model.layout.pipeline_cuts)) or '(none)'} "
                f"({model.layout.cuts_limited_because}): too few cuts for {len(nodes)} nodes",
            )
        shares = fitted
    plan: list[RankPlan] = []
    start = 0
    for rank, (node_id, share) in enumerate(zip(nodes, shares, strict=True)):
        shard = ShardSpec(start, start + share, rank, len(nodes), "pipeline")
        plan.append(RankPlan(node_id, shard))
        start += share
    return tuple(plan)


def tensor_plan(model: ModelRef, nodes: Sequence[NodeId]) -> Plan | Infeasible:
    """Every layer on every node, each rank computing its share of the heads and widths
    (`trexo.engine.tensor_shares`: uneven shares where the split is still exact)."""
    if model.layout is None:
        return _no_layout(model)
    layout, n = model.layout, len(nodes)
    shape = layout.tensor or TensorShape(
        layout.n_heads,
        layout.n_kv_heads,
        0,
        (layout.intermediate_size,),
        even_only_because="its shape is not fully known",
    )
    reason = tensor_refusal(shape, n)
    if reason is not None:
        return Infeasible(
            RefusalKind.UNSHARDABLE,
            f"model {model.model_id} cannot be tensor-sharded across {n} nodes: {reason}",
        )
    return tuple(
        RankPlan(node_id, ShardSpec(0, layout.n_layers, rank, n, "tensor"))
        for rank, node_id in enumerate(nodes)
    )


def shard_plan(
    model: ModelRef, nodes: Sequence[NodeId], sharding: PlacementSharding, free: dict[NodeId, int]
) -> Plan | Infeasible:
    """The shape of an instance of `model` on `nodes` (rank order), memory not yet judged.

    One node is always the whole model; "auto" over several nodes is a pipeline (it works
    for every model with a known layout, whatever its head counts).
    """
    if len(nodes) == 1:
        return whole_plan(nodes[0])
    if sharding == "tensor":
        return tensor_plan(model, nodes)
    return pipeline_plan(model, nodes, free)


def memory_shortfall(
    state: State,
    model: ModelRef,
    plan: Plan,
    free: dict[NodeId, int],
    *,
    named: bool,
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> Infeasible | None:
    """Why `plan` does not fit the nodes' free memory, or None if every runner fits.

    `named`: the user chose the nodes (the message says "node x", not "the freest node").
    """
    short = [
        (r, need)
        for r in plan
        if (need := runner_requirement(model, r.shard, overhead)) > free[r.node_id]
    ]
    if not short:
        return None
    if len(plan) == 1:
        ((r, need),) = short
        return Infeasible(
            RefusalKind.INSUFFICIENT_MEMORY,
            _whole_shortfall(state, model, r.node_id, need, free[r.node_id], named=named),
        )
    details = "; ".join(
        f"node {r.node_id} needs {format_bytes(need)} for {_share(r.shard)}, "
        f"has {format_bytes(max(0, free[r.node_id]))} available"
        f"{_reserved_detail(state, r.node_id, free[r.node_id])}"
        for r, need in short
    )
    return Infeasible(
        RefusalKind.INSUFFICIENT_MEMORY,
        f"model {model.model_id} needs {format_bytes(required_bytes(model, overhead))}, "
        f"split across {len(plan)} nodes ({plan[0].shard.sharding}): {details}",
    )


def _share(shard: ShardSpec) -> str:
    if shard.sharding == "tensor":
        return f"its 1/{shard.world_size} share"
    return f"layers [{shard.start_layer}, {shard.end_layer})"


def _reserved_detail(state: State, node_id: NodeId, free: int) -> str:
    reserved = state.nodes[node_id].memory_available - free
    return f" ({format_bytes(reserved)} reserved by placed instances)" if reserved else ""


def _whole_shortfall(
    state: State, model: ModelRef, node_id: NodeId, need: int, free: int, *, named: bool
) -> str:
    where = f"node {node_id}" if named else f"the freest node, {node_id},"
    return (
        f"model {model.model_id} needs {format_bytes(need)}, "
        f"{where} has {format_bytes(max(0, free))} available"
        f"{_reserved_detail(state, node_id, free)}"
    )


# --- choosing nodes ----------------------------------------------------------------------------


def request_problem(
    model: ModelRef,
    free: dict[NodeId, int],
    node_ids: Sequence[NodeId],
    node_count: int | None,
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> Infeasible | None:
    """What is wrong with the request itself, whatever the memory: None if nothing."""
    repeated = sorted({n for n in node_ids if node_ids.count(n) > 1})
    if repeated:
        return Infeasible(RefusalKind.INVALID, f"node ids repeat: {', '.join(repeated)}")
    unknown = [n for n in node_ids if n not in free]
    if unknown:
        which = f"node {unknown[0]} is" if len(unknown) == 1 else f"nodes {', '.join(unknown)} are"
        return Infeasible(RefusalKind.NODE_NOT_FOUND, f"{which} not in the cluster")
    if node_count is not None:
        if node_count < 1:
            return Infeasible(
                RefusalKind.INVALID, f"node count must be at least 1, not {node_count}"
            )
        if node_ids and node_count != len(node_ids):
            return Infeasible(
                RefusalKind.INVALID,
                f"node count {node_count} does not match the {len(node_ids)} node ids given",
            )
        if node_count > len(free):
            return Infeasible(
                RefusalKind.INVALID,
                f"{node_count} nodes were asked for, the cluster has {len(free)}",
            )
    if not free:
        return Infeasible(
            RefusalKind.INSUFFICIENT_MEMORY,
            f"model {model.model_id} needs {format_bytes(required_bytes(model, overhead))}, "
            "and the cluster has no nodes",
        )
    return None


def plan_on(
    state: State,
    model: ModelRef,
    nodes: Sequence[NodeId],
    sharding: PlacementSharding,
    free: dict[NodeId, int],
    *,
    named: bool,
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> Plan | Infeasible:
    """An instance of `model` on exactly `nodes` (in rank order), if it fits."""
    plan = shard_plan(model, nodes, sharding, free)
    if isinstance(plan, Infeasible):
        return plan
    return memory_shortfall(state, model, plan, free, named=named, overhead=overhead) or plan


def plan_placement(
    state: State,
    model: ModelRef,
    *,
    sharding: PlacementSharding = "auto",
    node_ids: Sequence[NodeId] = (),
    node_count: int | None = None,
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> Plan | Infeasible:
    """Where `model` goes: on `node_ids` (in that rank order) if given; else on the freest
    `node_count` nodes; else on the fewest nodes that fit (the whole model on one if it can)."""
    free = free_memory(state, overhead)
    problem = request_problem(model, free, node_ids, node_count, overhead)
    if problem is not None:
        return problem
    if node_ids:
        return plan_on(state, model, node_ids, sharding, free, named=True, overhead=overhead)
    freest = by_free_memory(free)
    if node_count is not None:
        chosen = sorted(freest[:node_count])
        return plan_on(state, model, chosen, sharding, free, named=False, overhead=overhead)
    return _fewest_nodes(state, model, sharding, freest, free, overhead)


def _fewest_nodes(
    state: State,
    model: ModelRef,
    sharding: PlacementSharding,
    freest: list[NodeId],
    free: dict[NodeId, int],
    overhead: float,
) -> Plan | Infeasible:
    """The first of 1, 2, ... freest nodes that fits `model` (ranks in node id order)."""
    most = 1 if model.layout is None else len(freest)
    if sharding != "tensor" and model.layout is not None:
        most = min(most, model.layout.n_layers)  # a pipeline rank needs a layer
    tried: list[Infeasible] = []
    for k in range(1, most + 1):
        chosen = sorted(freest[:k])
        outcome = plan_on(state, model, chosen, sharding, free, named=False, overhead=overhead)
        if not isinstance(outcome, Infeasible):
            return outcome
        tried.append(outcome)
    if len(tried) == 1:
        return tried[0]
    need = required_bytes(model, overhead)
    total = sum(max(0, f) for f in free.values())
    if total < need:
        return Infeasible(
            RefusalKind.INSUFFICIENT_MEMORY,
            f"model {model.model_id} needs {format_bytes(need)}, "
            f"the {len(free)} nodes have {format_bytes(total)} available in all",
        )
    # Enough memory in all, yet no split fits: say why the largest split tried failed,
    # preferring a memory shortfall (one more node could fix that) to a shape problem.
    short = [t for t in tried if t.kind == RefusalKind.INSUFFICIENT_MEMORY]
    return (short or tried)[-1]


def instantiate(model: ModelRef, plan: Plan, new_id: Callable[[], str]) -> Instance:
    """`plan` as an instance: the instance id first, then a runner id per rank."""
    instance_id = InstanceId(new_id())
    assignments = tuple(RunnerAssignment(RunnerId(new_id()), r.node_id, r.shard) for r in plan)
    return Instance(instance_id=instance_id, model=model, assignments=assignments)


def try_place(
    state: State,
    model: ModelRef,
    *,
    new_id: Callable[[], str],
    sharding: PlacementSharding = "auto",
    node_ids: Sequence[NodeId] = (),
    node_count: int | None = None,
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> Instance | Infeasible:
    """An instance of `model` (see `plan_placement`), or why there can be none.

    `new_id` is called only for an instance that is made.
    """
    plan = plan_placement(
        state, model, sharding=sharding, node_ids=node_ids, node_count=node_count, overhead=overhead
    )
    if isinstance(plan, Infeasible):
        return plan
    return instantiate(model, plan, new_id)


def place(
    state: State,
    model: ModelRef,
    *,
    new_id: Callable[[], str],
    sharding: PlacementSharding = "auto",
    node_ids: Sequence[NodeId] = (),
    node_count: int | None = None,
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> Instance:
    """`try_place`, raising `PlacementRefused` with the reason when there can be no instance."""
    outcome = try_place(
        state,
        model,
        new_id=new_id,
        sharding=sharding,
        node_ids=node_ids,
        node_count=node_count,
        overhead=overhead,
    )
    if isinstance(outcome, Infeasible):
        raise PlacementRefused(outcome.reason)
    return outcome


def split_of(instance: Instance) -> tuple[Sharding | None, int]:
    """How `instance` is split (None: whole) and over how many nodes."""
    lead = instance.lead.shard
    return (None if lead.is_whole else lead.sharding), len(instance.assignments)
