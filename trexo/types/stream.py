"""Point-to-point messages on the `stream` topic: chunks to the requesting node, and replies."""

from __future__ import annotations

import attrs

from trexo.types.chunks import Chunk
from trexo.types.failure import FailureKind
from trexo.types.generation import GenerationRequest
from trexo.types.ids import NodeId, RequestId
from trexo.types.refusal import RefusalKind


@attrs.frozen
class StreamChunk:
    chunk: Chunk


@attrs.frozen
class StreamFailed:
    """The generation ended in error; no more chunks will come."""

    request_id: RequestId
    message: str
    kind: FailureKind = FailureKind.INTERNAL


@attrs.frozen
class CommandReply:
    """The master's answer to a command: accepted (with a result id) or refused (with why)."""

    command_id: str
    error: str | None = None
    error_kind: RefusalKind | None = None
    result_id: str | None = None
    lead_node: NodeId | None = None
    """An accepted `SubmitTask`: the node whose runner generates it (its body goes there)."""


@attrs.frozen
class TaskBody:
    """What a generation asks for, from its origin to the node running its instance's rank
    0 (on the `requests` topic): point-to-point, held there only until it runs."""

    request: GenerationRequest


StreamItem = StreamChunk | StreamFailed | CommandReply
