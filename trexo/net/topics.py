"""The topics nodes exchange messages on, and the message type each carries (see the README,
"Architecture")."""

from __future__ import annotations

import enum
from typing import Any

from trexo.types.commands import Command
from trexo.types.local_events import LocalEvent
from trexo.types.snapshot import GlobalItem
from trexo.types.stream import StreamItem, TaskBody


class Topic(enum.Enum):
    ELECTION = "election"
    """broadcast: election messages"""
    COMMANDS = "commands"
    """to the master: API and worker commands"""
    LOCAL_EVENTS = "local_events"
    """to the master: worker and runner facts"""
    GLOBAL_EVENTS = "global_events"
    """master to all: the session's indexed events"""
    STREAM = "stream"
    """point-to-point: chunks to the requesting node, command replies"""
    REQUESTS = "requests"
    """point-to-point: a generation's request, from its origin to its lead runner's node"""


def payload_type(topic: Topic) -> Any:
    """The (union) type of messages on `topic`, for decoding."""
    from trexo.types.election import ElectionMessage

    return {
        Topic.ELECTION: ElectionMessage,
        Topic.COMMANDS: Command,
        Topic.LOCAL_EVENTS: LocalEvent,
        Topic.GLOBAL_EVENTS: GlobalItem,
        Topic.STREAM: StreamItem,
        Topic.REQUESTS: TaskBody,
    }[topic]
