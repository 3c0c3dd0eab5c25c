"""Global events: the master's ordered log of state changes, applied by `trexo.state.apply`."""

from __future__ import annotations

import attrs

from trexo.types.chunks import FinishReason
from trexo.types.downloads import DownloadProgress
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.runner_status import RunnerStatus
from trexo.types.session import Session
from trexo.types.state import CommandDone, Instance, NodeInfo, Task, TaskStatus


@attrs.frozen
class NodeUpdated:
    node: NodeInfo


@attrs.frozen
class NodeRemoved:
    node_id: NodeId


@attrs.frozen
class InstanceCreated:
    instance: Instance
    done: CommandDone | None = None
    """The command that placed it (None when the master placed it again on its own): in
    the same event, so no failover falls between the placement and its record."""


@attrs.frozen
class InstanceDeleted:
    instance_id: InstanceId
    done: CommandDone | None = None
    """The command that deleted it (None when the master deleted it on its own)."""


@attrs.frozen
class RunnerStatusChanged:
    runner_id: RunnerId
    instance_id: InstanceId
    node_id: NodeId
    status: RunnerStatus


@attrs.frozen
class TaskCreated:
    task: Task


@attrs.frozen
class TaskStatusChanged:
    task_id: RequestId
    status: TaskStatus


@attrs.frozen
class TaskFinished:
    task_id: RequestId
    finish_reason: FinishReason


@attrs.frozen
class RankAddressed:
    """Rank `rank` of a split instance listens on `address` in the group's `epoch`."""

    instance_id: InstanceId
    epoch: int
    rank: int
    address: str


@attrs.frozen
class GroupReset:
    """A split instance's group is rebuilt: every rank restarts in `epoch`, on new ports."""

    instance_id: InstanceId
    epoch: int


@attrs.frozen
class DownloadUpdated:
    """Node `node_id`'s download of `progress.model_id` stands as `progress`."""

    node_id: NodeId
    progress: DownloadProgress


# `CommandDone` (from `trexo.types.state`) is an event too: a new session's master writes the
# records it carried over with it.


@attrs.frozen
class SessionOpened:
    """The master has written the state it carried over: from here on the log is this
    session's own. Workers act on the state (stop runners, cancel tasks) only after it."""


Event = (
    NodeUpdated
    | NodeRemoved
    | InstanceCreated
    | InstanceDeleted
    | RunnerStatusChanged
    | TaskCreated
    | TaskStatusChanged
    | TaskFinished
    | RankAddressed
    | GroupReset
    | DownloadUpdated
    | SessionOpened
    | CommandDone
)


@attrs.frozen
class IndexedEvent:
    """An event at its place in a session's log. Indices are contiguous from 0."""

    session: Session
    index: int
    event: Event
