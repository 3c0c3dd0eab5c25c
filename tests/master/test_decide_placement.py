"""The master's decisions on placing split instances: `PlaceInstance` with node ids, a node
count and a sharding, and placing a lost node's instances again the way they were split."""

from __future__ import annotations

import itertools

import pytest

from trexo.master.decide import Accepted, Refused, decide_command, decide_nodes_lost
from trexo.state import apply_all
from trexo.types.commands import Command, PlaceInstance, PlacementSharding
from trexo.types.events import Event, InstanceCreated, InstanceDeleted, NodeRemoved, NodeUpdated
from trexo.types.ids import InstanceId, NodeId, RunnerId
from trexo.types.models import ModelLayout, ModelRef
from trexo.types.refusal import RefusalKind
from trexo.types.shard import ShardSpec
from trexo.types.state import Instance, NodeInfo, RunnerAssignment, State
from trexo.wire import from_json, to_json

MiB = 1024 * 1024
A, B, C = NodeId("a"), NodeId("b"), NodeId("c")
MODEL = ModelRef("m", "demo:tiny", 80 * MiB, layout=ModelLayout(8, 8, 4, 1024))  # 96 MiB
PLAIN = ModelRef("plain", "demo:tiny", 80 * MiB)


def cluster(**available: int) -> State:
    return apply_all(
        State(),
        [NodeUpdated(NodeInfo(NodeId(n), n, 2 * m, m)) for n, m in available.items()],
    )


def decide(state: State, command: PlaceInstance) -> Accepted | Refused:
    ids = itertools.count()
    return decide_command(state, command, new_id=lambda: f"id{next(ids)}")


def created(decision: Accepted | Refused) -> Instance:
    assert isinstance(decision, Accepted), decision
    (event,) = decision.events
    assert isinstance(event, InstanceCreated)
    assert decision.result_id == event.instance.instance_id
    return event.instance


def test_place_on_named_nodes_splits_in_their_order_with_fresh_ids() -> None:
    state = cluster(a=100 * MiB, b=100 * MiB)
    instance = created(decide(state, PlaceInstance("c", MODEL, (B, A), sharding="pipeline")))
    assert instance.instance_id == "id0"
    assert [(a.runner_id, a.node_id, a.shard) for a in instance.assignments] == [
        ("id1", B, ShardSpec(0, 4, 0, 2, "pipeline")),
        ("id2", A, ShardSpec(4, 8, 1, 2, "pipeline")),
    ]


def test_place_with_a_node_count_and_tensor_sharding() -> None:
    state = cluster(a=100 * MiB, b=100 * MiB, c=10 * MiB)
    instance = created(decide(state, PlaceInstance("c", MODEL, sharding="tensor", node_count=2)))
    assert [(a.node_id, a.shard) for a in instance.assignments] == [
        (A, ShardSpec(0, 8, 0, 2, "tensor")),
        (B, ShardSpec(0, 8, 1, 2, "tensor")),
    ]


def test_auto_splits_what_no_node_can_hold() -> None:
    state = cluster(a=60 * MiB, b=50 * MiB, c=10 * MiB)
    instance = created(decide(state, PlaceInstance("c", MODEL)))
    assert instance.node_ids == (A, B)
    assert sum(a.shard.layer_count or 0 for a in instance.assignments) == 8


@pytest.mark.parametrize(
    ("command", "kind", "says"),
    [
        (PlaceInstance("c", MODEL, (A, NodeId("x"))), RefusalKind.NODE_NOT_FOUND, "node x"),
        (PlaceInstance("c", MODEL, (A, A)), RefusalKind.INVALID, "repeat"),
        (PlaceInstance("c", MODEL, (A,), node_count=2), RefusalKind.INVALID, "does not match"),
        (PlaceInstance("c", MODEL, node_count=4), RefusalKind.INVALID, "the cluster has 3"),
        (
            PlaceInstance("c", MODEL, sharding="tensor", node_count=3),
            RefusalKind.UNSHARDABLE,
            "not divisible by 3",
        ),
        (PlaceInstance("c", PLAIN, node_count=2), RefusalKind.UNSHARDABLE, "placed whole"),
        (PlaceInstance("c", MODEL, (C, A)), RefusalKind.INSUFFICIENT_MEMORY, "node c needs"),
        (
            PlaceInstance("c", PLAIN),
            RefusalKind.INSUFFICIENT_MEMORY,
            "the freest node, a, has 60.0 MiB",
        ),
    ],
)
def test_place_refusals_have_kinds(command: PlaceInstance, kind: RefusalKind, says: str) -> None:
    state = cluster(a=60 * MiB, b=50 * MiB, c=10 * MiB)
    decision = decide(state, command)
    assert isinstance(decision, Refused), decision
    assert decision.kind == kind
    assert says in decision.error


def test_place_instance_round_trips_the_wire() -> None:
    command = PlaceInstance("c", MODEL, (B, A), sharding="tensor", node_count=2)
    assert from_json(to_json(command, Command), Command) == command
    old_style = to_json(PlaceInstance("c", MODEL), Command)
    assert b'"node_ids":[]' in old_style and b'"sharding":"auto"' in old_style


# --- nodes lost ----------------------------------------------------------------------------------


def split_on(iid: str, nodes: tuple[NodeId, ...], sharding: PlacementSharding) -> Instance:
    n = len(nodes)
    step = 8 // n
    shards = [
        ShardSpec(0, 8, r, n, "tensor")
        if sharding == "tensor"
        else ShardSpec(r * step, (r + 1) * step, r, n, "pipeline")
        for r in range(n)
    ]
    return Instance(
        InstanceId(iid),
        MODEL,
        tuple(
            RunnerAssignment(RunnerId(f"{iid}-r{r}"), node, shard)
            for r, (node, shard) in enumerate(zip(nodes, shards, strict=True))
        ),
    )


def lose(state: State, live: set[NodeId]) -> list[Event]:
    ids = (f"new-{k}" for k in itertools.count())
    return decide_nodes_lost(state, frozenset(live), new_id=lambda: next(ids))


def test_a_lost_split_instance_is_split_again_the_same_way_if_the_survivors_allow() -> None:
    lost = split_on("i", (A, B), "tensor")
    state = apply_all(cluster(a=100 * MiB, b=100 * MiB, c=100 * MiB), [InstanceCreated(lost)])
    events = lose(state, {A, C})
    assert events[:2] == [InstanceDeleted(lost.instance_id), NodeRemoved(B)]
    (again,) = events[2:]
    assert isinstance(again, InstanceCreated)
    assert [(a.node_id, a.shard) for a in again.instance.assignments] == [
        (A, ShardSpec(0, 8, 0, 2, "tensor")),
        (C, ShardSpec(0, 8, 1, 2, "tensor")),
    ]


def test_a_lost_split_instance_falls_back_to_auto_when_too_few_survive() -> None:
    lost = split_on("i", (A, B, C), "pipeline")
    state = apply_all(cluster(a=200 * MiB, b=100 * MiB, c=100 * MiB), [InstanceCreated(lost)])
    events = lose(state, {A, B})
    (again,) = [e for e in events if isinstance(e, InstanceCreated)]
    # Three nodes are no longer there; "auto" fits the whole model on a.
    assert [(a.node_id, a.shard) for a in again.instance.assignments] == [(A, ShardSpec())]


def test_a_lost_whole_instance_may_come_back_split() -> None:
    whole = Instance(InstanceId("i"), MODEL, (RunnerAssignment(RunnerId("r"), C),))
    state = apply_all(cluster(a=60 * MiB, b=60 * MiB, c=200 * MiB), [InstanceCreated(whole)])
    (again,) = [e for e in lose(state, {A, B}) if isinstance(e, InstanceCreated)]
    assert again.instance.node_ids == (A, B)
    assert again.instance.lead.shard.sharding == "pipeline"
