"""The cluster state every node derives from the session's event log (see `trexo.state`)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

import attrs

from trexo.types.downloads import DownloadProgress
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.models import ModelRef
from trexo.types.runner_status import RunnerIdle, RunnerStatus
from trexo.types.shard import RankGroup, ShardSpec

HTTP_SCHEMES = ("http", "https")


def _http_url(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    """An address pages follow (the dashboard links each node's): an http(s) URL only, so a
    peer's report cannot make it a script (`javascript:`) or break the page."""
    if value is None:
        return
    try:
        parts = urlsplit(value)
    except ValueError:
        parts = None
    printable = value.isprintable() and " " not in value
    if parts is None or parts.scheme not in HTTP_SCHEMES or not parts.hostname or not printable:
        raise ValueError(f"{attribute.name} must be an http(s) URL, got {value[:100]!r}")


@attrs.frozen
class NodeInfo:
    node_id: NodeId
    hostname: str
    memory_total: int
    """bytes"""
    memory_available: int
    """bytes, as the node's OS reports it"""
    api_url: str | None = attrs.field(default=None, validator=_http_url)
    """Where its API answers (`http(s)://host:port`); None until it listens."""
    peers: tuple[NodeId, ...] = ()
    """The nodes this node has a live link to (sorted), as it last reported them: the
    cluster's links, for a picture of it (the dashboard draws them)."""


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
    def is_split(self) -> bool:
        """Several runners (ranks) hold parts of the model and form a group."""
        return len(self.assignments) > 1

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


@attrs.frozen
class GroupState:
    """The bring-up of a split instance's ranks: which ranks have reported their address
    for the current `epoch`. A rebuilt group starts a new epoch with no addresses."""

    epoch: int
    addresses: tuple[str | None, ...]
    """Rank r's `"ip:port"` for this epoch, or None until its node reports it."""

    @classmethod
    def empty(cls, epoch: int, world_size: int) -> GroupState:
        return cls(epoch, (None,) * world_size)

    @property
    def group(self) -> RankGroup | None:
        """The group the ranks connect with, once every rank has reported its address."""
        if any(address is None for address in self.addresses):
            return None
        return RankGroup(self.epoch, tuple(a for a in self.addresses if a is not None))


@attrs.frozen
class CommandDone:
    """A state-changing command the master carried out: a resend of `command_id` (the
    client's retry, or its resend to the next master) is answered `result_id` again instead
    of being carried out twice. `fingerprint` is what the command asked for, so a key reused
    for a different request is told apart."""

    command_id: str
    fingerprint: str
    result_id: str | None


TaskStatus = Literal["pending", "running"]


@attrs.frozen
class Task:
    """A generation in flight. Its chunks go from the lead runner's node to `origin_node`.

    What the user sent (the messages, the sampling) is not here: it travels from the origin
    straight to the lead runner's node (`TaskBody`), so it is never in the log, on the
    master, or in anyone's state.
    """

    task_id: RequestId
    instance_id: InstanceId
    origin_node: NodeId
    status: TaskStatus = "pending"


@attrs.frozen
class State:
    nodes: dict[NodeId, NodeInfo] = attrs.field(factory=dict)
    instances: dict[InstanceId, Instance] = attrs.field(factory=dict)
    runners: dict[RunnerId, RunnerRecord] = attrs.field(factory=dict)
    tasks: dict[RequestId, Task] = attrs.field(factory=dict)
    groups: dict[InstanceId, GroupState] = attrs.field(factory=dict)
    """The rank group of every instance split over several runners."""
    downloads: dict[NodeId, dict[str, DownloadProgress]] = attrs.field(factory=dict)
    """Each node's model downloads by model id, as last reported (kept once done: the node
    has the files)."""
    commands: dict[str, CommandDone] = attrs.field(factory=dict)
    """The last placements and deletions carried out, by command id, oldest first (bounded:
    `trexo.config.REMEMBERED_COMMANDS`). In the state, so a new master answers a command
    the old one carried out from what it did."""
    last_index: int = -1
    """Index of the last event applied; -1 before any."""
    opened: bool = False
    """The session's master has written its carried-over state (`SessionOpened`)."""
