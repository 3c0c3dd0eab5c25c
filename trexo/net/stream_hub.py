"""The receiving end of the `stream` topic: chunks and command replies for this node.

Node-lifetime. Requests register before they send their command, so nothing that arrives
can be missed; what arrives for nobody (a request that already left) is dropped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from trexo.net.router import Router
from trexo.net.topics import Topic
from trexo.types.failure import FailureKind
from trexo.types.ids import RequestId
from trexo.types.stream import CommandReply, StreamChunk, StreamFailed

log = logging.getLogger(__name__)

StreamEvent = StreamChunk | StreamFailed


class StreamHub:
    def __init__(self, router: Router) -> None:
        self._router = router
        self._streams: dict[RequestId, trio.MemorySendChannel[StreamEvent]] = {}
        self._replies: dict[str, trio.MemorySendChannel[CommandReply]] = {}

    async def run(
        self, *, task_status: trio.TaskStatus[StreamHub] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with self._router.subscribe(Topic.STREAM) as inbox:
            task_status.started(self)
            async for envelope in inbox:
                self._dispatch(envelope.payload)

    def _dispatch(self, item: object) -> None:
        match item:
            case StreamChunk(chunk=chunk):
                self._to_stream(chunk.request_id, item)
            case StreamFailed(request_id=request_id):
                self._to_stream(request_id, item)
            case CommandReply(command_id=command_id):
                if (channel := self._replies.get(command_id)) is not None:
                    channel.send_nowait(item)
            case _:
                log.warning("dropped a %s on the stream topic", type(item).__name__)

    def _to_stream(self, request_id: RequestId, item: StreamEvent) -> None:
        channel = self._streams.get(request_id)
        if channel is not None:
            channel.send_nowait(item)

    @contextmanager
    def expect_stream(
        self, request_id: RequestId
    ) -> Iterator[trio.MemoryReceiveChannel[StreamEvent]]:
        """Receive what arrives for `request_id` while the block runs."""
        if request_id in self._streams:
            raise ValueError(f"request id {request_id} is already streaming")
        # Unbounded: a generation's output is bounded by its max_tokens.
        send, receive = trio.open_memory_channel[StreamEvent](math.inf)
        self._streams[request_id] = send
        try:
            with receive:
                yield receive
        finally:
            del self._streams[request_id]
            send.close()

    @contextmanager
    def expect_reply(self, command_id: str) -> Iterator[trio.MemoryReceiveChannel[CommandReply]]:
        send, receive = trio.open_memory_channel[CommandReply](math.inf)
        self._replies[command_id] = send
        try:
            with receive:
                yield receive
        finally:
            del self._replies[command_id]
            send.close()

    @property
    def open_streams(self) -> frozenset[RequestId]:
        return frozenset(self._streams)

    def fail_stream(self, request_id: RequestId, message: str) -> None:
        """End an open stream with a retryable error (no node will send it more)."""
        self._to_stream(request_id, StreamFailed(request_id, message, FailureKind.UNAVAILABLE))
