"""`trexo.state.apply`: one test per event kind, then properties of random event sequences."""

from __future__ import annotations

import copy
import logging

import attrs
import pytest
from hypothesis import given
from state_strategies import event_lists, events

from trexo import wire
from trexo.state import (
    after_restart,
    apply,
    apply_all,
    carry_over,
    rebuild_events,
    remember_command,
)
from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.events import (
    DownloadUpdated,
    Event,
    GroupReset,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeRemoved,
    NodeUpdated,
    RankAddressed,
    RunnerStatusChanged,
    TaskCreated,
    TaskFinished,
    TaskStatusChanged,
)
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.models import ModelRef
from trexo.types.runner_status import (
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
)
from trexo.types.session import Session
from trexo.types.shard import ShardSpec
from trexo.types.state import (
    CommandDone,
    Instance,
    NodeInfo,
    RunnerAssignment,
    RunnerRecord,
    State,
    Task,
)

N1, N2 = NodeId("n1"), NodeId("n2")
I1 = InstanceId("i1")
R1 = RunnerId("r1")
T1 = RequestId("t1")
MODEL = ModelRef("m", "demo:tiny", 1000)
SESSION = Session(1, N1)


def node(node_id: NodeId, available: int = 1000) -> NodeInfo:
    return NodeInfo(node_id, f"host-{node_id}", memory_total=2000, memory_available=available)


def instance(iid: InstanceId = I1, runner: RunnerId = R1, on: NodeId = N1) -> Instance:
    return Instance(iid, MODEL, (RunnerAssignment(runner, on),))


def task(tid: RequestId = T1, iid: InstanceId = I1) -> Task:
    return Task(tid, iid, N2)


def base() -> State:
    """One node, one instance with one runner, one task."""
    return apply_all(
        State(), [NodeUpdated(node(N1)), InstanceCreated(instance()), TaskCreated(task())]
    )


# --- one event at a time -------------------------------------------------------------------


def test_node_updated_inserts_then_replaces() -> None:
    state = apply(State(), NodeUpdated(node(N1, 10)))
    assert state.nodes == {N1: node(N1, 10)}
    state = apply(state, NodeUpdated(node(N1, 20)))
    assert state.nodes == {N1: node(N1, 20)}


def test_node_removed_leaves_instances_for_the_master() -> None:
    state = apply(base(), NodeRemoved(N1))
    assert state.nodes == {}
    assert I1 in state.instances
    assert R1 in state.runners
    assert T1 in state.tasks


def test_instance_created_adds_an_idle_runner_record_per_assignment() -> None:
    two = Instance(
        I1,
        MODEL,
        (
            RunnerAssignment(R1, N1, ShardSpec(0, 2, rank=0, world_size=2)),
            RunnerAssignment(RunnerId("r2"), N2, ShardSpec(2, 4, rank=1, world_size=2)),
        ),
    )
    state = apply(State(), InstanceCreated(two))
    assert state.instances == {I1: two}
    assert state.runners == {
        R1: RunnerRecord(R1, I1, N1, RunnerIdle()),
        RunnerId("r2"): RunnerRecord(RunnerId("r2"), I1, N2, RunnerIdle()),
    }


def test_instance_created_twice_keeps_the_first() -> None:
    state = apply(base(), RunnerStatusChanged(R1, I1, N1, RunnerReady()))
    assert apply(state, InstanceCreated(instance())) == state


def test_instance_deleted_removes_its_runners_and_tasks_only() -> None:
    other = instance(InstanceId("i2"), RunnerId("r2"))
    state = apply_all(
        base(), [InstanceCreated(other), TaskCreated(task(RequestId("t2"), other.instance_id))]
    )
    state = apply(state, InstanceDeleted(I1))
    assert set(state.instances) == {"i2"}
    assert set(state.runners) == {"r2"}
    assert set(state.tasks) == {"t2"}
    assert state.nodes == {N1: node(N1)}


def test_runner_status_changed_updates_the_record() -> None:
    state = apply(base(), RunnerStatusChanged(R1, I1, N1, RunnerLoading(0.5)))
    assert state.runners[R1] == RunnerRecord(R1, I1, N1, RunnerLoading(0.5))


def test_runner_status_changed_creates_a_missing_record_of_a_known_instance() -> None:
    state = apply(base(), RunnerStatusChanged(RunnerId("extra"), I1, N2, RunnerReady()))
    assert state.runners[RunnerId("extra")] == RunnerRecord(
        RunnerId("extra"), I1, N2, RunnerReady()
    )


def test_task_created_and_its_status_changes() -> None:
    state = apply(base(), TaskStatusChanged(T1, "running"))
    assert state.tasks[T1] == attrs.evolve(task(), status="running")


def test_task_finished_removes_the_task() -> None:
    state = apply(base(), TaskFinished(T1, "stop"))
    assert state.tasks == {}
    assert I1 in state.instances


def test_indexed_event_sets_last_index() -> None:
    assert State().last_index == -1
    state = apply(State(), IndexedEvent(SESSION, 0, NodeUpdated(node(N1))))
    assert state.last_index == 0
    assert apply(state, NodeUpdated(node(N2))).last_index == 0  # a bare event keeps it


@pytest.mark.parametrize(
    "event",
    [
        NodeRemoved(NodeId("ghost")),
        InstanceDeleted(InstanceId("ghost")),
        RunnerStatusChanged(RunnerId("r9"), InstanceId("ghost"), N1, RunnerReady()),
        TaskCreated(task(RequestId("t9"), InstanceId("ghost"))),
        TaskStatusChanged(RequestId("ghost"), "running"),
        TaskFinished(RequestId("ghost"), "stop"),
    ],
)
def test_unknown_ids_are_logged_no_ops(event: Event, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trexo.state")
    assert apply(base(), event) == base()
    assert any("unknown" in r.getMessage() for r in caplog.records)


def test_apply_never_mutates_its_input() -> None:
    before = base()
    snapshot = copy.deepcopy(before)
    changes: list[Event] = [
        NodeUpdated(node(N2)),
        NodeRemoved(N1),
        InstanceCreated(instance(InstanceId("i2"), RunnerId("r2"))),
        RunnerStatusChanged(R1, I1, N1, RunnerReady()),
        TaskCreated(task(RequestId("t2"))),
        TaskStatusChanged(T1, "running"),
        TaskFinished(T1, "stop"),
        InstanceDeleted(I1),
    ]
    for event in changes:
        apply(before, event)
    assert before == snapshot


# --- properties ----------------------------------------------------------------------------


def _indexed(evs: list[Event]) -> list[IndexedEvent]:
    return [IndexedEvent(SESSION, k, e) for k, e in enumerate(evs)]


@given(event_lists)
def test_any_event_sequence_applies_and_replays_to_the_same_state(evs: list[Event]) -> None:
    indexed = _indexed(evs)
    first = apply_all(State(), indexed)
    assert apply_all(State(), indexed) == first
    assert first.last_index == len(evs) - 1


@given(event_lists)
def test_state_invariants_hold(evs: list[Event]) -> None:
    state = apply_all(State(), evs)
    assert all(r.instance_id in state.instances for r in state.runners.values())
    assert all(t.instance_id in state.instances for t in state.tasks.values())
    for instance_ in state.instances.values():
        assert all(a.runner_id in state.runners for a in instance_.assignments)
    # Exactly the split instances have a group, with one address slot per rank.
    assert set(state.groups) == {i for i, inst in state.instances.items() if inst.is_split}
    for iid, group in state.groups.items():
        assert len(group.addresses) == len(state.instances[iid].assignments)
    # Only nodes in the cluster have downloads, each under its model's id.
    assert set(state.downloads) <= set(state.nodes)
    for downloads in state.downloads.values():
        assert all(model_id == p.model_id for model_id, p in downloads.items())


@given(event_lists)
def test_state_round_trips_through_the_wire(evs: list[Event]) -> None:
    state = apply_all(State(), _indexed(evs))
    assert wire.from_json(wire.to_json(state, State), State) == state


@given(event_lists)
def test_indexed_events_round_trip_through_the_wire(evs: list[Event]) -> None:
    for event in _indexed(evs):
        assert wire.from_json(wire.to_json(event, IndexedEvent), IndexedEvent) == event


@given(event_lists)
def test_rebuild_events_reproduce_the_state(evs: list[Event]) -> None:
    state = apply_all(State(), _indexed(evs))
    rebuilt = apply_all(State(), rebuild_events(state))
    assert rebuilt == attrs.evolve(state, last_index=-1)


@given(event_lists, events)
def test_apply_leaves_earlier_states_alone(evs: list[Event], event: Event) -> None:
    state = apply_all(State(), evs)
    encoded = wire.to_json(state, State)
    apply(state, event)
    assert wire.to_json(state, State) == encoded


@given(event_lists)
def test_carry_over_keeps_everything_but_the_log_position(evs: list[Event]) -> None:
    state = apply_all(State(), _indexed(evs))
    kept = carry_over(state)
    assert kept == attrs.evolve(state, last_index=-1, opened=False)
    # And a new session's log rebuilds it exactly.
    assert apply_all(State(), rebuild_events(kept)) == kept


def test_downloads_are_kept_per_node_and_model_and_leave_with_the_node() -> None:
    progress = DownloadProgress("org/m", DownloadPhase.DOWNLOADING, 10, 100)
    state = apply(base(), DownloadUpdated(N1, progress))
    assert state.downloads == {N1: {"org/m": progress}}
    done = attrs.evolve(progress, phase=DownloadPhase.DONE, done_bytes=100)
    other = DownloadProgress("org/n", DownloadPhase.FAILED, error="gated")
    state = apply_all(state, [DownloadUpdated(N1, done), DownloadUpdated(N1, other)])
    assert state.downloads == {N1: {"org/m": done, "org/n": other}}
    assert apply(state, DownloadUpdated(NodeId("ghost"), progress)) == state
    assert apply(state, NodeRemoved(N1)).downloads == {}


def test_a_split_instance_forms_its_group_rank_by_rank_and_resets_to_a_new_epoch() -> None:
    a, b = NodeId("n1"), NodeId("n2")
    split = Instance(
        InstanceId("i"),
        MODEL,
        (
            RunnerAssignment(RunnerId("r0"), a, ShardSpec(0, 2, rank=0, world_size=2)),
            RunnerAssignment(RunnerId("r1"), b, ShardSpec(2, 4, rank=1, world_size=2)),
        ),
    )
    state = apply_all(State(), [InstanceCreated(split)])
    assert state.groups[split.instance_id].group is None
    state = apply_all(state, [RankAddressed(split.instance_id, 0, 1, "10.0.0.2:7001")])
    assert state.groups[split.instance_id].group is None  # rank 0 still missing
    stale = apply(state, RankAddressed(split.instance_id, 5, 0, "10.0.0.1:7000"))
    assert stale == state  # another epoch's address is not this one's
    state = apply(state, RankAddressed(split.instance_id, 0, 0, "10.0.0.1:7000"))
    group = state.groups[split.instance_id].group
    assert group is not None and group.hosts == ("10.0.0.1:7000", "10.0.0.2:7001")
    reset = apply(state, GroupReset(split.instance_id, 1))
    assert reset.groups[split.instance_id].epoch == 1
    assert reset.groups[split.instance_id].group is None
    assert apply(reset, GroupReset(split.instance_id, 1)) == reset  # not a newer epoch
    assert split.instance_id not in apply(reset, InstanceDeleted(split.instance_id)).groups
    assert apply_all(State(), rebuild_events(reset)) == reset


def test_commands_are_remembered_newest_last_and_bounded() -> None:
    state = State()
    for k in range(5):
        state = remember_command(state, CommandDone(f"c{k}", "f", None), bound=3)
    assert list(state.commands) == ["c2", "c3", "c4"]
    # Done again: it moves to the newest place, so it is forgotten last.
    state = remember_command(state, CommandDone("c2", "f", "i9"), bound=3)
    assert list(state.commands) == ["c3", "c4", "c2"]
    assert state.commands["c2"].result_id == "i9"
    assert remember_command(state, None) is state


def test_the_record_comes_with_the_placement_and_survives_a_restart() -> None:
    done = CommandDone("c1", "f", "i2")
    created = apply(base(), InstanceCreated(Instance(InstanceId("i2"), MODEL, ()), done))
    assert created.commands == {"c1": done}
    assert after_restart(created).commands == created.commands
    assert carry_over(created).commands == created.commands
    # A placement the state already has (a duplicate event) records nothing.
    twice = apply(
        created,
        InstanceCreated(Instance(InstanceId("i2"), MODEL, ()), CommandDone("c2", "f", "i2")),
    )
    assert list(twice.commands) == ["c1"]
