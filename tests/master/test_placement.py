"""Placement by memory: pure functions of State."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.errors import PlacementRefused
from trexo.master.placement import (
    format_bytes,
    free_memory,
    place,
    required_bytes,
    reserved_bytes,
)
from trexo.state import apply, apply_all
from trexo.types.events import InstanceCreated, NodeUpdated
from trexo.types.ids import InstanceId, NodeId, RunnerId
from trexo.types.models import ModelRef
from trexo.types.shard import ShardSpec
from trexo.types.state import NodeInfo, State

MiB = 1024 * 1024
SMALL = ModelRef("trexo-demo-small", "demo:small", 80 * MiB)  # needs 96 MiB at 1.2x


def cluster(**available: int) -> State:
    return apply_all(
        State(),
        [NodeUpdated(NodeInfo(NodeId(n), n, 2 * m, m)) for n, m in available.items()],
    )


def place_one(state: State, model: ModelRef, node: str | None = None, k: int = 0) -> State:
    instance = place(
        state, model, NodeId(node) if node else None, InstanceId(f"i{k}"), RunnerId(f"r{k}")
    )
    return apply(state, InstanceCreated(instance))


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (96 * MiB, "96.0 MiB"),
        (3 * 1024**3 // 2, "1.5 GiB"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_required_memory_is_size_times_overhead() -> None:
    assert required_bytes(SMALL) == 96 * MiB
    assert required_bytes(SMALL, overhead=1.0) == 80 * MiB


def test_places_the_whole_model_on_the_named_node() -> None:
    state = cluster(a=500 * MiB, b=100 * MiB)
    instance = place(state, SMALL, NodeId("b"), InstanceId("i"), RunnerId("r"))
    assert instance.instance_id == "i"
    assert instance.model == SMALL
    assert instance.node_ids == ("b",)
    assert instance.lead.runner_id == "r"
    assert instance.lead.shard == ShardSpec()


def test_refusal_names_required_and_available_memory() -> None:
    state = cluster(abc=50 * MiB)
    with pytest.raises(PlacementRefused) as info:
        place(state, SMALL, NodeId("abc"), InstanceId("i"), RunnerId("r"))
    assert (
        str(info.value) == "model trexo-demo-small needs 96.0 MiB, node abc has 50.0 MiB available"
    )


def test_two_placements_cannot_claim_the_same_memory() -> None:
    state = place_one(cluster(a=150 * MiB), SMALL, "a")
    assert reserved_bytes(state, NodeId("a")) == 96 * MiB
    assert free_memory(state) == {"a": 54 * MiB}
    with pytest.raises(PlacementRefused, match=r"has 54\.0 MiB available \(96\.0 MiB reserved"):
        place_one(state, SMALL, "a", k=1)


def test_without_a_node_picks_the_most_free_memory() -> None:
    state = cluster(a=200 * MiB, b=300 * MiB, c=250 * MiB)
    assert place(state, SMALL, None, InstanceId("i"), RunnerId("r")).node_ids == ("b",)
    # b now has 204 MiB free, c 250: the next goes to c.
    state = place_one(state, SMALL, k=0)
    assert place(state, SMALL, None, InstanceId("j"), RunnerId("s")).node_ids == ("c",)


def test_ties_go_to_the_smallest_node_id() -> None:
    state = cluster(zed=200 * MiB, abe=200 * MiB, mid=200 * MiB)
    assert place(state, SMALL, None, InstanceId("i"), RunnerId("r")).node_ids == ("abe",)


def test_refused_when_no_node_fits_names_the_freest() -> None:
    state = cluster(a=10 * MiB, b=60 * MiB)
    with pytest.raises(
        PlacementRefused, match=r"needs 96\.0 MiB, the freest node, b, has 60\.0 MiB"
    ):
        place(state, SMALL, None, InstanceId("i"), RunnerId("r"))


def test_refused_on_an_empty_cluster_and_an_unknown_node() -> None:
    with pytest.raises(PlacementRefused, match="no nodes"):
        place(State(), SMALL, None, InstanceId("i"), RunnerId("r"))
    with pytest.raises(PlacementRefused, match="node ghost is not in the cluster"):
        place(cluster(a=MiB), SMALL, NodeId("ghost"), InstanceId("i"), RunnerId("r"))


# --- properties ----------------------------------------------------------------------------

memories = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 4096 * MiB), min_size=1
)
models = st.builds(
    ModelRef,
    model_id=st.sampled_from(["m1", "m2"]),
    source=st.just("demo:tiny"),
    size_bytes=st.integers(0, 2048 * MiB),
)


@given(memories, st.lists(models, max_size=8))
def test_placements_never_overcommit_a_node(available: dict[str, int], ms: list[ModelRef]) -> None:
    state = cluster(**available)
    for k, model in enumerate(ms):
        try:
            state = place_one(state, model, k=k)
        except PlacementRefused:
            # Refused only when really no node has room.
            assert max(free_memory(state).values()) < required_bytes(model)
    for node_id, node in state.nodes.items():
        assert reserved_bytes(state, node_id) <= node.memory_available


@given(memories, models)
def test_choice_is_the_freest_node_with_the_smallest_id(
    available: dict[str, int], model: ModelRef
) -> None:
    state = cluster(**available)
    free = free_memory(state)
    best = max(free.values())
    if best < required_bytes(model):
        with pytest.raises(PlacementRefused, match="needs"):
            place(state, model, None, InstanceId("i"), RunnerId("r"))
        return
    chosen = place(state, model, None, InstanceId("i"), RunnerId("r")).node_ids[0]
    assert free[chosen] == best
    assert chosen == min(n for n, f in free.items() if f == best)
