"""The cluster state every node derives from the session's event log (see `trexo.state`)."""

from __future__ import annotations

from typing import Literal

import attrs

from trexo.types.generation import GenerationRequest
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.models import ModelRef
from trexo.types.runner_status import RunnerIdle, RunnerStatus
from trexo.types.shard import ShardSpec


@attrs.frozen
class NodeInfo:
    node_id: NodeId
    hostname: str
    memory_total: int
    """bytes"""
    memory_available: int
    """bytes, as the node's OS reports it"""
    api_url: str | None = None


@attrs.frozen
class RunnerAssignment:
    """One runner of an instance: which node runs it and which part of the model it holds."""

    runner_id: RunnerId
    node_id: NodeId
    shard: ShardSpec = ShardSpec()


@attrs.frozen
class Instance:
    """A placed model: one or more runners that together serve it."""

    instance_id: InstanceId
    model: ModelRef
    assignments: tuple[RunnerAssignment, ...]

    @property
    def node_ids(self) -> tuple[NodeId, ...]:
        return tuple(a.node_id for a in self.assignments)

    @property
    def lead(self) -> RunnerAssignment:
        """The rank-0 runner: it receives tasks and streams their chunks."""
        return min(self.assignments, key=lambda a: a.shard.rank)


@attrs.frozen
class RunnerRecord:
    runner_id: RunnerId
    instance_id: InstanceId
    node_id: NodeId
    status: RunnerStatus = RunnerIdle()


TaskStatus = Literal["pending", "running"]


@attrs.frozen
class Task:
    """A generation in flight. Its chunks go from the lead runner's node to `origin_node`."""

    task_id: RequestId
    instance_id: InstanceId
    origin_node: NodeId
    request: GenerationRequest
    status: TaskStatus = "pending"


@attrs.frozen
class State:
    nodes: dict[NodeId, NodeInfo] = attrs.field(factory=dict)
    instances: dict[InstanceId, Instance] = attrs.field(factory=dict)
    runners: dict[RunnerId, RunnerRecord] = attrs.field(factory=dict)
    tasks: dict[RequestId, Task] = attrs.field(factory=dict)
    last_index: int = -1
    """Index of the last event applied; -1 before any."""
    opened: bool = False
    """The session's master has written its carried-over state (`SessionOpened`)."""
