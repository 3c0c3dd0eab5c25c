"""`apply(state, event) -> State`: the one pure function every node folds the event log with.

Nothing is mutated: each change copies the dicts it touches and `attrs.evolve`s the state, so
a `State` handed out earlier never changes under its holder. An event naming an id the state
does not know is a no-op (logged at debug), never an exception: the log is the master's
word, and a late fact about something already gone is ordinary.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TypeVar

import attrs

from trexo.config import REMEMBERED_COMMANDS
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
    SessionOpened,
    TaskCreated,
    TaskFinished,
    TaskStatusChanged,
)
from trexo.types.runner_status import RunnerIdle
from trexo.types.state import CommandDone, GroupState, RunnerRecord, State

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")


def apply(state: State, event: IndexedEvent | Event) -> State:
    """`state` after `event`; an `IndexedEvent` also moves `last_index` to its index."""
    if isinstance(event, IndexedEvent):
        return attrs.evolve(_apply_event(state, event.event), last_index=event.index)
    return _apply_event(state, event)


def apply_all(state: State, events: Iterable[IndexedEvent | Event]) -> State:
    """`state` after each of `events` in turn."""
    for event in events:
        state = apply(state, event)
    return state


def rebuild_events(state: State) -> list[Event]:
    """Events that rebuild `state` (all but `last_index`) when applied to an empty `State`.

    A new session's master starts its log with these (for its `carry_over` state), so that
    the log alone, replayed from index 0 by a late joiner, gives the state it started from.
    """
    events: list[Event] = [NodeUpdated(node) for node in state.nodes.values()]
    events += [InstanceCreated(instance) for instance in state.instances.values()]
    # InstanceCreated makes an idle record per assignment; correct the ones that moved on.
    implied = apply_all(State(), events).runners
    events += [
        RunnerStatusChanged(r.runner_id, r.instance_id, r.node_id, r.status)
        for r in state.runners.values()
        if implied.get(r.runner_id) != r
    ]
    for instance_id, group in state.groups.items():
        if group.epoch != 0:
            events.append(GroupReset(instance_id, group.epoch))
        events += [
            RankAddressed(instance_id, group.epoch, rank, address)
            for rank, address in enumerate(group.addresses)
            if address is not None
        ]
    events += [TaskCreated(task) for task in state.tasks.values()]
    events += [
        DownloadUpdated(node_id, progress)
        for node_id, downloads in state.downloads.items()
        for progress in downloads.values()
    ]
    events += list(state.commands.values())
    return events


def carry_over(state: State) -> State:
    """What of a previous session's `state` a new session starts from: everything but the
    log's position.

    Runners belong to their nodes, not to sessions: they keep running, with their models
    loaded, and their tasks keep streaming, so placements, runner statuses and tasks in
    flight all carry over (workers re-report what changed meanwhile). The master then drops
    what belonged to nodes that are gone.
    """
    return State(
        nodes=dict(state.nodes),
        instances=dict(state.instances),
        runners=dict(state.runners),
        tasks=dict(state.tasks),
        groups=dict(state.groups),
        downloads=dict(state.downloads),
        commands=dict(state.commands),
    )


def after_restart(state: State) -> State:
    """What a node that was restarted keeps of the last state it wrote as master.

    Its placements, with every runner idle (the processes died with the node) and every
    split instance's group in a fresh epoch (new ports); the nodes it knew (a new master
    drops those that are gone, and places their instances again where it can). Not its
    tasks, whose streams died with it, nor downloads, which nodes report again. The
    commands it carried out, so a client's retry is still answered from them.
    """
    groups = {
        iid: GroupState.empty(group.epoch + 1, len(group.addresses))
        for iid, group in state.groups.items()
    }
    return State(
        nodes=dict(state.nodes),
        instances=dict(state.instances),
        runners={rid: attrs.evolve(r, status=RunnerIdle()) for rid, r in state.runners.items()},
        groups=groups,
        commands=dict(state.commands),
    )


def remember_command(
    state: State, done: CommandDone | None, *, bound: int = REMEMBERED_COMMANDS
) -> State:
    """`state` remembering `done` (the newest), forgetting the oldest past `bound`."""
    if done is None:
        return state
    commands = {k: v for k, v in state.commands.items() if k != done.command_id}
    commands[done.command_id] = done
    for stale in list(commands)[: max(0, len(commands) - bound)]:
        del commands[stale]
    return attrs.evolve(state, commands=commands)


def _apply_event(state: State, event: Event) -> State:
    match event:
        case NodeUpdated(node):
            return attrs.evolve(state, nodes={**state.nodes, node.node_id: node})
        case NodeRemoved(node_id):
            # Instances on the node stay: the master deletes them with their own events.
            if node_id not in state.nodes:
                return _unknown(state, event, "node", node_id)
            return attrs.evolve(
                state,
                nodes=_without(state.nodes, node_id),
                downloads=_without(state.downloads, node_id),
            )
        case InstanceCreated(instance, done):
            if instance.instance_id in state.instances:
                return _unknown(state, event, "instance (already exists)", instance.instance_id)
            runners = dict(state.runners)
            for a in instance.assignments:
                runners[a.runner_id] = RunnerRecord(a.runner_id, instance.instance_id, a.node_id)
            instances = {**state.instances, instance.instance_id: instance}
            groups = state.groups
            if instance.is_split:
                empty = GroupState.empty(0, len(instance.assignments))
                groups = {**groups, instance.instance_id: empty}
            created = attrs.evolve(state, instances=instances, runners=runners, groups=groups)
            return remember_command(created, done)
        case InstanceDeleted(instance_id, done):
            if instance_id not in state.instances:
                return _unknown(state, event, "instance", instance_id)
            deleted = attrs.evolve(
                state,
                instances=_without(state.instances, instance_id),
                runners={k: r for k, r in state.runners.items() if r.instance_id != instance_id},
                tasks={k: t for k, t in state.tasks.items() if t.instance_id != instance_id},
                groups=_without(state.groups, instance_id),
            )
            return remember_command(deleted, done)
        case CommandDone():
            return remember_command(state, event)
        case RunnerStatusChanged(runner_id, instance_id, node_id, status):
            # Creates a missing record of a known instance; a report about a deleted
            # instance's runner arrives late and is ignored.
            if instance_id not in state.instances:
                return _unknown(state, event, "instance", instance_id)
            record = RunnerRecord(runner_id, instance_id, node_id, status)
            return attrs.evolve(state, runners={**state.runners, runner_id: record})
        case TaskCreated(task):
            if task.instance_id not in state.instances:
                return _unknown(state, event, "instance", task.instance_id)
            return attrs.evolve(state, tasks={**state.tasks, task.task_id: task})
        case TaskStatusChanged(task_id, status):
            current = state.tasks.get(task_id)
            if current is None:
                return _unknown(state, event, "task", task_id)
            tasks = {**state.tasks, task_id: attrs.evolve(current, status=status)}
            return attrs.evolve(state, tasks=tasks)
        case TaskFinished(task_id, _):
            if task_id not in state.tasks:
                return _unknown(state, event, "task", task_id)
            return attrs.evolve(state, tasks=_without(state.tasks, task_id))
        case RankAddressed(instance_id, epoch, rank, address):
            group = state.groups.get(instance_id)
            if group is None or group.epoch != epoch or not 0 <= rank < len(group.addresses):
                return _unknown(state, event, "group epoch or rank", (instance_id, epoch, rank))
            addresses = tuple(address if r == rank else a for r, a in enumerate(group.addresses))
            groups = {**state.groups, instance_id: attrs.evolve(group, addresses=addresses)}
            return attrs.evolve(state, groups=groups)
        case GroupReset(instance_id, epoch):
            group = state.groups.get(instance_id)
            if group is None or epoch <= group.epoch:
                return _unknown(state, event, "group (or an older epoch)", (instance_id, epoch))
            reset = GroupState.empty(epoch, len(group.addresses))
            return attrs.evolve(state, groups={**state.groups, instance_id: reset})
        case DownloadUpdated(node_id, progress):
            if node_id not in state.nodes:
                return _unknown(state, event, "node", node_id)
            mine = {**state.downloads.get(node_id, {}), progress.model_id: progress}
            return attrs.evolve(state, downloads={**state.downloads, node_id: mine})
        case SessionOpened():
            return attrs.evolve(state, opened=True)
    log.warning("not an event, ignored: %r", event)  # unreachable for well-typed input
    return state


def _without(mapping: dict[K, V], key: K) -> dict[K, V]:
    return {k: v for k, v in mapping.items() if k != key}


def _unknown(state: State, event: Event, kind: str, key: object) -> State:
    log.debug("%s names unknown %s %s: no-op", type(event).__name__, kind, key)
    return state
