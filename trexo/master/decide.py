"""What the master makes of a command or a local event, given its state. Pure functions.

`decide_command` validates a state-changing command and answers `Accepted` (the events to
emit, and the id to report back) or `Refused` (why, and a machine-readable kind).
`decide_local_event` turns a worker's fact into the global event that records it, or into
nothing when it names something unknown or changes nothing (a periodic report that repeats
the state would only bloat the log).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

from trexo.config import MEMORY_REPORT_THRESHOLD_BYTES, PLACEMENT_MEMORY_OVERHEAD
from trexo.idempotency import KEY_REUSED_MESSAGE, command_fingerprint
from trexo.master.placement import Infeasible, split_of, try_place
from trexo.state import apply_all
from trexo.types.commands import CancelTask, DeleteInstance, PlaceInstance, SubmitTask
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
from trexo.types.ids import InstanceId, NodeId, RunnerId
from trexo.types.local_events import (
    DownloadReport,
    LocalEvent,
    NodeReport,
    RankAddressReport,
    RunnerReport,
    TaskInFlight,
    TaskReport,
)
from trexo.types.refusal import RefusalKind
from trexo.types.runner_status import (
    TERMINAL_STATUSES,
    RunnerFailed,
    RunnerReady,
    RunnerRunning,
)
from trexo.types.state import CommandDone, Instance, NodeInfo, RunnerRecord, State, Task

log = logging.getLogger(__name__)

StateCommand = PlaceInstance | DeleteInstance | SubmitTask | CancelTask
"""The commands that change state (`RequestReplay` only reads the log)."""


@attrs.frozen
class Accepted:
    events: tuple[Event, ...]
    result_id: str | None = None
    """What the command made or touched (an instance id, a task id), for the reply."""


@attrs.frozen
class Refused:
    error: str
    kind: RefusalKind


Decision = Accepted | Refused


def decide_command(
    state: State,
    command: StateCommand,
    *,
    new_id: Callable[[], str],
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> Decision:
    """Validate `command` against `state`; `new_id` names what the command creates.

    A placement or deletion the state records as done (a retry under the same idempotency
    key, a resend to the next master) is answered with what it did, not done again.
    """
    fingerprint = command_fingerprint(command)
    if (done := state.commands.get(command.command_id)) is not None:
        if done.fingerprint != fingerprint:
            return Refused(KEY_REUSED_MESSAGE, RefusalKind.KEY_REUSED)
        return Accepted((), done.result_id)
    match command:
        case PlaceInstance(
            model=model,
            node_ids=node_ids,
            sharding=sharding,
            node_count=node_count,
            only_if_absent=only_if_absent,
        ):
            if only_if_absent and (existing := choose_instance(state, model.model_id)):
                return Accepted((), existing.instance_id)
            if not model.model_id or model.size_bytes < 0:
                return Refused(
                    f"invalid model {model.model_id!r} ({model.size_bytes} B)", RefusalKind.INVALID
                )
            placed = try_place(
                state,
                model,
                new_id=new_id,
                sharding=sharding,
                node_ids=node_ids,
                node_count=node_count,
                overhead=overhead,
            )
            if isinstance(placed, Infeasible):
                return Refused(placed.reason, placed.kind)
            done = CommandDone(command.command_id, fingerprint or "", placed.instance_id)
            return Accepted((InstanceCreated(placed, done),), placed.instance_id)
        case DeleteInstance(_, instance_id):
            if instance_id not in state.instances:
                return Refused(f"no instance {instance_id}", RefusalKind.INSTANCE_NOT_FOUND)
            done = CommandDone(command.command_id, fingerprint or "", instance_id)
            return Accepted((InstanceDeleted(instance_id, done),), instance_id)
        case SubmitTask(_, model_id, origin_node, request_id):
            if request_id in state.tasks:
                return Refused(f"task {request_id} already exists", RefusalKind.INVALID)
            chosen = choose_instance(state, model_id)
            if chosen is None:
                return Refused(
                    f"model {model_id} is not placed in the cluster", RefusalKind.MODEL_NOT_FOUND
                )
            task = Task(request_id, chosen.instance_id, origin_node)
            return Accepted((TaskCreated(task),), task.task_id)
        case CancelTask(_, task_id):
            if task_id not in state.tasks:
                return Refused(f"no task {task_id}", RefusalKind.TASK_NOT_FOUND)
            return Accepted((TaskFinished(task_id, "cancelled"),), task_id)


def choose_instance(state: State, model_id: str) -> Instance | None:
    """The instance of `model_id` a new task should go to, or None if none is placed.

    Prefer a serving lead runner (ready or running), then a live one (still loading), then
    the fewest tasks in flight; ties go to the smallest instance id.
    """
    candidates = [i for i in state.instances.values() if i.model.model_id == model_id]
    if not candidates:
        return None
    load: dict[InstanceId, int] = {}
    for task in state.tasks.values():
        load[task.instance_id] = load.get(task.instance_id, 0) + 1

    def rank(instance: Instance) -> tuple[int, int, str]:
        record = state.runners.get(instance.lead.runner_id)
        status = record.status if record is not None else None
        if isinstance(status, RunnerReady | RunnerRunning):
            readiness = 0
        elif isinstance(status, TERMINAL_STATUSES) or status is None:
            readiness = 2
        else:
            readiness = 1
        return (readiness, load.get(instance.instance_id, 0), instance.instance_id)

    return min(candidates, key=rank)


def decide_local_event(state: State, event: LocalEvent) -> list[Event]:
    """The global events recording `event`: none if it names nothing known or changes nothing."""
    match event:
        case NodeReport(node):
            known = state.nodes.get(node.node_id)
            if known is not None and not node_info_changed(known, node):
                return []
            return [NodeUpdated(node)]
        case RunnerReport(runner_id, instance_id, status):
            record = state.runners.get(runner_id)
            if record is None or record.instance_id != instance_id:
                log.info(
                    "ignored report of unknown runner %s (instance %s)", runner_id, instance_id
                )
                return []
            if record.status == status:
                return []
            if isinstance(record.status, RunnerRunning) and isinstance(status, RunnerRunning):
                return []  # only its batch size changed: chatter, not history
            changed: list[Event] = [
                RunnerStatusChanged(runner_id, instance_id, record.node_id, status)
            ]
            # A rank that failed for good is not restarted: a new epoch would wait for it.
            retried = isinstance(status, RunnerFailed) and not status.permanent
            if retried and (reset := group_reset(state, record)):
                changed.append(reset)
            return changed
        case RankAddressReport(instance_id, runner_id, epoch, address):
            return rank_addressed(state, instance_id, runner_id, epoch, address)
        case TaskInFlight(adopted):
            if adopted.task_id in state.tasks or adopted.instance_id not in state.instances:
                return []
            return [TaskCreated(attrs.evolve(adopted, status="running"))]
        case TaskReport(task_id, status, finish_reason):
            task = state.tasks.get(task_id)
            if task is None:
                log.debug("ignored report of unknown task %s (finished already?)", task_id)
                return []
            if finish_reason is not None:
                return [TaskFinished(task_id, finish_reason)]
            if task.status == status:
                return []
            return [TaskStatusChanged(task_id, status)]
        case DownloadReport(node_id, progress):
            if node_id not in state.nodes:
                return []
            if state.downloads.get(node_id, {}).get(progress.model_id) == progress:
                return []
            return [DownloadUpdated(node_id, progress)]


def group_reset(state: State, failed: RunnerRecord) -> GroupReset | None:
    """A rank of a split instance failed: the whole group restarts in a new epoch.

    Only a rank that took part in the current epoch (it reported its address) resets it: the
    other ranks' failures that follow (their peer left) belong to the same, already reset,
    epoch. A node reports in order, so its failure in an old epoch reaches the master
    before its address in the new one.
    """
    instance = state.instances.get(failed.instance_id)
    group = state.groups.get(failed.instance_id)
    if instance is None or group is None:
        return None
    rank = _rank_of(instance, failed.runner_id)
    if rank is None or group.addresses[rank] is None:
        return None
    return GroupReset(instance.instance_id, group.epoch + 1)


def rank_addressed(
    state: State, instance_id: InstanceId, runner_id: RunnerId, epoch: int, address: str
) -> list[Event]:
    """Record a rank's address for the current epoch; stale or unknown reports record nothing."""
    instance = state.instances.get(instance_id)
    group = state.groups.get(instance_id)
    rank = _rank_of(instance, runner_id) if instance is not None else None
    if group is None or rank is None or group.epoch != epoch:
        log.info(
            "ignored address of runner %s (instance %s, epoch %d): not its current group",
            runner_id,
            instance_id,
            epoch,
        )
        return []
    if group.addresses[rank] == address:
        return []
    return [RankAddressed(instance_id, epoch, rank, address)]


def _rank_of(instance: Instance, runner_id: RunnerId) -> int | None:
    for assignment in instance.assignments:
        if assignment.runner_id == runner_id:
            return assignment.shard.rank
    return None


def node_info_changed(old: NodeInfo, new: NodeInfo) -> bool:
    """Worth an event: anything but a small drift of available memory (nodes re-report
    every few seconds; each drift would otherwise be an event in the log)."""
    drift = abs(old.memory_available - new.memory_available)
    same_but_memory = attrs.evolve(old, memory_available=new.memory_available) == new
    return not same_but_memory or drift > MEMORY_REPORT_THRESHOLD_BYTES


def decide_nodes_lost(
    state: State,
    live: frozenset[NodeId],
    *,
    new_id: Callable[[], str] | None = None,
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> list[Event]:
    """Events for every node of `state` that is no longer linked: its instances go, the tasks
    it asked for end, then it goes, then (with `new_id`) each lost instance is placed again
    on the survivors if it fits.

    An instance with a runner on a lost node cannot serve (a split model loses a layer
    range), so it is deleted as a whole; its tasks go with it (`apply` of InstanceDeleted).
    Only models every node can make or download are placed again (demo and Hugging Face
    models): a local model's directory exists only on the node it was placed on.
    """
    lost = sorted(set(state.nodes) - live)
    gone = [
        instance
        for instance in sorted(state.instances.values(), key=lambda i: i.instance_id)
        if any(node_id in lost for node_id in instance.node_ids)
    ]
    events: list[Event] = [InstanceDeleted(instance.instance_id) for instance in gone]
    # A task asked for by a node that left has nobody to stream to (and its request body,
    # if it had not reached the runner yet, never will).
    events.extend(
        TaskFinished(task.task_id, "cancelled")
        for task in sorted(state.tasks.values(), key=lambda t: t.task_id)
        if task.origin_node in lost and all(task.instance_id != i.instance_id for i in gone)
    )
    events.extend(NodeRemoved(node_id) for node_id in lost)
    if new_id is None:
        return events
    survivors = apply_all(state, events)
    for instance in gone:
        if not instance.model.every_node_can_fetch:
            continue
        again = place_again(survivors, instance, new_id=new_id, overhead=overhead)
        if isinstance(again, Infeasible):
            log.info("instance %s is not placed again: %s", instance.instance_id, again.reason)
            continue
        events.append(InstanceCreated(again))
        survivors = apply_all(survivors, [InstanceCreated(again)])
    return events


def place_again(
    state: State,
    lost: Instance,
    *,
    new_id: Callable[[], str],
    overhead: float = PLACEMENT_MEMORY_OVERHEAD,
) -> Instance | Infeasible:
    """A new instance of `lost`'s model: split the same way over as many nodes if the
    survivors allow, else wherever "auto" puts it."""
    sharding, node_count = split_of(lost)
    same = try_place(
        state,
        lost.model,
        new_id=new_id,
        sharding=sharding or "auto",
        node_count=node_count,
        overhead=overhead,
    )
    if not isinstance(same, Infeasible):
        return same
    return try_place(state, lost.model, new_id=new_id, overhead=overhead)


def orphaned_tasks(state: State, events: list[Event]) -> list[Task]:
    """Tasks whose instance `events` delete: their requesters must be told (those still in
    the cluster: a node that left is told nothing)."""
    deleted = {e.instance_id for e in events if isinstance(e, InstanceDeleted)}
    removed = {e.node_id for e in events if isinstance(e, NodeRemoved)}
    return [
        t for t in state.tasks.values() if t.instance_id in deleted and t.origin_node not in removed
    ]
