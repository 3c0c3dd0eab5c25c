"""The master's pure decisions: commands to events or refusals, local events to events."""

from __future__ import annotations

import itertools

import attrs
import pytest

from trexo.idempotency import command_fingerprint
from trexo.master.decide import (
    Accepted,
    Refused,
    choose_instance,
    decide_command,
    decide_local_event,
    decide_nodes_lost,
    orphaned_tasks,
)
from trexo.state import apply_all
from trexo.types.commands import CancelTask, DeleteInstance, PlaceInstance, SubmitTask
from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.events import (
    DownloadUpdated,
    Event,
    GroupReset,
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
from trexo.types.local_events import (
    DownloadReport,
    NodeReport,
    RunnerReport,
    TaskInFlight,
    TaskReport,
)
from trexo.types.models import ModelRef
from trexo.types.refusal import RefusalKind
from trexo.types.runner_status import RunnerFailed, RunnerLoading, RunnerReady, RunnerRunning
from trexo.types.shard import ShardSpec
from trexo.types.state import CommandDone, Instance, NodeInfo, RunnerAssignment, State, Task

MiB = 1024 * 1024
A = NodeId("a")
MODEL = ModelRef("m", "demo:tiny", 10 * MiB)
NODE = NodeInfo(A, "host-a", 1024 * MiB, 1024 * MiB)


def instance(iid: str, runner: str) -> Instance:
    return Instance(InstanceId(iid), MODEL, (RunnerAssignment(RunnerId(runner), A),))


def decide(state: State, command: object) -> Accepted | Refused:
    counter = itertools.count()
    return decide_command(state, command, new_id=lambda: f"id{next(counter)}")  # type: ignore[arg-type]


def test_place_creates_an_instance_with_fresh_ids() -> None:
    state = apply_all(State(), [NodeUpdated(NODE)])
    decision = decide(state, PlaceInstance("c", MODEL))
    assert isinstance(decision, Accepted)
    (event,) = decision.events
    assert isinstance(event, InstanceCreated)
    assert decision.result_id == event.instance.instance_id == "id0"
    assert event.instance.lead.runner_id == "id1"


def test_place_refusals_have_kinds() -> None:
    state = apply_all(State(), [NodeUpdated(NodeInfo(A, "h", MiB, MiB))])
    short = decide(state, PlaceInstance("c", MODEL))
    assert isinstance(short, Refused)
    assert short.kind == RefusalKind.INSUFFICIENT_MEMORY
    assert "needs 12.0 MiB" in short.error
    ghost = decide(state, PlaceInstance("c", MODEL, (NodeId("ghost"),)))
    assert ghost == Refused("node ghost is not in the cluster", RefusalKind.NODE_NOT_FOUND)
    bad = decide(state, PlaceInstance("c", ModelRef("", "demo:tiny", 1)))
    assert isinstance(bad, Refused)
    assert bad.kind == RefusalKind.INVALID


def test_place_only_if_absent_answers_with_the_existing_instance() -> None:
    state = apply_all(State(), [NodeUpdated(NODE), InstanceCreated(instance("i1", "r1"))])
    assert decide(state, PlaceInstance("c", MODEL, only_if_absent=True)) == Accepted((), "i1")
    placed = decide(state, PlaceInstance("c", MODEL))
    assert isinstance(placed, Accepted)
    assert len(placed.events) == 1


def test_delete() -> None:
    state = apply_all(State(), [NodeUpdated(NODE), InstanceCreated(instance("i1", "r1"))])
    delete = DeleteInstance("c", InstanceId("i1"))
    done = CommandDone("c", command_fingerprint(delete) or "", "i1")
    assert decide(state, delete) == Accepted((InstanceDeleted(InstanceId("i1"), done),), "i1")
    assert decide(state, DeleteInstance("c", InstanceId("nope"))) == Refused(
        "no instance nope", RefusalKind.INSTANCE_NOT_FOUND
    )


def test_submit_creates_a_task_named_by_the_request() -> None:
    state = apply_all(State(), [NodeUpdated(NODE), InstanceCreated(instance("i1", "r1"))])
    decision = decide(state, SubmitTask("c", "m", NodeId("origin"), RequestId("q1")))
    task = Task(RequestId("q1"), InstanceId("i1"), NodeId("origin"))
    assert decision == Accepted((TaskCreated(task),), "q1")
    assert decide(state, SubmitTask("c", "other", A, RequestId("q2"))) == Refused(
        "model other is not placed in the cluster", RefusalKind.MODEL_NOT_FOUND
    )
    state = apply_all(state, [TaskCreated(task)])
    duplicate = decide(state, SubmitTask("c", "m", A, RequestId("q1")))
    assert isinstance(duplicate, Refused)
    assert duplicate.kind == RefusalKind.INVALID


def test_cancel() -> None:
    task = Task(RequestId("q1"), InstanceId("i1"), A)
    state = apply_all(State(), [InstanceCreated(instance("i1", "r1")), TaskCreated(task)])
    assert decide(state, CancelTask("c", RequestId("q1"))) == Accepted(
        (TaskFinished(RequestId("q1"), "cancelled"),), "q1"
    )
    assert decide(state, CancelTask("c", RequestId("zz"))) == Refused(
        "no task zz", RefusalKind.TASK_NOT_FOUND
    )


def test_choose_instance_prefers_ready_then_fewest_tasks() -> None:
    state = apply_all(
        State(),
        [
            InstanceCreated(instance("i1", "r1")),
            InstanceCreated(instance("i2", "r2")),
            InstanceCreated(instance("i3", "r3")),
            RunnerStatusChanged(RunnerId("r1"), InstanceId("i1"), A, RunnerLoading(0.5)),
            RunnerStatusChanged(RunnerId("r3"), InstanceId("i3"), A, RunnerFailed("boom")),
        ],
    )
    assert choose_instance(state, "m") is not None
    assert choose_instance(state, "m").instance_id == "i1"  # type: ignore[union-attr]
    ready = [
        RunnerStatusChanged(RunnerId(r), InstanceId(i), A, RunnerReady())
        for i, r in [("i1", "r1"), ("i2", "r2")]
    ]
    state = apply_all(state, ready)
    assert choose_instance(state, "m").instance_id == "i1"  # type: ignore[union-attr]
    busy = Task(RequestId("q"), InstanceId("i1"), A)
    state = apply_all(state, [TaskCreated(busy)])
    assert choose_instance(state, "m").instance_id == "i2"  # type: ignore[union-attr]
    assert choose_instance(state, "unplaced") is None


def test_local_events_become_events_only_when_they_change_something() -> None:
    task = Task(RequestId("q1"), InstanceId("i1"), A)
    state = apply_all(
        State(), [NodeUpdated(NODE), InstanceCreated(instance("i1", "r1")), TaskCreated(task)]
    )
    assert decide_local_event(state, NodeReport(NODE)) == []
    moved = NodeInfo(A, "host-a", 1024 * MiB, 512 * MiB)
    assert decide_local_event(state, NodeReport(moved)) == [NodeUpdated(moved)]

    ready = RunnerReport(RunnerId("r1"), InstanceId("i1"), RunnerReady())
    assert decide_local_event(state, ready) == [
        RunnerStatusChanged(RunnerId("r1"), InstanceId("i1"), A, RunnerReady())
    ]
    assert (
        decide_local_event(state, RunnerReport(RunnerId("r9"), InstanceId("i1"), RunnerReady()))
        == []
    )
    assert (
        decide_local_event(state, RunnerReport(RunnerId("r1"), InstanceId("i9"), RunnerReady()))
        == []
    )

    assert decide_local_event(state, TaskReport(RequestId("q1"), "pending")) == []
    assert decide_local_event(state, TaskReport(RequestId("q1"), "running")) == [
        TaskStatusChanged(RequestId("q1"), "running")
    ]
    done = TaskReport(RequestId("q1"), finish_reason="length")
    assert decide_local_event(state, done) == [TaskFinished(RequestId("q1"), "length")]
    assert decide_local_event(state, TaskReport(RequestId("zz"), finish_reason="stop")) == []


@pytest.mark.parametrize("status", [RunnerReady(), RunnerLoading(0.1)])
def test_runner_report_keeps_the_recorded_node(status: object) -> None:
    state = apply_all(State(), [InstanceCreated(instance("i1", "r1"))])
    (event,) = decide_local_event(state, RunnerReport(RunnerId("r1"), InstanceId("i1"), status))  # type: ignore[arg-type]
    assert isinstance(event, RunnerStatusChanged)
    assert event.node_id == A


def test_a_lost_node_takes_its_instances_and_their_tasks_with_it() -> None:
    b = NodeId("b")
    on_a, on_b = (
        instance("ia", "ra"),
        Instance(InstanceId("ib"), MODEL, (RunnerAssignment(RunnerId("rb"), b),)),
    )
    task = Task(RequestId("t"), on_b.instance_id, A)
    state = apply_all(
        State(),
        [
            NodeUpdated(NODE),
            NodeUpdated(NodeInfo(b, "host-b", 1024 * MiB, 1024 * MiB)),
            InstanceCreated(on_a),
            InstanceCreated(on_b),
            TaskCreated(task),
        ],
    )
    events = decide_nodes_lost(state, frozenset({A}))
    assert events == [InstanceDeleted(on_b.instance_id), NodeRemoved(b)]
    assert orphaned_tasks(state, events) == [task]
    after = apply_all(state, events)
    assert set(after.nodes) == {A}
    assert set(after.instances) == {on_a.instance_id}
    assert after.tasks == {}
    assert decide_nodes_lost(after, frozenset({A})) == []


def test_the_tasks_a_lost_node_asked_for_end_and_nobody_is_told() -> None:
    b = NodeId("b")
    asked_by_b = Task(RequestId("t"), InstanceId("ia"), b)
    state = apply_all(
        State(),
        [
            NodeUpdated(NODE),
            NodeUpdated(NodeInfo(b, "host-b", 1024 * MiB, 1024 * MiB)),
            InstanceCreated(instance("ia", "ra")),
            TaskCreated(asked_by_b),
        ],
    )
    events = decide_nodes_lost(state, frozenset({A}))
    assert events == [TaskFinished(asked_by_b.task_id, "cancelled"), NodeRemoved(b)]
    assert orphaned_tasks(state, events) == []
    assert apply_all(state, events).tasks == {}


def test_a_lost_nodes_demo_instances_are_placed_again_on_a_survivor_if_they_fit() -> None:
    b, c = NodeId("b"), NodeId("c")
    local = ModelRef("mine", "/models/mine", 10 * MiB)
    huge = ModelRef("huge", "demo:small", 2000 * MiB)
    lost = [
        Instance(InstanceId(f"i{k}"), model, (RunnerAssignment(RunnerId(f"r{k}"), b),))
        for k, model in enumerate((MODEL, local, huge))
    ]
    state = apply_all(
        State(),
        [
            NodeUpdated(NODE),
            NodeUpdated(NodeInfo(b, "host-b", 4096 * MiB, 4096 * MiB)),
            NodeUpdated(NodeInfo(c, "host-c", 512 * MiB, 512 * MiB)),
            *(InstanceCreated(i) for i in lost),
        ],
    )
    ids = (f"new-{k}" for k in itertools.count())
    events = decide_nodes_lost(state, frozenset({A, c}), new_id=lambda: next(ids))
    assert events[:4] == [*(InstanceDeleted(i.instance_id) for i in lost), NodeRemoved(b)]
    (again,) = events[4:]  # not the local model (its files were on b), not the one too big
    assert isinstance(again, InstanceCreated)
    assert again.instance.model == MODEL
    assert again.instance.node_ids == (A,)  # the survivor with the most free memory
    after = apply_all(state, events)
    assert [i.model for i in after.instances.values()] == [MODEL]
    assert decide_nodes_lost(after, frozenset({A, c}), new_id=lambda: next(ids)) == []


def test_a_download_report_is_an_event_when_it_changes_something() -> None:
    state = apply_all(State(), [NodeUpdated(NODE)])
    progress = DownloadProgress("org/m", DownloadPhase.DOWNLOADING, 1, 10)
    (event,) = decide_local_event(state, DownloadReport(A, progress))
    assert event == DownloadUpdated(A, progress)
    assert decide_local_event(apply_all(state, [event]), DownloadReport(A, progress)) == []
    assert decide_local_event(state, DownloadReport(NodeId("ghost"), progress)) == []


def test_a_lost_nodes_hub_models_are_placed_again_too() -> None:
    b = NodeId("b")
    hub = ModelRef("org/m", f"hf:org/m@{'a' * 40}", 10 * MiB)
    lost = Instance(InstanceId("i"), hub, (RunnerAssignment(RunnerId("r"), b),))
    state = apply_all(
        State(),
        [
            NodeUpdated(NODE),
            NodeUpdated(NodeInfo(b, "host-b", 1024 * MiB, 1024 * MiB)),
            InstanceCreated(lost),
        ],
    )
    events = decide_nodes_lost(state, frozenset({A}), new_id=lambda: "new")
    again = events[-1]
    assert isinstance(again, InstanceCreated) and again.instance.model == hub
    assert again.instance.node_ids == (A,)  # any node can download it


def test_small_memory_drifts_are_not_events_but_real_changes_are() -> None:
    state = apply_all(State(), [NodeUpdated(NODE)])
    drift = attrs.evolve(NODE, memory_available=NODE.memory_available - 10 * MiB)
    assert decide_local_event(state, NodeReport(drift)) == []
    big = attrs.evolve(NODE, memory_available=NODE.memory_available - 512 * MiB)
    assert decide_local_event(state, NodeReport(big)) == [NodeUpdated(big)]
    renamed = attrs.evolve(NODE, api_url="http://127.0.0.1:1")
    assert decide_local_event(state, NodeReport(renamed)) == [NodeUpdated(renamed)]


def test_a_task_in_flight_that_the_master_missed_is_adopted_once() -> None:
    state = apply_all(State(), [NodeUpdated(NODE), InstanceCreated(instance("i1", "r1"))])
    missed = Task(RequestId("q1"), InstanceId("i1"), A)
    (adopted,) = decide_local_event(state, TaskInFlight(missed))
    assert adopted == TaskCreated(attrs.evolve(missed, status="running"))
    state = apply_all(state, [adopted])
    assert decide_local_event(state, TaskInFlight(missed)) == []  # known now
    stray = Task(RequestId("q2"), InstanceId("gone"), A)
    assert decide_local_event(state, TaskInFlight(stray)) == []  # its instance is gone


def test_a_change_of_batch_size_alone_is_not_logged() -> None:
    state = apply_all(State(), [InstanceCreated(instance("i1", "r1"))])

    def report(status: object) -> list[Event]:
        return decide_local_event(state, RunnerReport(RunnerId("r1"), InstanceId("i1"), status))  # type: ignore[arg-type]

    (running,) = report(RunnerRunning(1))
    state = apply_all(state, [running])
    assert report(RunnerRunning(5)) == []  # chatter: only the batch size changed
    (ready,) = report(RunnerReady())  # a change of kind is history
    assert isinstance(ready, RunnerStatusChanged) and ready.status == RunnerReady()


def test_a_placement_done_is_answered_from_its_record_not_placed_again() -> None:
    state = apply_all(State(), [NodeUpdated(NODE)])
    first = decide(state, PlaceInstance("k", MODEL))
    assert isinstance(first, Accepted)
    state = apply_all(state, first.events)
    assert list(state.commands) == ["k"]
    # The same command id again (a retry under its key, or a resend to the next master).
    assert decide(state, PlaceInstance("k", MODEL)) == Accepted((), first.result_id)
    # A newer revision of the same model is the same request (a hub branch moved on).
    newer = attrs.evolve(MODEL, source="demo:tiny@2")
    assert decide(state, PlaceInstance("k", newer)) == Accepted((), first.result_id)
    # Once deleted, the placement's retry still names what it placed, and does not place.
    deleted = decide(state, DeleteInstance("d", InstanceId(first.result_id or "")))
    assert isinstance(deleted, Accepted)
    state = apply_all(state, deleted.events)
    assert not state.instances
    assert decide(state, PlaceInstance("k", MODEL)) == Accepted((), first.result_id)
    assert decide(state, DeleteInstance("d", InstanceId(first.result_id or ""))) == Accepted(
        (), first.result_id
    )


def test_a_key_used_for_another_request_is_refused() -> None:
    state = apply_all(State(), [NodeUpdated(NODE)])
    first = decide(state, PlaceInstance("k", MODEL))
    assert isinstance(first, Accepted)
    state = apply_all(state, first.events)
    other = attrs.evolve(MODEL, model_id="other")
    for command in (
        PlaceInstance("k", other),
        PlaceInstance("k", MODEL, node_count=2),
        DeleteInstance("k", InstanceId(first.result_id or "")),
    ):
        refused = decide(state, command)
        assert isinstance(refused, Refused), command
        assert refused.kind == RefusalKind.KEY_REUSED
    assert len(state.instances) == 1


def test_a_rank_failed_for_good_does_not_reset_its_group() -> None:
    split = Instance(
        InstanceId("s"),
        MODEL,
        (
            RunnerAssignment(RunnerId("r0"), A, ShardSpec(0, 2, rank=0, world_size=2)),
            RunnerAssignment(RunnerId("r1"), A, ShardSpec(2, 4, rank=1, world_size=2)),
        ),
    )
    state = apply_all(
        State(),
        [
            NodeUpdated(NODE),
            InstanceCreated(split),
            RankAddressed(InstanceId("s"), 0, 0, "127.0.0.1:1"),
            RankAddressed(InstanceId("s"), 0, 1, "127.0.0.1:2"),
        ],
    )
    transient = RunnerReport(RunnerId("r1"), InstanceId("s"), RunnerFailed("exit code 5"))
    assert any(isinstance(e, GroupReset) for e in decide_local_event(state, transient))
    for_good = RunnerFailed("load failed: ValueError: no layout", permanent=True)
    events = decide_local_event(state, RunnerReport(RunnerId("r1"), InstanceId("s"), for_good))
    assert events == [RunnerStatusChanged(RunnerId("r1"), InstanceId("s"), A, for_good)]
