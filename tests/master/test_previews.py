"""Placement previews: every candidate placement, judged exactly as `place` judges it."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from trexo.master.placement import Infeasible, runner_requirement, try_place
from trexo.master.previews import PlacementPreview, PreviewRank, node_sets, previews
from trexo.state import apply, apply_all
from trexo.types.events import InstanceCreated, NodeUpdated
from trexo.types.ids import NodeId
from trexo.types.models import ModelLayout, ModelRef
from trexo.types.refusal import RefusalKind
from trexo.types.state import Instance, NodeInfo, State
from trexo.wire import converter

MiB = 1024 * 1024
MODEL = ModelRef("m", "demo:m", 80 * MiB, layout=ModelLayout(8, 8, 4, 1024))  # needs 96 MiB


def cluster(**available: int) -> State:
    return apply_all(
        State(),
        [NodeUpdated(NodeInfo(NodeId(n), n, 2 * m, m)) for n, m in available.items()],
    )


def placed_as(state: State, model: ModelRef, p: PlacementPreview) -> Instance | Infeasible:
    ids = itertools.count()
    return try_place(
        state,
        model,
        new_id=lambda: f"id{next(ids)}",
        sharding="auto" if p.sharding == "whole" else p.sharding,
        node_ids=p.node_ids,
    )


def test_two_nodes_give_whole_on_each_then_both_splits() -> None:
    state = cluster(a=100 * MiB, b=50 * MiB)
    listed = previews(state, MODEL)
    assert [(p.sharding, p.node_ids, p.feasible) for p in listed] == [
        ("whole", ("a",), True),
        ("whole", ("b",), False),
        ("pipeline", ("a", "b"), True),
        ("tensor", ("a", "b"), True),
    ]
    pipeline = listed[2]
    assert pipeline.ranks == (
        PreviewRank(NodeId("a"), 0, 0, 5, 60 * MiB, 100 * MiB),
        PreviewRank(NodeId("b"), 1, 5, 8, 36 * MiB, 50 * MiB),
    )
    short = listed[1]
    assert short.error == "model m needs 96.0 MiB, node b has 50.0 MiB available"
    assert short.error_kind == RefusalKind.INSUFFICIENT_MEMORY
    assert short.ranks == (PreviewRank(NodeId("b"), 0, None, None, 96 * MiB, 50 * MiB),)


def test_previews_see_memory_already_reserved() -> None:
    state = cluster(a=100 * MiB)
    [before] = previews(state, MODEL)
    assert before.feasible
    instance = placed_as(state, MODEL, before)
    assert isinstance(instance, Instance)
    [after] = previews(apply(state, InstanceCreated(instance)), MODEL)
    assert not after.feasible
    assert after.ranks[0].memory_free == 4 * MiB


def test_a_model_without_layout_previews_splits_as_unshardable() -> None:
    plain = ModelRef("plain", "/models/plain", MiB)
    listed = previews(cluster(a=100 * MiB, b=100 * MiB), plain)
    splits = [p for p in listed if p.sharding != "whole"]
    assert len(splits) == 2
    assert all(not p.feasible and p.ranks == () for p in splits)
    assert all(p.error_kind == RefusalKind.UNSHARDABLE for p in splits)


def test_every_subset_up_to_the_bound_then_the_freest_prefixes() -> None:
    free = {NodeId(n): m for n, m in zip("abcd", (4, 1, 3, 2), strict=True)}
    assert len(list(node_sets(free, all_subsets_max_nodes=4))) == 15
    assert list(node_sets(free, all_subsets_max_nodes=3)) == [
        ("a",),
        ("a", "c"),
        ("a", "c", "d"),
        ("a", "b", "c", "d"),
    ]
    assert previews(State(), MODEL) == []


def test_previews_unstructure_to_plain_json() -> None:
    [preview] = previews(cluster(a=MiB), MODEL)
    assert converter.unstructure(preview, PlacementPreview) == {
        "sharding": "whole",
        "node_ids": ["a"],
        "feasible": False,
        "ranks": [
            {
                "node_id": "a",
                "rank": 0,
                "start_layer": None,
                "end_layer": None,
                "memory_needed": 96 * MiB,
                "memory_free": MiB,
            }
        ],
        "error": "model m needs 96.0 MiB, node a has 1.0 MiB available",
        "error_kind": "insufficient_memory",
    }


# --- properties ----------------------------------------------------------------------------------

memories = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]), st.integers(-64 * MiB, 512 * MiB), min_size=1
)
layouts = st.builds(
    ModelLayout,
    n_layers=st.integers(1, 12),
    n_heads=st.sampled_from([1, 2, 4, 6]),
    n_kv_heads=st.sampled_from([1, 2, 3]),
    intermediate_size=st.sampled_from([96, 250, 256]),
)
models = st.builds(
    ModelRef,
    model_id=st.just("m"),
    source=st.just("demo:m"),
    size_bytes=st.integers(0, 1024 * MiB),
    layout=st.none() | layouts,
)


@given(memories, models)
def test_feasible_previews_are_exactly_what_place_accepts(
    available: dict[str, int], model: ModelRef
) -> None:
    state = cluster(**available)
    listed = previews(state, model)
    assert len(listed) == len({(p.sharding, p.node_ids) for p in listed})
    for p in listed:
        outcome = placed_as(state, model, p)
        if isinstance(outcome, Infeasible):
            assert not p.feasible
            assert (p.error, p.error_kind) == (outcome.reason, outcome.kind)
            continue
        assert p.feasible and p.error is None
        assert outcome.node_ids == p.node_ids
        assert [
            (a.node_id, a.shard.rank, a.shard.start_layer, a.shard.end_layer)
            for a in outcome.assignments
        ] == [(r.node_id, r.rank, r.start_layer, r.end_layer) for r in p.ranks]
        assert [runner_requirement(model, a.shard) for a in outcome.assignments] == [
            r.memory_needed for r in p.ranks
        ]
        assert all(r.memory_needed <= r.memory_free for r in p.ranks)


@given(memories, models)
def test_what_auto_places_is_a_feasible_preview(available: dict[str, int], model: ModelRef) -> None:
    state = cluster(**available)
    ids = itertools.count()
    outcome = try_place(state, model, new_id=lambda: f"id{next(ids)}")
    feasible = {(p.sharding, p.node_ids) for p in previews(state, model) if p.feasible}
    if isinstance(outcome, Infeasible):
        return
    sharding = "whole" if outcome.lead.shard.is_whole else outcome.lead.shard.sharding
    assert (sharding, outcome.node_ids) in feasible
