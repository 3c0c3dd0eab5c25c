"""The receiving end of the `stream` topic: chunks and command replies for this node.

Node-lifetime. Requests register before they send their command, so nothing that arrives
can be missed; what arrives for nobody (a request that already left) is dropped.

Each item is taken only from the node entitled to send it, whatever the item says (every
peer learns every task's id from the master's events, so an id proves nothing): a
command's reply from a node the command was sent to (`sent_to`); a generation's chunks from
the node leading it, which the master's reply named (`stream_from`; none are taken before);
its failure from that node or from the current master (which ends the streams of a lead
node that left). Anything else is dropped with a log line.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import attrs
import trio

from trexo.net.router import Router
from trexo.net.topics import Topic
from trexo.types.failure import FailureKind
from trexo.types.ids import NodeId, RequestId
from trexo.types.stream import CommandReply, StreamChunk, StreamFailed

log = logging.getLogger(__name__)

StreamEvent = StreamChunk | StreamFailed
T = TypeVar("T")


def _no_master() -> NodeId | None:
    return None


@attrs.define
class _Expected(Generic[T]):
    """Where what this node waits for on one stream or reply goes, and whom it comes from."""

    channel: trio.MemorySendChannel[T]
    senders: set[NodeId] = attrs.field(factory=set)


class StreamHub:
    def __init__(self, router: Router, *, master: Callable[[], NodeId | None] = _no_master) -> None:
        self._router = router
        self._master = master
        """The current session's master, if any."""
        self._streams: dict[RequestId, _Expected[StreamEvent]] = {}
        self._replies: dict[str, _Expected[CommandReply]] = {}
        self.dropped = 0
        """Items dropped for coming from a node not entitled to send them."""

    async def run(
        self, *, task_status: trio.TaskStatus[StreamHub] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with self._router.subscribe(Topic.STREAM) as inbox:
            task_status.started(self)
            async for envelope in inbox:
                self._dispatch(envelope.sender, envelope.payload)

    def _dispatch(self, sender: NodeId, item: object) -> None:
        match item:
            case StreamChunk(chunk=chunk):
                self._to_stream(sender, chunk.request_id, item, lead_only=True)
            case StreamFailed(request_id=request_id):
                self._to_stream(sender, request_id, item, lead_only=False)
            case CommandReply(command_id=command_id):
                expected = self._replies.get(command_id)
                if expected is None:
                    return
                if sender not in expected.senders:
                    self._drop(sender, item, f"command {command_id} was not sent to it")
                    return
                expected.channel.send_nowait(item)
            case _:
                log.warning("dropped a %s on the stream topic", type(item).__name__)

    def _to_stream(
        self, sender: NodeId, request_id: RequestId, item: StreamEvent, *, lead_only: bool
    ) -> None:
        expected = self._streams.get(request_id)
        if expected is None:
            return
        if sender not in expected.senders and (lead_only or sender != self._master()):
            self._drop(sender, item, f"it does not lead generation {request_id}")
            return
        expected.channel.send_nowait(item)

    def _drop(self, sender: NodeId, item: object, why: str) -> None:
        self.dropped += 1
        log.warning(
            "dropped a %s on the stream topic from %s: %s", type(item).__name__, sender, why
        )

    @contextmanager
    def expect_stream(
        self, request_id: RequestId
    ) -> Iterator[trio.MemoryReceiveChannel[StreamEvent]]:
        """Receive what arrives for `request_id` while the block runs, once `stream_from`
        names the node it comes from."""
        if request_id in self._streams:
            raise ValueError(f"request id {request_id} is already streaming")
        # Unbounded: a generation's output is bounded by its max_tokens.
        send, receive = trio.open_memory_channel[StreamEvent](math.inf)
        self._streams[request_id] = _Expected(send)
        try:
            with receive:
                yield receive
        finally:
            del self._streams[request_id]
            send.close()

    def stream_from(self, request_id: RequestId, lead_node: NodeId) -> None:
        """`request_id`'s chunks come from `lead_node` (the master's reply said so)."""
        if (expected := self._streams.get(request_id)) is not None:
            expected.senders = {lead_node}

    @contextmanager
    def expect_reply(self, command_id: str) -> Iterator[trio.MemoryReceiveChannel[CommandReply]]:
        """Receive the reply to `command_id` from the nodes it is `sent_to`."""
        send, receive = trio.open_memory_channel[CommandReply](math.inf)
        self._replies[command_id] = _Expected(send)
        try:
            with receive:
                yield receive
        finally:
            del self._replies[command_id]
            send.close()

    def sent_to(self, command_id: str, node_id: NodeId) -> None:
        """`command_id` goes to `node_id` (a master): its reply may come from there."""
        if (expected := self._replies.get(command_id)) is not None:
            expected.senders.add(node_id)

    @property
    def open_streams(self) -> frozenset[RequestId]:
        return frozenset(self._streams)

    def fail_stream(self, request_id: RequestId, message: str) -> None:
        """End an open stream with a retryable error (no node will send it more)."""
        expected = self._streams.get(request_id)
        if expected is not None:
            failed = StreamFailed(request_id, message, FailureKind.UNAVAILABLE)
            expected.channel.send_nowait(failed)
