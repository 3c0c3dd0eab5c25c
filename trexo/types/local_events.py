"""Local events: facts a worker reports to the master, which publishes them as global events."""

from __future__ import annotations

import attrs

from trexo.types.chunks import FinishReason
from trexo.types.downloads import DownloadProgress
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.runner_status import RunnerStatus
from trexo.types.state import NodeInfo, Task, TaskStatus


@attrs.frozen
class NodeReport:
    node: NodeInfo


@attrs.frozen
class RunnerReport:
    runner_id: RunnerId
    instance_id: InstanceId
    status: RunnerStatus


@attrs.frozen
class TaskReport:
    """A task's progress; `finish_reason` set means it has ended."""

    task_id: RequestId
    status: TaskStatus = "running"
    finish_reason: FinishReason | None = None


@attrs.frozen
class TaskInFlight:
    """A task this node's runner is generating now; a new master that does not know of it
    (it missed its creation) adopts it rather than lose it."""

    task: Task


@attrs.frozen
class RankAddressReport:
    """This node's rank of a split instance will listen on `address` in `epoch`."""

    instance_id: InstanceId
    runner_id: RunnerId
    epoch: int
    address: str


@attrs.frozen
class DownloadReport:
    """Where node `node_id`'s download of a model stands."""

    node_id: NodeId
    progress: DownloadProgress


LocalEvent = (
    NodeReport | RunnerReport | TaskReport | TaskInFlight | RankAddressReport | DownloadReport
)
