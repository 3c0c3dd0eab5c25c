"""Placement by memory, whole and split: pure functions of State."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.errors import PlacementRefused
from trexo.master.placement import (
    Infeasible,
    free_memory,
    place,
    required_bytes,
    reserved_bytes,
    runner_requirement,
    split_layers,
    try_place,
)
from trexo.state import apply, apply_all
from trexo.types.commands import PlacementSharding
from trexo.types.events import InstanceCreated, NodeUpdated
from trexo.types.ids import NodeId
from trexo.types.models import ModelLayout, ModelRef, TensorShape
from trexo.types.refusal import RefusalKind
from trexo.types.shard import ShardSpec
from trexo.types.state import Instance, NodeInfo, State
from trexo.units import format_bytes

MiB = 1024 * 1024
GiB = 1024 * MiB
SMALL = ModelRef("trexo-demo-small", "demo:small", 80 * MiB)  # needs 96 MiB at 1.2x
LAYOUT = ModelLayout(n_layers=8, n_heads=8, n_kv_heads=4, intermediate_size=1024)
SPLITTABLE = ModelRef("split-me", "demo:small", 80 * MiB, layout=LAYOUT)  # 12 MiB a layer
BIG = ModelRef("X", "demo:x", 80 * GiB, layout=ModelLayout(32, 32, 8, 14336))  # needs 96 GiB


def cluster(**available: int) -> State:
    return apply_all(
        State(),
        [NodeUpdated(NodeInfo(NodeId(n), n, 2 * m, m)) for n, m in available.items()],
    )


def counter(prefix: str = "id") -> Callable[[], str]:
    ids = itertools.count()
    return lambda: f"{prefix}{next(ids)}"


def place_one(state: State, model: ModelRef, node: str | None = None, k: int = 0) -> State:
    nodes = (NodeId(node),) if node else ()
    instance = place(state, model, new_id=counter(f"p{k}-"), node_ids=nodes)
    return apply(state, InstanceCreated(instance))


def shards(instance: Instance) -> list[tuple[str, ShardSpec]]:
    return [(a.node_id, a.shard) for a in instance.assignments]


def refusal(outcome: Instance | Infeasible) -> Infeasible:
    assert isinstance(outcome, Infeasible), outcome
    return outcome


def placed(outcome: Instance | Infeasible) -> Instance:
    assert isinstance(outcome, Instance), outcome
    return outcome


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


def test_a_runner_needs_its_share_of_the_model() -> None:
    assert runner_requirement(SPLITTABLE, ShardSpec()) == 96 * MiB
    assert runner_requirement(SPLITTABLE, ShardSpec(0, 2, 0, 3)) == 24 * MiB
    assert runner_requirement(SPLITTABLE, ShardSpec(2, 8, 1, 3)) == 72 * MiB
    assert runner_requirement(SPLITTABLE, ShardSpec(0, 8, 1, 4, "tensor")) == 24 * MiB
    # Without a layout a pipeline shard is priced as an equal share.
    assert runner_requirement(SMALL, ShardSpec(0, 2, 0, 2)) == 48 * MiB


# --- whole models (one node) -----------------------------------------------------------------


def test_places_the_whole_model_on_the_named_node() -> None:
    state = cluster(a=500 * MiB, b=100 * MiB)
    instance = place(state, SMALL, new_id=counter(), node_ids=(NodeId("b"),))
    assert instance.instance_id == "id0"
    assert instance.model == SMALL
    assert instance.node_ids == ("b",)
    assert instance.lead.runner_id == "id1"
    assert instance.lead.shard == ShardSpec()


def test_refusal_names_required_and_available_memory() -> None:
    state = cluster(abc=50 * MiB)
    with pytest.raises(PlacementRefused) as info:
        place(state, SMALL, new_id=counter(), node_ids=(NodeId("abc"),))
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
    assert place(state, SMALL, new_id=counter()).node_ids == ("b",)
    # b now has 204 MiB free, c 250: the next goes to c.
    state = place_one(state, SMALL, k=0)
    assert place(state, SMALL, new_id=counter()).node_ids == ("c",)


def test_ties_go_to_the_smallest_node_id() -> None:
    state = cluster(zed=200 * MiB, abe=200 * MiB, mid=200 * MiB)
    assert place(state, SMALL, new_id=counter()).node_ids == ("abe",)


def test_refused_when_no_node_fits_names_the_freest() -> None:
    state = cluster(a=10 * MiB, b=60 * MiB)
    with pytest.raises(
        PlacementRefused, match=r"needs 96\.0 MiB, the freest node, b, has 60\.0 MiB"
    ):
        place(state, SMALL, new_id=counter())


def test_refused_on_an_empty_cluster_and_an_unknown_node() -> None:
    with pytest.raises(PlacementRefused, match="no nodes"):
        place(State(), SMALL, new_id=counter())
    ghost = refusal(try_place(cluster(a=MiB), SMALL, new_id=counter(), node_ids=(NodeId("x"),)))
    assert ghost == Infeasible(RefusalKind.NODE_NOT_FOUND, "node x is not in the cluster")


def test_a_refusal_uses_no_ids() -> None:
    ids = counter()
    refusal(try_place(cluster(a=MiB), SMALL, new_id=ids))
    assert ids() == "id0"


# --- pipeline ----------------------------------------------------------------------------------


def test_pipeline_layers_follow_free_memory_and_the_named_order() -> None:
    state = cluster(a=300 * MiB, b=100 * MiB)
    # 8 layers in proportion 1:3 -> 2 and 6; b is rank 0 because it is named first.
    instance = place(
        state,
        SPLITTABLE,
        new_id=counter(),
        sharding="pipeline",
        node_ids=(NodeId("b"), NodeId("a")),
    )
    assert shards(instance) == [
        ("b", ShardSpec(0, 2, 0, 2, "pipeline")),
        ("a", ShardSpec(2, 8, 1, 2, "pipeline")),
    ]
    assert [a.runner_id for a in instance.assignments] == ["id1", "id2"]
    after = apply(state, InstanceCreated(instance))
    assert free_memory(after) == {"a": 300 * MiB - 72 * MiB, "b": 100 * MiB - 24 * MiB}


def test_a_node_count_takes_the_freest_nodes_in_node_id_order() -> None:
    state = cluster(d=400 * MiB, c=100 * MiB, b=300 * MiB, a=10 * MiB)
    instance = place(state, SPLITTABLE, new_id=counter(), node_count=2)
    assert instance.node_ids == ("b", "d")
    assert [a.shard.layer_count for a in instance.assignments] == [3, 5]  # 3:4 of 8 layers


def test_a_pipeline_share_that_does_not_fit_is_refused_with_its_numbers() -> None:
    state = cluster(a=90 * MiB, b=10 * MiB)
    short = refusal(try_place(state, SPLITTABLE, new_id=counter(), node_count=2))
    # 8 layers at 9:1 -> 7 and 1: a's 84 MiB fit its 90, b's 12 MiB do not fit its 10.
    assert short == Infeasible(
        RefusalKind.INSUFFICIENT_MEMORY,
        "model split-me needs 96.0 MiB, split across 2 nodes (pipeline): "
        "node b needs 12.0 MiB for layers [7, 8), has 10.0 MiB available",
    )


def test_a_pipeline_cuts_only_where_the_architecture_allows() -> None:
    # KV-shared blocks (gemma 4) must stay with the blocks they read: cuts before 1 or 2 only.
    limited = attrs.evolve(
        LAYOUT, n_layers=6, pipeline_cuts=(1, 2), cuts_limited_because="KV sharing"
    )
    model = ModelRef("shared-kv", "demo:s", MiB, layout=limited)
    state = cluster(a=GiB, b=GiB, c=GiB, d=GiB)
    two = place(state, model, new_id=counter(), sharding="pipeline", node_count=2)
    assert [a.shard.layer_count for a in two.assignments] == [2, 4]  # not the even 3 and 3
    three = place(state, model, new_id=counter(), sharding="pipeline", node_count=3)
    assert [a.shard.layer_count for a in three.assignments] == [1, 1, 4]
    short = refusal(try_place(state, model, new_id=counter(), sharding="pipeline", node_count=4))
    assert short == Infeasible(
        RefusalKind.UNSHARDABLE,
        "model shared-kv can be cut as a pipeline only before blocks 1, 2 (KV sharing): "
        "too few cuts for 4 nodes",
    )


def test_more_nodes_than_layers_is_unshardable() -> None:
    tiny = ModelRef("two-layers", "demo:t", MiB, layout=ModelLayout(2, 4, 2, 256))
    state = cluster(a=GiB, b=GiB, c=GiB)
    short = refusal(try_place(state, tiny, new_id=counter(), sharding="pipeline", node_count=3))
    assert short == Infeasible(
        RefusalKind.UNSHARDABLE, "model two-layers has 2 layers, too few to split across 3 nodes"
    )


def test_one_node_is_always_the_whole_model() -> None:
    state = cluster(a=GiB, b=GiB)
    for sharding in ("pipeline", "tensor", "auto"):
        instance = place(state, SPLITTABLE, new_id=counter(), sharding=sharding, node_count=1)
        assert shards(instance) == [("a", ShardSpec())]


# --- tensor ------------------------------------------------------------------------------------


def test_tensor_shards_hold_every_layer() -> None:
    state = cluster(a=GiB, b=GiB)
    instance = place(state, SPLITTABLE, new_id=counter(), sharding="tensor", node_count=2)
    assert shards(instance) == [
        ("a", ShardSpec(0, 8, 0, 2, "tensor")),
        ("b", ShardSpec(0, 8, 1, 2, "tensor")),
    ]
    assert reserved_bytes(apply(state, InstanceCreated(instance)), NodeId("b")) == 48 * MiB


UNKNOWN = "its shape is not fully known"


@pytest.mark.parametrize(
    ("layout", "nodes", "why"),
    [
        (
            ModelLayout(4, 4, 2, 256),
            3,
            "its attention heads (4), key-value heads (2), feed-forward width (256) "
            f"are not divisible by 3 ({UNKNOWN})",
        ),
        (
            ModelLayout(4, 6, 2, 768),
            3,
            f"its key-value heads (2) is not divisible by 3 ({UNKNOWN})",
        ),
        (
            ModelLayout(4, 4, 4, 250),
            4,
            f"its feed-forward width (250) is not divisible by 4 ({UNKNOWN})",
        ),
        (
            ModelLayout(4, 4, 2, 256, tensor=TensorShape(4, 2, 128, (256,))),
            5,
            "its 4 attention heads (2 key-value) cannot be split over 5 ranks",
        ),
        (
            ModelLayout(4, 4, 2, 256, tensor=TensorShape(4, 2, 16, (256,), group_size=64)),
            2,
            "its 4 attention heads (2 key-value) cannot be split over 2 ranks "
            "in blocks of 4 (quantized in groups of 64)",
        ),
        (
            ModelLayout(4, 8, 8, 256, tensor=TensorShape(8, 8, 64, (256, 96), 0, "MLA")),
            3,
            "its attention heads (8), key-value heads (8), feed-forward width (256) "
            "are not divisible by 3 (MLA)",
        ),
    ],
)
def test_tensor_refusals_name_what_cannot_be_split(
    layout: ModelLayout, nodes: int, why: str
) -> None:
    model = ModelRef("m", "demo:m", MiB, layout=layout)
    state = cluster(**{f"n{k}": GiB for k in range(nodes)})
    short = refusal(try_place(state, model, new_id=counter(), sharding="tensor", node_count=nodes))
    assert short == Infeasible(
        RefusalKind.UNSHARDABLE, f"model m cannot be tensor-sharded across {nodes} nodes: {why}"
    )


def test_a_known_shape_splits_unevenly_and_each_rank_reserves_the_largest_share() -> None:
    # 4 query heads over 3 ranks go 2-1-1; the edges (a quarter here) are on every rank.
    layout = ModelLayout(4, 4, 2, 300, blocks_fraction=0.75, tensor=TensorShape(4, 2, 16, (300,)))
    model = ModelRef("m", "demo:m", 120 * MiB, layout=layout)
    state = cluster(a=GiB, b=GiB, c=GiB)
    instance = place(state, model, new_id=counter(), sharding="tensor", node_count=3)
    assert [shard.rank for _, shard in shards(instance)] == [0, 1, 2]
    need = required_bytes(model)
    expected = math.ceil(need * (0.25 + 0.75 * 2 / 4))
    assert runner_requirement(model, ShardSpec(0, 4, 2, 3, "tensor")) == expected


def test_a_tensor_share_that_does_not_fit_is_refused() -> None:
    state = cluster(a=GiB, b=40 * MiB)
    short = refusal(try_place(state, SPLITTABLE, new_id=counter(), sharding="tensor", node_count=2))
    assert short.kind == RefusalKind.INSUFFICIENT_MEMORY
    assert "node b needs 48.0 MiB for its 1/2 share, has 40.0 MiB available" in short.reason


# --- auto --------------------------------------------------------------------------------------


def test_auto_uses_the_fewest_nodes_that_fit() -> None:
    state = cluster(a=60 * GiB, b=50 * GiB, c=40 * GiB, d=5 * GiB)
    two = place(state, BIG, new_id=counter())
    assert two.node_ids == ("a", "b")
    assert sum(a.shard.layer_count or 0 for a in two.assignments) == 32
    three = place(state, attrs.evolve(BIG, size_bytes=110 * GiB), new_id=counter())
    assert three.node_ids == ("a", "b", "c")
    whole = place(state, attrs.evolve(BIG, size_bytes=40 * GiB), new_id=counter())
    assert shards(whole) == [("a", ShardSpec())]


def test_auto_refusal_names_what_the_cluster_has_in_all() -> None:
    state = cluster(a=30 * GiB, b=20 * GiB, c=21 * GiB + 512 * MiB)
    short = refusal(try_place(state, BIG, new_id=counter()))
    assert short == Infeasible(
        RefusalKind.INSUFFICIENT_MEMORY,
        "model X needs 96.0 GiB, the 3 nodes have 71.5 GiB available in all",
    )


def test_a_model_without_a_layout_is_only_placed_whole() -> None:
    state = cluster(a=60 * MiB, b=60 * MiB)
    # auto: today's refusal, about the freest node
    with pytest.raises(PlacementRefused, match=r"the freest node, a, has 60\.0 MiB"):
        place(state, SMALL, new_id=counter())
    for sharding in ("pipeline", "tensor", "auto"):
        short = refusal(try_place(state, SMALL, new_id=counter(), sharding=sharding, node_count=2))
        assert short.kind == RefusalKind.UNSHARDABLE
        assert "can only be placed whole" in short.reason


@pytest.mark.parametrize(
    ("node_ids", "node_count", "kind", "reason"),
    [
        (("a", "a"), None, RefusalKind.INVALID, "node ids repeat: a"),
        (("a", "x", "y"), None, RefusalKind.NODE_NOT_FOUND, "nodes x, y are not in the cluster"),
        ((), 0, RefusalKind.INVALID, "node count must be at least 1, not 0"),
        (("a",), 2, RefusalKind.INVALID, "node count 2 does not match the 1 node ids given"),
        ((), 3, RefusalKind.INVALID, "3 nodes were asked for, the cluster has 2"),
    ],
)
def test_bad_requests_are_refused_whatever_the_memory(
    node_ids: tuple[str, ...], node_count: int | None, kind: RefusalKind, reason: str
) -> None:
    state = cluster(a=GiB, b=GiB)
    nodes = tuple(NodeId(n) for n in node_ids)
    outcome = try_place(state, SPLITTABLE, new_id=counter(), node_ids=nodes, node_count=node_count)
    assert refusal(outcome) == Infeasible(kind, reason)


# --- layer splitting -----------------------------------------------------------------------------


def test_split_layers_by_largest_remainder() -> None:
    assert split_layers(8, [1, 3]) == (2, 6)
    assert split_layers(10, [1, 1, 1]) == (4, 3, 3)  # ties: the earlier rank
    assert split_layers(4, [0, 0]) == (2, 2)
    assert split_layers(4, [-5, 10]) == (1, 3)  # every rank gets a layer
    assert split_layers(3, [1, 1000, 1]) == (1, 1, 1)


@given(
    st.integers(1, 80).flatmap(
        lambda n: st.tuples(
            st.just(n), st.lists(st.integers(-GiB, 64 * GiB), min_size=1, max_size=min(n, 8))
        )
    )
)
def test_split_layers_properties(case: tuple[int, list[int]]) -> None:
    n_layers, weights = case
    shares = split_layers(n_layers, weights)
    assert len(shares) == len(weights)
    assert sum(shares) == n_layers
    assert min(shares) >= 1
    assert split_layers(n_layers, weights) == shares
    clamped = [max(0, w) for w in weights]
    total = sum(clamped)
    if total and all(n_layers * w >= total for w in clamped):
        # No rank needed topping up: each share is its quota rounded down or up.
        assert all(abs(s - n_layers * w / total) < 1 for s, w in zip(shares, clamped, strict=True))


# --- properties ----------------------------------------------------------------------------------

NODE_NAMES = ["a", "b", "c", "d", "e"]
memories = st.dictionaries(st.sampled_from(NODE_NAMES), st.integers(0, 4096 * MiB), min_size=1)
layouts = st.builds(
    ModelLayout,
    n_layers=st.integers(1, 40),
    n_heads=st.sampled_from([1, 2, 4, 6, 8, 12]),
    n_kv_heads=st.sampled_from([1, 2, 4]),
    intermediate_size=st.sampled_from([96, 128, 250, 256, 768]),
)
models = st.builds(
    ModelRef,
    model_id=st.sampled_from(["m1", "m2"]),
    source=st.just("demo:tiny"),
    size_bytes=st.integers(0, 8192 * MiB),
    layout=st.none() | layouts,
)
shardings: st.SearchStrategy[PlacementSharding] = st.sampled_from(["auto", "pipeline", "tensor"])


@st.composite
def requests(draw: st.DrawFn) -> tuple[tuple[NodeId, ...], int | None]:
    node_ids = draw(
        st.lists(st.sampled_from(NODE_NAMES), max_size=5, unique=True).map(
            lambda ns: tuple(NodeId(n) for n in ns)
        )
    )
    node_count = draw(st.none() | st.integers(1, 5))
    return node_ids, node_count


def check_instance(state: State, model: ModelRef, instance: Instance) -> None:
    """Rank order, layer coverage and memory of a placed instance."""
    free = free_memory(state)
    world = len(instance.assignments)
    assert [a.shard.rank for a in instance.assignments] == list(range(world))
    assert len(set(instance.node_ids)) == world
    for a in instance.assignments:
        assert runner_requirement(model, a.shard) <= free[a.node_id]
    if world == 1:
        assert instance.lead.shard == ShardSpec()
        return
    assert model.layout is not None
    assert all(a.shard.world_size == world for a in instance.assignments)
    if instance.lead.shard.sharding == "tensor":
        assert all(
            (a.shard.start_layer, a.shard.end_layer) == (0, model.layout.n_layers)
            for a in instance.assignments
        )
        return
    bounds = [(a.shard.start_layer, a.shard.end_layer) for a in instance.assignments]
    assert bounds[0][0] == 0
    assert bounds[-1][1] == model.layout.n_layers
    for (_, end), (start, _) in itertools.pairwise(bounds):
        assert end == start  # contiguous in rank order
    counts = [a.shard.layer_count or 0 for a in instance.assignments]
    assert min(counts) >= 1
    assert sum(counts) == model.layout.n_layers


def check_refusal(model: ModelRef, outcome: Infeasible) -> None:
    """Memory and shape refusals name their numbers (the model id may hold digits too)."""
    reason = outcome.reason.replace(model.model_id, "<model>")
    if outcome.kind == RefusalKind.INSUFFICIENT_MEMORY:
        assert re.search(r"needs \d+(\.\d)? [KMGTP]?i?B", reason), reason
        assert re.search(r"\d+(\.\d)? [KMGTP]?i?B available", reason), reason
    elif outcome.kind == RefusalKind.UNSHARDABLE and model.layout is not None:
        assert re.search(r"\d", reason), reason


@given(memories, models, shardings, requests())
def test_placements_are_sound_and_deterministic(
    available: dict[str, int],
    model: ModelRef,
    sharding: PlacementSharding,
    request: tuple[tuple[NodeId, ...], int | None],
) -> None:
    node_ids, node_count = request
    state = cluster(**available)
    outcome = try_place(
        state, model, new_id=counter(), sharding=sharding, node_ids=node_ids, node_count=node_count
    )
    # Every node decides the same, whatever order it learned of the nodes in.
    reversed_state = cluster(**dict(reversed(list(available.items()))))
    assert outcome == try_place(
        reversed_state,
        model,
        new_id=counter(),
        sharding=sharding,
        node_ids=node_ids,
        node_count=node_count,
    )
    if isinstance(outcome, Infeasible):
        check_refusal(model, outcome)
        return
    check_instance(state, model, outcome)
    assert outcome.instance_id == "id0"
    assert [a.runner_id for a in outcome.assignments] == [
        f"id{k}" for k in range(1, len(outcome.assignments) + 1)
    ]
    if node_ids:
        assert outcome.node_ids == node_ids
    if node_count is not None:
        assert len(outcome.assignments) == node_count


@given(memories, st.lists(st.tuples(models, shardings), max_size=8))
def test_placements_never_overcommit_a_node(
    available: dict[str, int], asks: list[tuple[ModelRef, PlacementSharding]]
) -> None:
    state = cluster(**available)
    for k, (model, sharding) in enumerate(asks):
        outcome = try_place(state, model, new_id=counter(f"p{k}-"), sharding=sharding)
        if isinstance(outcome, Instance):
            check_instance(state, model, outcome)
            state = apply(state, InstanceCreated(outcome))
        elif max(free_memory(state).values()) >= required_bytes(model):
            raise AssertionError(f"refused though one node has room: {outcome}")
    for node_id, node in state.nodes.items():
        assert reserved_bytes(state, node_id) <= node.memory_available


@given(memories, models)
def test_auto_is_the_fewest_freest_nodes(available: dict[str, int], model: ModelRef) -> None:
    state = cluster(**available)
    free = free_memory(state)
    best = max(free.values())
    outcome = try_place(state, model, new_id=counter())
    if best >= required_bytes(model):
        chosen = placed(outcome).node_ids
        assert chosen == (min(n for n, f in free.items() if f == best),)
        return
    if isinstance(outcome, Infeasible):
        for k in range(2, len(free) + 1):
            assert isinstance(try_place(state, model, new_id=counter(), node_count=k), Infeasible)
        return
    k = len(outcome.assignments)
    assert outcome == try_place(state, model, new_id=counter(), node_count=k)
    for fewer in range(1, k):
        assert isinstance(try_place(state, model, new_id=counter(), node_count=fewer), Infeasible)


def test_the_pipeline_ends_also_pay_for_the_embedding_and_the_head() -> None:
    # Untied: embedding 10 %, norm and head 10 %, blocks 80 % of the weights.
    layout = attrs.evolve(LAYOUT, embedding_fraction=0.1, head_fraction=0.1, blocks_fraction=0.8)
    edged = ModelRef("e", "demo:e", 80 * MiB, layout=layout)
    need = 96 * MiB
    first, middle, last = ShardSpec(0, 2, 0, 3), ShardSpec(2, 4, 1, 3), ShardSpec(4, 8, 2, 3)
    assert runner_requirement(edged, first) == math.ceil(need * (0.1 + 0.8 * 2 / 8))
    assert runner_requirement(edged, middle) == math.ceil(need * (0.8 * 2 / 8))
    assert runner_requirement(edged, last) == math.ceil(need * (0.1 + 0.8 * 4 / 8))
    together = sum(runner_requirement(edged, shard) for shard in (first, middle, last))
    assert need <= together <= need + 3  # each weight once (and rounding)
    # A tied head is the embedding again: the last rank holds it too.
    tied = ModelRef("t", "demo:t", 80 * MiB, layout=attrs.evolve(layout, head_fraction=0.2))
    two = ShardSpec(0, 4, 0, 2), ShardSpec(4, 8, 1, 2)
    assert sum(runner_requirement(tied, shard) for shard in two) > need
    assert runner_requirement(edged, ShardSpec(0, 8, 1, 2, "tensor")) == need // 2
