"""The worker's decisions, as a pure function of the cluster state and what runs here.

`plan` is called after every state change and every local change; the worker service
executes what it returns. Each action, once started, shows up in `LocalWorld`, so calling
`plan` again never repeats it.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from trexo.availability import failed_for_good
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.runner_status import RunnerFailed
from trexo.types.state import GroupState, Instance, RunnerAssignment, State, Task

BringUp = tuple[tuple[object, ...], ...]
"""Per rank of a forming group still without an address: (rank, runner status, bytes of the
model its node has downloaded)."""


@attrs.frozen
class StartRunner:
    """Spawn the runner of `assignment` and load its part of `instance`'s model."""

    instance: Instance
    assignment: RunnerAssignment


@attrs.frozen
class StopRunner:
    """Its instance was deleted: stop and reap the runner."""

    runner_id: RunnerId


@attrs.frozen
class ForwardTask:
    """Hand `task` (with its request, which is held here) to the local lead runner and
    stream its chunks to the task's origin."""

    task: Task
    runner_id: RunnerId


@attrs.frozen
class CancelTask:
    """The task left the state (cancelled) while we still forward it: stop it in the runner."""

    task_id: RequestId


@attrs.frozen
class UpdateGroup:
    """The rank group of a local runner's split instance changed (an address came in, or a
    new epoch began): its runner connects once the group is complete, restarts on a new one."""

    runner_id: RunnerId
    group: GroupState
    bring_up: BringUp = ()
    """What the ranks still without an address have shown of their progress (while the
    group forms): the runner waits as long as this keeps changing."""


Action = StartRunner | StopRunner | UpdateGroup | ForwardTask | CancelTask


@attrs.frozen
class LocalWorld:
    """What this node's worker is doing right now."""

    node_id: NodeId
    runners: frozenset[RunnerId] = frozenset()
    """Runners with a live supervisor here (starting, loading, ready or running)."""
    taken: frozenset[RequestId] = frozenset()
    """Tasks this worker has forwarded (in flight or ended) that may still be in the state."""
    inflight: frozenset[RequestId] = frozenset()
    """Tasks being forwarded right now (a subset of `taken`)."""
    cancelling: frozenset[RequestId] = frozenset()
    """Forwarded tasks whose cancellation was already sent."""
    known: frozenset[RequestId] | None = None
    """Tasks this session's state has listed; None: every task in flight counts as known."""
    groups: Mapping[RunnerId, GroupState] = attrs.field(factory=dict)
    """The rank group each local runner of a split instance was last told of."""
    bring_ups: Mapping[RunnerId, BringUp] = attrs.field(factory=dict)
    """The other ranks' progress each local runner of a forming group was last told of."""
    bodies: frozenset[tuple[RequestId, NodeId]] = frozenset()
    """Requests held here (sent point-to-point), by task and the node that sent each: a task
    runs only the one its origin sent."""


def bring_up(state: State, instance_id: InstanceId, group: GroupState) -> BringUp:
    """How far the ranks of a forming group that have not reported an address have come:
    each one's runner status and its node's download of the model. A rank reports its
    address once its node has the model's files, which takes as long as the download: while
    this changes, the group is forming, however long that takes. Empty once formed."""
    instance = state.instances.get(instance_id)
    if instance is None or group.group is not None:
        return ()
    missing = {rank for rank, address in enumerate(group.addresses) if address is None}
    progress: list[tuple[object, ...]] = []
    for assignment in sorted(instance.assignments, key=lambda a: a.shard.rank):
        rank = assignment.shard.rank
        if rank not in missing:
            continue
        record = state.runners.get(assignment.runner_id)
        download = state.downloads.get(assignment.node_id, {}).get(instance.model.model_id)
        progress.append(
            (
                rank,
                record.status if record is not None else None,
                download.done_bytes if download is not None else None,
            )
        )
    return tuple(progress)


def plan(state: State, local: LocalWorld) -> list[Action]:
    """Every action the worker should start now, in a stable order.

    A runner that died keeps its place in `local.runners` while it waits out its restart
    backoff (the worker's restart policy), so it is started again only after that.
    """
    actions: list[Action] = []
    for instance in sorted(state.instances.values(), key=lambda i: i.instance_id):
        broken = failed_for_good(state, instance)
        for assignment in instance.assignments:
            if assignment.node_id != local.node_id:
                continue
            if assignment.runner_id not in local.runners:
                if not broken:
                    actions.append(StartRunner(instance, assignment))
            elif broken and not _failed_for_good(state, assignment.runner_id):
                # A rank of it failed for good: the others would only wait for it.
                actions.append(StopRunner(assignment.runner_id))
    for runner_id in sorted(local.runners - state.runners.keys()):
        actions.append(StopRunner(runner_id))
    for runner_id in sorted(local.runners & state.runners.keys()):
        instance_id = state.runners[runner_id].instance_id
        group = state.groups.get(instance_id)
        if group is None:
            continue
        progress = bring_up(state, instance_id, group)
        if local.groups.get(runner_id) != group or local.bring_ups.get(runner_id, ()) != progress:
            actions.append(UpdateGroup(runner_id, group, progress))
    for task in sorted(state.tasks.values(), key=lambda t: t.task_id):
        if task.task_id in local.taken:
            continue
        owner = state.instances.get(task.instance_id)
        if owner is None or owner.lead.node_id != local.node_id:
            continue
        lead = owner.lead.runner_id
        if lead in local.runners and (task.task_id, task.origin_node) in local.bodies:
            actions.append(ForwardTask(task, lead))
    # A task that left the state was cancelled; one it never listed may be adopted yet.
    known = local.inflight if local.known is None else local.inflight & local.known
    for task_id in sorted(known - state.tasks.keys() - local.cancelling):
        actions.append(CancelTask(task_id))
    return actions


def _failed_for_good(state: State, runner_id: RunnerId) -> bool:
    record = state.runners.get(runner_id)
    return (
        record is not None and isinstance(record.status, RunnerFailed) and record.status.permanent
    )
