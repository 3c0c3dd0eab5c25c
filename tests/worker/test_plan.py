"""The worker's pure planner."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from trexo.state import apply_all
from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.events import (
    DownloadUpdated,
    InstanceCreated,
    NodeUpdated,
    RankAddressed,
    RunnerStatusChanged,
)
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.models import ModelRef
from trexo.types.runner_status import RunnerFailed, RunnerLoading
from trexo.types.shard import ShardSpec
from trexo.types.state import (
    Instance,
    NodeInfo,
    RunnerAssignment,
    RunnerRecord,
    State,
    Task,
)
from trexo.worker.plan import (
    CancelTask,
    ForwardTask,
    LocalWorld,
    StartRunner,
    StopRunner,
    UpdateGroup,
    bring_up,
    plan,
)

ME, OTHER = NodeId("me"), NodeId("other")
MODEL = ModelRef("m", "demo:tiny", 1000)


def instance(iid: str, node: NodeId, runner: str) -> Instance:
    return Instance(InstanceId(iid), MODEL, (RunnerAssignment(RunnerId(runner), node),))


def state_with(*instances: Instance, tasks: tuple[Task, ...] = ()) -> State:
    return State(
        instances={i.instance_id: i for i in instances},
        runners={
            a.runner_id: RunnerRecord(a.runner_id, i.instance_id, a.node_id)
            for i in instances
            for a in i.assignments
        },
        tasks={t.task_id: t for t in tasks},
    )


def task(tid: str, iid: str) -> Task:
    return Task(RequestId(tid), InstanceId(iid), OTHER)


def test_starts_the_runners_assigned_here_only() -> None:
    mine, theirs = instance("i1", ME, "r1"), instance("i2", OTHER, "r2")
    actions = plan(state_with(mine, theirs), LocalWorld(ME))
    assert actions == [StartRunner(mine, mine.assignments[0])]


def test_a_started_runner_is_not_started_again() -> None:
    mine = instance("i1", ME, "r1")
    assert plan(state_with(mine), LocalWorld(ME, runners=frozenset({RunnerId("r1")}))) == []


def test_a_dead_runner_is_started_again_once_its_supervisor_is_gone() -> None:
    mine = instance("i1", ME, "r1")
    t = task("t1", "i1")
    waiting = LocalWorld(ME, runners=frozenset({RunnerId("r1")}), taken=frozenset({t.task_id}))
    assert plan(state_with(mine, tasks=(t,)), waiting) == []
    gone = LocalWorld(ME, taken=frozenset({t.task_id}))
    assert plan(state_with(mine, tasks=(t,)), gone) == [StartRunner(mine, mine.assignments[0])]


def test_stops_runners_whose_instance_is_gone() -> None:
    local = LocalWorld(ME, runners=frozenset({RunnerId("old")}))
    assert plan(State(), local) == [StopRunner(RunnerId("old"))]


def test_forwards_tasks_of_a_local_lead_runner_once_their_request_is_here() -> None:
    mine = instance("i1", ME, "r1")
    t = task("t1", "i1")
    no_body = LocalWorld(ME, runners=frozenset({RunnerId("r1")}))
    assert plan(state_with(mine, tasks=(t,)), no_body) == []
    running = LocalWorld(
        ME, runners=frozenset({RunnerId("r1")}), bodies=frozenset({(t.task_id, t.origin_node)})
    )
    assert plan(state_with(mine, tasks=(t,)), running) == [ForwardTask(t, RunnerId("r1"))]
    taken = LocalWorld(
        ME,
        runners=frozenset({RunnerId("r1")}),
        taken=frozenset({t.task_id}),
        inflight=frozenset({t.task_id}),
    )
    assert plan(state_with(mine, tasks=(t,)), taken) == []


def test_only_the_request_its_origin_sent_is_forwarded() -> None:
    # Every node learns every task's id from the log: a rogue peer can send a request for
    # someone else's task to its lead first. It never runs (its output would go to the
    # task's origin, into that user's stream).
    mine = instance("i1", ME, "r1")
    t = task("t1", "i1")  # asked for through OTHER
    rogue = LocalWorld(
        ME, runners=frozenset({RunnerId("r1")}), bodies=frozenset({(t.task_id, NodeId("x"))})
    )
    assert plan(state_with(mine, tasks=(t,)), rogue) == []
    both = attrs.evolve(rogue, bodies=rogue.bodies | {(t.task_id, OTHER)})
    assert plan(state_with(mine, tasks=(t,)), both) == [ForwardTask(t, RunnerId("r1"))]


def test_tasks_of_other_nodes_instances_are_left_alone() -> None:
    theirs = instance("i2", OTHER, "r2")
    assert plan(state_with(theirs, tasks=(task("t", "i2"),)), LocalWorld(ME)) == []


def test_the_lead_is_rank_zero() -> None:
    split = Instance(
        InstanceId("i"),
        MODEL,
        (
            RunnerAssignment(RunnerId("r-rank1"), ME, ShardSpec(2, 4, rank=1, world_size=2)),
            RunnerAssignment(RunnerId("r-rank0"), OTHER, ShardSpec(0, 2, rank=0, world_size=2)),
        ),
    )
    bodies = frozenset({(RequestId("t"), OTHER)})
    local = LocalWorld(ME, runners=frozenset({RunnerId("r-rank1")}), bodies=bodies)
    assert plan(state_with(split, tasks=(task("t", "i"),)), local) == []


def test_a_task_that_left_the_state_while_in_flight_is_cancelled_once() -> None:
    mine = instance("i1", ME, "r1")
    tid = RequestId("t1")
    local = LocalWorld(
        ME, runners=frozenset({RunnerId("r1")}), taken=frozenset({tid}), inflight=frozenset({tid})
    )
    assert plan(state_with(mine), local) == [CancelTask(tid)]
    local_after = LocalWorld(
        ME,
        runners=frozenset({RunnerId("r1")}),
        taken=frozenset({tid}),
        inflight=frozenset({tid}),
        cancelling=frozenset({tid}),
    )
    assert plan(state_with(mine), local_after) == []


@given(
    st.lists(st.tuples(st.sampled_from([ME, OTHER]), st.booleans()), max_size=6),
    st.lists(st.integers(0, 5), max_size=6),
)
def test_executing_the_plan_reaches_a_fixed_point(
    specs: list[tuple[NodeId, bool]], task_on: list[int]
) -> None:
    instances = [instance(f"i{n}", node, f"r{n}") for n, (node, _) in enumerate(specs)]
    tasks = tuple(task(f"t{k}", f"i{n}") for k, n in enumerate(task_on) if n < len(instances))
    state = state_with(*instances, tasks=tasks)
    bodies = frozenset((t.task_id, t.origin_node) for t in tasks)
    local = LocalWorld(ME, bodies=bodies)
    for _ in range(3):
        actions = plan(state, local)
        runners, taken, inflight = set(local.runners), set(local.taken), set(local.inflight)
        for action in actions:
            match action:
                case StartRunner(assignment=a):
                    runners.add(a.runner_id)
                case ForwardTask(task=t):
                    taken.add(t.task_id)
                    inflight.add(t.task_id)
        local = LocalWorld(
            ME, frozenset(runners), frozenset(taken), frozenset(inflight), bodies=bodies
        )
    assert plan(state, local) == []
    mine = {i.assignments[0].runner_id for i in instances if i.assignments[0].node_id == ME}
    assert local.runners == mine


def test_a_task_in_flight_is_cancelled_only_once_the_session_listed_it() -> None:
    mine = instance("i1", ME, "r1")
    t = task("t1", "i1")
    # A new master has not adopted it yet: it keeps running.
    unlisted = LocalWorld(
        ME,
        runners=frozenset({RunnerId("r1")}),
        taken=frozenset({t.task_id}),
        inflight=frozenset({t.task_id}),
        known=frozenset(),
    )
    assert plan(state_with(mine), unlisted) == []
    # It was listed and has left the state: it was cancelled.
    listed = attrs.evolve(unlisted, known=frozenset({t.task_id}))
    assert plan(state_with(mine), listed) == [CancelTask(t.task_id)]


def test_a_local_rank_is_told_of_its_group_whenever_it_changes() -> None:
    split = Instance(
        InstanceId("i"),
        MODEL,
        (
            RunnerAssignment(RunnerId("r0"), OTHER, ShardSpec(0, 2, rank=0, world_size=2)),
            RunnerAssignment(RunnerId("r1"), ME, ShardSpec(2, 4, rank=1, world_size=2)),
        ),
    )
    state = apply_all(State(), [InstanceCreated(split)])
    assert plan(state, LocalWorld(ME)) == [StartRunner(split, split.assignments[1])]
    running = LocalWorld(ME, runners=frozenset({RunnerId("r1")}))
    group = state.groups[split.instance_id]
    progress = bring_up(state, split.instance_id, group)
    assert plan(state, running) == [UpdateGroup(RunnerId("r1"), group, progress)]
    told = attrs.evolve(
        running, groups={RunnerId("r1"): group}, bring_ups={RunnerId("r1"): progress}
    )
    assert plan(state, told) == []
    state = apply_all(state, [RankAddressed(split.instance_id, 0, 0, "127.0.0.1:7000")])
    group = state.groups[split.instance_id]
    assert plan(state, told) == [
        UpdateGroup(RunnerId("r1"), group, bring_up(state, split.instance_id, group))
    ]


def test_a_forming_group_hears_of_its_missing_ranks_progress_until_it_is_formed() -> None:
    split = Instance(
        InstanceId("i"),
        MODEL,
        (
            RunnerAssignment(RunnerId("r0"), ME, ShardSpec(0, 2, rank=0, world_size=2)),
            RunnerAssignment(RunnerId("r1"), OTHER, ShardSpec(2, 4, rank=1, world_size=2)),
        ),
    )
    state = apply_all(
        State(),
        [
            NodeUpdated(NodeInfo(OTHER, "other", 100, 0)),
            InstanceCreated(split),
            RankAddressed(split.instance_id, 0, 0, "127.0.0.1:7000"),
        ],
    )
    group = state.groups[split.instance_id]
    before = bring_up(state, split.instance_id, group)
    assert [rank for rank, *_ in before] == [1]  # only the rank without an address
    told = LocalWorld(
        ME,
        runners=frozenset({RunnerId("r0")}),
        groups={RunnerId("r0"): group},
        bring_ups={RunnerId("r0"): before},
    )
    assert plan(state, told) == []
    # The other rank's node downloads its part: each report is progress.
    for done in (10, 20):
        progress = DownloadProgress(MODEL.model_id, DownloadPhase.DOWNLOADING, done, 100)
        state = apply_all(state, [DownloadUpdated(OTHER, progress)])
        (action,) = plan(state, told)
        assert isinstance(action, UpdateGroup) and action.bring_up != before
        told = attrs.evolve(told, bring_ups={RunnerId("r0"): action.bring_up})
        before = action.bring_up
    # Its runner moves on: progress too.
    state = apply_all(
        state, [RunnerStatusChanged(RunnerId("r1"), split.instance_id, OTHER, RunnerLoading())]
    )
    (action,) = plan(state, told)
    assert isinstance(action, UpdateGroup) and action.bring_up != before
    # Formed: nothing left to wait for.
    state = apply_all(state, [RankAddressed(split.instance_id, 0, 1, "127.0.0.1:7001")])
    assert bring_up(state, split.instance_id, state.groups[split.instance_id]) == ()


def test_an_instance_failed_for_good_is_not_started_and_its_other_ranks_stop() -> None:
    split = Instance(
        InstanceId("s"),
        MODEL,
        (
            RunnerAssignment(RunnerId("rank0"), ME, ShardSpec(0, 2, rank=0, world_size=2)),
            RunnerAssignment(RunnerId("rank1"), ME, ShardSpec(2, 4, rank=1, world_size=2)),
        ),
    )
    state = state_with(split)
    running = LocalWorld(ME, runners=frozenset({RunnerId("rank0"), RunnerId("rank1")}))
    assert plan(state, running) == []
    broken = RunnerFailed("load failed: ValueError: no layout", permanent=True)
    state = attrs.evolve(
        state,
        runners={
            **state.runners,
            RunnerId("rank1"): RunnerRecord(RunnerId("rank1"), InstanceId("s"), ME, broken),
        },
    )
    # rank1 is parked (its pool waits for the deletion); rank0 would only wait for it.
    assert plan(state, running) == [StopRunner(RunnerId("rank0"))]
    # Neither is started again, however the world stands.
    assert plan(state, LocalWorld(ME)) == []
    assert plan(state, LocalWorld(ME, runners=frozenset({RunnerId("rank1")}))) == []
    # A failure that a restart may mend starts it again as before.
    retried = attrs.evolve(broken, permanent=False, restart_in=1.0)
    state = attrs.evolve(
        state,
        runners={
            **state.runners,
            RunnerId("rank1"): RunnerRecord(RunnerId("rank1"), InstanceId("s"), ME, retried),
        },
    )
    assert plan(state, LocalWorld(ME)) == [
        StartRunner(split, split.assignments[0]),
        StartRunner(split, split.assignments[1]),
    ]
